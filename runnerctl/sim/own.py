"""A host's own job start or end: when the simulator need not plan the host for it.

Split from `replan` (which hosts a change in the queue or the claims plans again) so
each stays small. After a plan that changed nothing, or one that is its own next plan
(`replan._settled`), a host is planned again only when its inputs change; its own job
starting or ending on one of its runners changes them, but where `own_start` or
`own_end` say so, the plan read back would be its last one but for `Plan.singles` (the
single kept open for which 1-GPU job), which they then set, or mark unknown (None).
They then note the host's new `replan.boundary` for `replan.sees`, as `reconcile` does
after a plan. Each case is argued in its docstring from `controller.plan._Reserver`;
tests/test_simulator_replan.py compares with planning every host at every tick.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runnerctl.controller.plan import idle_claim
from runnerctl.sim.hosts import SimHost, SimRunner
from runnerctl.sim.replan import backfill_here, boundary, may_take

if TYPE_CHECKING:
    from runnerctl.sim.simulator import Simulator


def own_start(sim: Simulator, now: float, host_no: int, job_id: int, runner: SimRunner | None) -> bool:
    """A job just started on this host's open single: is the host's next plan its last
    one (so it need not be planned for this)? Yes where that plan kept this very single
    open for this job, the first 1-GPU job in claim order (`Plan.singles`: a job gets one
    only if every 1-GPU job before it did), the host was not to be planned anyway, and
    backfill can open nothing. Then the plan read back has the job gone and its GPU busy
    instead of kept open, which `plan._Reserver` treats alike (no idle slot on it, the
    same crowding and blocks used); jobs before it in claim order did not take that GPU
    (or it would not have been idle for this one); no drain chooses its block by cost
    (after a plan that changed nothing, or `replan._settled`, each drain keeps its
    block); and no block on that GPU is reserved, so each runner gets the same decision.

    Also yes, whichever 1-GPU job started on whichever single (GitLab hands the oldest
    job to the first runner that polls, so in a fleet a host's single often gets another
    job than the one its plan kept it for), where no GPU of the host is idle now. The
    last plan then had this GPU as its only idle one: no idle block, a single kept for
    at most one job; the plan read back has nothing idle, keeps no single (`Plan.singles`
    empty whatever it was, even unknown) and reads no 1-GPU job (only `_Reserver._idle`
    and backfill read them, and a drain reads kept singles only for a job with a known
    timeout); the drains keep their blocks as above.

    Else yes but for which singles are kept (then unknown: None) where no block of the
    host is idle now. This single was open, so no block on its GPU was reserved; the last
    plan then reserved no idle block (one on this GPU would have closed this single, and
    the others are as they were, not idle), the plan read back reserves none either, and
    only which 1-GPU jobs keep which singles may change; decisions are as above."""
    if runner is None or sim.config.policy != "dynamic" or sim.timed_multi:
        return False  # a drain for a multi-GPU job with a timeout avoids kept singles, not busy GPUs
    host = sim.hosts[host_no]
    singles = host.singles
    gpu = runner.slot.gpus[0]
    if (host_no in sim._dirty or runner.slot.size != 1 or host.recheck_at != float("inf")
            or any(gpu in host.slot_of[name].gpus for name in host.reserved)):
        return False
    idle = [owner is None and not host.gated(g, now) for g, owner in enumerate(host.owner)]
    full = not any(idle)
    kept = {} if full or singles is None else singles  # full: the plan read back keeps no single
    known = full or (bool(kept) and next(iter(kept)) == job_id and kept[job_id] == runner.slot.name)
    if not known and any(other.slot.size > 1 and all(idle[g] for g in other.slot.gpus)
                         for other in host.runners):
        return False  # a multi-GPU job may take an idle block, or may have (the docstring's last paragraph)
    policy = sim.config.plan_policy
    if backfill_here(host, idle, policy):
        return False
    host.singles = {job: name for job, name in kept.items() if job != job_id} if known else None
    host.boundary = boundary(host, now, sim._demand_of, policy)
    return True


def own_end(sim: Simulator, now: float, host_no: int, runner: SimRunner | None) -> bool:
    """A job just ended on this host's open single: is the host's next plan its last one
    but for the single kept open (`Plan.singles`)? Yes where the host was not to be
    planned anyway, backfill can open nothing, no block on the GPU is reserved, none on
    it is now idle (free, no GPU closed), and the last plan kept no single open (so the
    first 1-GPU job in claim order found none). Read back, jobs before that one do not
    take the GPU (no idle block on it), that job keeps this single open, a GPU kept open
    counts as a busy one for every later job (`own_start`), drains keep their blocks, and
    each runner gets the same decision. Which job that is (the single it keeps is
    remembered) is the queue's first without fair share; with it, the host is planned.

    Also yes, but for which singles are kept (then unknown: None), on any single, open or
    drained, where no block of the host is idle now and no multi-GPU job's timeout is
    known. Read back, no multi-GPU job finds an idle block (`_Reserver._idle`), so 1-GPU
    jobs may keep other singles than before and nothing else: a drain reads kept singles
    only for a job with a known timeout, and keeps its block; a reserved block on the GPU
    still waits for another job on it (it is not idle) and its singles stay drained; a
    single outside the reserved blocks opens as it was, free as it was with its own job."""
    if runner is None or sim.config.policy != "dynamic":
        return False
    host = sim.hosts[host_no]
    if host_no in sim._dirty or host.recheck_at != float("inf"):
        return False
    if runner.slot.size == 1 and _single_end(sim, now, host, runner):
        return True
    return _drained_end(sim, now, host_no, runner)


def _single_end(sim: Simulator, now: float, host: SimHost, runner: SimRunner) -> bool:
    """`own_end` for a job on a single."""
    gpu = runner.slot.gpus[0]
    if host.gated(gpu, now):
        return False
    idle = [o is None and not host.gated(g, now) for g, o in enumerate(host.owner)]
    known = (runner.open and host.singles is not None and not host.singles and not sim.fair.on
             and not any(gpu in host.slot_of[name].gpus for name in host.reserved))
    if any(other.slot.size > 1 and (gpu in other.slot.gpus or not known)
           and all(idle[g] for g in other.slot.gpus) for other in host.runners):
        return False  # a block (on it) is usable and idle now: a multi-GPU job may take it
    policy = sim.config.plan_policy
    if (not known and sim.timed_multi) or backfill_here(host, idle, policy):
        return False
    if known:
        first = next(iter(sim.queue.by_urgency(1)), None)
        host.singles = {} if first is None else {first: runner.slot.name}
    else:
        host.singles = None
    host.boundary = boundary(host, now, sim._demand_of, policy)
    return True


def _drained_end(sim: Simulator, now: float, host_no: int, runner: SimRunner) -> bool:
    """`own_end` for a job on a single, or on a block that lies in a drained block, where
    the plan's reading ends where it ended (`boundary` is known: every idle block lies
    in a drained block that still waits for a job on it, and backfill opens nothing), no
    multi-GPU job's timeout is known, and no multi-GPU job of the host's demand may take
    an idle slot (`replan.sees`; one it drains for or protects is counted as one that
    may): read back, no multi-GPU job takes an idle slot (`_Reserver._idle`), 1-GPU jobs
    may keep other singles than before (then unknown: None), drains keep their blocks,
    and each runner gets the same decision: the ended job's single opens or stays
    drained as before, and its block's GPUs stay drained (a block outside the drains
    would leave its singles, closed while it ran, to open)."""
    host = sim.hosts[host_no]
    if sim.timed_multi or runner.slot.size > 1 and any(
            all(g not in host.slot_of[name].gpus for name in host.reserved) for g in runner.slot.gpus):
        return False
    policy, demand_of = sim.config.plan_policy, sim._demand_of
    last = boundary(host, now, demand_of, policy)
    if last is None:
        return False
    idle, protected = host.idle_slots, host.protected
    own = protected.union(host.reserved.values())

    def claim(job_id: int) -> tuple[int, float, int]:
        return idle_claim(demand_of(job_id), policy)

    for demand in sim._host_demand(host_no)[0]:
        if demand.gpus > 1 and demand.gpus in idle and (
                demand.job_id in own or may_take(idle[demand.gpus], demand, protected, demand_of, claim)):
            return False
    host.singles, host.boundary = None, last
    return True
