"""The controller's fair share: each pending job's `Demand.fair_s` from the job history.

Why a module: `fairshare` is pure; this one reads the store at most once per `REFRESH_S`
for usage: the open rows and those that ended since its last read, whose use since then
is added to the usage it keeps (decayed to now); and once per `FULL_S` every row of the
last ten half-lives (older use weighs under 0.1 %), which also corrects what a row
written late changed. Reading them all every minute took seconds of the store at a big
lab's 300,000 jobs in ten half-lives (benchmarks/history_reads.py, benchmarks/RESULTS.md).
The queue share counts the jobs running on every host with the pending ones, so those
are read at every tick (the open rows, `jobs_store.open_jobs`: one indexed query): a job
that just started leaves GitLab's pending list and must count as running at once, as in
the simulator (`fairshare.fair_seconds`). A job's user is its GitLab login, its project the project's
path (as the history records it from CI_PROJECT_PATH or the job's page);
`[controller] user_shares` and `project_shares` name them so.
"""

from __future__ import annotations

from collections.abc import Iterable

from runnerctl.controller import jobs_store
from runnerctl.controller.demand import PendingJob, due
from runnerctl.controller.fairshare import FairPolicy, Penalties, Queued, Span, Usage, fair_seconds
from runnerctl.controller.history import project_of
from runnerctl.controller.store import Store
from runnerctl.settings import ControllerSettings

REFRESH_S = 60.0
FULL_S = 3600.0
"""Every row of the last ten half-lives is read again at most this often."""
ALIVE_S = 600.0
"""An open history row counts as a running job if its host sampled it this recently (a
host that went away leaves its rows open); at least three of the controller's ticks
(`[controller] interval_s`), since a host samples its rows once a tick."""


def policy_of(settings: ControllerSettings) -> FairPolicy:
    return FairPolicy(weight_s=settings.fair_weight_h * 3600, half_life_s=settings.fair_half_life_h * 3600,
                      user_shares=settings.user_shares, project_shares=settings.project_shares,
                      queue_step_s=settings.fair_queue_step_min * 60)


class FairShare:
    def __init__(self, store: Store, settings: ControllerSettings) -> None:
        self.store, self.policy = store, policy_of(settings)
        self.alive_s = max(ALIVE_S, 3 * settings.interval_s)
        self.usage: Usage | None = None
        self._read_at = self._full_at = float("-inf")

    def penalties(self, pending: Iterable[PendingJob], now: float) -> dict[int, float]:
        """Job id -> seconds it counts younger (empty when fair share is off)."""
        if not self.policy.on:
            return {}
        open_rows = jobs_store.open_jobs(self.store)
        usage = self.usage
        if usage is None or due(now, self._read_at + REFRESH_S, REFRESH_S):  # a clock stepped back too
            usage = self._read(now, open_rows)
        running = [Queued(r.job_id, r.user, r.project, len(r.gpus), r.started_at)
                   for r in open_rows if now - r.seen_at < self.alive_s]
        jobs = [queued(j) for j in pending]
        table = Penalties(usage, self.policy, users={j.user for j in jobs},
                          projects={j.project for j in jobs})
        return fair_seconds(table, jobs, running)

    def _read(self, now: float, open_rows: list[jobs_store.JobRecord]) -> Usage:
        usage = self.usage
        if usage is None or now < self._read_at or due(now, self._full_at + FULL_S, FULL_S):
            since = now - 10 * self.policy.half_life_s
            spans = (self._span(r, now) for r in jobs_store.jobs(self.store, since=since))
            usage, self._full_at = Usage.of(spans, now, self.policy.half_life_s), now
        else:  # the use since the last read: of the jobs running, and of those that ended since
            usage.decay_to(now)
            rows = {(r.host, r.job_id): r for r in open_rows}  # read apart: a row closed in between
            rows.update({(r.host, r.job_id): r for r in jobs_store.ended_after(self.store, self._read_at)})
            for record in rows.values():  # is in both, and counts once, closed
                usage.add(self._span(record, now), since=self._read_at)
        self.usage, self._read_at = usage, now
        return usage

    def _span(self, record: jobs_store.JobRecord, now: float) -> Span:
        return Span(record.user, record.project, len(record.gpus), record.started_at, self._end(record, now))

    def _end(self, record: jobs_store.JobRecord, now: float) -> float | None:
        """A job's end as fair share counts it: None while its host still sees it; an open
        job no host has seen for `alive_s` (its host stopped for good) ends where it was
        last seen, else it would count as GPU use up to now, for ever."""
        if record.ended_at is not None or now - record.seen_at < self.alive_s:
            return record.ended_at
        return record.seen_at


def queued(job: PendingJob) -> Queued:
    """A pending job as fair share counts it: its GitLab login and project path."""
    return Queued(job.job_id, job.user or "", project_path(job), job.gpus, job.created_at)


def project_path(job: PendingJob) -> str:
    """The job's project as the history names it: its path from the job's page, else its id."""
    return project_of(job.web_url or "") or str(job.project_id)
