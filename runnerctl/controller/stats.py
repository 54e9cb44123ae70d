"""What the controller accumulates tick by tick for monitoring: counters, histograms, occupancy.

A `ControllerView` is a picture of one instant; Prometheus also wants what happened
between pictures (GPU-seconds per occupant class, how long jobs waited, how long a
tick took, how many drains, idle blocks opened for jobs and gate decisions). The loop
hands every finished view, its tick duration and each event to `ControllerStats`,
which folds them into one frozen `StatsView` replaced per tick. The exporter reads
only that view (it carries the `ControllerView` it was made from, so a scrape never
mixes two ticks) and never calls NVML or GitLab.

Occupancy of a GPU over the interval between two ticks is the class it had at the
first of them, so per GPU the classes add up to the time since the first tick, exactly.
A GPU once read stays in the stats: while NVML cannot be read, or no longer lists it
(fallen off the bus), it is `unknown`, so an alert sees it instead of its series ending.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

from runnerctl.controller.store import Event
from runnerctl.controller.view import ControllerView
from runnerctl.model import Gpu, GpuProcess

log = logging.getLogger(__name__)

WAIT_BUCKETS_S = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0)
"""Job wait buckets (s): from a free GPU picked at the next runner poll to a day-long wait."""
RECONCILE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Tick duration buckets (s): a tick without GitLab calls takes milliseconds, one with
several GitLab requests up to the request timeout."""
PENDING_MEMORY_S = 3600.0
"""A job seen pending is remembered this long (s) after it was last seen, to time its wait."""
IsCi = Callable[[int, GpuProcess], bool]


@runtime_checkable
class CountsRequests(Protocol):
    """A GitLab port that counts its HTTP requests by status (`PythonGitLab` does)."""

    requests_by_status: Mapping[str, int]


