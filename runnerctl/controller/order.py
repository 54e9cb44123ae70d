"""The order in which pending jobs get GPUs: claims on idle GPUs, which job drains
first, and when one job may take GPUs held for another (`plan._Reserver`).

Kept apart from `plan` so each stays small; `sim.replan` reads the same order to tell
which hosts' plans a change can touch. A job of N GPUs counts older per GPU beyond the
first (a size credit: big jobs are hard to place) unless its timeout is known: then
age alone, as in EASY backfilling (`PlanPolicy`; docs/controller.md "Size credits").
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runnerctl.controller.plan import Demand, PlanPolicy


def drain_order(demand: Demand, protected: Collection[int],
                policy: PlanPolicy) -> tuple[int, bool, float, int]:
    """The order in which multi-GPU jobs reserve a block to drain (step 2 of `_Reserver`):
    priority, protected jobs first, then age with `drain_credit_s` per extra GPU. When no
    GPU of a host is idle, a job after its last drained job in this order cannot change
    its plan (the simulator skips such hosts)."""
    rank, created, job_id = _credited(demand, policy.drain_credit_s)
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


def idle_claim(demand: Demand, policy: PlanPolicy) -> tuple[int, float, int]:
    """A job's claim on idle GPUs (`_Reserver.claim`): `idle_credit_s` per extra GPU."""
    return _credited(demand, policy.idle_credit_s)


def _credited(demand: Demand, credit_s: float) -> tuple[int, float, int]:
    """Priority, then age (fair-share adjusted: `Demand.urgency`), a job of N GPUs
    counting `credit_s` older per extra GPU unless its timeout is known (`PlanPolicy`:
    with estimates, age alone)."""
    if demand.timeout_s is not None:
        return demand.urgency
    rank, created, job_id = demand.urgency
    return rank, created - credit_s * (demand.gpus - 1), job_id
