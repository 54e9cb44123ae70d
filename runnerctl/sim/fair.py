"""The simulator's fair share and GitLab's choice of job for instance runners.

Split from `simulator` (the event loop) so each stays small, and so that the speed work
on the event loop and this one touch it only through a few hooks.

- Fair share (`SimConfig.fair`, off by default): decayed GPU use per user and project of
  the jobs started (`runnerctl.controller.fairshare.Usage`), read again every
  `SimConfig.fair_update_s` at a controller tick, as the controller reads its job
  history; each pending job's `Demand.fair_s` comes from it and, at every tick, from the
  queue (`fairshare.queue_share_s`: the jobs its user and project run and wait with
  ahead of it), through `fairshare.fair_seconds` as in the controller. When a job's
  `fair_s` changes, so may every host's plan and the order of the queue's top: the simulator then plans
  every host again (`Simulator._fair_refresh`), and the top is cut in the planner's own
  order (`Demand.urgency`, fair share included), not arrival order.
- Runner type (`SimConfig.runner_type`): which pending job GitLab hands to a polling
  runner. gitlabhq app/services/ci/queue/pending_builds_strategy.rb: group and project
  runners (`builds_for_group_runner`, `builds_for_project_runner` through
  build_queue_service.rb) take the oldest job (`order`: build_id ASC); instance runners
  (`builds_for_shared_runner`) take first the jobs of the projects with the fewest
  builds running on instance runners (`running_builds_for_shared_runners_cte`, COALESCE
  0), then build_id ASC. Every runner of a simulated fleet is of the one type.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING

from runnerctl.controller.fairshare import Penalties, Queued, Span, Usage, fair_seconds
from runnerctl.tags import PRIORITY_RANK

if TYPE_CHECKING:
    from runnerctl.sim.inputs import TraceJob
    from runnerctl.sim.simulator import Simulator

RUNNER_TYPES = ("group", "instance")


class SimFair:
    def __init__(self, sim: Simulator) -> None:
        config = sim.config
        if config.runner_type not in RUNNER_TYPES:
            raise ValueError(f"unknown runner type {config.runner_type!r}; one of {', '.join(RUNNER_TYPES)}")
        self.policy = config.fair
        self.on = config.fair.on and config.policy == "dynamic"
        self.instance = config.runner_type == "instance"
        self.update_s = config.fair_update_s
        self.usage = Usage(config.fair.half_life_s)
        self.spans: dict[int, Span] = {}  # jobs that ran since the last read
        self.penalties = Penalties(self.usage, self.policy)
        self.present: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())
        self.next_at = float("-inf")
        self.held: dict[int, Queued] = {}  # jobs running now (queue share)
        self.table: dict[int, float] = {}  # job id -> fair_s, as of the last tick it was pending
        self.running: dict[str, int] = {}  # project -> jobs running (instance runners' order)

    def started(self, job: TraceJob, now: float) -> None:
        self.running[job.project] = self.running.get(job.project, 0) + 1
        if self.on:
            self.spans[job.job_id] = Span(job.owner, job.project, job.gpus, now)
            self.held[job.job_id] = _queued(job)

    def finished(self, job: TraceJob, now: float) -> None:
        self.running[job.project] -= 1
        self.held.pop(job.job_id, None)
        span = self.spans.get(job.job_id)
        if span is not None:
            self.spans[job.job_id] = dataclasses.replace(span, end=now)

    def refresh(self, sim: Simulator, now: float) -> bool:
        """At a controller tick: read usage again if `fair_update_s` passed, and every
        pending job's `fair_s` from it, the users and projects waiting now and the queue
        (`fairshare.fair_seconds`), as the controller does at each tick; True if a job
        the simulator remembers now has another `fair_s` (a new job has no remembered
        value: nothing planned from it yet)."""
        if not self.on:
            return False
        read = now >= self.next_at
        if read:
            self._read(now)
        pending = [_queued(sim.jobs[j]) for j in sim.queue]
        present = (frozenset(j.user for j in pending), frozenset(j.project for j in pending))
        if read or present != self.present:
            self.present = present
            self.penalties = Penalties(self.usage, self.policy, users=present[0], projects=present[1])
        fresh = fair_seconds(self.penalties, pending, self.held.values())
        changed = any(self.table.get(j, s) != s for j, s in fresh.items())
        self.table.update(fresh)  # a job that left keeps its last value (the change log may read it)
        return read or changed

    def _read(self, now: float) -> None:
        self.next_at = now + self.update_s
        last = self.usage.at
        self.usage.decay_to(now)
        for job_id, span in list(self.spans.items()):
            self.usage.add(span, since=last)
            if span.end is not None:
                del self.spans[job_id]

    def fair_s(self, job: TraceJob) -> float:
        """The job's `Demand.fair_s` as of the last tick (a pending job's is read only at a tick)."""
        return self.table[job.job_id] if self.on else 0.0

    def by_urgency(self, sim: Simulator, gpus: int) -> Iterable[int]:
        """Pending jobs of `gpus` GPUs in the planner's order (`Demand.urgency`)."""
        if not self.on:
            return sim.queue.by_urgency(gpus)
        jobs = sim.jobs
        mine = list(sim.queue.by_urgency(gpus))
        return sorted(mine, key=lambda j: (PRIORITY_RANK.get(jobs[j].priority, 1),
                                           jobs[j].submit + self.fair_s(jobs[j]), j))

    def pick(self, sim: Simulator, gpus: int) -> int | None:
        """The job GitLab hands to a polling runner for `gpus` GPUs (module docstring)."""
        if not self.instance:
            return sim.queue.oldest(gpus)
        jobs, running = sim.jobs, self.running
        best: tuple[int, int] | None = None
        for job_id in sim.queue.by_urgency(gpus):
            key = (running.get(jobs[job_id].project, 0), job_id)
            if best is None or key < best:
                best = key
        return None if best is None else best[1]


def _queued(job: TraceJob) -> Queued:
    return Queued(job.job_id, job.owner, job.project, job.gpus, job.submit)
