"""The reconcile loop: observe -> plan -> act, once per tick, and the view it leaves.

Thin by design: everything it decides comes from `plan.plan`. Each tick it reads the
GPUs once, the running jobs, toggles and claims from the store, steps the gate, polls
demand within the API budget, plans, claims the jobs it drains for, applies pauses
then resumes, and stores drains, gate states and events. It then replaces one frozen
`ControllerView`, which the web API, exporter and page read (they never call NVML or
GitLab themselves).

Restart: drains, toggles, claims and gate states come back from the store, runner
states are re-read from GitLab, and the plan is recomputed from what is observed, so
a controller killed at any point never resumes a runner it should not.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from runnerctl.controller import act as acting
from runnerctl.controller.demand import ApiBudget, DemandTracker, PendingJob
from runnerctl.controller.gate import GateState, GateThresholds, IsCi, reopen
from runnerctl.controller.liveness import Liveness
from runnerctl.controller.observe import JobSource, RunnerCache, gate_step, nothing_is_ci
from runnerctl.controller.orphans import OrphanAudit
from runnerctl.controller.plan import Decision, Observed, Plan, PlanPolicy, SlotState, plan
from runnerctl.controller.stats import ControllerStats
from runnerctl.controller.store import Event, Store, Toggle
from runnerctl.controller.toggles import held_slots, toggle_status
from runnerctl.errors import GitLabError, GpuError
from runnerctl.gitlab import GitLabPort
from runnerctl.gpus import GpuSource
from runnerctl.layout import plan_slots
from runnerctl.model import GpuSnapshot, Slot
from runnerctl.settings import ControllerSettings
from runnerctl.standby import Standby

log = logging.getLogger(__name__)
Clock = Callable[[], float]


@dataclasses.dataclass(frozen=True)
class SlotView:
    name: str
    gpus: tuple[int, ...]
    runner_id: int
    state: str  # open | paused | draining (a block waiting for its GPUs)
    paused_in_gitlab: bool | None
    reason: str
    running_jobs: tuple[int, ...]
    online: bool | None = None  # GitLab's `online`: gitlab-runner polled lately; None unknown


@dataclasses.dataclass(frozen=True)
class GpuView:
    index: int
    open: bool
    reason: str
    unhealthy: bool


@dataclasses.dataclass(frozen=True)
class ControllerView:
    """Everything the controller knows after one tick; replaced, never mutated."""

    host: str
    at: float
    tick: int
    snapshot: GpuSnapshot | None
    slots: tuple[SlotView, ...] = ()
    gpus: tuple[GpuView, ...] = ()
    demand: tuple[PendingJob, ...] = ()
    toggles: tuple[tuple[Toggle, str], ...] = ()  # (toggle, paused|draining (n left)|drained)
    drains: Mapping[str, int] = dataclasses.field(default_factory=dict)
    gitlab_error: str = ""
    api_requests: int = 0
    owners: Mapping[int, tuple[str, str]] = dataclasses.field(default_factory=dict)
    """Running job id -> (user, link), from the executor's leases."""
    standby: str = ""
    """The stand-by runner: `online`, `none`, `not yet verified` or why it may not be online."""

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["snapshot"] = None if self.snapshot is None else dataclasses.asdict(self.snapshot)
        if self.snapshot is not None:
            topology = self.snapshot.topology.items()
            data["snapshot"]["topology"] = {f"{a}-{b}": int(v) for (a, b), v in topology}
        data["toggles"] = [{**dataclasses.asdict(t), "status": s} for t, s in self.toggles]
        return data


@dataclasses.dataclass
class Wiring:
    """What a controller talks to; all injected (the demo and tests pass fakes)."""

    host: str
    gpus: GpuSource
    gitlab: GitLabPort
    runner_ids: Mapping[str, int]
    store: Store
    jobs: JobSource
    clock: Clock
    is_ci: IsCi = nothing_is_ci
    webhook_secret: str = ""
    on_event: Callable[[Event], None] = lambda event: None
    standby: Standby | None = None  # kept online so GitLab never drops a job waiting for a drain


