"""Backfill into a draining block: keep singles and smaller blocks open while short jobs fit.

A block drained for a multi-GPU job waits for its last running job; its idle GPUs do
nothing meanwhile. The planner cannot choose which job a runner gets (GitLab hands an
open single the oldest pending 1-GPU job, docs/controller.md "Which job an open runner
gets"), only which runners are open. So a single on an idle GPU of a draining block is
kept open while the pending 1-GPU jobs GitLab would hand out next are short enough:

- The drain's expected end is the latest `ends_by` (start + GitLab timeout) of the jobs
  still running on the block; GitLab kills a job at its timeout, so it is an upper
  bound of its script's end (its after_script, up to 5 minutes, and cleanup still hold
  the GPUs after it: DESIGN.md section 6). Unknown for any of them: no backfill there.
- With F idle singles open anyway and B backfill singles, GitLab hands out the F + B
  oldest pending 1-GPU jobs (`order.handout_order`: not the planner's urgency, which
  counts priority and fair share, unknown to GitLab); each must have a known
  `timeout_s` that ends by `now` + timeout before the drain's expected end, and at most
  `PlanPolicy.backfill_max_s`. The last bound holds whatever the estimates are: a
  backfilled job is killed at its timeout, so it delays the drained job by at most
  `backfill_max_s` (plus its after_script and cleanup) even if every running job ends
  far sooner than its timeout.
- Fewer such jobs pending than open singles: none (a job arriving later could land).
- Smaller blocks the same way (`_blocks`, first, biggest first): a block smaller than the
  drained one, all on its idle GPUs (a pair or a quad of a host drained for an 8-GPU
  job), opens while the pending jobs of its size that GitLab would hand out (it hands an
  open N-GPU block runner the oldest pending `gpus:N` job) end in time, with timeouts
  at most `PlanPolicy.backfill_blocks_max_s` (3 h; singles 2 h); singles then only on
  the idle GPUs left. On the lab traces, 2-GPU jobs on one host waited up to 2.9x
  easy-oracle's p95 behind drains without it (docs/controller.md).

- By estimate (`PlanPolicy.backfill_estimated`, off by default): a pending job whose
  timeout is unknown counts by its run-time estimate instead (`Demand.estimate_s`, at
  least `MIN_RUNNER_TIMEOUT_S`, GitLab's smallest maximum timeout), and the slot opened
  for it (and every slot opened with it: GitLab may hand the job to any of them) gets a
  deadline, the drain's expected end (`Plan.deadlines`): the controller sets its
  runner's maximum job timeout to end there (`controller.caps`), so GitLab kills a job
  that outruns its estimate at the drain's end, and the drained job waits no longer
  than without backfill (give or take `caps.CAP_SLACK_S` and a tick). An estimate wrong
  by any factor costs the backfilled job, never the drained one.

Singles are added in order of their block's expected end, latest first; `recheck_at` is
when the oldest of those jobs would no longer end in time (time alone closes a backfill
single: the simulator plans that host again then). Known gaps: instance runners take
the jobs of the projects with the fewest running first (`handout_order`); and in a
fleet, other hosts' singles take the head of the queue too, so a single here may get a
job after those this plan checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from runnerctl.controller.order import handout_order
from runnerctl.model import Slot
from runnerctl.settings import MIN_RUNNER_TIMEOUT_S

if TYPE_CHECKING:
    from runnerctl.controller.plan import Decision, Demand, Observed, PlanPolicy

Opened = tuple[dict[str, str], float | None, dict[str, float]]
"""Slots to open (name -> reason), when to plan again (or None), and the deadlines of
the slots opened by estimate (name -> when a job they start must end)."""


def _bounds(jobs: list[Demand], policy: PlanPolicy) -> tuple[float | None, bool]:
    """How long the longest of these jobs runs at most (None: unknown for one of them),
    and whether that rests on an estimate (its slot then needs a deadline)."""
    longest, estimated = 0.0, False
    for d in jobs:
        if d.timeout_s is not None:
            longest = max(longest, d.timeout_s)
        elif policy.backfill_estimated and d.estimate_s is not None:
            longest, estimated = max(longest, d.estimate_s, MIN_RUNNER_TIMEOUT_S), True
        else:
            return None, False
    return longest, estimated


def backfill(observed: Observed, busy: Mapping[int, list[str]], reservations: Mapping[str, tuple[Slot, int]],
             decisions: tuple[Decision, ...], policy: PlanPolicy) -> Opened:
    """Slots to open for backfill, when to plan again, and the estimated ones' deadlines."""
    now = observed.now
    if now is None or not policy.backfill_max_s or not reservations or not busy:
        return {}, None, {}
    ends_by = {s.slot.name: s.ends_by for s in observed.slots if s.ends_by is not None}
    if not ends_by:
        return {}, None, {}  # no running job's end is known, so no drain's
    closed, held = observed.closed, observed.held
    known: list[tuple[Slot, int, float]] = []  # each drain whose end is known: (block, job, expected end)
    for block, job in reservations.values():
        holders = {h for g in block.gpus for h in busy.get(g, ())}
        ends = [ends_by.get(h) for h in holders]
        if not holders or any(e is None for e in ends):
            continue  # opens now, or its end is unknown
        known.append((block, job, max(e for e in ends if e is not None)))
    drain_end: dict[int, tuple[float, int]] = {}  # idle GPU of a draining block -> (expected end, job)
    kept = {d.slot.gpus[0] for d in decisions if d.open and len(d.slot.gpus) == 1}  # in a drain: `plan`
    for block, job, end in known:
        drain_end.update((g, (end, job)) for g in block.gpus if g not in busy and g not in kept)
    if not drain_end:
        return {}, None, {}
    opened: dict[str, str] = {}
    deadlines: dict[str, float] = {}
    recheck = _blocks(observed, busy, reservations, decisions, policy, drain_end, opened, deadlines)
    blocks = len(opened)
    taken = {g for d in decisions if d.slot.name in opened for g in d.slot.gpus}
    free = 0
    candidates = []
    for d in decisions:
        slot = d.slot
        if len(slot.gpus) != 1 or slot.gpus[0] in busy:
            continue
        gpu = slot.gpus[0]
        if d.open:
            free += 1
        elif gpu in drain_end and gpu not in closed and slot.name not in held and gpu not in taken:
            candidates.append((drain_end[gpu], slot))
    ones = sorted((d for d in observed.demand if d.gpus == 1), key=handout_order)
    limit = float("inf")
    needed = 0.0
    singles: dict[str, float] = {}  # backfill singles opened -> their drain's expected end
    guessed = False
    for (end, job), slot in sorted(candidates, key=lambda c: (-c[0][0], c[1].gpus)):
        count = free + len(opened) - blocks + 1
        if len(ones) < count:
            break
        longest, estimated = _bounds(ones[:count], policy)
        if longest is None or longest > policy.backfill_max_s or now + longest > min(limit, end):
            break
        limit, needed = min(limit, end), max(needed, longest)
        opened[slot.name] = f"backfill for job {job}'s drain: pending 1-GPU jobs end by {end:.0f}"
        singles[slot.name] = end
        guessed = guessed or estimated
    if guessed:  # any of these singles may get the job known by estimate only
        _by_estimate(singles, opened, deadlines)
    if len(opened) > blocks:
        recheck = min(recheck, limit - needed)
    return opened, (recheck if opened else None), deadlines


