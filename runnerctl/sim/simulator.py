"""A discrete-event simulator: the same planner against simulated GPUs and GitLab.

Virtual clock, no I/O, event driven: time jumps from one event to the next (a job
arrives or ends, foreign use starts or ends, a GPU's cool-down runs out, a controller
tick, a runner poll), and ticks and polls are only scheduled when something changed
that they could act on, so idle stretches cost nothing. State is kept incrementally
(pending jobs by size and urgency, idle open runners, free GPUs per host); nothing is
rescanned per event.

Runner policies model gitlab-runner's mechanics: runners poll every `check_s` seconds
(all on one beat), GitLab hands the oldest pending job to an open, idle runner whose
tags cover the job's (`gpus:N` -> a slot of N GPUs), and the executor's gate keeps a
runner from starting on a GPU with a foreign process. Reference policies (`greedy`,
`fifo`, `easy-oracle`: `reference`) have no runners, polling or drain latency.

Policies: `static-singles` (one runner per GPU), `static-partition` (per host one
quad, one pair and two singles, always open), `dynamic` (runnerctl: every slot, opened
by `runnerctl.controller.plan.plan` on the reconcile beat; hosts claim a pending job
before draining for it, and no other host drains for it, though one with an idle block
may start it; a host keeps the claim of a job it drained for until the job starts, as
`runnerctl.controller.claims` does), `greedy` (start any queued job that fits, oldest first),
`fifo` (strict arrival order) and `easy-oracle` (EASY backfilling knowing every job's
duration: the limit no real controller reaches).

A job runs for its duration, but at most its timeout (the trace's, capped by the runners'
`maximum_timeout`: GitLab fails it then). What `dynamic`'s planner knows of a pending
job's timeout (backfill: `controller.backfill`; age order: `controller.order`) is
`SimConfig.pending_timeouts` (`timeouts.job_timeouts`): by default the trace's, more than
a real controller can know; a running job's is always known (`SimRunner.ends_by`).

GitLab's own rule against waiting jobs runs on its hourly cron (`gitlab_cron`): a job
pending over an hour that no online, unpaused runner covers, and any job pending over
a day, is failed and counted in `jobs_dropped`. `dynamic` hosts have runnerctl's
stand-by runner (`SimConfig.standby`, on by default); the reference policies are no
GitLab and drop nothing.

`dynamic` calls `plan` for a host only when its inputs changed since its last plan
(its jobs, its closed GPUs) or that plan acted and is not its own next plan; the plan
is a pure function, so an unchanged input would give the same plan again (a 1-GPU
job's start or end on the host is no change where `own.own_start`/`own_end` say so).
Demand is handed over as the top of the queue, which holds what `relevant_demand`
keeps (the same plan as the whole queue). Jobs that enter or leave the top or a
claim go to a log; at a tick, a host whose last plan changed nothing reads the log's
new part and plans again only if one of those jobs could change that plan
(`replan.sees`: a job it drains for or protects, one that may take one of its idle
slots, or a new candidate before its last drain that finds a block it may take); else
the plan would be the same, as the simulator's tests check by comparing starts,
placements and runner actions with planning every host at every change.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable

from runnerctl.controller.caps import CAP_SLACK_S, wanted
from runnerctl.controller.estimates import RunTimes
from runnerctl.controller.order import short_enough
from runnerctl.controller.plan import Demand
from runnerctl.sim.fair import SimFair
from runnerctl.sim.gitlab_cron import CRON_S, drop_stuck
from runnerctl.sim.hosts import SimHost, SimRunner, host_name
from runnerctl.sim.inputs import ForeignUse, SimConfig, TraceJob
from runnerctl.sim.metrics import metrics
from runnerctl.sim.own import own_end, own_start
from runnerctl.sim.queue import PendingQueue
from runnerctl.sim.reference import REFERENCE, schedule
from runnerctl.sim.replan import SeesRead, reconcile, sees
from runnerctl.sim.timeouts import gitlab_timeout, job_timeouts
from runnerctl.sim.top import QueueTop

__all__ = ["POLICIES", "REFERENCE", "ForeignUse", "SimConfig", "Simulator", "TraceJob"]

POLICIES = ("dynamic", "static-singles", "static-partition", *REFERENCE)

# event kinds; at one instant they run in this order (state changes, then the
# controller, then the runners)
END, FOREIGN_OFF, FOREIGN_ON, ARRIVE, REOPEN, OLD_ENOUGH, TICK, POLL, CRON = range(9)
# OLD_ENOUGH: a multi-GPU job may drain now (`PlanPolicy.drain_after_s`); before a tick at the same time


class Simulator:
    def __init__(self, jobs: Iterable[TraceJob], config: SimConfig,
                 foreign: Iterable[ForeignUse] = ()) -> None:
        if config.policy not in POLICIES:
            raise ValueError(f"unknown policy {config.policy!r}; one of {', '.join(POLICIES)}")
        self.config = config
        self.jobs = {j.job_id: j for j in jobs}
        # per job: the timeout it runs under, and what the planner knows of it while pending
        self.timeout, self.known_timeout = job_timeouts(self.jobs.values(), config)
        if config.pending_timeouts == "trace":
            self.known_timeout = dict(self.known_timeout)  # `_capped` changes `timeout` only
        self.killed_at_deadline = 0  # jobs GitLab killed at a backfill deadline (`_capped`)
        self.timed_multi = any(self.known_timeout[j.job_id] is not None and j.gpus > 1
                               for j in self.jobs.values())  # own_start
        self.hosts = [SimHost(i, gpus=config.gpus_per_host, policy=config.policy)
                      for i in range(config.hosts)]
        self.queue = PendingQueue()
        self.fair = SimFair(self)  # fair share, and which job GitLab hands a runner
        self.started: dict[int, float] = {}
        self.finished: dict[int, float] = {}
        self.claims: dict[int, int] = {}  # job -> host draining for it
        self.run_times = RunTimes()  # dynamic: run times per project and job name (`_ran`)
        self.placement: dict[int, tuple[int, tuple[int, ...]]] = {}  # job -> (host, GPUs)
        self.first_block: dict[int, tuple[int, tuple[int, ...]]] = {}  # job -> first reserved
        self.dropped: dict[int, tuple[float, str]] = {}  # job -> (when, reason): GitLab failed it
        self.double_allocations = 0
        self.foreign_collisions = 0
        self.actions = 0  # runner pauses and resumes sent to GitLab
        self.busy_gpu_s = 0.0
        self.plans = 0  # host plans computed (the benchmark reports it)
        self._events: list[tuple[float, int, int, int, int]] = []
        self._seq = itertools.count()
        self.free_counts = [len(h.owner) for h in self.hosts]  # reference policies' free GPUs
        self._foreign_spans: dict[tuple[int, int], list[tuple[float, float]]] = {}  # easy-oracle
        self._next_poll = -1.0  # scheduled poll, or -1
        self._next_cron = -1.0  # GitLab's next stuck-job cron, or -1
        self._ticks: set[float] = set()  # scheduled controller ticks
        self._last_poll = self._last_tick = float("-inf")
        self._dirty: set[int] = set(range(config.hosts))
        self.top_ids: frozenset[int] = frozenset()
        # multi-GPU jobs that came into or left the top or a claim, oldest first: a host
        # not dirty plans again at a tick only if those since its last plan matter (replan.sees)
        self._log: list[int] = []
        self._logged = 0  # jobs dropped from the log's start (every host has seen them)
        # replan.sees: what it read of the logged jobs (their size, place, claim), and at which log length
        self.sees_read: SeesRead = (-1, {}, {})
        self.crowded: dict[tuple[int, frozenset[int]], bool] = {}  # replan._crowded, by log length
        # replan._held_again: (log length, held job) -> the candidates after it, in drain order
        self.held_read: dict[tuple[int, int], list[tuple[tuple[int, bool, float, int], Demand]]] = {}
        # the top jobs' demand, their ids, those claimed (same for every host; see _host_demand)
        self._common: tuple[tuple[Demand, ...], frozenset[int], frozenset[int]] | None = None
        self._demand: dict[int, Demand] = {}
        self._queue_since: float | None = None  # pending queue non-empty since
        self._queued_beats = 0  # reconcile beats with jobs pending (demand polls per host)
        sizes = {r.slot.size for h in self.hosts for r in h.runners}
        self._slots = [r.slot for r in self.hosts[0].runners] if self.hosts else []
        self.top = QueueTop({n: 1 + sum(1 for s in self._slots if s.size == n) for n in sizes})
        for job in sorted(self.jobs.values(), key=lambda j: (j.submit, j.job_id)):
            self._push(job.submit, ARRIVE, job.job_id)
        for use in foreign:
            if not (0 <= use.host < config.hosts and 0 <= use.gpu < config.gpus_per_host):
                raise ValueError(f"foreign use on {host_name(use.host)} GPU {use.gpu}: no such host "
                                 f"or GPU ({config.hosts} hosts x {config.gpus_per_host} GPUs)")
            self._push(use.start, FOREIGN_ON, use.host, use.gpu)
            spans = self._foreign_spans.setdefault((use.host, use.gpu), [])
            spans.append((use.start, use.start + use.duration))
            self._push(use.start + use.duration, FOREIGN_OFF, use.host, use.gpu)

    def _push(self, at: float, kind: int, a: int = 0, b: int = 0) -> None:
        heapq.heappush(self._events, (at, kind, next(self._seq), a, b))

    def run(self) -> dict[str, object]:
        reference = self.config.policy in REFERENCE
        events = self._events
        idle_ticks = 0
        while events:
            now, kind, _, a, b = heapq.heappop(events)
            if kind == TICK:
                idle_ticks += 1
                if idle_ticks > 10_000:
                    raise RuntimeError(f"the planner keeps changing runners with nothing else happening "
                                       f"(t={now}): it does not settle")
                self._tick(now)
                continue
            idle_ticks = 0
            if kind == POLL:
                self._poll(now)
            elif kind == CRON:
                self._cron(now)
            else:
                self._handle(now, kind, a, b)
                if reference:
                    schedule(self, now)
        if self._queue_since is not None:  # jobs never started: polled until the last event
            self._count_beats(max(self.finished.values(), default=self._queue_since))
        return metrics(self)

    @property
    def gitlab_api_calls(self) -> int:
        """Runner pauses/resumes plus one pending-jobs poll per host and reconcile beat
        while jobs wait (what the controller spends; runner polls are not counted)."""
        if self.config.policy != "dynamic":
            return self.actions
        return self.actions + self._queued_beats * self.config.hosts

    # -- events ----------------------------------------------------------------------
    def _handle(self, now: float, kind: int, a: int, b: int) -> None:
        if kind == ARRIVE:
            job = self.jobs[a]
            if not self.queue:
                self._queue_since = now
            self.queue.add(a, job.gpus, job.priority, self._credited(job))
            self.top.stale.add(job.gpus)
            if job.gpus > 1 and self.config.policy == "dynamic":  # its webhook wakes the loop
                self._schedule_tick(now)
                after = self.config.plan_policy.drain_after_s
                if after > 0 and self.known_timeout[a] is None:
                    self._push(job.submit + after, OLD_ENOUGH, a)
            self._want_tick(now)
            self._want_poll(now)
            self._want_cron(now)
            return
        if kind == OLD_ENOUGH:
            self._old_enough(now, a)
            return
        host = self.hosts[b] if kind == END else self.hosts[a]
        if kind == END:
            self._finish(now, a, b)
            return
        if kind == FOREIGN_ON:
            host.foreign[b] += 1
        elif kind == FOREIGN_OFF:
            host.foreign[b] -= 1
            host.closed_until[b] = max(host.closed_until[b], now + self.config.cooldown_s)
            self._push(host.closed_until[b], REOPEN, a, b)
        elif kind == REOPEN and host.gated(b, now):
            return  # still in use, or a later cool-down runs
        self._changed(now, a)

    def _old_enough(self, now: float, job_id: int) -> None:
        """A pending multi-GPU job has waited `PlanPolicy.drain_after_s`: from now on it
        may drain (`plan._Reserver._too_young`). Every host reads it as if it came now
        (the change log, `replan.sees`), but a host that holds it as its own (claimed or
        protected there, which `sees` passes over) plans again; the controller sees it
        at its next tick."""
        if job_id not in self.queue:
            return
        self._log.append(job_id)
        for host_no, host in enumerate(self.hosts):
            if job_id in host.claimed or job_id in host.protected:
                self._dirty.add(host_no)
        self._want_tick(now)

    def _changed(self, now: float, host_no: int, *, replan: bool = True) -> None:
        """Something on this host changed: its free GPUs, its plan (unless `replan` is
        False: `own.own_start`), its runners' chances."""
        host = self.hosts[host_no]
        self.free_counts[host_no] = len(host.free_gpus(now))
        if replan:
            self._dirty.add(host_no)
        self._want_tick(now)
        self._want_poll(now)

    def _start(self, now: float, host_no: int, gpus: tuple[int, ...], job_id: int,
               runner: SimRunner | None) -> None:
        host = self.hosts[host_no]
        if any(host.owner[g] is not None for g in gpus):
            self.double_allocations += 1
            return
        if any(host.foreign[g] for g in gpus):
            self.foreign_collisions += 1
        for g in gpus:
            host.owner[g] = job_id
        self.placement[job_id] = (host_no, gpus)
        if runner is not None:
            timeout = self._capped(now, host, runner, job_id)
            runner.job, runner.started = job_id, now
            runner.ends_by = None if timeout is None else now + timeout
            runner.refresh()
            host.idle.discard(runner.index)
        self.queue.remove(job_id)
        if not self.queue:
            self._count_beats(now)
        self.top.stale.add(self.jobs[job_id].gpus)
        claimer = self.claims.pop(job_id, None)
        self._common = None
        if claimer is not None:
            self.hosts[claimer].claimed.discard(job_id)
            self.hosts[claimer].drained.discard(job_id)
            self._dirty.add(claimer)
        self.started[job_id] = now
        self.fair.started(self.jobs[job_id], now)
        run = self.run_time(job_id)
        self.busy_gpu_s += self.jobs[job_id].gpus * run
        self._push(now + run, END, job_id, host_no)
        self._changed(now, host_no, replan=not own_start(self, now, host_no, job_id, runner))

    def _finish(self, now: float, job_id: int, host_no: int) -> None:
        host = self.hosts[host_no]
        for g, owner in enumerate(host.owner):
            if owner == job_id:
                host.owner[g] = None
        ran = None
        for runner in host.runners:
            if runner.job == job_id:
                runner.job = runner.started = runner.ends_by = None
                runner.refresh()
                if runner.open:
                    host.idle.add(runner.index)
                ran = runner
        self.finished[job_id] = now
        self.fair.finished(self.jobs[job_id], now)
        self._ran(self.jobs[job_id])
        self._changed(now, host_no, replan=not own_end(self, now, host_no, ran))

    # -- scheduling of beats ----------------------------------------------------------
    def _want_poll(self, now: float) -> None:
        if self.config.policy in REFERENCE or self._next_poll >= now:
            return
        self._next_poll = _beat(now, self.config.check_s, self._last_poll)
        self._push(self._next_poll, POLL)

    def _want_tick(self, now: float) -> None:
        if self.config.policy == "dynamic":
            self._schedule_tick(_beat(now, self.config.reconcile_s, self._last_tick))

    def _schedule_tick(self, at: float) -> None:
        """A controller tick at `at`, unless one comes by then anyway."""
        if min(self._ticks, default=float("inf")) > at:
            self._ticks.add(at)
            self._push(at, TICK)

    def _want_cron(self, now: float) -> None:
        if self.config.policy not in REFERENCE and self._next_cron < now:
            self._next_cron = (now // CRON_S + 1) * CRON_S
            self._push(self._next_cron, CRON)

    def _cron(self, now: float) -> None:
        """GitLab's hourly cron: drop what its rules drop, again next hour while jobs wait."""
        self._next_cron = -1.0
        pending = ((j, self.jobs[j].submit, self.jobs[j].gpus, self.jobs[j].priority) for j in self.queue)
        standby = self.config.standby and self.config.policy == "dynamic"
        for job_id, reason in drop_stuck(self.hosts, pending, now, standby=standby):
            self.dropped[job_id] = (now, reason)
            self.queue.remove(job_id)
            claimer = self.claims.pop(job_id, None)
            if claimer is not None:
                self.hosts[claimer].claimed.discard(job_id)
                self.hosts[claimer].drained.discard(job_id)
            self.top.stale.add(self.jobs[job_id].gpus)
            self._common = None
            self._dirty.update(range(len(self.hosts)))
            self._want_tick(now)
        if not self.queue and self._queue_since is not None:
            self._count_beats(now)
        if self.queue:
            self._want_cron(now)

    def _count_beats(self, until: float) -> None:
        """The queue empties at `until`: count the reconcile beats it was non-empty."""
        assert self._queue_since is not None
        period = self.config.reconcile_s
        self._queued_beats += int(until // period) - int(self._queue_since // period)
        self._queue_since = None

    # -- runner policies ---------------------------------------------------------------
    def _poll(self, now: float) -> None:
        """Every idle open runner polls: GitLab gives a matching job to the first (the oldest
        for group runners, fair by project for instance runners: `SimFair.pick`)."""
        self._last_poll, self._next_poll = now, -1.0
        for host_no, host in enumerate(self.hosts):
            if not host.idle or not self.queue:
                continue
            for index in sorted(host.idle):
                runner = host.runners[index]
                job_id = self.fair.pick(self, runner.slot.size)
                if job_id is None or any(host.gated(g, now) for g in runner.slot.gpus):
                    continue  # nothing for it, or the executor's gate refuses to start here
                self._start(now, host_no, runner.slot.gpus, job_id, runner)

    def _tick(self, now: float) -> None:
        self._last_tick = now
        self._ticks.discard(now)
        self.sees_read = (-1, {}, {})  # jobs may have started or been claimed or dropped since
        if self.fair.refresh(self, now):
            self._fair_refresh()
        if self.top.stale:
            self._refresh_top()
        log, dirty = self._log, self._dirty
        for host_no, host in enumerate(self.hosts):
            if host.recheck_at < now:  # a backfill single's time is up (replan.reconcile)
                dirty.add(host_no)
            elif host_no not in dirty:
                logged = self._logged + len(log)
                if host.seen >= logged:
                    continue
                if not sees(host, host_no, self):
                    host.seen = logged
                    continue
                dirty.add(host_no)
            reconcile(self, now, host_no)
        if log:  # what every host has seen is dropped
            seen = min(host.seen for host in self.hosts)
            del log[:seen - self._logged]
            self._logged = seen

    def _refresh_top(self) -> None:
        """Cut the top of the queue again where its jobs changed (`top.QueueTop`); when
        the cut changes, every host's demand may have changed."""
        changed = self.top.refresh(self)
        if changed is not None:
            self.top_ids = self.top.ids
            self._common = None
            self._log.extend(changed)

    def _host_demand(self, host_no: int) -> tuple[tuple[Demand, ...], frozenset[int]]:
        """What this host's controller would read: pending jobs, those another host
        claimed (`elsewhere`) among them. Not the whole queue: the top jobs, which hold
        all that `relevant_demand` keeps for any host, and this host's own claimed and
        protected jobs; `plan` of any such superset of the cut is the plan of the queue
        (the cut of the superset is the same cut)."""
        host = self.hosts[host_no]
        if self._common is None:
            ids = frozenset(j for top in self.top.by_size.values() for j in top)
            self._common = (tuple(self._demand_of(j) for j in ids), ids, ids.intersection(self.claims))
        demand, ids, claimed = self._common
        own = [j for j in (*host.claimed, *host.protected)
               if j not in ids and j in self.queue and self.claims.get(j, host_no) == host_no]
        if own:
            demand = demand + tuple(self._demand_of(j) for j in dict.fromkeys(own))
        return demand, claimed - host.claimed if host.claimed else claimed

    def _demand_of(self, job_id: int) -> Demand:
        demand = self._demand.get(job_id)
        if demand is None:
            job = self.jobs[job_id]
            demand = self._demand[job_id] = Demand(job_id, job.gpus, job.submit, job.priority,
                                                   self.known_timeout[job_id], self.fair.fair_s(job),
                                                   self._estimate(job))
        return demand

    def _estimate(self, job: TraceJob) -> float | None:
        """How long the history says the job may run (`controller.estimates`), if anything."""
        return self.run_times.estimate((job.project, job.name)) if self.config.history else None

    def _credited(self, job: TraceJob) -> bool:
        """Does the planner give this pending job size credits (`order.credited`)?"""
        return self.known_timeout[job.job_id] is None and short_enough(self._estimate(job),
                                                                        self.config.plan_policy)

    def _ran(self, job: TraceJob) -> None:
        """A job ended: its run time joins its history (`controller.estimates`). Where that
        moves its project and name's estimate across `PlanPolicy.credit_estimate_max_s`, the
        pending jobs of that history gain or lose their size credits: every order may
        change, as when fair share is read again (`_fair_refresh`). The controller reads
        the history once a minute (`estimates.REFRESH_S`); here it counts at once."""
        if not self.config.history or self.config.policy != "dynamic":
            return
        key = job.project, job.name
        before = self._estimate(job)
        self.run_times.add(key, self.run_time(job.job_id))
        policy = self.config.plan_policy
        if short_enough(before, policy) == short_enough(self._estimate(job), policy):
            return
        for job_id in self.queue:
            other = self.jobs[job_id]
            if (other.project, other.name) == key:
                self.queue.set_credited(job_id, self._credited(other))
        self._fair_refresh()

    def _fair_refresh(self) -> None:
        """Fair-share penalties were read again: every job's demand, the top's order and
        every host's plan may change, so nothing remembered of them holds."""
        self._demand.clear()
        self._common = None
        self.top.stale.update(self.top.room)
        self._dirty.update(range(len(self.hosts)))
        for host in self.hosts:
            host.boundary = None

    def run_time(self, job_id: int) -> float:
        """How long a job runs: its duration, but GitLab fails it at its timeout ("The job,
        if running longer, times out": gitlabhq doc/ci/runners/configure_runners.md)."""
        job, timeout = self.jobs[job_id], self.timeout[job_id]
        return job.duration if timeout is None else min(job.duration, timeout)

    def base_cap(self, runner: SimRunner) -> int | None:
        """A runner's own maximum timeout (`[controller] runner_max_timeout_s` for its size)."""
        cap = self.config.runner_cap(runner.slot.size)
        return None if cap is None else int(cap)

    def _capped(self, now: float, host: SimHost, runner: SimRunner, job_id: int) -> float | None:
        """The timeout a job runs under as this runner picks it: where runnerctl set the
        runner a deadline's maximum timeout (`caps`, backfill by estimate), GitLab's min of
        the job's own and that, as the controller last set it (it sets it again at a tick
        once off by more than `caps.CAP_SLACK_S`: taken here at the pick). A job that would
        run longer is killed then: counted in `killed_at_deadline`."""
        timeout = self.timeout[job_id]
        if runner.cap is None:
            return timeout
        deadline = host.deadlines.get(runner.slot.name)
        if deadline is not None:
            want = wanted(deadline, self.base_cap(runner), now)
            if want is not None and abs(want - runner.cap) > CAP_SLACK_S:
                runner.cap = want
        job = self.jobs[job_id]
        timeout = gitlab_timeout(job.timeout, float(runner.cap))
        self.timeout[job_id] = timeout
        if timeout is not None and job.duration > timeout:
            self.killed_at_deadline += 1
        return timeout

    # -- reference policies (runnerctl.sim.reference) ----------------------------------
    def start_reference(self, now: float, host_no: int, job_id: int) -> None:
        """A reference policy starts a job on the first free GPUs of a host."""
        gpus = tuple(self.hosts[host_no].free_gpus(now)[:self.jobs[job_id].gpus])
        self._start(now, host_no, gpus, job_id, None)

    def foreign_free_at(self, host_no: int, gpu: int, now: float) -> float:
        """When a GPU's foreign use and cool-down will be over (what only an oracle knows)."""
        host = self.hosts[host_no]
        if not host.foreign[gpu]:
            return max(now, host.closed_until[gpu])
        ends = [end for start, end in self._foreign_spans.get((host_no, gpu), ()) if start <= now <= end]
        return max(ends, default=now) + self.config.cooldown_s


def _beat(now: float, period: float, last: float) -> float:
    """The first beat (a multiple of `period`) at or after `now` that has not run yet."""
    beat = -(-now // period) * period
    return beat if beat > last else beat + period
