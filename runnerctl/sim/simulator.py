"""A discrete-event simulator: the same planner against simulated GPUs and GitLab.

Virtual clock, no I/O. Runner policies model gitlab-runner's mechanics: runners poll
every `check_s` seconds (all on one beat), GitLab hands the oldest pending job to an
open, idle runner whose tags cover the job's (`gpus:N` -> a slot of N GPUs), and the
executor's gate keeps a runner from starting on a GPU with a foreign process. Reference
policies (`greedy`, `fifo`) have no runners, polling or drain latency.

Policies: `static-singles` (one runner per GPU), `static-partition` (per host one
quad, one pair and two singles, always open), `dynamic` (runnerctl: every slot, opened
by `runnerctl.controller.plan.plan` every `reconcile_s`; hosts claim a pending job
before draining for it), `greedy` (start any queued job that fits, oldest first) and
`fifo` (strict arrival order).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import statistics
from collections.abc import Iterable

from runnerctl.controller.plan import Demand, Observed, SlotState, plan
from runnerctl.gpus.sim import count_snapshot
from runnerctl.layout import plan_slots
from runnerctl.model import Slot

POLICIES = ("dynamic", "static-singles", "static-partition", "greedy", "fifo")


@dataclasses.dataclass(frozen=True)
class TraceJob:
    job_id: int
    submit: float
    gpus: int
    duration: float
    project: str = "p"
    priority: str = "normal"


@dataclasses.dataclass(frozen=True)
class ForeignUse:
    start: float
    duration: float
    host: int
    gpu: int


@dataclasses.dataclass(frozen=True)
class SimConfig:
    hosts: int = 1
    gpus_per_host: int = 8
    policy: str = "dynamic"
    reconcile_s: float = 5.0  # controller interval
    check_s: float = 3.0  # gitlab-runner check_interval
    cooldown_s: float = 30.0  # a GPU stays closed this long after foreign use ends


@dataclasses.dataclass
class _Runner:
    slot: Slot
    open: bool
    job: int | None = None


class _Host:
    def __init__(self, index: int, config: SimConfig) -> None:
        slots = plan_slots(count_snapshot(f"gpu-{chr(97 + index)}", config.gpus_per_host))
        chosen = _policy_slots(slots, config.policy)
        self.runners = [_Runner(s, open=config.policy != "dynamic" or s.size == 1) for s in chosen]
        self.owner: list[int | None] = [None] * config.gpus_per_host
        self.foreign: list[int] = [0] * config.gpus_per_host  # active foreign processes
        self.closed_until: list[float] = [0.0] * config.gpus_per_host
        self.reserved: dict[str, int] = {}


def _policy_slots(slots: list[Slot], policy: str) -> list[Slot]:
    if policy == "static-singles":
        return [s for s in slots if s.size == 1]
    if policy == "static-partition":
        keys = {"gpu0-3", "gpu4-5", "gpu6", "gpu7"}
        return [s for s in slots if s.key in keys] or [s for s in slots if s.size == 1]
    return slots


class Simulator:
    def __init__(self, jobs: Iterable[TraceJob], config: SimConfig,
                 foreign: Iterable[ForeignUse] = ()) -> None:
        if config.policy not in POLICIES:
            raise ValueError(f"unknown policy {config.policy!r}; one of {', '.join(POLICIES)}")
        self.config = config
        self.jobs = {j.job_id: j for j in jobs}
        self.hosts = [_Host(i, config) for i in range(config.hosts)]
        self.pending: dict[int, None] = {}  # arrival order
        self.by_size: dict[int, dict[int, None]] = {}  # pending jobs by GPU count
        self.started: dict[int, float] = {}
        self.finished: dict[int, float] = {}
        self.claims: dict[int, int] = {}  # job -> host draining for it
        self.double_allocations = 0
        self.foreign_collisions = 0
        self.api_calls = 0
        self.busy_gpu_s = 0.0
        self._events: list[tuple[float, int, str, tuple[int, ...]]] = []
        self._seq = itertools.count()
        for job in self.jobs.values():
            self._push(job.submit, "arrive", job.job_id)
        for use in foreign:
            self._push(use.start, "foreign+", use.host, use.gpu)
            self._push(use.start + use.duration, "foreign-", use.host, use.gpu)

    def _push(self, at: float, kind: str, *data: int) -> None:
        heapq.heappush(self._events, (at, next(self._seq), kind, data))

    def run(self) -> dict[str, object]:
        runner_policy = self.config.policy not in ("greedy", "fifo")
        beat = self.config.check_s if runner_policy else None
        next_poll = 0.0
        next_tick = 0.0
        now = 0.0
        while self._events or (self.pending and self._can_progress()):  # cheap while events remain
            if runner_policy and self.pending:
                upcoming = self._events[0][0] if self._events else float("inf")
                wake = min(next_poll, next_tick if self.config.policy == "dynamic" else float("inf"))
                if wake <= upcoming:
                    now = max(now, wake)
                    if self.config.policy == "dynamic" and next_tick <= next_poll:
                        self._reconcile(now)
                        next_tick = now + self.config.reconcile_s
                    else:
                        self._poll(now)
                        next_poll = now + (beat or 3.0)
                    continue
            if not self._events:
                break
            now, _, kind, data = heapq.heappop(self._events)
            self._handle(now, kind, data)
            if runner_policy:
                next_poll = max(next_poll, _next_beat(now, beat or 3.0))
                next_tick = max(next_tick, _next_beat(now, self.config.reconcile_s))
            else:
                self._schedule_reference(now)
        return self._metrics()

    def _can_progress(self) -> bool:
        return any(self._fits_somewhere(self.jobs[j]) for j in self.pending)

    def _fits_somewhere(self, job: TraceJob) -> bool:
        return job.gpus in self._sizes

    @property
    def _sizes(self) -> set[int]:
        if self.config.policy in ("greedy", "fifo"):
            return set(range(1, self.config.gpus_per_host + 1))
        return {r.slot.size for h in self.hosts for r in h.runners}

    # -- events ----------------------------------------------------------------------
    def _handle(self, now: float, kind: str, data: tuple[int, ...]) -> None:
        if kind == "arrive":
            self.pending[data[0]] = None
            self.by_size.setdefault(self.jobs[data[0]].gpus, {})[data[0]] = None
        elif kind == "end":
            self._finish(now, data[0], data[1])
        elif kind == "foreign+":
            self.hosts[data[0]].foreign[data[1]] += 1
        elif kind == "foreign-":
            host = self.hosts[data[0]]
            host.foreign[data[1]] -= 1
            host.closed_until[data[1]] = now + self.config.cooldown_s

    def _start(self, now: float, host_no: int, gpus: tuple[int, ...], job_id: int,
               runner: _Runner | None) -> None:
        host = self.hosts[host_no]
        if any(host.owner[g] is not None for g in gpus):
            self.double_allocations += 1
            return
        if any(host.foreign[g] for g in gpus):
            self.foreign_collisions += 1
        for g in gpus:
            host.owner[g] = job_id
        if runner is not None:
            runner.job = job_id
        del self.pending[job_id]
        del self.by_size[self.jobs[job_id].gpus][job_id]
        self.claims.pop(job_id, None)
        self.started[job_id] = now
        job = self.jobs[job_id]
        self.busy_gpu_s += job.gpus * job.duration
        self._push(now + job.duration, "end", job_id, host_no)

    def _finish(self, now: float, job_id: int, host_no: int) -> None:
        host = self.hosts[host_no]
        for g, owner in enumerate(host.owner):
            if owner == job_id:
                host.owner[g] = None
        for runner in host.runners:
            if runner.job == job_id:
                runner.job = None
        self.finished[job_id] = now

    # -- runner policies ---------------------------------------------------------------
    def _poll(self, now: float) -> None:
        """Every runner polls: GitLab gives the oldest matching pending job to the first."""
        for host_no, host in enumerate(self.hosts):
            for runner in host.runners:
                if not self.pending or not runner.open or runner.job is not None:
                    continue
                if any(host.foreign[g] or host.closed_until[g] > now for g in runner.slot.gpus):
                    continue  # the executor's gate refuses to start there
                job_id = next(iter(self.by_size.get(runner.slot.size, ())), None)
                if job_id is not None:
                    self._start(now, host_no, runner.slot.gpus, job_id, runner)

    def _reconcile(self, now: float) -> None:
        multi = [self.jobs[j] for size, queue in self.by_size.items() if size > 1 for j in queue]
        for host_no, host in enumerate(self.hosts):
            closed = {g: "foreign" for g in range(len(host.owner))
                      if host.foreign[g] or host.closed_until[g] > now}
            demand = tuple(Demand(j.job_id, j.gpus, j.submit, j.priority) for j in multi
                           if self.claims.get(j.job_id, host_no) == host_no)
            observed = Observed(
                tuple(SlotState(r.slot, not r.open, () if r.job is None else (r.job,))
                      for r in host.runners), closed, demand, host.reserved)
            result = plan(observed)
            pauses, resumes = result.actions(observed)
            by_name = {r.slot.name: r for r in host.runners}
            for decision in [*pauses, *resumes]:
                by_name[decision.slot.name].open = decision.open
                self.api_calls += 1
            host.reserved = dict(result.reserved)
            for job_id in result.reserved.values():
                self.claims[job_id] = host_no
            self.api_calls += 1  # polling pending jobs

    # -- reference policies ------------------------------------------------------------
    def _schedule_reference(self, now: float) -> None:
        for job_id in list(self.pending):
            job = self.jobs[job_id]
            placed = False
            for host_no, host in enumerate(self.hosts):
                free = [g for g in range(len(host.owner))
                        if host.owner[g] is None and not host.foreign[g] and host.closed_until[g] <= now]
                if len(free) >= job.gpus:
                    self._start(now, host_no, tuple(free[: job.gpus]), job_id, None)
                    placed = True
                    break
            if not placed and self.config.policy == "fifo":
                return

    # -- results -----------------------------------------------------------------------
    def _metrics(self) -> dict[str, object]:
        jobs = list(self.jobs.values())
        gpus = self.config.hosts * self.config.gpus_per_host
        first = min((j.submit for j in jobs), default=0.0)
        end = max(self.finished.values(), default=first)
        makespan = end - first
        lower = max(sum(j.gpus * j.duration for j in jobs) / gpus,
                    max((j.submit + j.duration for j in jobs), default=0.0) - first)
        waits: dict[int, list[float]] = {}
        for job in jobs:
            if job.job_id in self.started:
                waits.setdefault(job.gpus, []).append(self.started[job.job_id] - job.submit)
        return {
            "policy": self.config.policy, "makespan_s": round(makespan, 3),
            "lower_bound_s": round(lower, 3),
            "gpu_occupancy": round(self.busy_gpu_s / (gpus * makespan), 4) if makespan else 0.0,
            "wait_p50_s": {n: round(statistics.median(w), 3) for n, w in sorted(waits.items())},
            "wait_p95_s": {n: round(_quantile(w, 0.95), 3) for n, w in sorted(waits.items())},
            "wait_max_s": {n: round(max(w), 3) for n, w in sorted(waits.items())},
            "jobs_completed": len(self.finished), "jobs_never_started": len(jobs) - len(self.started),
            "double_allocations": self.double_allocations,
            "foreign_collisions": self.foreign_collisions, "gitlab_api_calls": self.api_calls,
        }


def _next_beat(now: float, period: float) -> float:
    return (int(now // period) + 1) * period


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
