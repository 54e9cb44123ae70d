"""The order in which pending jobs get GPUs: claims on idle GPUs, which job drains
first, and when one job may take GPUs held for another (`plan._Reserver`).

Kept apart from `plan` so each stays small; `sim.replan` reads the same order to tell
which hosts' plans a change can touch, and `relevant_demand` cuts the queue by these
orders (the part of it a plan can act on). A job of N GPUs counts older per GPU beyond the
first (a size credit: big jobs are hard to place) unless its timeout is known or its
recent runs say it may run long: then age alone, as in EASY backfilling (`credited`,
`PlanPolicy`; docs/controller.md "Size credits").
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runnerctl.controller.plan import Demand, PlanPolicy
    from runnerctl.model import Slot


def drain_order(demand: Demand, protected: Collection[int],
                policy: PlanPolicy) -> tuple[int, bool, float, int]:
    """The order in which multi-GPU jobs reserve a block to drain (step 2 of `_Reserver`):
    priority, protected jobs first, then age with `drain_credit_s` per extra GPU. When no
    GPU of a host is idle, a job after its last drained job in this order cannot change
    its plan (the simulator skips such hosts)."""
    rank, created, job_id = _credited(demand, policy.drain_credit_s, policy)
    return rank, demand.job_id not in protected, created, job_id


def cuts_in(mine: Demand, theirs: Demand, protected: Collection[int],
            claim: Callable[[int], tuple[int, float, int]]) -> bool:
    """May `mine` take GPUs that a block holds for `theirs` (`_Reserver._may_cut_in`)?
    A higher priority always may; at equal priority only with a better `claim` and, if
    `theirs` is protected, only if `mine` was waiting before it came."""
    if mine.urgency[0] != theirs.urgency[0]:
        return mine.urgency[0] < theirs.urgency[0]
    came_first = mine.created_at < theirs.created_at
    return (came_first or theirs.job_id not in protected) and claim(mine.job_id) < claim(theirs.job_id)


def handout_order(demand: Demand) -> tuple[float, int]:
    """The order in which GitLab hands the pending jobs of one size to open group or
    project runners: oldest first (gitlabhq app/services/ci/queue/pending_builds_strategy.rb,
    `builds_for_group_runner` and `builds_for_project_runner`: build id ascending, and ids
    grow with creation; `runnerctl.sim.fair.pick` models it). GitLab knows neither the
    priority tag nor fair share, so neither counts here. Instance runners take first the
    jobs of projects with the fewest builds running on instance runners, counts the
    planner does not see: it assumes this order for them too (a known gap)."""
    return demand.created_at, demand.job_id


def idle_claim(demand: Demand, policy: PlanPolicy) -> tuple[int, float, int]:
    """A job's claim on idle GPUs (`_Reserver.claim`): `idle_credit_s` per extra GPU."""
    return _credited(demand, policy.idle_credit_s, policy)


def credited(demand: Demand, policy: PlanPolicy) -> bool:
    """Does the job get size credits? Only if its timeout is unknown and no recent run of
    its project and job name took longer than `PlanPolicy.credit_estimate_max_s`
    (`Demand.estimate_s`); the others wait in age order (`PlanPolicy`)."""
    return demand.timeout_s is None and short_enough(demand.estimate_s, policy)


def short_enough(estimate_s: float | None, policy: PlanPolicy) -> bool:
    """Is a job with this run-time estimate short enough for size credits: none yet, or at
    most `PlanPolicy.credit_estimate_max_s`?"""
    return estimate_s is None or estimate_s <= policy.credit_estimate_max_s


def _credited(demand: Demand, credit_s: float, policy: PlanPolicy) -> tuple[int, float, int]:
    """Priority, then age (fair-share adjusted: `Demand.urgency`), a job of N GPUs
    counting `credit_s` older per extra GPU if it gets size credits (`credited`)."""
    estimate = demand.estimate_s  # `credited`, inline: every plan reads every job's claim
    if demand.timeout_s is not None or (estimate is not None and estimate > policy.credit_estimate_max_s):
        return demand.urgency
    memo = demand.credited_memo
    found = memo.get(credit_s)
    if found is None:
        rank, created, job_id = demand.urgency
        found = memo[credit_s] = rank, created - credit_s * (demand.gpus - 1), job_id
    return found


def relevant_demand(demand: Iterable[Demand], slots: Iterable[Slot], protected: Iterable[int] = (),
                    elsewhere: Iterable[int] = (), policy: PlanPolicy | None = None) -> tuple[Demand, ...]:
    """The jobs `plan` can act on: in each order in which it reads the jobs of one size,
    one more than the host has slots of that size (each takes a slot or, failing, so does
    every later one of its size), as many again of those not claimed `elsewhere` (only
    they may drain), and the protected ones. The orders: urgency among the jobs without
    size credits and among the others (claims and drain order: only the latter get size
    credits, so those two run in urgency order within each; `credited`), and
    GitLab's (`handout_order`: backfill, singles left open in a drain). Handing `plan`
    only these gives the same plan as the whole queue, and so does handing it any part of
    the queue that holds these (the cut of that part is the same cut); the simulator
    relies on it."""
    if policy is None:
        from runnerctl.controller.plan import PlanPolicy
        policy = PlanPolicy()
    demand = tuple(demand)
    room: dict[int, int] = {}
    for slot in slots:
        room[len(slot.gpus)] = room.get(len(slot.gpus), 1) + 1
    keep, away = set(protected), set(elsewhere)
    kept: set[int] = set()
    urgent = sorted(demand, key=lambda d: d.urgency)
    for order, by_timeout in ((urgent, True), (sorted(demand, key=handout_order), False)):
        left: dict[tuple[int, bool], int] = {}
        left_here: dict[tuple[int, bool], int] = {}
        for d in order:
            key = d.gpus, by_timeout and credited(d, policy)
            first = left.setdefault(key, room.get(d.gpus, 0)) > 0
            here = d.job_id not in away and left_here.setdefault(key, room.get(d.gpus, 0)) > 0
            if first or here or d.job_id in keep:
                left[key] -= 1
                if d.job_id not in away:
                    left_here[key] -= 1
                kept.add(d.job_id)
    return tuple(d for d in urgent if d.job_id in kept)
