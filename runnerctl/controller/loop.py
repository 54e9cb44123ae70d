"""The reconcile loop: observe -> plan -> act, once per tick, and the view it leaves.

Thin by design: everything it decides comes from `plan.plan`. Each tick it reads the
GPUs once, the running jobs, toggles and claims from the store, steps the gate, polls
demand within the API budget, plans and claims the jobs it drains for (claims.py),
applies pauses then resumes, and stores drains, gate states and events. It then
replaces one frozen `ControllerView`, which the web API, exporter and page read (they
never call NVML or GitLab themselves).

Restart: drains, toggles, claims and gate states come back from the store, runner
states are re-read from GitLab, and the plan is recomputed from what is observed, so
a controller killed at any point never resumes a runner it should not.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from runnerctl.controller import act as acting
from runnerctl.controller.caps import to_send
from runnerctl.controller.claims import Claims
from runnerctl.controller.demand import ApiBudget, DemandTracker
from runnerctl.controller.estimates import Estimates
from runnerctl.controller.fair_usage import FairShare
from runnerctl.controller.gate import GateState, GateThresholds, IsCi, reopen
from runnerctl.controller.history import History
from runnerctl.controller.liveness import Liveness
from runnerctl.controller.observe import JobSource, Owner, RunnerCache, gate_step, nothing_is_ci
from runnerctl.controller.orphans import OrphanAudit
from runnerctl.controller.plan import Decision, Demand, Observed, Plan, PlanPolicy, SlotState
from runnerctl.controller.stats import ControllerStats
from runnerctl.controller.store import Event, Store, Toggle
from runnerctl.controller.toggles import Target, held_slots, toggle_status
from runnerctl.controller.token_expiry import TokenExpiry
from runnerctl.controller.view import ControllerView, GpuView, SlotView
from runnerctl.controller.waiting import why_waiting
from runnerctl.errors import GitLabError, GpuError
from runnerctl.gitlab import GitLabPort
from runnerctl.gpus import GpuSource
from runnerctl.layout import plan_slots
from runnerctl.model import GpuSnapshot, Slot
from runnerctl.settings import ControllerSettings
from runnerctl.standby import Standby

log = logging.getLogger(__name__)
CANNOT_READ_GPUS = "cannot read GPUs (every runner stays closed)"
Clock = Callable[[], float]



CLOCK_STEP_S = 30.0
"""A wall clock that moves this much more (or less) than the time that passed stepped."""
CLOCK_CHECK_S = 300.0
"""How often a controller on a shared store compares its clock with the store's."""
MAX_CLOCK_SKEW_S = 10.0
"""Hosts' clocks may differ by this much: claims (`claim_ttl_s`, 120 s) and the fleet
page's host ages compare one host's stamps with another's clock, so hosts minutes apart
both drain for one job, and the page shows a live host stopped (NTP keeps them within
milliseconds)."""
CLOCK_OFF = "this host's clock is off the shared store's; claims and the fleet page compare hosts' clocks"


def clock_skew(store: Store, clock: Clock) -> tuple[float, str]:
    """How far `clock` is ahead of the shared store's (its PostgreSQL server's; the
    query's round trip taken out; 0 for SQLite, one host's store), and where that is more
    than `MAX_CLOCK_SKEW_S`, a line saying so ("" otherwise)."""
    before = clock()
    server = store.server_time()
    after = clock()
    if server is None:
        return 0.0, ""
    skew = (before + after) / 2 - server
    if abs(skew) <= MAX_CLOCK_SKEW_S + (after - before) / 2:
        return skew, ""
    return skew, (f"{abs(skew):.0f} s {'ahead of' if skew > 0 else 'behind'} the store's server "
                  f"(at most {MAX_CLOCK_SKEW_S:.0f} s): sync the clocks (NTP); claims use the server's")


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
    check_clock: bool = False
    """Compare `clock` (then the wall clock: serve) with a shared store's (`clock_skew`)."""
    check_token: bool = False
    """Read the GitLab token's expiry now and then and say it before the day (serve:
    controller/token_expiry.py)."""
    monotonic: Clock | None = None
    """A clock that never steps, beside `clock` (serve: time.monotonic), to tell a step of
    the wall clock from time passing (`Controller._clock_step`); None: `clock` never steps
    (the simulator's)."""


