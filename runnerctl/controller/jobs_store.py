"""Job history rows in the controller store, and retention of history and events.

One row per job a runner of the host ran (table `job_history`, migration 4), keyed by
(host, job id): the controller inserts it when the job's lease appears, updates it each
tick while the lease lasts (last seen, utilization samples) and closes it when the
lease is gone. Writes are upserts of the whole row from the controller's memory, which
it reads back from here on start, so a restart neither loses nor double-counts a job.
Kept apart from store.py so that the store's core stays small.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from runnerctl.controller.store import Store

_COLUMNS = ("host", "job_id", "slot", "gpus", "project", "pipeline", "name", "username", "url",
            "queued_at", "started_at", "seen_at", "ended_at", "outcome", "util_sum", "util_samples",
            "idle_gpu_s", "low_since", "unused_at")


@dataclasses.dataclass(frozen=True)
class JobRecord:
    """One job as the controller saw it. Times are Unix seconds; `ended_at` None while it
    runs; `queued_at` None when the job was never seen pending (its wait is unknown)."""

    host: str
    job_id: int
    slot: str
    gpus: tuple[int, ...]
    project: str
    pipeline: str
    name: str
    user: str
    url: str
    queued_at: float | None
    started_at: float
    seen_at: float
    ended_at: float | None = None
    outcome: str = "running"
    util_sum: float = 0.0
    """Sum of the per-tick mean utilization (0-1) of its GPUs, over ticks where it was known."""
    util_samples: int = 0
    idle_gpu_s: float = 0.0
    """GPU-seconds its GPUs spent below the "unused" utilization while it held them."""
    low_since: float | None = None
    """Since when its utilization has stayed below the "unused" threshold (None: not now)."""
    unused_at: float | None = None
    """When it was flagged "requested but unused" (once per job)."""

    @property
    def end(self) -> float:
        return self.ended_at if self.ended_at is not None else self.seen_at

    @property
    def gpu_hours(self) -> float:
        return len(self.gpus) * max(0.0, self.end - self.started_at) / 3600.0

    @property
    def mean_utilization(self) -> float | None:
        """None when no sample was known (never 0 for unknown)."""
        return self.util_sum / self.util_samples if self.util_samples else None

    @property
    def wait_s(self) -> float | None:
        return None if self.queued_at is None else max(0.0, self.started_at - self.queued_at)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        del data["util_sum"], data["util_samples"], data["low_since"]
        data["gpus"] = list(self.gpus)
        data.update(gpu_hours=self.gpu_hours, mean_utilization=self.mean_utilization, wait_s=self.wait_s)
        return data

    def _row(self) -> tuple[Any, ...]:
        values = dataclasses.astuple(self)
        return (*values[:3], ",".join(map(str, self.gpus)), *values[4:])


def _record(row: Sequence[Any]) -> JobRecord:
    gpus = tuple(int(g) for g in str(row[3]).split(",") if g)
    opt = [None if v is None else float(v) for v in (row[9], row[12], row[17], row[18])]
    return JobRecord(row[0], int(row[1]), row[2], gpus, row[4], row[5], row[6], row[7], row[8],
                     opt[0], float(row[10]), float(row[11]), opt[1], row[13], float(row[14]),
                     int(row[15]), float(row[16]), opt[2], opt[3])


def save_jobs(store: Store, records: Iterable[JobRecord]) -> None:
    """Insert or replace these rows, in one transaction."""
    rows = [r._row() for r in records]
    if not rows:
        return
    marks = ", ".join("?" * len(_COLUMNS))
    updates = ", ".join(f"{c} = excluded.{c}" for c in _COLUMNS[2:])
    with store.transaction() as cur:
        for row in rows:
            cur.execute(f"INSERT INTO job_history ({', '.join(_COLUMNS)}) VALUES ({marks}) "
                        f"ON CONFLICT (host, job_id) DO UPDATE SET {updates}", row)


def open_jobs(store: Store, host: str | None = None) -> list[JobRecord]:
    """The host's jobs not yet closed (running when its controller last looked); every
    host's when `host` is None (fair share's queue share reads them each tick)."""
    where, params = ("AND host = ? ", (host,)) if host is not None else ("", ())
    with store.transaction() as cur:
        rows = cur.query(f"SELECT {', '.join(_COLUMNS)} FROM job_history WHERE ended_at IS NULL {where}"
                         "ORDER BY host, job_id", params)
    return [_record(r) for r in rows]


def jobs(store: Store, *, since: float | None = None, until: float | None = None) -> list[JobRecord]:
    """Every host's jobs that ran at some time in [since, until), oldest start first."""
    where, params = [], []
    if since is not None:
        where.append("(ended_at IS NULL OR ended_at >= ?)")
        params.append(since)
    if until is not None:
        where.append("started_at < ?")
        params.append(until)
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    with store.transaction() as cur:
        rows = cur.query(f"SELECT {', '.join(_COLUMNS)} FROM job_history{clause} ORDER BY started_at, job_id",
                         params)
    return [_record(r) for r in rows]


