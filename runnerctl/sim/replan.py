"""Which hosts the simulator plans again: only those whose plan could change.

Split from `simulator` (the event loop) so each stays small; `reconcile` plans one host
as the controller's loop does. After a plan that changed nothing, `boundary` notes how
far that plan read (`plan._Reserver`): its drained blocks, its idle slots and the jobs
drained for on them, and its last drain's place in `drain_order`. Jobs that enter or
leave the top of the queue or a claim go to the simulator's log; at a tick, `sees` tells
from the log's new part whether any of them could change the host's plan. Where it says
no, planning would give the same plan (tests/test_simulator_replan.py compares with
planning every host at every tick). Backfill (`controller.backfill`) reads the time and
pending jobs' timeouts: a host with idle GPUs in a drained block whose drain end is
known has no `boundary` (any change may open or close a backfill single, pair or quad),
and one whose plan keeps a backfill slot open is planned again at the first beat after its
`recheck_at`. Fewer plans still: a plan that acted is not planned again where it is its
own next plan (`_settled`), nor a host for its own job's start or end where the plan
read back is provably its last one (`sim.own`: `own_start`, `own_end`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from runnerctl.controller.caps import to_send
from runnerctl.controller.claims import waiting
from runnerctl.controller.plan import (
    Demand,
    Observed,
    Plan,
    PlanPolicy,
    cuts_in,
    differences,
    drain_order,
    idle_claim,
    may_drain_from,
    plan,
)
from runnerctl.sim.hosts import SimHost
from runnerctl.tags import PRIORITY_RANK

if TYPE_CHECKING:
    from runnerctl.sim.simulator import Simulator

Boundary = tuple[int, bool, float, int]  # a place in `drain_order`
READ_KEPT = 64  # `boundary`: the reads kept per host (its states recur as jobs come and go)
EVERYTHING: Boundary = (len(PRIORITY_RANK), False, float("inf"), 0)  # after every place
JobRead = tuple[int, Boundary | None, int | None]  # `_read_job`
SliceRead = tuple[frozenset[int], set[int], Boundary | None]  # `_read_slice`
SeesRead = tuple[int, dict[int, JobRead], dict[int, SliceRead]]  # Simulator.sees_read: at which log length


def sees(host: SimHost, host_no: int, sim: Simulator) -> bool:
    """Could the jobs logged since its last plan (`Simulator._log` from `host.seen`), by
    their arrival in, or leaving, this host's demand or its `elsewhere`, change its
    plan? Not if its last plan changed nothing (`boundary` set) and each job is neither
    drained for nor protected there (or is its own claim either way), could take no
    idle slot there (`plan._Reserver._idle`: one that cannot fails in any order,
    and so do those after it of its size), and is no candidate to drain there now (gone,
    or claimed by another host: a candidate that left had failed to drain, or came after
    the last drain), or one after `boundary` in `drain_order` (`plan._Reserver.run` reads
    no further) or that finds no block it may take. The one candidate that neither
    failed nor came after is the job that held new drains back, too young
    (`Plan.drains_from`, `host.stopped_by`): any news of it plans the host again (it came
    of age, `Simulator._old_enough`, left, or another host claimed it).

    A 1-GPU job where every idle slot is a single and no multi-GPU job's timeout is
    known changes only which job a single is kept for (`Plan.singles`, then unknown:
    None): decisions open a single outside the drains and close one inside either way
    (`decide`; singles kept in a drain matter only to a drain for a job whose timeout is
    known, `_Reserver._drain`), no multi-GPU job can use its GPU (no idle block), and the
    drains keep their blocks."""
    last = host.boundary
    if last is None:
        return True
    log, start = sim._log, host.seen - sim._logged  # its new part: log[start:]
    at = sim._logged + len(log)
    if sim.sees_read[0] != at:  # read again after each change of the top or of a claim
        sim.sees_read = at, {}, {}
    read, slices = sim.sees_read[1], sim.sees_read[2]
    whole = slices.get(host.seen)  # what the hosts that read the log from here read of it
    if whole is None:
        whole = slices[host.seen] = _read_slice(sim, log[start:], read)
    ids, sizes, first = whole
    protected, idle, stopped = host.protected, host.idle_slots, host.stopped_by
    if ((first is None or not first < last) and (not idle or idle.keys().isdisjoint(sizes))
            and protected.isdisjoint(ids) and host.claimed.isdisjoint(ids)
            and (not host.reserved or ids.isdisjoint(host.reserved.values()))
            and (stopped is None or stopped not in ids)):
        # the loop below finds nothing: none unclaimed before its last drain, none that fits an
        # idle slot, no job of the host's own (drained for or protected), none claimed by it;
        # but a multi-GPU job coming or going may leave one alone here (`_lone`)
        return not host.block_sizes.isdisjoint(sizes) and _lone(sim, host, host_no)
    policy, claims, blocks, demand_of = sim.config.plan_policy, sim.claims, host.blocks, sim._demand_of
    own = protected.union(host.reserved.values()) if host.reserved else protected  # drained for or protected

    def claim(job_id: int) -> tuple[int, float, int]:
        return idle_claim(demand_of(job_id), policy)

    only_singles = idle.keys() == {1} and not sim.timed_multi  # see the docstring's last paragraph
    for job_id in log[start:]:
        if job_id == stopped:  # it held new drains back: it came of age, left, or another host claimed it
            again = _held_again(sim, host, host_no)
            if again is None:
                return True
            stopped, last = host.stopped_by, again
            continue
        if job_id in own:
            if job_id in host.claimed and claims.get(job_id) == host_no and job_id in sim.queue:
                continue  # its own either way, claimed since before its last plan (no other host may)
            return True
        found = read.get(job_id)
        if found is None:
            found = read[job_id] = _read_job(sim, job_id)
        gpus, order, claimer = found
        if only_singles and gpus == 1:
            host.singles = None  # which 1-GPU job keeps which single: all it could change
            continue
        if idle and gpus in idle and may_take(idle[gpus], demand_of(job_id), protected, demand_of, claim):
            return True
        if order is not None and order < last and (claimer is None or claimer == host_no) \
                and may_take(blocks.get(gpus, ()), demand_of(job_id), protected, demand_of, claim):
            return True
    return not host.block_sizes.isdisjoint(sizes) and _lone(sim, host, host_no)


def _lone(sim: Simulator, host: SimHost, host_no: int) -> bool:
    """Is one multi-GPU job, not yet protected here, now the only one waiting for this
    host? Its plan protects it (`plan._Reserver`: it came when no other waited), which
    also lets it drain without waiting (`PlanPolicy.drain_after_s`), even where it can
    take no block now."""
    at = sim._logged + len(sim._log)  # the top and the claims change only with the log
    key = at, host.slot_sizes
    crowded = sim.crowded.get(key)
    if crowded is None:
        if len(sim.crowded) > 64:
            sim.crowded.clear()
        crowded = sim.crowded[key] = _crowded(sim, host.slot_sizes)
    if crowded:
        return False
    demand, elsewhere = sim._host_demand(host_no)
    sizes = host.slot_sizes
    waiting = [d.job_id for d in demand if d.gpus > 1 and d.gpus in sizes and d.job_id not in elsewhere]
    return (len(waiting) == 1 and waiting[0] not in host.protected
            and waiting[0] not in host.reserved.values())


def _crowded(sim: Simulator, sizes: frozenset[int]) -> bool:
    """Do two unclaimed multi-GPU jobs of these sizes wait at the top of the queue? They
    wait for every host with those sizes: none is alone there (`_lone`)."""
    unclaimed, claims = 0, sim.claims
    for size in sizes:
        if size > 1:
            for job_id in sim.top.by_size.get(size, ()):
                if job_id not in claims:
                    unclaimed += 1
                    if unclaimed > 1:
                        return True
    return False


def _held_again(sim: Simulator, host: SimHost, host_no: int) -> Boundary | None:
    """The job that held new drains back in the host's last plan (`host.stopped_by`) is
    no longer a candidate there (another host claimed it, it started or left the top),
    and the next candidate in `drain_order` that may take a block here is too young as
    well: the plan's decisions stay, only the job that holds drains back changes (noted,
    with the boundary at its place, which it returns). None where the host must plan:
    the job is still a candidate here (it came of age), the next one may drain, a block
    is reserved for a job after it (it may keep its drain now), or there is none. (A job
    left alone here, which the plan would protect, `sees` finds after: `_lone`.)"""
    stopped, now, policy = host.stopped_by, sim._last_tick, sim.config.plan_policy
    if stopped is None:
        return None
    protected, reserved, demand_of = host.protected, set(host.reserved.values()), sim._demand_of
    # a host with no job of its own reads the queue's top as every such host does: read once
    key = (sim._logged + len(sim._log), stopped) if not (protected or reserved or host.claimed) else None
    after = sim.held_read.get(key) if key is not None else None
    if after is None:
        demand, elsewhere = sim._host_demand(host_no)
        if any(d.job_id == stopped for d in demand if d.job_id not in elsewhere):
            after = []  # still a candidate here: it came of age
        else:
            place = drain_order(demand_of(stopped), protected, policy)
            after = sorted((order, d) for d in demand
                           if d.gpus > 1 and d.job_id not in elsewhere and d.job_id not in protected
                           and (order := drain_order(d, protected, policy)) > place)
        if key is not None:
            if len(sim.held_read) > 64:
                sim.held_read.clear()
            sim.held_read[key] = after

    def claim(job_id: int) -> tuple[int, float, int]:
        return idle_claim(demand_of(job_id), policy)

    for order, candidate in after:  # in drain order
        if candidate.job_id in reserved:
            return None
        if not may_take(host.blocks.get(candidate.gpus, ()), candidate, protected, demand_of, claim):
            continue  # it fails to drain here: the plan reads the next
        if may_drain_from(candidate, protected, policy) <= now:  # as `plan._Reserver._too_young`
            return None
        host.stopped_by, host.boundary = candidate.job_id, order
        return order
    return None


def _read_slice(sim: Simulator, changed: Iterable[int], read: dict[int, JobRead]) -> SliceRead:
    """What `sees` reads of a part of the log, the same for every host that reads that part:
    its jobs, their sizes, and the first place in `drain_order` among those no host claimed."""
    ids, sizes, first = frozenset(changed), set(), None
    for job_id in ids:
        found = read.get(job_id)
        if found is None:
            found = read[job_id] = _read_job(sim, job_id)
        gpus, order, claimer = found
        sizes.add(gpus)
        if order is not None and claimer is None and (first is None or order < first):
            first = order
    return ids, sizes, first


def _read_job(sim: Simulator, job_id: int) -> JobRead:
    """What `sees` reads of a job, the same for every host while the top of the queue and
    the claims stay as they are: its GPUs, its place in `drain_order` if it is a multi-GPU
    job at the top (not protected: `sees` handles a host's protected jobs before), and the
    host that claimed it, if any."""
    gpus = sim.jobs[job_id].gpus
    at_top = gpus > 1 and job_id in sim.top_ids
    order = drain_order(sim._demand_of(job_id), frozenset(), sim.config.plan_policy) if at_top else None
    return gpus, order, sim.claims.get(job_id)


def may_take(slots: Iterable[tuple[int, ...]], demand: Demand, protected: frozenset[int],
              demand_of: Callable[[int], Demand], claim: Callable[[int], tuple[int, float, int]]) -> bool:
    """Of these slots, each given as the jobs drained for on its GPUs (the distinct such
    sets: `boundary`): is there one that this job may take from each of them (`plan.cuts_in`)?"""
    return any(all(cuts_in(demand, demand_of(other), protected, claim) for other in holders)
               for holders in slots)


def boundary(host: SimHost, now: float, demand_of: Callable[[int], Demand],
             policy: PlanPolicy) -> Boundary | None:
    """After a plan that changed nothing (`sees`), if each idle block lies in a block
    drained for a job (still busy, so no block opened on idle GPUs, and only a job that
    may cut in takes an idle block): how far in `drain_order` it read, to its last drain
    if it drained as many blocks as it may, everything if it drained none (each
    candidate failed); else None (with an idle block outside the drains, a job that
    takes it may make a drain give way to a later one). Where a job too young to drain
    stopped new drains (`host.stopped_by`), its place: no job after it starts one. Notes
    the blocks and the idle slots with the jobs drained for on their GPUs. An idle GPU
    outside the drains in no idle block is a single that opens whichever 1-GPU job it is
    kept for, and that no multi-GPU job takes; a job that may take it is one that may
    change the plan (`sees`), but for a 1-GPU job where only singles are idle and no
    multi-GPU job's timeout is known (which job keeps which single changes, nothing
    else: `sees`)."""
    owner = host.owner
    drained: dict[int, int] = {}
    for name, job_id in host.reserved.items():
        gpus = host.slot_of[name].gpus
        if all(owner[g] is None for g in gpus):
            return None  # open on idle GPUs
        drained.update((g, job_id) for g in gpus)
    # SimHost.gated and the idle GPUs, inline
    gated = [bool(n) or until > now for n, until in zip(host.foreign, host.closed_until, strict=True)]
    idle = [o is None and not shut for o, shut in zip(owner, gated, strict=True)]
    if any(all(idle[g] for g in block) for gpu, free in enumerate(idle) if free and gpu not in drained
           for block in host.blocks_on[gpu]):
        return None  # an idle block outside the drains
    if backfill_here(host, idle, policy):
        return None  # a 1-GPU job coming or going may open or close a backfill single
    if not drained and not any(gated) and not any(idle):  # every block usable, none drained, nothing idle
        host.blocks, host.idle_slots = host.all_blocks, {}
    else:
        key = (tuple(host.reserved.items()), tuple(gated), tuple(idle))
        found = host.read.get(key)
        if found is None:  # else read for the same drains, closed and idle GPUs before
            if len(host.read) >= READ_KEPT:
                host.read.clear()
            found = host.read[key] = _read(host, drained, gated, idle)
        host.blocks, host.idle_slots = found
    if host.stopped_by is not None:  # no new drain after it (`plan._Reserver._too_young`)
        return drain_order(demand_of(host.stopped_by), host.protected, policy)
    if not host.reserved:
        return EVERYTHING
    if len(host.reserved) != policy.max_draining:
        return None
    return max(drain_order(demand_of(j), host.protected, policy) for j in host.reserved.values())


def _read(host: SimHost, drained: dict[int, int], gated: list[bool],
          idle: list[bool]) -> tuple[dict[int, set[tuple[int, ...]]], dict[int, set[tuple[int, ...]]]]:
    """`boundary`'s blocks and idle slots of the host, each with the jobs drained for on it."""
    blocks: dict[int, set[tuple[int, ...]]] = {}
    idle_slots: dict[int, set[tuple[int, ...]]] = {}
    for runner in host.runners:
        gpus = runner.slot.gpus
        if any(gated[g] for g in gpus):
            continue  # not usable
        holders = tuple({drained[g] for g in gpus if g in drained})
        if len(gpus) > 1:
            blocks.setdefault(len(gpus), set()).add(holders)
        if all(idle[g] for g in gpus):
            idle_slots.setdefault(len(gpus), set()).add(holders)
    return blocks, idle_slots