def _blocks(observed: Observed, busy: Mapping[int, list[str]], reservations: Mapping[str, tuple[Slot, int]],
            decisions: tuple[Decision, ...], policy: PlanPolicy, drain_end: Mapping[int, tuple[float, int]],
            opened: dict[str, str], deadlines: dict[str, float]) -> float:
    """The same for blocks smaller than the drained one, all on its idle GPUs, biggest
    first: with F idle open blocks of that size and B backfill ones, the F + B oldest
    pending jobs of that size (`handout_order`) must each end in time, their timeouts at most
    `backfill_blocks_max_s`. Adds to `opened`; returns when the first of them would no
    longer end in time (infinity if none opened)."""
    now = observed.now
    assert now is not None
    closed, held = observed.closed, observed.held
    free: dict[int, int] = {}
    candidates: dict[int, list[tuple[tuple[float, int], Slot]]] = {}
    for d in decisions:
        slot = d.slot
        size = len(slot.gpus)
        if size < 2 or any(g in busy for g in slot.gpus):
            continue
        if d.open:
            free[size] = free.get(size, 0) + 1
        elif (all(g in drain_end and g not in closed for g in slot.gpus) and slot.name not in held
              and slot.name not in reservations and len({drain_end[g] for g in slot.gpus}) == 1):
            candidates.setdefault(size, []).append((drain_end[slot.gpus[0]], slot))
    recheck = float("inf")
    taken: set[int] = set()
    for size in sorted(candidates, reverse=True):
        pending = sorted((d for d in observed.demand if d.gpus == size), key=handout_order)
        count = free.get(size, 0)
        same: dict[str, float] = {}  # this size's backfill blocks opened -> their drain's expected end
        guessed = False
        for (end, job), slot in sorted(candidates[size], key=lambda c: (-c[0][0], c[1].gpus)):
            if taken.intersection(slot.gpus):
                continue
            count += 1
            if len(pending) < count:
                break
            longest, estimated = _bounds(pending[:count], policy)
            if longest is None or longest > policy.backfill_blocks_max_s or now + longest > end:
                break
            opened[slot.name] = f"backfill for job {job}'s drain: pending {size}-GPU jobs end by {end:.0f}"
            same[slot.name] = end
            guessed = guessed or estimated
            taken.update(slot.gpus)
            recheck = min(recheck, end - longest)
        if guessed:
            _by_estimate(same, opened, deadlines)
    return recheck


def _by_estimate(ends: Mapping[str, float], opened: dict[str, str], deadlines: dict[str, float]) -> None:
    """These slots, opened together for jobs of one size, may get a job known by its
    estimate only (GitLab hands them out in its own order): each gets its drain's
    expected end as deadline."""
    for name, end in ends.items():
        deadlines[name] = end
        opened[name] += " (by estimate: killed then)"
