"""Run-time estimates from the job history: how long a pending job may run.

GitLab says nothing of how long a pending job will run (its jobs API has no timeout,
docs/controller.md "Where the timeouts come from"), but the jobs that ran before it with
the same project and job name (`.gitlab-ci.yml`'s key) say how long such a job can run:
a training job trains, a lint job lints. The estimate is the longest of the last
`RUNS_KEPT` such runs that ended (none cancelled or freed by the orphan audit: those
say when someone stopped a job, not how long it runs); none before the first. The
outcome `canceled` needs the job webhook; without it a cancelled run counts as `ended`,
which can only make the estimate shorter (it ran less than the job would have). A freed
job whose status a webhook brought is no longer `freed`, but its end is then when that
was heard (`history`), not when its lease was freed. The job name is the lease's
(CI_JOB_NAME), else what demand polling saw while the job was pending.

The longest, not the mean: what the estimate decides is whether a multi-GPU job may go
ahead of older smaller ones (a size credit), and what that costs them is its run time,
which for heavy-tailed ML jobs is often many times the usual one. So a job gets the
credit only if none of its recent runs was long (`PlanPolicy.credit_estimate_max_s`).
The mean, tried first, came out under the bound for jobs that often run for hours (the
first runs to end are the short ones, and a mean of 20 heavy-tailed runs swings): on
`benchmarks/simulate_lab.py` it helped half as much (docs/controller.md "Size credits").

Only the planner's order reads it (`Demand.estimate_s`): being no bound, it never lets
a job backfill a drained block (a wrong estimate could then delay the drained job
without limit); the timeouts do that.

`RunTimes` is pure (the simulator feeds it the jobs it ends); `Estimates` fills it from
the store at most once per `REFRESH_S`: the runs that ended since its last read (the
`ended_at` index), and the whole window once per `FULL_S`, which also drops runs that
left the window and sees an outcome a webhook changed after the run ended. Reading the
whole window every minute took seconds of the store at a big lab's 300,000 runs in 70
days (benchmarks/history_reads.py, figures in benchmarks/RESULTS.md). Fair share reads
usage the same way (`fair_usage`).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping

from runnerctl.controller import jobs_store
from runnerctl.controller.demand import PendingJob, due
from runnerctl.controller.fair_usage import project_path
from runnerctl.controller.store import Store

RUNS_KEPT = 20
"""The estimate reads at most this many of the latest runs."""
REFRESH_S = 60.0
FULL_S = 3600.0
"""The whole window is read again at most this often (see the module's docstring)."""
LATE_S = 300.0
"""A run written this long after a later one ended (a host whose clock is behind, a write
retried) is still read by the next refresh; runs read twice are told apart by host and job."""
WINDOW_S = 30 * 86400.0
"""Runs that ended longer ago than this are not read (a job name that has not run for a
month starts afresh; the history keeps `history_retention_days`, 400 by default)."""
NOT_RUNS = frozenset({"canceled", "freed"})
"""Outcomes that say when the job was stopped, not how long it runs."""

Key = tuple[str, str]  # (project path, job name)


class RunTimes:
    """The latest run times per (project, job name), in the order they ended."""

    def __init__(self) -> None:
        self._runs: dict[Key, collections.deque[float]] = {}
        self._longest: dict[Key, float] = {}  # the estimate, kept as runs are added

    def add(self, key: Key, seconds: float) -> None:
        runs = self._runs.get(key)
        if runs is None:
            runs = self._runs[key] = collections.deque(maxlen=RUNS_KEPT)
        runs.append(max(0.0, seconds))
        self._longest[key] = max(runs)

    def estimate(self, key: Key) -> float | None:
        """The longest of the kept runs; None before the first."""
        return self._longest.get(key)


class Estimates:
    """The controller's estimates, read again from the store at most every `REFRESH_S`."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.times = RunTimes()
        self._read_at = self._full_at = float("-inf")
        self._newest = float("-inf")  # the latest end read
        self._recent: dict[tuple[str, int], float] = {}  # (host, job) -> end of runs within LATE_S of it

    def of(self, pending: Iterable[PendingJob], now: float) -> Mapping[int, float]:
        """Job id -> its estimated run time, for the pending jobs that have one."""
        if due(now, self._read_at + REFRESH_S, REFRESH_S):  # due: a clock stepped back too
            self._read(now)
        found = {}
        for job in pending:
            estimate = self.times.estimate((project_path(job), job.name or ""))
            if estimate is not None:
                found[job.job_id] = estimate
        return found

    def _read(self, now: float) -> None:
        if now < self._read_at or due(now, self._full_at + FULL_S, FULL_S):
            rows = [r for r in jobs_store.jobs(self.store, since=now - WINDOW_S) if r.ended_at is not None]
            self.times, self._recent, self._newest, self._full_at = RunTimes(), {}, float("-inf"), now
        else:
            rows = jobs_store.ended_after(self.store, self._newest - LATE_S)
        for run in sorted(rows, key=lambda r: (r.ended_at or 0.0, r.job_id)):
            end = run.ended_at or 0.0
            if self._recent.get((run.host, run.job_id)) == end:
                continue  # read before, within LATE_S of the newest end
            self._recent[(run.host, run.job_id)] = end
            self._newest = max(self._newest, min(end, now))  # a host's clock ahead hides no one
            if run.outcome not in NOT_RUNS:
                self.times.add((run.project, run.name), end - run.started_at)
        self._recent = {key: end for key, end in self._recent.items() if end >= self._newest - LATE_S}
        self._read_at = now