class Controller:
    def __init__(self, wiring: Wiring, settings: ControllerSettings | None = None,
                 policy: PlanPolicy | None = None) -> None:
        """`policy` overrides the settings' `[controller.planner]` (tests, the simulator)."""
        settings = settings or ControllerSettings()
        self.wiring, self.settings, self.policy = wiring, settings, policy or settings.planner
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
        self.limits = GateThresholds.from_settings(settings)
        self.drains = wiring.store.drains(self.host)
        self.claims = Claims(wiring.store, self.host, ttl_s=settings.claim_ttl(), drains=self.drains)
        self.protected = wiring.store.protected(self.host)  # drains no later job may delay (plan.py)
        self.gate = {gpu: GateState.from_row(row) for gpu, row in wiring.store.gate(self.host).items()}
        self.view = ControllerView(self.host, wiring.clock(), 0, None)
        self.ticks = 0
        self._slots: tuple[Slot, ...] = ()
        self._synced = False
        self._published = False  # the inventory toggles are checked against (store.save_inventory)
        self._partial_caps_logged = False  # runners' maximum timeouts on some sizes only
        self.stats = ControllerStats()  # counters for the exporter, fed once per tick
        self.on_tick: list[Callable[[ControllerView], None]] = []  # e.g. dcgm job mapping files
        self._failing: set[str] = set()  # side tasks failing now (logged once)
        self._clock_checked = -math.inf  # when check_clock last compared the clocks
        self._clocks: tuple[float, float] | None = None  # (wall, monotonic) at the last tick
        self._skew = 0.0  # how far the clock is ahead of a shared store's: claims take the store's
        self.liveness = Liveness(host=self.host, interval_s=settings.interval_s)  # for /healthz, /metrics
        self.history = History(wiring.store, self.host, settings)  # job history, retention
        self.fair = FairShare(wiring.store, settings)  # fair share from the job history
        self.estimates = Estimates(wiring.store)  # run-time estimates from it (order only)
        self.token = TokenExpiry()  # the GitLab token's expiry, with check_token

    # -- one tick ------------------------------------------------------------------
    def tick(self) -> ControllerView:
        started = time.perf_counter()
        now = self.wiring.clock()
        self._clock_step(now)
        if self.wiring.check_clock and now >= self._clock_checked + CLOCK_CHECK_S:
            self._clock_checked = now
            self._skew, off = clock_skew(self.wiring.store, self.wiring.clock)
            self.history.skew = self._skew
            self.liveness.trouble("clock", off, warn=CLOCK_OFF)
        self.ticks += 1
        snapshot = self._snapshot()
        running = self.wiring.jobs.running()
        self.history.remember_pending(self.demand.jobs)
        # before any store write: a store that cannot write fails the tick, not the history
        self.history.observe(self.wiring.jobs.leased(), snapshot, now, self.demand.take_outcomes())
        self._publish_inventory(snapshot)
        self.demand.forget(j for jobs in running.values() for j in jobs)
        toggles = self._toggles(snapshot, now)
        self._step_gate(snapshot, running, now)
        gitlab_ready = self.health.ready(now)
        if gitlab_ready:  # first: at most one request a minute, before demand takes the budget
            self._free_orphans(running, now)
        gitlab_ok = gitlab_ready and self._talk_to_gitlab(now)
        observed = self._observed(snapshot, running, toggles, now)
        result, observed = self.claims.plan(observed, self.policy, now - self._skew)
        self._remember(result, now)  # before acting: a serve killed mid-drain finds it stored
        if gitlab_ok:
            caps = None
            if self.policy.backfill_estimated:  # controller/caps.py
                opens = [d.slot.name for d in result.decisions if d.open]
                caps = to_send(opens, result.deadlines, self._own_caps(), self.cache.known_caps(), now)
            acting.apply(result.decisions, gitlab=self.wiring.gitlab, cache=self.cache, health=self.health,
                         now=now, on_action=lambda a: self._acted(a, now), caps=caps)
        if gitlab_ready:
            self.standby.keep_online(self.wiring.gitlab, now)
        if gitlab_ok:
            acting.retag(self._slots, cache=self.cache, gitlab=self.wiring.gitlab)
        # a store failure here fails the tick like any other (not a side task): /healthz sees it
        self.history.save(now, lambda *event: self._event(now, *event))
        self.view = dataclasses.replace(self._view(snapshot, result, running, toggles, now),
                                        waiting=why_waiting(observed, result))
        self.liveness.good()
        self.liveness.trouble("gitlab", self.health.write_error or (
            "" if gitlab_ok else self.health.last_error or "not asked yet"))
        self.liveness.notice("token", self.token.notice(now))
        view, took = self.view, time.perf_counter() - started
        self._aside("stats", lambda: self.stats.observe(view, duration_s=took, is_ci=self.wiring.is_ci,
                                                        gitlab=self.wiring.gitlab,
                                                        token_expires_at=self.token.expires_at))
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
            snapshot = self.wiring.gpus.snapshot()
        except GpuError as exc:
            self.liveness.trouble("gpus", str(exc), warn=CANNOT_READ_GPUS)  # logged once while it lasts
            return None
        self.liveness.trouble("gpus", "", warn=CANNOT_READ_GPUS)
        if not self._slots:
            # lost GPUs keep their slots (the gate keeps them closed); so do MIG GPUs whose
            # runners init made before MIG was turned on (closed too), besides MIG-less slots
            whole = dataclasses.replace(snapshot, gpus=tuple(dataclasses.replace(g, lost=False)
                                                             for g in snapshot.gpus))
            no_mig = dataclasses.replace(whole, gpus=tuple(dataclasses.replace(g, mig_enabled=False)
                                                           for g in whole.gpus))
            planned = {s.name: s for s in (*plan_slots(whole), *plan_slots(no_mig))}
            self._slots = tuple(sorted((s for s in planned.values() if s.name in self.cache.ids),
                                       key=lambda s: (s.size, s.gpus)))
        return snapshot

    def _publish_inventory(self, snapshot: GpuSnapshot | None) -> None:
        """Once per start, and again whenever the store has none for this host (its tables
        made again under serve, by this host or another): the GPUs and slots that toggle
        targets may name (toggles.py)."""
        store = self.wiring.store
        if snapshot is not None and (not self._published or store.inventory(self.host) is None):
            store.save_inventory(self.host, [g.index for g in snapshot.gpus], [s.key for s in self._slots],
                                 self.wiring.clock())
            self._published = True

    def _toggles(self, snapshot: GpuSnapshot | None, now: float) -> list[Toggle]:
        toggles = self.wiring.store.toggles(self.host)
        for toggle in [t for t in toggles if t.action == "reopen"]:
            target = Target.parse(toggle.target)
            if target is None or target.gpu is None:
                continue  # stored checked: a reopen names a GPU
            gpu = target.gpu
            found = next((g for g in snapshot.gpus if g.index == gpu), None) if snapshot else None
            self.gate[gpu] = reopen(self.gate.get(gpu, GateState()), found)
            self.wiring.store.clear_toggle(toggle)  # a pause set on it since stays
            self._event(now, "reopen", f"gpu{gpu}", f"by {toggle.who}: {toggle.why}")
        return [t for t in toggles if t.action != "reopen"]

    def _step_gate(self, snapshot: GpuSnapshot | None, running: Mapping[str, tuple[int, ...]],
                   now: float) -> None:
        if snapshot is None:
            return
        owned = {g for s in self._slots if running.get(s.name) for g in s.gpus}
        new = gate_step(snapshot, self.gate, now=now, is_ci=self.wiring.is_ci, owned=owned,
                        limits=self.limits, unreadable=self.wiring.jobs.unreadable())
        for gpu, state in new.items():
            old = self.gate.get(gpu, GateState())
            if state.closed != old.closed:
                self._event(now, "gate-close" if state.closed else "gate-open", f"gpu{gpu}",
                            state.reason or "no foreign use for the cool-down")
        self.gate = new

    def _talk_to_gitlab(self, now: float) -> bool:
        """Read runners and demand; False (logged once, backing off) when GitLab fails. A
        request answered clears the failures (`GitLabHealth.ok`): in steady state no pause
        or resume is sent, and these reads are all that says GitLab is back. A 404 is no
        answer here (a runner read gets None): with every request answered 404 (a wrong
        URL behind a proxy), the project polls fail and the runner reads must not say ok."""
        answers = self.cache.found + self.demand.answered
        try:
            if not self._synced:
                self.cache.sync_all(self.wiring.gitlab)
                self._synced = True
            if self.ticks % 4:  # three tokens of four go to demand, one to re-reading a runner
                self.demand.poll(self.wiring.gitlab)
            self.cache.refresh_one(self.wiring.gitlab, self.budget)
            if self.wiring.check_token and self.token.due(now):
                self.budget.charge()
                self.token.read(self.wiring.gitlab, now)
        except GitLabError as exc:
            self.health.failed(exc, now)
            return False
        if self.cache.found + self.demand.answered != answers:
            self.health.ok()
        return True

    def _free_orphans(self, running: Mapping[str, tuple[int, ...]], now: float) -> None:
        """Reap and release leases of jobs long over in GitLab (their cleanup was killed)."""
        projects = {job: lease.project for job, lease in self.wiring.jobs.leased().items()}
        try:
            over = self.orphans.over(running, self.cache.ids, gitlab=self.wiring.gitlab, budget=self.budget,
                                     now=now, unconfirmed=self.history.unconfirmed, projects=projects)
        except GitLabError as exc:  # this look only: pauses and resumes go on
            if "lease audit" not in self._failing:
                log.warning("GitLab failed on a runner's running jobs: %s; no lease is freed while "
                            "it fails (the controller goes on)", exc)
            self._failing.add("lease audit")
            return
        if over is None:  # not asked this tick
            return
        self._failing.discard("lease audit")
        self.history.confirm(self.orphans.take_users())
        for job, missing_s in over:

            def free(job: int = job, missing_s: float = missing_s) -> None:
                gpus = self.wiring.jobs.free(job)
                self.history.freed.add(job)
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
        claims = self.wiring.store.claims(now - self._skew)  # the store's clock: hosts' may differ
        claimed = {job for job, host in claims.items() if host != self.host}
        pending = self.demand.jobs
        demand = self._timed(self.demand.demand(self.host, self.fair.penalties(pending, now),
                                                self.estimates.of(pending, now)))
        if self.drains and not self.demand.complete:
            demand = self._still_drained(demand)
        elsewhere = frozenset(d.job_id for d in demand if d.job_id in claimed)
        started: dict[str, float] = {}  # slot -> when its latest job took its lease
        ends: dict[str, list[float | None]] = {}  # slot -> when each of its jobs ends at the latest
        for job in self.wiring.jobs.leased().values():
            if job.created_at is not None:
                started[job.slot] = max(started.get(job.slot, job.created_at), job.created_at)
            ends.setdefault(job.slot, []).append(job.ends_by)
        states = tuple(SlotState(s, self.cache.paused.get(s.name) is not False, running.get(s.name, ()),
                                 started.get(s.name), _latest(ends.get(s.name, ())))
                       for s in self._slots)
        return Observed(states, closed, demand, self.drains, held_slots(toggles, self._slots), self.protected,
                        elsewhere, now)

    def _clock_step(self, now: float) -> None:
        """A wall clock that moved by more than `CLOCK_STEP_S` beyond the time that passed
        (`Wiring.monotonic`) stepped: logged; the job history's running jobs, the gate's
        cool-downs and the orphan audit's suspects move with it (else a step back kept a GPU
        closed for its length, and a step forward freed a finishing job's GPUs before their
        grace); and the store's clock is compared again at once (the skew NTP just corrected
        would else be taken off every claim for up to CLOCK_CHECK_S). Found by a review of
        the clocks."""
        if self.wiring.monotonic is None:
            return
        mono = self.wiring.monotonic()
        if self._clocks is not None:
            step = (now - self._clocks[0]) - (mono - self._clocks[1])
            if abs(step) > CLOCK_STEP_S:
                log.warning("the wall clock stepped %+.0f s (NTP?); the running jobs' history times "
                            "move with it", step)
                self.history.shift(step)
                self.gate = {gpu: state.shifted(step) for gpu, state in self.gate.items()}
                self.orphans.shift(step)
                self._clock_checked = -math.inf
        self._clocks = (now, mono)

    def _still_drained(self, demand: tuple[Demand, ...]) -> tuple[Demand, ...]:
        """A restart: the jobs of the drains the store kept that no poll has read yet, as
        pending, most urgent, so the plan keeps their blocks drained and their singles
        paused (else it resumed them at once, and younger 1-GPU jobs took those GPUs)
        until every project is read once (`DemandTracker.complete`): a job that left
        meanwhile goes then. Found by a review as an operator killing serve mid-drain."""
        known = {d.job_id for d in demand}
        sizes = {s.name: s.size for s in self._slots}
        kept = tuple(Demand(job, sizes[name], 0.0) for name, job in sorted(self.drains.items())
                     if job not in known and name in sizes)
        return kept + demand

    def _timed(self, demand: tuple[Demand, ...]) -> tuple[Demand, ...]:
        """Pending jobs with the timeout they will have here at the most: GitLab's jobs
        API does not say a pending job's timeout (lib/api/entities/ci/job_basic.rb), but
        any job this host's N-GPU runners start is cut at their maximum timeout, where
        every one of them has one (`RunnerCache.timeout_bound`). All sizes or none: a
        known timeout takes a job's size credit away (controller/order.py), so bounds on
        some sizes only would let the unbounded sizes' jobs, still credited, jump ahead of
        the bounded ones (8-GPU jobs behind credited 4-GPU ones). Unknown,
        the planner gives a job no backfill and a size credit."""
        names: dict[int, list[str]] = {}
        for slot in self._slots:
            names.setdefault(slot.size, []).append(slot.name)
        own = self._own_caps() if self.policy.backfill_estimated else None
        bounds = {size: self.cache.timeout_bound(slot_names, own) for size, slot_names in names.items()}
        if None in bounds.values():
            partial = sorted(size for size, bound in bounds.items() if bound is not None)
            if partial and not self._partial_caps_logged:
                log.warning("runners of %s GPUs have a maximum job timeout and others not: the planner "
                            "uses none (set runner_max_timeout_s for every size, then `runnerctl init`)",
                            "/".join(map(str, partial)))
            self._partial_caps_logged = bool(partial)
            return demand
        timed = []
        for d in demand:
            bound = bounds.get(d.gpus)
            timed.append(d if bound is None else dataclasses.replace(d, timeout_s=float(bound)))
        return tuple(timed)

    def _own_caps(self) -> dict[str, int | None]:
        """Each runner's own maximum timeout (`[controller] runner_max_timeout_s` for its
        size; None: none), which it gets back after backfill by estimate."""
        own = self.settings.runner_max_timeout_s
        return {slot.name: own.get(str(slot.size)) for slot in self._slots}

    def _acted(self, action: acting.Action, now: float) -> None:
        d = action.decision
        verb = "resume" if d.open else "pause"
        detail = d.reason if action.ok else f"failed: {action.error}"
        if action.cap:
            verb = "cap"
            seconds = self.cache.max_timeout.get(d.slot.name)
            if action.ok and seconds == self._own_caps().get(d.slot.name):
                detail = f"maximum job timeout back to {seconds or 'none'}"
            elif action.ok:
                detail = f"maximum job timeout {seconds} s: {d.reason}"
        self._event(now, verb if action.ok else f"{verb}-failed", d.slot.name, detail)

    def _remember(self, result: Plan, now: float) -> None:
        for kind, name, detail in self.claims.tell(result):
            self._event(now, kind, name, detail)
        self.drains = dict(result.reserved)
        self.protected = result.protected
        self.wiring.store.save_drains(self.host, self.drains, now)
        self.wiring.store.save_protected(self.host, self.protected)
        self.wiring.store.save_gate(self.host, {g: s.to_row() for g, s in self.gate.items()})

    def _event(self, now: float, kind: str, subject: str, detail: str) -> None:
        event = Event(now, self.host, kind, subject, detail)
        self.wiring.store.record(event)
        self.stats.event(event)
        self.wiring.on_event(event)

    def _view(self, snapshot: GpuSnapshot | None, result: Plan, running: Mapping[str, tuple[int, ...]],
              toggles: list[Toggle], now: float) -> ControllerView:
        slots = tuple(_slot_view(d, self.cache, running, result) for d in result.decisions)
        gpus = tuple(GpuView(g, not s.closed, s.reason, s.unhealthy) for g, s in sorted(self.gate.items()))
        return ControllerView(
            self.host, now, self.ticks, snapshot, slots, gpus, tuple(self.demand.jobs),
            tuple((t, toggle_status(t, self._slots, running)) for t in toggles), dict(result.reserved),
            self.health.last_error, self.budget.spent, self._owners(),
            unused=self.history.unused(), standby=self.standby.status(),
            started={job: lease.created_at for job, lease in self.wiring.jobs.leased().items()
                     if lease.created_at is not None})

    def _owners(self) -> dict[int, Owner]:
        """Each running job's user and page: the history's user (GitLab's word where it was
        heard, `History.confirm`) over its lease's (the job's own variables)."""
        return {job: (record.user if (record := self.history.open.get(job)) else user, url)
                for job, (user, url) in self.wiring.jobs.owners().items()}

    # -- running ---------------------------------------------------------------------
    def run(self, stop: threading.Event, *, step: Callable[[], object] | None = None,
            every_s: float | None = None) -> None:
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


def _latest(ends: Iterable[float | None]) -> float | None:
    """When the last of a slot's jobs ends at the latest; None if one end is unknown."""
    known = list(ends)
    return None if not known or None in known else max(e for e in known if e is not None)
