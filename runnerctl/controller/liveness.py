"""Whether the reconcile loop is really working: the age of its last good tick.

A controller whose ticks fail (a store locked or restarting, a bug) or whose thread
died still answers HTTP, so "the process is up" says nothing. The loop reports each
finished tick and each failed one here; `/healthz` answers 503 while the last good
tick is older than `stale_after_s` (a few intervals), while every tick since the start
has failed, or once the thread is gone, and the exporter shows the age
(`runnerctl_reconcile_last_success_age_seconds`) for the alert
`RunnerctlReconcileStalled`. Failures are logged once per kind while they last, and
the loop backs off between failed ticks (`backoff_s`).

A tick can also succeed while the controller cannot do its work: GitLab unreachable
(runners stay as they are or paused) or the GPUs unreadable (every runner stays closed).
The loop reports such a part as in trouble (`trouble`); one in trouble for longer than
`stale_after_s` makes `/healthz` 503 as well, naming it, since the host serves no new
job the way it should.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from runnerctl.errors import RunnerctlError, first_line

log = logging.getLogger(__name__)
STALE_INTERVALS = 3
"""A tick this many intervals overdue makes the controller unhealthy."""
STALE_MIN_S = 10.0
"""... and never sooner than this (a tick with GitLab calls, on a busy host, takes a while)."""
BACKOFF_MAX_S = 30.0
"""Longest wait between failed ticks: a store back after a restart is used this soon."""
BACKOFF_INTERVALS = 10
"""... and never longer than this many intervals (short intervals recover quickly)."""


class Liveness:
    """Last good tick, failures by kind, and the thread that ticks (`watch`)."""

    def __init__(self, *, host: str, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.host = host
        self.interval_s = interval_s
        self.stale_after_s = max(STALE_INTERVALS * interval_s, STALE_MIN_S)
        self._clock = clock
        self.started = clock()
        self.last_good: float | None = None
        self.failures: Counter[str] = Counter()  # kind -> failed ticks, since start
        self.streak = 0  # failed ticks since the last good one
        self.last_error = ""
        self._logged: set[str] = set()
        self.thread: threading.Thread | None = None
        self.troubles: dict[str, tuple[float, str]] = {}  # part -> (since, its last error)
        self.notices: dict[str, str] = {}  # part -> what an admin must act on soon (`notice`)

    def watch(self, thread: threading.Thread) -> None:
        self.thread = thread

    def good(self) -> None:
        if self.streak:
            log.warning("reconcile ticks work again after %d failed (%s)", self.streak, self.last_error)
        self.last_good = self._clock()
        self.streak = 0
        self.last_error = ""
        self._logged.clear()

    def trouble(self, part: str, error: str, *, warn: str = "") -> None:
        """The loop's word on a part it needs ("gitlab", "gpus"): its error, or "" when
        it works again. With `warn`, the start of a trouble is logged once as `warn:
        error`, and its end as that the part works again."""
        if not error:
            if self.troubles.pop(part, None) is not None and warn:
                log.warning("%s works again", _PART_NAMES.get(part, part))
            return
        if part not in self.troubles and warn:
            log.warning("%s: %s", warn, error)
        self.troubles[part] = (self.troubles.get(part, (self._clock(), ""))[0], error)

    def trouble_ages(self) -> dict[str, float]:
        """Seconds each part the loop needs ("gitlab", "gpus", "clock") has failed, 0 for one
        that works: the metrics' `runnerctl_reconcile_trouble_seconds`."""
        now = self._clock()
        return {part: round(now - self.troubles[part][0], 3) if part in self.troubles else 0.0
                for part in sorted({*_PARTS, *self.troubles})}

    def notice(self, part: str, text: str) -> None:
        """Something an admin must act on before it fails (the GitLab token's expiry), or
        "" when it is gone: on /healthz under `notices`, which stays healthy; logged as a
        warning each time its text changes."""
        if not text:
            self.notices.pop(part, None)
            return
        if self.notices.get(part) != text:
            log.warning("%s", text)
        self.notices[part] = text

    def failed(self, exc: BaseException, tick: int) -> None:
        """Count a failed tick; log it with its traceback the first time its kind fails in
        this streak, at debug level after that."""
        kind = type(exc).__name__
        self.failures[kind] += 1
        self.streak += 1
        self.last_error = f"{kind}: {first_line(exc)}" if str(exc).strip() else kind  # on /healthz
        if kind in self._logged:
            log.debug("tick %d failed again: %s", tick, self.last_error)
            return
        self._logged.add(kind)
        known = isinstance(exc, RunnerctlError)  # a store busy or away says all in its line
        log.error("tick %d failed, retrying in %.1f s (logged once until a tick works): %s", tick,
                  self.backoff_s(), self.last_error, exc_info=None if known else exc)

    def backoff_s(self, every_s: float | None = None) -> float:
        """Wait before the next tick: the interval (or `every_s`), doubled per failed tick
        in a row, at most `BACKOFF_MAX_S` or `BACKOFF_INTERVALS` intervals."""
        base = self.interval_s if every_s is None else every_s
        if not self.streak:
            return base
        doubled: float = base * 2.0 ** (self.streak - 1)
        return min(doubled, max(base, min(BACKOFF_MAX_S, BACKOFF_INTERVALS * base)))

    def age_s(self) -> float:
        """Seconds since the last good tick (since start before the first one)."""
        return self._clock() - (self.started if self.last_good is None else self.last_good)

    def report(self) -> tuple[bool, dict[str, Any]]:
        """(healthy, what /healthz shows)."""
        age = self.age_s()
        thread = "unwatched" if self.thread is None else "alive" if self.thread.is_alive() else "dead"
        problems = []
        if thread == "dead":
            problems.append("the reconcile thread has stopped")
        if age > self.stale_after_s:
            problems.append(f"no good tick for {age:.1f} s (limit {self.stale_after_s:.1f} s)")
        elif self.last_good is None and self.streak:  # a serve that never worked is no healthy start
            problems.append(f"no good tick since the start ({self.streak} failed)")
        if problems and self.last_error:
            problems.append(f"last error: {self.last_error}")
        now = self._clock()
        lasting = {part: (round(now - since, 3), error)
                   for part, (since, error) in sorted(self.troubles.items())}
        problems += [f"{_PARTS.get(part, part)} for {for_s:.0f} s: {error}"
                     for part, (for_s, error) in lasting.items() if for_s > self.stale_after_s]
        troubles = {part: {"for_s": for_s, "error": error} for part, (for_s, error) in lasting.items()}
        return not problems, {"last_good_tick_age_s": round(age, 3), "stale_after_s": self.stale_after_s,
                              "failed_ticks_in_a_row": self.streak, "reconcile_thread": thread,
                              "troubles": troubles, "notices": dict(sorted(self.notices.items())),
                              "problem": "; ".join(problems)}


_PARTS = {"gitlab": "GitLab fails", "gpus": "the GPUs cannot be read (every runner stays closed)",
          "clock": "this host's clock is off the shared store's", "leases": "leases cannot be written"}
_PART_NAMES = {"gitlab": "GitLab", "gpus": "reading the GPUs", "clock": "this host's clock",
               "leases": "writing leases"}