def backfill_here(host: SimHost, idle: list[bool], policy: PlanPolicy) -> bool:
    """Could `controller.backfill` open anything on this host (`_may_backfill` on any of
    its drained blocks)?"""
    return bool(policy.backfill_max_s) and any(_may_backfill(host, host.slot_of[name].gpus, idle)
                                               for name in host.reserved)


def _may_backfill(host: SimHost, gpus: tuple[int, ...], idle: list[bool]) -> bool:
    """Could `controller.backfill` open a slot (a single, or a smaller block) in this
    drained block? Only on an idle GPU, and only if the drain's end is known: each job
    running on the block has an `ends_by` (its timeout). Else it opens none there,
    whatever the queue or the time."""
    return any(idle[g] for g in gpus) and all(r.ends_by is not None for r in host.runners
                                              if r.job is not None and any(g in gpus for g in r.slot.gpus))


def set_caps(sim: Simulator, host: SimHost, result: Plan, now: float) -> None:
    """The maximum timeouts the controller sets before its runners open (`caps.to_send`:
    backfill by estimate), one GitLab call each. `SimRunner.cap` None: the runner's own
    (`SimConfig.runner_cap`)."""
    opens = [d.slot.name for d in result.decisions if d.open]
    by_name = host.runner_of
    base = {name: sim.base_cap(by_name[name]) for name in opens}
    current = {name: base[name] if by_name[name].cap is None else by_name[name].cap for name in opens}
    for name, cap in to_send(opens, result.deadlines, base, current, now).items():
        by_name[name].cap = None if cap == base[name] else cap
        (host.capped.discard if cap == base[name] else host.capped.add)(name)
        sim.actions += 1
    host.deadlines = dict(result.deadlines)


