"""Each host's last good tick in the shared store, so that any host's page shows the fleet.

Hosts that share a PostgreSQL store see each other's toggles and events, but a GPU's
state and the reasons jobs wait live only in the memory of the controller that
computed them. After each good tick, `serve` writes one row per host here (the page's
JSON of its GPUs and queue, the time, the tick and its tick period, `save`); every
host's page reads all rows (`load`). A row older than `STOPPED_INTERVALS` periods means
the controller stopped (killed, its thread dead, or its ticks failing: a failed tick
writes nothing), which the page shows over its last GPUs. The period is the interval
plus the tick's own time, since the loop waits an interval after each tick: a slow
tick is not taken for a stop. Hosts compare their clocks, as claims already do: keep
them in NTP sync.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from runnerctl.controller.store import Store

STOPPED_INTERVALS = 2.0
"""A host whose last good tick is older than this many of its tick periods is shown stopped."""


@dataclasses.dataclass(frozen=True)
class HostRow:
    host: str
    at: float
    """The host's clock at its last good tick."""
    interval_s: float
    """Its tick period at that tick: the interval plus the tick's own time."""
    tick: int
    view: dict[str, Any]

    def age_s(self, now: float) -> float:
        return max(0.0, now - self.at)

    def stopped(self, now: float) -> bool:
        return self.age_s(now) > STOPPED_INTERVALS * self.interval_s


def save(store: Store, *, host: str, at: float, interval_s: float, tick: int, view: dict[str, Any]) -> None:
    """Replace the host's row (one short transaction, every good tick)."""
    text = json.dumps(view, separators=(",", ":"), sort_keys=True)
    with store.transaction() as cur:
        cur.execute("INSERT INTO host_views (host, at, interval_s, tick, view) VALUES (?, ?, ?, ?, ?) "
                    "ON CONFLICT (host) DO UPDATE SET at = excluded.at, interval_s = excluded.interval_s, "
                    "tick = excluded.tick, view = excluded.view", (host, at, interval_s, tick, text))


def load(store: Store) -> list[HostRow]:
    """Every host's row, by name."""
    with store.transaction() as cur:
        rows = cur.query("SELECT host, at, interval_s, tick, view FROM host_views ORDER BY host")
    return [HostRow(r[0], float(r[1]), float(r[2]), int(r[3]), json.loads(r[4])) for r in rows]