def ended_after(store: Store, after: float) -> list[JobRecord]:
    """Every host's jobs that ended after `after`, oldest end first: what changed since a
    reader's last look (one range read on the index `job_history_ended`), for readers that
    keep what they read before (estimates, fair share)."""
    with store.transaction() as cur:
        rows = cur.query(f"SELECT {', '.join(_COLUMNS)} FROM job_history WHERE ended_at > ? "
                         "ORDER BY ended_at, host, job_id", (after,))
    return [_record(r) for r in rows]


def latest(store: Store, *, limit: int, since: float | None = None, user: str | None = None,
           project: str | None = None, host: str | None = None) -> list[JobRecord]:
    """The `limit` jobs that started last and match every filter given (the fleet page's
    history: `since` as in `jobs`, the others equal)."""
    where: list[str] = ["1 = 1"]
    params: list[object] = []
    if since is not None:
        where.append("(ended_at IS NULL OR ended_at >= ?)")
        params.append(since)
    for column, value in (("username", user), ("project", project), ("host", host)):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    with store.transaction() as cur:
        rows = cur.query(f"SELECT {', '.join(_COLUMNS)} FROM job_history WHERE {' AND '.join(where)} "
                         "ORDER BY started_at DESC, job_id DESC LIMIT ?", [*params, limit])
    return [_record(r) for r in rows]


class Pruned(NamedTuple):
    jobs: int
    events: int
    sessions: int
    hosts: int


def prune(store: Store, *, jobs_before: float, events_before: float, now: float | None = None) -> Pruned:
    """Delete jobs that ended before `jobs_before` (or, still open, were last seen then: a
    host that stopped for good never closes them), events before `events_before` (every
    host's: any host may prune a shared store), the fleet views of hosts not heard from
    since then, and web sessions expired by `now` (`events_before` without it): a
    privacy review found expired sessions kept until someone signed in, and a stopped
    host's last queue (users, job links) kept for good. Returns counts."""
    with store.transaction() as cur:
        gone_jobs = cur.execute("DELETE FROM job_history WHERE COALESCE(ended_at, seen_at) < ?",
                                (jobs_before,))
        gone_events = cur.execute("DELETE FROM events WHERE at < ?", (events_before,))
        gone_sessions = cur.execute("DELETE FROM web_sessions WHERE expires_at < ?",
                                    (events_before if now is None else now,))
        gone_hosts = cur.execute("DELETE FROM host_views WHERE at < ?", (events_before,))
    return Pruned(gone_jobs, gone_events, gone_sessions, gone_hosts)


def count_rows(store: Store) -> tuple[int, int]:
    """(job_history rows, events rows): what retention keeps bounded."""
    with store.transaction() as cur:
        found = cur.query("SELECT (SELECT COUNT(*) FROM job_history), (SELECT COUNT(*) FROM events)")
    return int(found[0][0]), int(found[0][1])
