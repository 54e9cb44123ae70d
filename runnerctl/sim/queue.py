"""The simulator's pending jobs: what GitLab hands out and what the planner reads.

Two orders over the same jobs, both kept incrementally (no rescans): per GPU count in
arrival order (GitLab gives a polling runner the oldest pending job its tags cover),
and per GPU count in urgency order (priority, then age: the order `plan` serves).
Arrivals are pushed in (submit time, job id) order, so within a priority arrival order
is urgency order and insertion-ordered dicts are enough.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterator

from runnerctl.tags import PRIORITY_RANK

RANKS = len(PRIORITY_RANK)


class PendingQueue:
    def __init__(self) -> None:
        self._arrival: dict[int, dict[int, None]] = {}  # GPUs -> job ids, oldest first
        self._urgent: dict[int, list[dict[int, None]]] = {}  # GPUs -> per priority rank
        self._rank: dict[int, tuple[int, int]] = {}  # job -> (GPUs, rank)
        self._order: dict[int, int] = {}  # job -> arrival number
        self._credited: dict[int, set[int]] = {}  # GPUs -> jobs with size credits (`order.credited`)

    def __len__(self) -> int:
        return len(self._rank)

    def __contains__(self, job_id: int) -> bool:
        return job_id in self._rank

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._rank))

    def add(self, job_id: int, gpus: int, priority: str, credited: bool = False) -> None:
        rank = PRIORITY_RANK.get(priority, 1)
        self._arrival.setdefault(gpus, {})[job_id] = None
        self._urgent.setdefault(gpus, [{} for _ in range(RANKS)])[rank][job_id] = None
        self._rank[job_id] = (gpus, rank)
        self._order[job_id] = len(self._order)
        if credited:
            self._credited.setdefault(gpus, set()).add(job_id)

    def set_credited(self, job_id: int, credited: bool) -> None:
        """The job now gets size credits, or no longer (its estimate crossed
        `PlanPolicy.credit_estimate_max_s`)."""
        gpus = self._rank[job_id][0]
        if credited:
            self._credited.setdefault(gpus, set()).add(job_id)
        else:
            self._credited.get(gpus, set()).discard(job_id)

    def remove(self, job_id: int) -> None:
        gpus, rank = self._rank.pop(job_id)
        del self._arrival[gpus][job_id]
        del self._urgent[gpus][rank][job_id]
        self._credited.get(gpus, set()).discard(job_id)

    def oldest(self, gpus: int) -> int | None:
        """The job GitLab hands to a runner for `gpus` GPUs."""
        return next(iter(self._arrival.get(gpus, ())), None)

    def by_arrival(self, gpus: int) -> Iterator[int]:
        """Pending jobs of `gpus` GPUs, oldest first (the order GitLab hands them out)."""
        return iter(self._arrival.get(gpus, ()))

    def counts(self, gpus: int) -> tuple[int, int]:
        """Pending jobs of `gpus` GPUs: (in age order, with size credits)."""
        credited = len(self._credited.get(gpus, ()))
        return len(self._arrival.get(gpus, ())) - credited, credited

    def credited(self, gpus: int) -> Collection[int]:
        """Pending jobs of `gpus` GPUs with size credits (`order.credited`)."""
        return self._credited.get(gpus, ())

    def one_rank(self, gpus: int) -> bool:
        """Are the pending jobs of `gpus` GPUs all of one priority (so urgency order,
        without fair share, is arrival order)?"""
        return sum(1 for jobs in self._urgent.get(gpus, ()) if jobs) <= 1

    def sizes(self) -> list[int]:
        return [g for g, jobs in self._arrival.items() if jobs]

    def by_urgency(self, gpus: int) -> Iterator[int]:
        for jobs in self._urgent.get(gpus, ()):
            yield from jobs

    def arrival_order(self) -> list[int]:
        """Every pending job, oldest first (a copy: the caller may start jobs meanwhile)."""
        heads = (list(jobs) for jobs in self._arrival.values())
        return list(heapq.merge(*heads, key=self._order.__getitem__))

    def oldest_fitting(self, free: int) -> int | None:
        """The oldest pending job that asks for at most `free` GPUs (reference policies)."""
        heads = [jobs for gpus, jobs in self._arrival.items() if gpus <= free and jobs]
        return min((next(iter(jobs)) for jobs in heads), key=self._order.__getitem__, default=None)
