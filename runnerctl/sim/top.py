"""The top of the simulator's queue: per job size, the jobs any host's plan can act on.

Split from `simulator` (the event loop) so each stays small. What `relevant_demand`
keeps for a host, for every host at once: per size, in each order `plan` reads the jobs
of that size (urgency among the jobs with a timeout, urgency among the others, and
GitLab's hand-out order), as many as a host has slots for and as many again not
claimed by a host. Only a size whose jobs changed (one came, started, was dropped, or
was claimed or let go) is cut again: the cut of any other size reads nothing that
changed. Where urgency order is arrival order (no fair share, one priority and one
kind, with or without a timeout, among the size's pending jobs) the hand-out cut is the
urgency cut, so it is not walked twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runnerctl.sim.simulator import Simulator


class QueueTop:
    def __init__(self, room: Mapping[int, int]) -> None:
        self.room = dict(room)  # size -> slots of that size on a host, plus one
        self.by_size: dict[int, tuple[int, ...]] = {n: () for n in self.room}
        self.ids: frozenset[int] = frozenset()
        self.stale: set[int] = set(self.room)  # sizes to cut again

    def refresh(self, sim: Simulator) -> set[int] | None:
        """Cut the stale sizes again: the jobs that came into or left the top, or None
        if no size's cut changed."""
        stale, self.stale = self.stale, set()
        changed: set[int] | None = None
        for size in stale:
            room = self.room.get(size)
            if room is None:
                continue  # no runner holds that many GPUs: no plan reads such a job
            cut = self._cut(sim, size, room)
            before = self.by_size[size]
            if cut != before:
                changed = changed or set()
                changed.update(set(cut).symmetric_difference(before))
                self.by_size[size] = cut
        if changed is not None:
            self.ids = frozenset(j for jobs in self.by_size.values() for j in jobs)
        return changed

    @staticmethod
    def _cut(sim: Simulator, size: int, room: int) -> tuple[int, ...]:
        claims, queue = sim.claims, sim.queue
        found: dict[int, None] = {}
        aged, credited = queue.counts(size)
        single = not sim.fair.on and queue.one_rank(size) and not (aged and credited)
        order = sim.fair.by_urgency(sim, size)
        if single:  # one kind: the same walk as in arrival order below
            _walk(order, claims, room, found)
            return tuple(found)
        credited_ids = queue.credited(size)
        left = [aged, credited]  # still to see: in age order, with size credits
        kept, unclaimed = [0, 0], [0, 0]
        done = [not aged, not credited]
        for job_id in order:
            kind = int(job_id in credited_ids)
            left[kind] -= 1
            free = job_id not in claims
            if free or kept[kind] < room:
                found[job_id] = None
                kept[kind] += 1
                unclaimed[kind] += free
            if not left[kind] or unclaimed[kind] >= room:  # this kind is cut: the other too?
                done[kind] = True
                if done[1 - kind]:
                    break
        _walk(queue.by_arrival(size), claims, room, found)
        return tuple(found)


def _walk(order: Iterable[int] | Iterator[int], claims: Mapping[int, int], room: int,
          found: dict[int, None]) -> None:
    """Add to `found` the first `room` jobs of this order and as many again unclaimed."""
    kept = unclaimed = 0
    for job_id in order:
        if job_id not in claims:
            found[job_id] = None
            kept += 1
            unclaimed += 1
            if unclaimed >= room:
                return
        elif kept < room:
            found[job_id] = None
            kept += 1
