"""Which runners of a host should be open: a pure function of what was observed.

`plan(observed, policy)` has no side effects and reads no clock; the loop observes,
calls it, and applies the returned actions (all pauses before any resume). It keeps:

- S1: the GPU sets of the slots it opens are pairwise disjoint; a slot on a closed GPU
  (foreign process, unhealthy, admin pause) or on a GPU busy with another slot's job is
  never opened.
- L1: pending multi-GPU jobs get aligned blocks: idle ones at once, and the most
  urgent job (priority, then age) drains one for itself: the singles and smaller blocks
  under it are paused (but for singles GitLab would hand only to jobs that go first:
  `_Reserver._drain`), so a stream of 1-GPU jobs cannot starve it, and it opens as
  soon as no other job runs on its GPUs. The block chosen frees soonest: fewest busy
  GPUs, then the one whose youngest job started earliest (lease times, when known),
  then fewest running jobs; a drain under way keeps its block. A job that came
  while no other multi-GPU job waited is protected: no later job delays it. Any other
  job whose timeout is unknown drains only once it has waited
  `PlanPolicy.drain_after_s` (20 min): until then a block may free by itself, and no
  new drain starts (no later job drains ahead of it; drains under way go on).
- Several hosts: a job another host claimed (`Observed.elsewhere`) is never drained for
  here, but may take an idle block here: a host that must drain never holds a job back
  from a host that has room now.
- L2: without demand for a block, it is paused and its singles open again in the same
  tick.
- Backfill (`controller.backfill`): a single, or a block smaller than the drained one,
  on idle GPUs of a draining block stays open while the jobs of its size GitLab would
  hand it end, by their timeouts, before the drain (or by their estimates, with a
  deadline for the slot's runner: `PlanPolicy.backfill_estimated`).

Idle GPUs go to pending jobs by claim (`controller.order`): age, where a big job counts
older (it is harder to place) unless its timeout is known, so big jobs take idle blocks
as they appear instead of draining one, and a 1-GPU job that waited long enough keeps an
idle single open rather than let a younger N-GPU job take it: 1-GPU jobs do not starve
under a stream of multi-GPU jobs either.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping

from runnerctl.controller.backfill import backfill
from runnerctl.controller.decide import Decision as Decision
from runnerctl.controller.decide import decide
from runnerctl.controller.order import cuts_in as cuts_in
from runnerctl.controller.order import drain_order as drain_order
from runnerctl.controller.order import handout_order
from runnerctl.controller.order import idle_claim as idle_claim
from runnerctl.controller.order import relevant_demand as relevant_demand
from runnerctl.model import Slot
from runnerctl.settings import PlanPolicy as PlanPolicy
from runnerctl.tags import PRIORITY_RANK


@dataclasses.dataclass(frozen=True)
class SlotState:
    slot: Slot
    paused: bool
    running_jobs: tuple[int, ...] = ()
    started_at: float | None = None
    """When the latest of its running jobs started (lease time), if known."""
    ends_by: float | None = None
    """When its running jobs end at the latest (start + GitLab timeout), if known."""


@dataclasses.dataclass(frozen=True)
class Demand:
    """A pending job that asked for `gpus` GPUs (tag gpus:N, or 1 for tag gpu)."""

    job_id: int
    gpus: int
    created_at: float
    priority: str = "normal"
    timeout_s: float | None = None
    """Its GitLab timeout, if known: GitLab kills it then, so it runs at most this long."""
    fair_s: float = 0.0
    """Fair share (`fairshare`): seconds this job counts younger, for its user's and
    project's recent GPU use; bounded, so its age still wins in the end."""
    estimate_s: float | None = None
    """How long the job history says it may run (`controller.estimates`: the longest of
    the latest runs of its project and job name), if any ended. The order reads it (a
    job that may run long gets no size credit: `PlanPolicy.credit_estimate_max_s`);
    being no bound, it lets a job backfill only where the runner it may get is given a
    deadline (`PlanPolicy.backfill_estimated`)."""
    queued_at: float | None = None
    """When it became pending, if known (GitLab's `queued_duration` before the poll): a
    job of a later stage is created with its pipeline, long before it is queued."""

    @property
    def pending_since(self) -> float:
        """Since when it waits for GPUs (`PlanPolicy.drain_after_s` counts from here)."""
        return self.created_at if self.queued_at is None else self.queued_at

    @functools.cached_property
    def urgency(self) -> tuple[int, float, int]:
        return PRIORITY_RANK.get(self.priority, 1), self.created_at + self.fair_s, self.job_id

    @functools.cached_property
    def credited_memo(self) -> dict[float, tuple[int, float, int]]:
        """`order._credited` per credit for a job with size credits, once computed (a job
        is read by many plans)."""
        return {}


