"""Which runners of a host should be open: a pure function of what was observed.

`plan(observed, policy)` has no side effects and reads no clock; the loop observes,
calls it, and applies the returned actions (all pauses before any resume). It keeps:

- S1: the GPU sets of the slots it opens are pairwise disjoint; a slot on a closed GPU
  (foreign process, unhealthy, admin pause) or on a GPU busy with another slot's job is
  never opened.
- L1: the most urgent pending N-GPU job (priority, then age) reserves an aligned block
  at once; the singles and smaller blocks under it are paused (drained) so a stream of
  1-GPU jobs cannot starve it, and the block opens as soon as no other job runs on its
  GPUs. The block chosen is the one that frees soonest: fewest busy GPUs, then fewest
  running jobs; a block already reserved keeps its reservation.
- L2: without demand for a block, it is paused and its singles open again in the same
  tick.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from runnerctl.model import Slot

PRIORITY_RANK = {"high": 0, "normal": 1, "low": 2}


@dataclasses.dataclass(frozen=True)
class SlotState:
    slot: Slot
    paused: bool
    running_jobs: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Demand:
    """A pending job that asked for `gpus` GPUs (tag gpus:N)."""

    job_id: int
    gpus: int
    created_at: float
    priority: str = "normal"

    @property
    def urgency(self) -> tuple[int, float, int]:
        return PRIORITY_RANK.get(self.priority, 1), self.created_at, self.job_id


@dataclasses.dataclass(frozen=True)
class Observed:
    slots: tuple[SlotState, ...]
    closed: Mapping[int, str] = dataclasses.field(default_factory=dict)  # GPU -> why
    demand: tuple[Demand, ...] = ()
    reserved: Mapping[str, int] = dataclasses.field(default_factory=dict)  # slot name -> job id
    held: Mapping[str, str] = dataclasses.field(default_factory=dict)  # slot name -> admin hold


@dataclasses.dataclass(frozen=True)
class PlanPolicy:
    """Tunables of the planner (the defaults are what the benchmark measures)."""

    max_draining: int = 1
    """Blocks that may drain (idle GPUs waiting for others) at once; more starts big
    jobs sooner but idles more GPUs; later demand only takes blocks already idle."""


@dataclasses.dataclass(frozen=True)
class Decision:
    slot: Slot
    open: bool
    reason: str


@dataclasses.dataclass(frozen=True)
class Plan:
    decisions: tuple[Decision, ...]
    reserved: Mapping[str, int]  # block name -> the job it drains for (to remember)

    def open_slots(self) -> list[Slot]:
        return [d.slot for d in self.decisions if d.open]

    def actions(self, observed: Observed) -> tuple[list[Decision], list[Decision]]:
        """(pauses, resumes) that differ from what GitLab has: pauses go first."""
        current = {s.slot.name: s.paused for s in observed.slots}
        pauses = [d for d in self.decisions if not d.open and not current[d.slot.name]]
        resumes = [d for d in self.decisions if d.open and current[d.slot.name]]
        return pauses, resumes


def plan(observed: Observed, policy: PlanPolicy = PlanPolicy()) -> Plan:
    busy = _busy_gpus(observed)
    reservations = _reserve(observed, busy, policy)
    reserved_gpus = {g: name for name, (slot, _) in reservations.items() for g in slot.gpus}
    decisions = tuple(_decide(state, observed, busy, reservations, reserved_gpus)
                      for state in observed.slots)
    return Plan(decisions, {name: job for name, (_, job) in reservations.items()})


def _busy_gpus(observed: Observed) -> dict[int, set[str]]:
    """GPU -> names of the slots whose running jobs are on it (more than one only if
    something already went wrong; the planner must stay safe then too)."""
    busy: dict[int, set[str]] = {}
    for state in observed.slots:
        if state.running_jobs:
            for gpu in state.slot.gpus:
                busy.setdefault(gpu, set()).add(state.slot.name)
    return busy


def _reserve(observed: Observed, busy: Mapping[int, set[str]],
             policy: PlanPolicy) -> dict[str, tuple[Slot, int]]:
    """Blocks reserved for pending multi-GPU jobs, most urgent first, disjoint.

    Only the most urgent job that fits drains GPUs for itself (a reservation, as a
    backfilling scheduler makes for its top job); later jobs take a block only when all
    of its GPUs are idle already, so draining never idles more than one block at a time.
    """
    by_name = {s.slot.name: s for s in observed.slots}
    taken: set[int] = set()
    reservations: dict[str, tuple[Slot, int]] = {}
    draining = 0
    for demand in sorted(observed.demand, key=lambda d: d.urgency):
        if demand.gpus < 2:
            continue
        candidates = [s.slot for s in observed.slots if s.slot.size == demand.gpus
                      and not taken & set(s.slot.gpus) and s.slot.name not in observed.held
                      and not any(g in observed.closed for g in s.slot.gpus)]
        if draining >= policy.max_draining:
            candidates = [c for c in candidates if not any(g in busy for g in c.gpus)]
        if not candidates:
            continue
        kept = [c for c in candidates if observed.reserved.get(c.name) == demand.job_id]
        block = kept[0] if kept else min(candidates, key=lambda c: _cost(c, busy, by_name))
        reservations[block.name] = (block, demand.job_id)
        taken.update(block.gpus)
        draining += any(g in busy for g in block.gpus)
    return reservations


def _cost(block: Slot, busy: Mapping[int, set[str]],
          by_name: Mapping[str, SlotState]) -> tuple[int, int, tuple[int, ...]]:
    holders = set().union(*(busy.get(g, set()) for g in block.gpus))
    jobs = sum(len(by_name[h].running_jobs) for h in holders if h in by_name)
    return sum(1 for g in block.gpus if g in busy), jobs, block.gpus


def _decide(state: SlotState, observed: Observed, busy: Mapping[int, set[str]],
            reservations: Mapping[str, tuple[Slot, int]],
            reserved_gpus: Mapping[int, str]) -> Decision:
    slot = state.slot
    closed = [g for g in slot.gpus if g in observed.closed]
    if closed:
        return Decision(slot, False, f"GPU {closed[0]} closed: {observed.closed[closed[0]]}")
    if slot.name in observed.held:
        return Decision(slot, False, observed.held[slot.name])
    others = sorted(set().union(*(busy.get(g, set()) for g in slot.gpus)) - {slot.name})
    if slot.name in reservations:
        job = reservations[slot.name][1]
        if others:
            return Decision(slot, False, f"draining for job {job}: waiting on {', '.join(others)}")
        return Decision(slot, True, f"open for job {job}")
    blocking = sorted({reserved_gpus[g] for g in slot.gpus if g in reserved_gpus})
    if blocking:
        return Decision(slot, False, f"drained for {blocking[0]}")
    if slot.size > 1:
        return Decision(slot, False, "no pending job needs this block")
    if others:
        return Decision(slot, False, f"GPU in use by {others[0]}")
    return Decision(slot, True, "free")