def reconcile(sim: Simulator, now: float, host_no: int) -> None:
    """Plan one host the way the controller's loop does (plan, then `differences`), apply
    the runner changes and record what other hosts must see (claims, the replan log)."""
    host = sim.hosts[host_no]
    host.seen = sim._logged + len(sim._log)
    closed = {g: "foreign" for g in range(len(host.owner)) if host.gated(g, now)}
    demand, elsewhere = sim._host_demand(host_no)
    observed = Observed(tuple([r.state for r in host.runners]), closed, demand, host.reserved,
                        protected=host.protected, elsewhere=elsewhere, now=now)
    result = plan(observed, sim.config.plan_policy)
    sim.plans += 1
    host.stopped_by = None if result.drains_from is None else result.drains_from[0]
    host.recheck_at = float("inf") if result.recheck_at is None else result.recheck_at
    host.singles = result.singles
    if result.deadlines or host.capped:
        set_caps(sim, host, result, now)
    if result.recheck_at is not None:  # time alone closes a backfill single: a tick then
        sim._schedule_tick((result.recheck_at // sim.config.reconcile_s + 1) * sim.config.reconcile_s)
    pauses, resumes = differences(result.decisions, host.paused)
    by_name = host.runner_of
    for decision in [*pauses, *resumes]:
        runner = by_name[decision.slot.name]
        runner.open = decision.open
        host.paused[decision.slot.name] = not decision.open
        runner.refresh()
        if runner.open and runner.job is None:
            host.idle.add(runner.index)
        else:
            host.idle.discard(runner.index)
        sim.actions += 1
    if resumes:
        sim._want_poll(now)
    reserved = dict(result.reserved)
    for name, job_id in reserved.items():
        sim.first_block.setdefault(job_id, (host_no, by_name[name].slot.gpus))
    drained = host.drained | {reserved[name] for name in waiting(observed, result)
                              if reserved[name] in result.claims} if reserved else host.drained
    if (not pauses and not resumes and reserved == host.reserved and result.protected == host.protected
            and drained == host.drained):
        sim._dirty.discard(host_no)
        host.boundary = boundary(host, now, sim._demand_of, sim.config.plan_policy)
        return
    settled = _settled(host, result, demand, elsewhere, sim.config.plan_policy)
    host.reserved, host.protected = reserved, result.protected
    host.drained = drained
    if settled:  # planning again with what it remembers now gives this plan
        sim._dirty.discard(host_no)
        host.boundary = boundary(host, now, sim._demand_of, sim.config.plan_policy)
    else:  # plan again next beat
        host.boundary = None
    sim._want_tick(now)
    claims = set(result.claims) | drained
    if claims != host.claimed:
        for job_id in host.claimed - claims:
            sim.claims.pop(job_id, None)
        for job_id in claims - host.claimed:
            sim.claims[job_id] = host_no
        changed = claims.symmetric_difference(host.claimed)
        host.claimed = claims
        sim._common = None
        sim.top.stale.update(sim.jobs[j].gpus for j in changed)
        sim._refresh_top()
        sim._log.extend(changed)  # other hosts' `elsewhere`


def _settled(host: SimHost, result: Plan, demand: Iterable[Demand], elsewhere: frozenset[int],
             policy: PlanPolicy) -> bool:
    """After a plan that acted: is it its own next plan (a fixed point)? Of what the host
    remembers (`host.reserved`, still what this plan read), `plan` reads its drains only
    for jobs in the demand (`draining`, a drain that keeps its block, whether a lone
    multi-GPU job is protected) and its protected jobs, which it returns as it read them
    but for that lone job (added again if read again). Runners' paused states it does not
    read; what it drained and claimed it gives again. So the next plan is this one if the
    drains it returns are those it read (jobs gone from the demand left out) plus:
    - idle blocks taken by jobs another host claimed: such a job never drains here and is
      never protected here (`_Reserver`), so each job before it in claim order may cut in
      on its block, as it may on an untaken one, and those after it find it taken;
    - with one drain at most, a new drain on a block where no idle GPU was taken (no
      single kept open, no idle block on it): read back, it only keeps jobs that may not
      cut in on it from GPUs they did not take, earlier drain candidates (which found no
      block) find fewer, and its job keeps it.
    Then, as after a plan that changed nothing, only a change in its inputs plans the host
    again (tests/test_simulator_replan.py compares with planning every host at every tick)."""
    before, after = host.reserved, result.reserved
    ids = {d.job_id for d in demand} if before else set()
    kept = {name: job for name, job in before.items() if job in ids}
    if any(after.get(name) != job for name, job in kept.items()):
        return False
    new = [name for name, job in after.items() if name not in kept and job not in elsewhere]
    if not new:
        return True
    if len(new) > 1 or policy.max_draining != 1:
        return False
    block = host.slot_of[new[0]].gpus
    owner = host.owner
    if any(host.slot_of[name].gpus[0] in block for name in result.singles.values()):
        return False
    return not any(runner.slot.size > 1 and all(owner[g] is None for g in runner.slot.gpus)
                   and any(g in block for g in runner.slot.gpus) for runner in host.runners)