@dataclasses.dataclass(frozen=True)
class Observed:
    slots: tuple[SlotState, ...]
    closed: Mapping[int, str] = dataclasses.field(default_factory=dict)  # GPU -> why
    demand: tuple[Demand, ...] = ()
    reserved: Mapping[str, int] = dataclasses.field(default_factory=dict)  # slot name -> job id
    held: Mapping[str, str] = dataclasses.field(default_factory=dict)  # slot name -> admin hold
    protected: frozenset[int] = frozenset()  # jobs no later job may delay (Plan.protected)
    elsewhere: frozenset[int] = frozenset()
    """Pending jobs another host claimed (drains for): this host may start them on an idle
    block, but never drains for them (two hosts never drain for one job)."""
    now: float | None = None
    """The observation's time, on the clock of `created_at` and `started_at`; None: no
    backfill, and drains start at once (the two rules that read the time)."""


@dataclasses.dataclass(frozen=True)
class Plan:
    decisions: tuple[Decision, ...]
    reserved: Mapping[str, int]  # block name -> the job it drains for (to remember)
    protected: frozenset[int] = frozenset()  # to remember, too
    claims: frozenset[int] = frozenset()  # reserved jobs not claimed elsewhere: claim them
    singles: Mapping[int, str] = dataclasses.field(default_factory=dict)
    """1-GPU job -> the idle single kept open for it (why_waiting reads it)."""
    recheck_at: float | None = None
    """When a backfill single this plan opens must close (time alone changes the plan)."""
    drains_from: tuple[int, float] | None = None
    """(job, when): the job that stopped the drains because it has not waited
    `PlanPolicy.drain_after_s` yet, and when it may drain (why_waiting says so)."""
    deadlines: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Slots opened for backfill by estimate (`PlanPolicy.backfill_estimated`) -> when
    a job they start must end: their runners' maximum timeout ends then (`caps`)."""

    def open_slots(self) -> list[Slot]:
        return [d.slot for d in self.decisions if d.open]



def differences(decisions: Iterable[Decision],
                paused: Mapping[str, bool | None]) -> tuple[list[Decision], list[Decision]]:
    """(pauses, resumes) to send, pauses first: what differs from what GitLab has. A runner
    whose state is unknown (None or missing) always gets the desired one. The one diff:
    the loop (act.apply) and the simulator both use it."""
    pauses, resumes = [], []
    for d in decisions:
        now = paused.get(d.slot.name)
        if d.open and now is not False:
            resumes.append(d)
        elif not d.open and now is not True:
            pauses.append(d)
    return pauses, resumes


def may_drain_from(demand: Demand, protected: Iterable[int], policy: PlanPolicy) -> float:
    """From when this multi-GPU job may drain a block (`PlanPolicy.drain_after_s` after
    it became pending): at once (-inf) if its timeout is known, it came alone
    (`protected`) or the delay is 0."""
    if policy.drain_after_s <= 0 or demand.timeout_s is not None or demand.job_id in protected:
        return float("-inf")
    return demand.pending_since + policy.drain_after_s


DEFAULTS = PlanPolicy()
"""The planner's defaults (`[controller.planner]` unset)."""


def plan(observed: Observed, policy: PlanPolicy = DEFAULTS) -> Plan:
    busy = _busy_gpus(observed.slots)
    reserver = _Reserver(observed, busy, policy)
    reservations = reserver.run()
    first = reserver.first_open()  # singles open in a drain: its block waits for them too
    held_by = {**busy, **{s.gpus[0]: [s.name] for s in reserver.usable.get(1, ()) if s.name in first}}
    decisions = _opened(decide(observed, held_by if first else busy, reservations), first)
    opened, recheck, deadlines = backfill(observed, busy, reservations, decisions, policy)
    decisions = _opened(decisions, opened)
    reserved = {name: job for name, (_, job) in reservations.items()}
    return Plan(decisions, reserved, frozenset(reserver.protected),
                frozenset(reserved.values()) - observed.elsewhere, reserver.singles, recheck,
                reserver.drains_from, deadlines)