@dataclasses.dataclass(frozen=True)
class Histogram:
    """Cumulative counts per upper bound (the last bucket is +Inf), sum and count."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...] = ()
    sum: float = 0.0

    @property
    def count(self) -> int:
        return self.counts[-1] if self.counts else 0

    def observe(self, value: float) -> Histogram:
        counts = self.counts or (0,) * (len(self.bounds) + 1)
        bumped = tuple(c + (1 if i == len(self.bounds) or value <= self.bounds[i] else 0)
                       for i, c in enumerate(counts))
        return dataclasses.replace(self, counts=bumped, sum=self.sum + value)


@dataclasses.dataclass(frozen=True)
class StatsView:
    """Everything the exporter shows, as of one tick; replaced, never mutated."""

    view: ControllerView
    first_at: float  # clock of the first tick these counters cover
    ticks: int
    occupancy: Mapping[int, str]  # GPU index -> class now
    foreign_processes: Mapping[int, int]  # GPU index -> processes not under a CI lease (absent: unknown)
    gpu_seconds: Mapping[tuple[int, str], float]  # (GPU index, class) -> seconds
    job_waits: Mapping[int, Histogram]  # GPUs asked -> wait from creation to start
    reconcile: Histogram
    events: Mapping[str, int]  # event kind (drain, reserve, gate-close, pause-failed, ...) -> count
    drains: Mapping[str, int]  # block name -> real drains started for it (event `drain`)
    reserves: Mapping[str, int]  # block name -> times opened at once on idle GPUs for a job
    admin_toggles: Mapping[str, int]  # pause | drain -> toggles seen
    gitlab_requests: Mapping[str, int] | None  # HTTP status -> count; None if not counted
    token_expires_at: float | None = None
    """When GitLab starts refusing the controller's token (controller/token_expiry.py);
    None: never, or not read."""
    known_gpus: Mapping[int, Gpu] = dataclasses.field(default_factory=dict)
    """GPU index -> the GPU as the last snapshot that had it read it: its identity (UUID,
    model) stays while NVML cannot be read or no longer lists it, so its series keep
    their labels."""


def occupancy(view: ControllerView, gpus: tuple[int, ...]) -> dict[int, str]:
    """Each GPU's state as the view decided it (controller/view.py), unknown for a GPU
    it no longer knows of."""
    found = view.occupancy
    return {g: found[g].state if g in found else "unknown" for g in gpus}


class ControllerStats:
    """Folds views and events into a `StatsView`; only the loop's thread calls it."""

    def __init__(self) -> None:
        self.view: StatsView | None = None
        self._gpus: tuple[int, ...] = ()
        self._known: dict[int, Gpu] = {}
        self._gpu_seconds: dict[tuple[int, str], float] = {}
        self._waits: dict[int, Histogram] = {}
        self._reconcile = Histogram(RECONCILE_BUCKETS_S)
        self._events: Counter[str] = Counter()
        self._drains: Counter[str] = Counter()
        self._reserves: Counter[str] = Counter()
        self._admin: Counter[str] = Counter()
        self._toggles_seen: set[tuple[str, str, float]] = set()
        self._pending: dict[int, tuple[int, float, float]] = {}  # job -> (GPUs, pending since, last seen)
        self._running: set[int] = set()

    def event(self, event: Event) -> None:
        self._events[event.kind] += 1
        if event.kind == "drain":  # the planner's; an admin's drain toggle is not an event here
            self._drains[event.subject] += 1
        elif event.kind == "reserve":
            self._reserves[event.subject] += 1

    def observe(self, view: ControllerView, *, duration_s: float, is_ci: IsCi,
                gitlab: object = None, token_expires_at: float | None = None) -> StatsView:
        if view.snapshot is not None:  # a GPU seen once stays: missing from a read, it is unknown
            self._known.update((g.index, g) for g in view.snapshot.gpus)
            self._gpus = tuple(sorted(self._known))
        previous = self.view
        if previous is not None:
            elapsed = max(0.0, view.at - previous.view.at)
            for gpu in self._gpus:
                key = (gpu, previous.occupancy.get(gpu, "unknown"))
                self._gpu_seconds[key] = self._gpu_seconds.get(key, 0.0) + elapsed
        self._reconcile = self._reconcile.observe(duration_s)
        self._time_waits(view)
        self._count_toggles(view)
        foreign = {} if view.snapshot is None else {  # a GPU whose processes NVML cannot list: none
            g.index: sum(1 for p in g.processes if not is_ci(g.index, p))
            for g in view.snapshot.gpus if g.processes_known}
        requests = dict(gitlab.requests_by_status) if isinstance(gitlab, CountsRequests) else None
        self.view = StatsView(
            view=view, first_at=previous.first_at if previous else view.at,
            ticks=(previous.ticks if previous else 0) + 1, occupancy=occupancy(view, self._gpus),
            foreign_processes=foreign, gpu_seconds=dict(self._gpu_seconds), job_waits=dict(self._waits),
            reconcile=self._reconcile, events=dict(self._events), drains=dict(self._drains),
            reserves=dict(self._reserves),
            admin_toggles=dict(self._admin), gitlab_requests=requests, token_expires_at=token_expires_at,
            known_gpus=dict(self._known))
        return self.view

    def _time_waits(self, view: ControllerView) -> None:
        """A job seen pending and now running on a slot waited from its queueing (a later
        stage's job is created hours before) until now (the first tick that sees it
        running: at most one interval late)."""
        running = {job for slot in view.slots for job in slot.running_jobs}
        for job in running - self._running:
            found = self._pending.pop(job, None)
            if found is not None and found[1] > 0:
                gpus = found[0]
                wait = max(0.0, view.at - found[1])
                self._waits[gpus] = self._waits.get(gpus, Histogram(WAIT_BUCKETS_S)).observe(wait)
        self._running = running
        for pending in view.demand:
            if pending.job_id not in running:
                self._pending[pending.job_id] = (pending.gpus, pending.pending_since, view.at)
        for job in [j for j, (_, _, seen) in self._pending.items() if view.at - seen > PENDING_MEMORY_S]:
            del self._pending[job]

    def _count_toggles(self, view: ControllerView) -> None:
        current = {(t.target, t.action, t.at) for t, _ in view.toggles}
        for _, action, _ in current - self._toggles_seen:
            self._admin[action] += 1
        self._toggles_seen = current
