"""Why each pending GPU job still waits, read from the planner's decision of this tick.

Like Slurm's `squeue` reason column (Resources, Priority, ...), every pending job the
host sees gets one code and a sentence. The page never guesses them: `why_waiting`
reads only what `plan.plan` decided (its reservations, the singles it keeps open, its
per-slot decisions) and what it was given (`Observed`: closed GPUs, admin holds, jobs
another host drains for). It runs once per controller tick, not inside `plan` (the
simulator makes plans by the thousand and needs no reasons).

Codes, in the order the fleet page prefers them when hosts disagree (`RANK`):

- `starting`: a runner is open for it now (a block reserved and free, or an idle single
  kept open); gitlab-runner takes it at its next poll.
- `draining`: a block drains for it (here, or on another host that claimed it).
- `priority`: the GPUs it could use are reserved or kept for a job the planner serves
  first (higher priority, or waiting longer with its size counted).
- `resources`: every runner of its size is busy, or this host has none of its size; a
  multi-GPU job whose timeout is unknown and that has not waited
  `PlanPolicy.drain_after_s` yet also says when it may drain a block (`Plan.drains_from`).
- `foreign`: the GPUs of every usable runner of its size are closed by the gate
  (a process outside CI, or unhealthy).
- `held`: an admin paused or drained every runner of its size (`runnerctl pause|drain`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from runnerctl.controller.plan import Decision, Demand, Observed, Plan
from runnerctl.model import slot_key

RANK = {"starting": 0, "draining": 1, "priority": 2, "resources": 3, "foreign": 4, "held": 5, "pinned": 6}
"""Most telling first, where hosts give a job different reasons; `pinned` is the fleet
page's word for a job another host's `host:` tag holds (that host's own reason wins)."""
"""Most telling first: a job one host starts or drains for waits for that host."""


class Waiting(NamedTuple):
    code: str
    detail: str
    elsewhere: bool = False
    """Another host acts for it (drains a block): that host's reason says more."""


def why_waiting(observed: Observed, result: Plan) -> dict[int, Waiting]:
    """Pending job id -> why it waits, for every job in `observed.demand`."""
    decisions = {d.slot.name: d for d in result.decisions}
    holder = {g: job for name, job in result.reserved.items() if name in decisions
              for g in decisions[name].slot.gpus}
    kept = {decisions[name].slot.gpus[0]: job for job, name in result.singles.items() if name in decisions}
    blocks = {job: name for name, job in result.reserved.items()}
    busy = {g: job for s in observed.slots for job in s.running_jobs for g in s.slot.gpus}
    found = {d.job_id: _one(d, observed, decisions, blocks, result.singles, {**holder, **kept}, busy)
             for d in observed.demand}
    if result.drains_from is not None:
        job, at = result.drains_from
        why = found.get(job)
        if why is not None and why.code == "resources":
            wait = _minutes(at - (observed.now or at))
            found[job] = Waiting("resources", f"{why.detail}; drains a block in {wait} if none frees first")
    return found


def _minutes(seconds: float) -> str:
    minutes = max(1, round(seconds / 60))
    return f"{minutes} minute{'s' if minutes != 1 else ''}"


def _one(demand: Demand, observed: Observed, decisions: Mapping[str, Decision],
         blocks: Mapping[int, str], singles: Mapping[int, str], taken: Mapping[int, int],
         busy: Mapping[int, int]) -> Waiting:
    job = demand.job_id
    if job in blocks:
        decision = decisions[blocks[job]]
        key = slot_key(blocks[job])
        running = sorted({busy[g] for g in decision.slot.gpus if g in busy})
        if running:  # open or not, its GPUs still run other jobs
            return Waiting("draining", f"runner {key} drains for it, waiting on job "
                           + ", ".join(map(str, running[:3])) + (" and more" if len(running) > 3 else ""))
        if decision.open:
            return Waiting("starting", f"runner {key} is open for it")
        return Waiting("draining", f"runner {key} drains for it: {decision.reason}")
    if job in singles:
        return Waiting("starting", f"runner {slot_key(singles[job])} is open for it")
    if job in observed.elsewhere:
        return Waiting("draining", "another host drains a block for it", elsewhere=True)
    sized = [s.slot for s in observed.slots if len(s.slot.gpus) == demand.gpus]
    if not sized:
        return Waiting("resources", f"no runner of {demand.gpus} GPU{'s' if demand.gpus != 1 else ''} here")
    held, closed = observed.held, observed.closed
    usable = [s for s in sized if s.name not in held and not any(g in closed for g in s.gpus)]
    if not usable:
        shut = next((g for s in sized if s.name not in held for g in s.gpus if g in closed), None)
        if shut is not None:
            return Waiting("foreign", f"GPU {shut} closed: {closed[shut]}")
        return Waiting("held", f"held by an admin: {held[sized[0].name]}")
    ahead = sorted({taken[g] for s in usable for g in s.gpus if g in taken and taken[g] != job})
    if ahead:
        return Waiting("priority", "behind job " + ", ".join(map(str, ahead[:3])) +
                       (" and more" if len(ahead) > 3 else "") + ", which the planner serves first")
    return Waiting("resources", f"all {len(usable)} runner{'s' if len(usable) != 1 else ''} of its size busy")