def _opened(decisions: tuple[Decision, ...], opened: Mapping[str, str]) -> tuple[Decision, ...]:
    """The decisions with these slots open (name -> why)."""
    if not opened:
        return decisions
    return tuple(Decision(d.slot, True, opened[d.slot.name]) if d.slot.name in opened else d
                 for d in decisions)


def _busy_gpus(states: Iterable[SlotState]) -> dict[int, list[str]]:
    """GPU -> names of the slots whose running jobs are on it (more than one only if
    something already went wrong; the planner must stay safe then too)."""
    busy: dict[int, list[str]] = {}
    for state in states:
        if state.running_jobs:
            for gpu in state.slot.gpus:
                busy.setdefault(gpu, []).append(state.slot.name)
    return busy


class _Reserver:
    """Blocks reserved for pending jobs, disjoint: idle GPUs first, then one drain.

    A job's claim: priority, then age, where a job of N GPUs counts `idle_credit_s`
    older per GPU beyond the first (big jobs are hard to place) unless its timeout is
    known (`controller.order`).

    1. Idle now: in order of claim, each job takes an idle slot of its size (a block
       for an N-GPU job; a single kept open for a 1-GPU job). GPUs of a block that
       drains for another job it may take only with a better claim and, if that job is
       protected, only if it was waiting before that job came.
    2. Drain: protected jobs first, then by priority and age (`drain_credit_s` per
       extra GPU), the first multi-GPU jobs still without a block (up to
       `max_draining`) reserve one, busy GPUs allowed, as a backfilling scheduler
       reserves for its top job: the block they already drain, else the one that
       frees soonest. Blocks taken in step 1 by jobs they may cut in on give way;
       singles kept in step 1 for 1-GPU jobs that may cut in are avoided, or left open
       in the drain if GitLab would hand them only to such jobs (`first_open`). The
       first of them that has not waited `drain_after_s` (timeout unknown) stops new
       drains; drains under way go on (`_too_young`).

    Protected: a multi-GPU job that came when no other one waited; no later job delays
    it (the L1 bound). Otherwise idle GPUs go to work whenever some job fits them, and
    a job waits only behind better claims: its claim eventually beats every newcomer's.
    Candidates only shrink along the order: once a job of some size finds no idle slot,
    later ones of that size will not either (`relevant_demand` relies on it).
    """

    def __init__(self, observed: Observed, busy: Mapping[int, list[str]], policy: PlanPolicy) -> None:
        self.observed, self.busy, self.policy = observed, busy, policy
        self.usable: dict[int, list[Slot]] = {}
        closed, held = observed.closed, observed.held
        shut = closed.keys()
        for state in observed.slots:
            slot = state.slot
            if not (held and slot.name in held) and (not closed or shut.isdisjoint(slot.gpus)):
                self.usable.setdefault(len(slot.gpus), []).append(slot)
        self.demand = {d.job_id: d for d in observed.demand}
        self.claims: dict[int, tuple[int, float, int]] = {}
        self.owner: dict[int, int] = {}  # GPU of a reserved block -> its job
        self.kept_open: dict[int, int] = {}  # GPU of an idle single held for a 1-GPU job -> that job
        self.singles: dict[int, str] = {}  # 1-GPU job -> the single kept open for it
        self.reservations: dict[str, tuple[Slot, int]] = {}
        self.first: dict[str, tuple[int, int]] = {}  # single left open under a drain -> (GPU, job)
        self.drains_from: tuple[int, float] | None = None  # `_too_young`
        sizes = {len(s.slot.gpus) for s in observed.slots}
        away = observed.elsewhere  # not waiting for this host: another one drains for them
        multi = []  # the multi-GPU jobs waiting for this host, up to a second one
        for d in observed.demand:
            if d.gpus > 1 and d.gpus in sizes and d.job_id not in away:
                multi.append(d.job_id)
                if len(multi) > 1:
                    break
        self.protected = {j for j in observed.protected
                          if j in self.demand and self.demand[j].gpus > 1 and j not in away}
        if len(multi) == 1 and multi[0] not in observed.reserved.values():
            self.protected.add(multi[0])  # came when no other multi-GPU job waited
        usable = {s.name: s for slots in self.usable.values() for s in slots} if observed.reserved else {}
        self.draining = {g: job for name, job in observed.reserved.items()  # drains under way
                         if job in self.demand and name in usable
                         and len(usable[name].gpus) == self.demand[job].gpus > 1 for g in usable[name].gpus}

    @functools.cached_property
    def states(self) -> dict[str, SlotState]:
        return {s.slot.name: s for s in self.observed.slots}

    def claim(self, job_id: int) -> tuple[int, float, int]:
        found = self.claims.get(job_id)
        if found is None:
            found = self.claims[job_id] = idle_claim(self.demand[job_id], self.policy)
        return found

    def run(self) -> dict[str, tuple[Slot, int]]:
        self._idle()
        drains = 0
        away = self.observed.elsewhere
        candidates = [d for d in self.observed.demand if d.gpus > 1 and d.job_id not in away]
        under_way = set(self.draining.values())  # drains that keep their block
        waiting = False  # a job before may drain here but is too young (`_too_young`)
        for demand in sorted(candidates, key=lambda d: drain_order(d, self.protected, self.policy)):
            if drains >= self.policy.max_draining:
                break
            if demand.job_id not in self.owner.values():  # a block of its own already
                if waiting and demand.job_id not in under_way and demand.job_id not in self.protected:
                    continue  # no later job starts a drain ahead of it; those under way go on
                found = self._drain(demand)
                if found is None:
                    waiting = True
                else:
                    drains += found
        return self.reservations

    def _too_young(self, demand: Demand) -> bool:
        """Must this job, which may take a block here, wait longer before it drains
        (`may_drain_from`)? Only if the time is known; notes when it may (`drains_from`)."""
        now = self.observed.now
        at = may_drain_from(demand, self.protected, self.policy)
        if now is None or at <= now:
            return False
        if self.drains_from is None:
            self.drains_from = demand.job_id, at
        return True

    def _idle(self) -> None:
        avail = set().union(*(s.gpus for slots in self.usable.values() for s in slots)).difference(self.busy)
        if not avail:
            return
        # a size without an idle slot now has none later (`avail` only shrinks): its jobs need no claim order
        sizes = {size for size, slots in self.usable.items() if any(avail.issuperset(s.gpus) for s in slots)}
        no_idle: set[int] = set()
        draining = self.draining
        policy = self.policy  # in claim order (`claim`; each key ends with its job id, so none tie)
        order = sorted([(idle_claim(d, policy), j) for j, d in self.demand.items() if d.gpus in sizes])
        for _, job_id in order:
            size = self.demand[job_id].gpus
            if size in no_idle:
                continue
            idle = [s for s in self.usable[size] if avail.issuperset(s.gpus)
                    and (not draining or all(self._may_cut_in(job_id, g) for g in s.gpus if g in draining))]
            if not idle:
                no_idle.add(size)
                if len(no_idle) == len(sizes):
                    break  # no later job finds one either
                continue
            if size == 1:
                chosen = max(idle, key=self._crowding)
                self.kept_open[chosen.gpus[0]] = job_id
                self.singles[job_id] = chosen.name
            else:
                chosen = min(idle, key=self._cost)
                self._reserve(chosen, job_id)
            avail.difference_update(chosen.gpus)
            if not avail:
                break  # no later job finds an idle slot

    def _may_cut_in(self, job_id: int, gpu: int) -> bool:
        """May this job take a GPU that a block holds for another job (draining since an
        earlier tick, or taken in this one)? Only if it was already waiting when that
        job came, and its claim is better: no later job ever delays a job."""
        other = self.owner.get(gpu, self.draining.get(gpu, job_id))
        if other == job_id:
            return True
        return cuts_in(self.demand[job_id], self.demand[other], self.protected, self.claim)

    def _drain(self, demand: Demand) -> bool | None:
        """Reserve a block for the job, busy GPUs allowed; True if one was found, False if
        it may take none here, None if it may but must wait longer (`_too_young`). If the
        job's timeout is known (age order, `PlanPolicy`), an idle single kept open for a
        1-GPU job that may cut in on it (`cuts_in`: a better claim, and no later job
        delays a protected one) is avoided: that job starts there first, as the oldest
        job would in EASY backfilling. If every block holds such singles, the job still
        drains one, and its singles kept for such jobs stay open if GitLab would hand
        them only to jobs that may cut in (`_check_first`)."""
        singles = self.kept_open if demand.timeout_s is not None else None
        first = {g for g, job in singles.items()  # kept for a job that goes first
                 if cuts_in(self.demand[job], demand, self.protected, self.claim)} if singles else set()
        held = self.owner.keys() | self.draining.keys()  # GPUs a block holds for some job
        candidates = [s for s in self.usable.get(demand.gpus, ())
                      if held.isdisjoint(s.gpus) or all(self._may_cut_in(demand.job_id, g) for g in s.gpus)]
        clear = [c for c in candidates if first.isdisjoint(c.gpus)] if first else candidates
        if not candidates:
            return False
        if self._too_young(demand):
            return None
        kept = [c for c in (clear or candidates) if self.observed.reserved.get(c.name) == demand.job_id]
        block = kept[0] if kept else min(clear or candidates, key=self._cost)
        for single in self.usable.get(1, ()) if not clear else ():
            if single.gpus[0] in first and single.gpus[0] in block.gpus:
                self.first[single.name] = single.gpus[0], demand.job_id
        for name, (slot, _) in list(self.reservations.items()):
            if not set(slot.gpus).isdisjoint(block.gpus):  # a worse claim gives way
                del self.reservations[name]
                for g in slot.gpus:
                    del self.owner[g]
        self._reserve(block, demand.job_id)
        return True

    def first_open(self) -> dict[str, str]:
        """Singles left open under drains (`_drain`; name -> why), once every drain is
        chosen: only if GitLab would hand them jobs that may cut in on each such drain.
        With F idle singles open anyway and these K, it hands out the F + K oldest
        pending 1-GPU jobs (`handout_order`, counted as `controller.backfill` does): each
        must cut in, else none stays open (L1: no later job takes GPUs of a protected
        job's block)."""
        first = {name: job for name, (gpu, job) in self.first.items() if self.owner.get(gpu) == job}
        if not first:
            return {}
        busy, owner = self.busy, self.owner
        free = [s for s in self.usable.get(1, ()) if s.gpus[0] not in busy and s.gpus[0] not in owner]
        count = len(free) + len(first)
        ones = sorted((d for d in self.observed.demand if d.gpus == 1), key=handout_order)[:count]
        if len(ones) < count or not all(cuts_in(d, self.demand[job], self.protected, self.claim)
                                        for d in ones for job in set(first.values())):
            return {}
        return {name: f"open in job {job}'s drain: GitLab hands it a job that goes first"
                for name, job in first.items()}

    def _reserve(self, block: Slot, job_id: int) -> None:
        self.reservations[block.name] = (block, job_id)
        for g in block.gpus:
            self.owner[g] = job_id

    def _crowding(self, single: Slot) -> tuple[int, int]:
        """Busy or taken GPUs in the blocks around a single: using a GPU in a crowded
        block leaves whole idle blocks for multi-GPU jobs (best fit)."""
        gpu = single.gpus[0]
        busy, owner, kept_open = self.busy, self.owner, self.kept_open
        around = sum(1 for gpus in self.blocks_of.get(gpu, ()) for g in gpus
                     if g in busy or g in owner or g in kept_open)
        return around, -gpu

    @functools.cached_property
    def blocks_of(self) -> dict[int, list[tuple[int, ...]]]:
        """GPU -> the GPUs of each usable block on it (`_crowding`)."""
        found: dict[int, list[tuple[int, ...]]] = {}
        for size, blocks in self.usable.items():
            if size > 1:
                for block in blocks:
                    for g in block.gpus:
                        found.setdefault(g, []).append(block.gpus)
        return found

    def _cost(self, block: Slot) -> tuple[int, float, int, tuple[int, ...]]:
        busy = self.busy
        holders = {h for g in block.gpus for h in busy.get(g, ())}
        states = [self.states[h] for h in holders if h in self.states]
        jobs = sum(len(s.running_jobs) for s in states)
        youngest = max((s.started_at or 0.0 for s in states), default=0.0)
        used = sum(1 for g in block.gpus if g in busy or g in self.owner or g in self.kept_open)
        return used, youngest, jobs, block.gpus