class Controller:
    def __init__(self, wiring: Wiring, settings: ControllerSettings | None = None,
                 policy: PlanPolicy | None = None) -> None:
        settings = settings or ControllerSettings()
        self.w, self.settings, self.policy = wiring, settings, policy or PlanPolicy()
        self.host = wiring.host
        self.budget = ApiBudget(settings.api_budget_per_min, wiring.clock)
        self.wake = threading.Event()  # a webhook brought multi-GPU demand: tick now
        self.demand = DemandTracker(
            projects=settings.projects, priorities=settings.project_priorities, budget=self.budget,
            clock=wiring.clock, runner_ids=wiring.runner_ids.values(),
            active_window_s=settings.active_window_s, webhook_fresh_s=settings.webhook_fresh_s,
            secret=wiring.webhook_secret, on_demand=self.wake.set)
        self.cache = RunnerCache(wiring.runner_ids)
        self.orphans = OrphanAudit(check_s=settings.lease_check_s, orphan_after_s=settings.orphan_after_s)
        self.health = acting.GitLabHealth(backoff_max_s=settings.backoff_max_s)
        self.standby = acting.StandbyKeeper(wiring.standby)
        self.limits = GateThresholds(settings.foreign_memory_mib, settings.foreign_utilization,
                                     settings.reopen_ratio, settings.cooldown_s)
        self.drains = wiring.store.drains(self.host)
        self.protected = wiring.store.protected(self.host)  # drains no later job may delay (plan.py)
        self.gate = {gpu: GateState.from_row(row) for gpu, row in wiring.store.gate(self.host).items()}
        self.view = ControllerView(self.host, wiring.clock(), 0, None)
        self.ticks = 0
        self._slots: tuple[Slot, ...] = ()
        self._synced = False
        self._published = False  # the inventory toggles are checked against (store.save_inventory)
        self.stats = ControllerStats()  # counters for the exporter, fed once per tick
        self.on_tick: list[Callable[[ControllerView], None]] = []  # e.g. dcgm job mapping files
        self._failing: set[str] = set()  # side tasks failing now (logged once)
        self.liveness = Liveness(host=self.host, interval_s=settings.interval_s)  # for /healthz, /metrics

    # -- one tick ------------------------------------------------------------------
    def tick(self) -> ControllerView:
        started = time.perf_counter()
        now = self.w.clock()
        self.ticks += 1
        snapshot = self._snapshot()
        self._publish_inventory(snapshot)
        running = self.w.jobs.running()
        self.demand.forget(j for jobs in running.values() for j in jobs)
        toggles = self._toggles(snapshot, now)
        self._step_gate(snapshot, running, now)
        gitlab_ready = self.health.ready(now)
        if gitlab_ready:  # first: at most one request a minute, before demand takes the budget
            self._free_orphans(running, now)
        gitlab_ok = gitlab_ready and self._talk_to_gitlab(now)
        observed = self._observed(snapshot, running, toggles, now)
        result = self._plan_with_claims(observed, now)
        if gitlab_ok:
            acting.apply(result.decisions, gitlab=self.w.gitlab, cache=self.cache, health=self.health,
                         now=now, on_action=lambda a: self._acted(a, now))
        if gitlab_ready:
            self.standby.keep_online(self.w.gitlab, now)
        self._remember(result, now)
        self.view = self._view(snapshot, result, running, toggles, now)
        self.liveness.good()
        view, took = self.view, time.perf_counter() - started
        self._aside("stats", lambda: self.stats.observe(view, duration_s=took, is_ci=self.w.is_ci,
                                                        gitlab=self.w.gitlab))
        for hook in self.on_tick:
            self._aside(getattr(hook, "__name__", type(hook).__name__), functools.partial(hook, view))
        return self.view

    def _aside(self, name: str, task: Callable[[], object]) -> None:
        """Run a side task of the tick (stats, hooks): its failure is logged once while it
        lasts and never stops the loop, which has already acted."""
        try:
            task()
        except Exception:
            if name not in self._failing:
                log.exception("%s failed after tick %d (the controller goes on)", name, self.ticks)
            self._failing.add(name)
        else:
            self._failing.discard(name)

    def _snapshot(self) -> GpuSnapshot | None:
        try:
            snapshot = self.w.gpus.snapshot()
        except GpuError as exc:
            log.warning("cannot read GPUs (every runner stays closed): %s", exc)
            return None
        if not self._slots:
            whole = dataclasses.replace(snapshot, gpus=tuple(dataclasses.replace(g, lost=False)
                                                             for g in snapshot.gpus))
            self._slots = tuple(s for s in plan_slots(whole) if s.name in self.cache.ids)
        return snapshot

    def _publish_inventory(self, snapshot: GpuSnapshot | None) -> None:
        """Once per start: the GPUs and slots that toggle targets may name (toggles.py)."""
        if snapshot is not None and not self._published:
            self.w.store.save_inventory(self.host, [g.index for g in snapshot.gpus],
                                        [s.key for s in self._slots], self.w.clock())
            self._published = True

    def _toggles(self, snapshot: GpuSnapshot | None, now: float) -> list[Toggle]:
        toggles = self.w.store.toggles(self.host)
        for toggle in [t for t in toggles if t.action == "reopen"]:
            gpu = int(toggle.target[4:])
            found = next((g for g in snapshot.gpus if g.index == gpu), None) if snapshot else None
            self.gate[gpu] = reopen(self.gate.get(gpu, GateState()), found)
            self.w.store.clear_toggles(self.host, toggle.target)
            self._event(now, "reopen", f"gpu{gpu}", f"by {toggle.who}: {toggle.why}")
        return [t for t in toggles if t.action != "reopen"]

    def _step_gate(self, snapshot: GpuSnapshot | None, running: Mapping[str, tuple[int, ...]],
                   now: float) -> None:
        if snapshot is None:
            return
        owned = {g for s in self._slots if running.get(s.name) for g in s.gpus}
        new = gate_step(snapshot, self.gate, now=now, is_ci=self.w.is_ci, owned=owned, limits=self.limits)
        for gpu, state in new.items():
            old = self.gate.get(gpu, GateState())
            if state.closed != old.closed:
                self._event(now, "gate-close" if state.closed else "gate-open", f"gpu{gpu}",
                            state.reason or "no foreign use for the cool-down")
        self.gate = new

    def _talk_to_gitlab(self, now: float) -> bool:
        """Read runners and demand; False (logged once, backing off) when GitLab fails."""
        try:
            if not self._synced:
                self.cache.sync_all(self.w.gitlab)
                self._synced = True
            if self.ticks % 4:  # three tokens of four go to demand, one to re-reading a runner
                self.demand.poll(self.w.gitlab)
            self.cache.refresh_one(self.w.gitlab, self.budget)
        except GitLabError as exc:
            self.health.failed(exc, now)
            return False
        return True

    def _free_orphans(self, running: Mapping[str, tuple[int, ...]], now: float) -> None:
        """Reap and release leases of jobs long over in GitLab (their cleanup was killed)."""
        try:
            over = self.orphans.over(running, self.cache.ids, gitlab=self.w.gitlab, budget=self.budget,
                                     now=now)
        except GitLabError as exc:  # this look only: pauses and resumes go on
            if "lease audit" not in self._failing:
                log.warning("GitLab failed on a runner's running jobs: %s; no lease is freed while "
                            "it fails (the controller goes on)", exc)
            self._failing.add("lease audit")
            return
        if over is None:  # not asked this tick
            return
        self._failing.discard("lease audit")
        for job, missing_s in over:

            def free(job: int = job, missing_s: float = missing_s) -> None:
                gpus = self.w.jobs.free(job)
                self._event(now, "free", f"job {job}", f"not running in GitLab for {missing_s:.0f} s "
                            f"but still leased (its cleanup was stopped): reaped, GPUs "
                            f"{', '.join(map(str, gpus)) or 'none'} released")

            self._aside(f"freeing job {job}", free)

    def _observed(self, snapshot: GpuSnapshot | None, running: Mapping[str, tuple[int, ...]],
                  toggles: list[Toggle], now: float) -> Observed:
        if snapshot is None:
            closed = {g: "GPU snapshot failed" for s in self._slots for g in s.gpus}
        else:
            closed = {gpu: state.reason for gpu, state in self.gate.items() if state.closed}
        claimed = {job for job, host in self.w.store.claims(now).items() if host != self.host}
        demand = tuple(self.demand.demand(self.host))
        elsewhere = frozenset(d.job_id for d in demand if d.job_id in claimed)
        states = tuple(SlotState(s, self.cache.paused.get(s.name) is not False, running.get(s.name, ()))
                       for s in self._slots)
        return Observed(states, closed, demand, self.drains, held_slots(toggles, self._slots), self.protected,
                        elsewhere)

    def _plan_with_claims(self, observed: Observed, now: float) -> Plan:
        """Plan and claim the jobs it reserves blocks for; a job another host claimed
        meanwhile counts as claimed elsewhere (no drain for it here) and the plan is redone."""
        for _ in range(4):
            result = plan(observed, self.policy)
            lost = [job for job in result.claims
                    if not self.w.store.claim(job, self.host, now=now, ttl_s=self.settings.claim_ttl_s)]
            if not lost:
                break
            observed = dataclasses.replace(observed, elsewhere=observed.elsewhere | frozenset(lost))
        self.w.store.release_claims(self.host, keep=list(result.claims))
        return result

    def _acted(self, action: acting.Action, now: float) -> None:
        d = action.decision
        verb = "resume" if d.open else "pause"
        detail = d.reason if action.ok else f"failed: {action.error}"
        self._event(now, verb if action.ok else f"{verb}-failed", d.slot.name, detail)

    def _remember(self, result: Plan, now: float) -> None:
        for name, job in result.reserved.items():
            if self.drains.get(name) != job:
                self._event(now, "drain", name, f"for pending job {job}")
        self.drains = dict(result.reserved)
        self.protected = result.protected
        self.w.store.save_drains(self.host, self.drains, now)
        self.w.store.save_protected(self.host, self.protected)
        self.w.store.save_gate(self.host, {g: s.to_row() for g, s in self.gate.items()})

    def _event(self, now: float, kind: str, subject: str, detail: str) -> None:
        event = Event(now, self.host, kind, subject, detail)
        self.w.store.record(event)
        self.stats.event(event)
        self.w.on_event(event)

    def _view(self, snapshot: GpuSnapshot | None, result: Plan, running: Mapping[str, tuple[int, ...]],
              toggles: list[Toggle], now: float) -> ControllerView:
        slots = tuple(_slot_view(d, self.cache, running, result) for d in result.decisions)
        gpus = tuple(GpuView(g, not s.closed, s.reason, s.unhealthy) for g, s in sorted(self.gate.items()))
        return ControllerView(
            self.host, now, self.ticks, snapshot, slots, gpus, tuple(self.demand.jobs),
            tuple((t, toggle_status(t, self._slots, running)) for t in toggles), dict(result.reserved),
            self.health.last_error, self.budget.spent, self.w.jobs.owners(), self.standby.status())

    # -- running ---------------------------------------------------------------------
    def run(self, stop: threading.Event, *, sleep: Callable[[float], None] | None = None,
            step: Callable[[], object] | None = None, every_s: float | None = None) -> None:
        """Tick every `interval_s` until `stop` is set, and at once when a webhook brings
        multi-GPU demand (so a block is reserved before runners hand out smaller jobs on
        it). No failure ends the loop: a failed tick (the store locked or restarting, a
        bug) is logged once per kind while it lasts, and ticks are retried with a growing
        pause (`Liveness.backoff_s`); `/healthz` fails meanwhile. `step` replaces the tick
        and `every_s` the interval (the simulated host advances its world instead)."""
        step = step or self.tick
        while not stop.is_set():
            self.wake.clear()
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - any kind: logged, counted, retried (liveness.py)
                self.liveness.failed(exc, self.ticks)
            wait = self.liveness.backoff_s(every_s)
            if sleep is not None:
                sleep(wait)
                continue
            deadline = time.monotonic() + wait
            while not stop.is_set() and time.monotonic() < deadline:
                slice_s = min(0.2, max(0.0, deadline - time.monotonic()))
                if self.liveness.streak:  # failing: a webhook does not cut the pause short
                    stop.wait(slice_s)
                elif self.wake.wait(slice_s):
                    break


def _slot_view(decision: Decision, cache: RunnerCache, running: Mapping[str, tuple[int, ...]],
               result: Plan) -> SlotView:
    name = decision.slot.name
    state = "open" if decision.open else "draining" if name in result.reserved else "paused"
    return SlotView(name, decision.slot.gpus, cache.ids.get(name, 0), state, cache.paused.get(name),
                    decision.reason, running.get(name, ()), cache.online.get(name))

