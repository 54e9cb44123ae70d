"""Backfill into a draining block: keep a single open while short jobs fit before the drain ends.

A block drained for a multi-GPU job waits for its last running job; its idle GPUs do
nothing meanwhile. The planner cannot choose which job a runner gets (GitLab hands an
open single the oldest pending 1-GPU job, docs/controller.md "Which job an open runner
gets"), only which runners are open. So a single on an idle GPU of a draining block is
kept open while the pending 1-GPU jobs GitLab would hand out next are short enough:

- The drain's expected end is the latest `ends_by` (start + GitLab timeout) of the jobs
  still running on the block; GitLab kills a job at its timeout, so it is an upper
  bound. Unknown for any of them: no backfill there.
- With F idle singles open anyway and B backfill singles, GitLab hands out the F + B
  most urgent pending 1-GPU jobs (equal priority: the oldest); each must have a known
  `timeout_s` that ends by `now` + timeout before the drain's expected end, and at most
  `PlanPolicy.backfill_max_s`. The last bound holds whatever the estimates are: a
  backfilled job is killed at its timeout, so it delays the drained job by at most
  `backfill_max_s` even if every running job ends far sooner than its timeout.
- Fewer such jobs pending than open singles: none (a job arriving later could land).

Singles are added in order of their block's expected end, latest first; `recheck_at` is
when the oldest of those jobs would no longer end in time (time alone closes a backfill
single: the simulator plans that host again then). Known gap: with mixed priorities,
GitLab (which knows no priority tag) may hand an older lower-priority job first; and in
a fleet, other hosts' singles take the head of the queue too, so a single here may get
a job after those this plan checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from runnerctl.model import Slot

if TYPE_CHECKING:
    from runnerctl.controller.plan import Decision, Observed, PlanPolicy


def backfill(observed: Observed, busy: Mapping[int, list[str]], reservations: Mapping[str, tuple[Slot, int]],
             decisions: tuple[Decision, ...], policy: PlanPolicy) -> tuple[dict[str, str], float | None]:
    """Singles to open for backfill (name -> reason) and when to plan again (or None)."""
    now = observed.now
    if now is None or not policy.backfill_max_s or not reservations or not busy:
        return {}, None
    ends_by = {s.slot.name: s.ends_by for s in observed.slots}
    closed, held = observed.closed, observed.held
    drain_end: dict[int, tuple[float, int]] = {}  # idle GPU of a draining block -> (expected end, job)
    for block, job in reservations.values():
        holders = {h for g in block.gpus for h in busy.get(g, ())}
        ends = [ends_by.get(h) for h in holders]
        if not holders or any(e is None for e in ends):
            continue  # opens now, or its end is unknown
        end = max(e for e in ends if e is not None)
        drain_end.update((g, (end, job)) for g in block.gpus if g not in busy)
    if not drain_end:
        return {}, None
    free = 0
    candidates = []
    for d in decisions:
        slot = d.slot
        if len(slot.gpus) != 1 or slot.gpus[0] in busy:
            continue
        gpu = slot.gpus[0]
        if d.open:
            free += 1
        elif gpu in drain_end and gpu not in closed and slot.name not in held:
            candidates.append((drain_end[gpu], slot))
    ones = sorted((d for d in observed.demand if d.gpus == 1), key=lambda d: d.urgency)
    opened: dict[str, str] = {}
    limit = float("inf")
    needed = 0.0
    for (end, job), slot in sorted(candidates, key=lambda c: (-c[0][0], c[1].gpus)):
        count = free + len(opened) + 1
        if len(ones) < count:
            break
        timeouts = [d.timeout_s for d in ones[:count]]
        if any(t is None for t in timeouts):
            break
        longest = max(t for t in timeouts if t is not None)
        if longest > policy.backfill_max_s or now + longest > min(limit, end):
            break
        limit, needed = min(limit, end), longest
        opened[slot.name] = f"backfill for job {job}'s drain: pending 1-GPU jobs end by {end:.0f}"
    return opened, (limit - needed if opened else None)
