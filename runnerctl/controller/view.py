"""What the controller knows after one tick, and the one place a GPU's occupancy is decided.

The page, `/api/state`, the fleet page, the exporter's `runnerctl_gpu_occupancy_state`
and GPU-seconds only display `ControllerView.occupancy`; none of them classifies a GPU
again, so Grafana and the page cannot disagree about one GPU at one tick (issue 15).

The states, first match wins:

- `unknown`: no GPU snapshot this tick (NVML failed), or the GPU is missing from it;
- `unhealthy`: NVML reports it lost or with errors, or the gate keeps it closed as such;
- `draining` / `paused`: an admin drain or pause over it (the GPU, a slot over it or the
  host), whatever runs there: a job still running under it is named in the detail;
- `ci`: a job runs on a runner over it;
- `foreign`: the gate closed it for foreign use (its cool-down included);
- `draining`: a block waits for its GPUs for a pending job (a job of a smaller slot
  still running there is `ci`);
- `paused`: no runner over it is open (GitLab trouble, a runner that failed to resume);
- `idle`: an open runner over it could take a job (a block opened at once for a pending
  job says so in the detail).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

from runnerctl.controller.demand import PendingJob
from runnerctl.controller.store import Toggle
from runnerctl.controller.toggles import describe, toggle_over_gpu
from runnerctl.controller.waiting import Waiting
from runnerctl.model import GpuSnapshot, slot_key

Occupancy = Literal["idle", "ci", "foreign", "draining", "paused", "unhealthy", "unknown"]
OCCUPANCY: tuple[Occupancy, ...] = ("idle", "ci", "foreign", "draining", "paused", "unhealthy", "unknown")


class GpuOccupancy(NamedTuple):
    state: Occupancy
    detail: str
    toggle: Toggle | None = None  # the admin toggle over the GPU, shown whatever the state


@dataclasses.dataclass(frozen=True)
class SlotView:
    name: str
    gpus: tuple[int, ...]
    runner_id: int
    state: str  # open | paused | draining (a block waiting for its GPUs)
    paused_in_gitlab: bool | None
    reason: str
    running_jobs: tuple[int, ...]
    online: bool | None = None  # GitLab's `online`: gitlab-runner polled lately; None unknown

    @property
    def key(self) -> str:
        """The slot's name on its host (`gpus0-3`), as toggles and the page name it."""
        return slot_key(self.name)


@dataclasses.dataclass(frozen=True)
class GpuView:
    index: int
    open: bool
    reason: str
    unhealthy: bool


@dataclasses.dataclass(frozen=True)
class ControllerView:
    """Everything the controller knows after one tick; replaced, never mutated."""

    host: str
    at: float
    tick: int
    snapshot: GpuSnapshot | None
    slots: tuple[SlotView, ...] = ()
    gpus: tuple[GpuView, ...] = ()
    demand: tuple[PendingJob, ...] = ()
    toggles: tuple[tuple[Toggle, str], ...] = ()  # (toggle, paused|draining (n left)|drained)
    drains: Mapping[str, int] = dataclasses.field(default_factory=dict)
    gitlab_error: str = ""
    api_requests: int = 0
    owners: Mapping[int, tuple[str, str]] = dataclasses.field(default_factory=dict)
    """Running job id -> (user, link), from the executor's leases."""
    unused: tuple[int, ...] = ()
    """Running jobs flagged "requested but unused": GPUs held, idle (controller/history.py)."""
    standby: str = ""
    """The stand-by runner: `online`, `none`, `not yet verified` or why it may not be online."""
    started: Mapping[int, float] = dataclasses.field(default_factory=dict)
    """Running job id -> when its lease was taken (it holds GPUs since), from the leases."""
    waiting: Mapping[int, Waiting] = dataclasses.field(default_factory=dict)
    """Pending job id -> why it waits, from this tick's plan (controller/waiting.py)."""

    @functools.cached_property
    def occupancy(self) -> Mapping[int, GpuOccupancy]:
        """Each GPU's state this tick, decided once (`classify`)."""
        return classify(self)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["snapshot"] = None if self.snapshot is None else dataclasses.asdict(self.snapshot)
        if self.snapshot is not None:
            topology = self.snapshot.topology.items()
            data["snapshot"]["topology"] = {f"{a}-{b}": int(v) for (a, b), v in topology}
        data["toggles"] = [{**dataclasses.asdict(t), "status": s} for t, s in self.toggles]
        data["waiting"] = {job: why._asdict() for job, why in self.waiting.items()}
        data["occupancy"] = {gpu: {"state": o.state, "detail": o.detail,
                                   "toggle": o.toggle.target if o.toggle else None}
                             for gpu, o in self.occupancy.items()}
        return data


def classify(view: ControllerView) -> dict[int, GpuOccupancy]:
    """Every GPU the view knows of (in the snapshot, the gate or a slot) -> its state."""
    known = {g.index for g in view.gpus} | {g for s in view.slots for g in s.gpus}
    gpus = {g.index: g for g in view.snapshot.gpus} if view.snapshot is not None else {}
    gates = {g.index: g for g in view.gpus}
    toggles = [t for t, _ in view.toggles if t.action in ("pause", "drain")]
    host_problem = view.snapshot.host_problem if view.snapshot is not None else ""
    found: dict[int, GpuOccupancy] = {}
    for index in sorted(known | set(gpus)):
        over = [s for s in view.slots if index in s.gpus]
        toggle = toggle_over_gpu(toggles, index, [s.key for s in over])
        found[index] = _one(index, gpus, gates.get(index), over, toggle, view.drains,
                            host_problem)._replace(toggle=toggle)
    return found


def _one(index: int, gpus: Mapping[int, Any], gate: GpuView | None, over: Sequence[SlotView],
         toggle: Toggle | None, drains: Mapping[str, int], host_problem: str = "") -> GpuOccupancy:
    gpu = gpus.get(index)
    if gpu is None:
        return GpuOccupancy("unknown", "no GPU snapshot")
    if gpu.lost or gpu.healthy is False or (gate is not None and gate.unhealthy):
        reason = gate.reason if gate is not None and gate.reason else "NVML reports errors"
        return GpuOccupancy("unhealthy", reason)
    if host_problem:  # unhealthy, so that RunnerctlGpuUnusable pages someone: a reboot mends it
        return GpuOccupancy("unhealthy", host_problem)
    jobs = ", ".join(f"job {job} on {s.key}" for s in over for job in s.running_jobs)
    if toggle is not None:
        return GpuOccupancy("draining" if toggle.action == "drain" else "paused",
                            describe(toggle) + (f"; still running: {jobs}" if jobs else ""))
    if jobs:
        return GpuOccupancy("ci", jobs)
    if gate is not None and not gate.open:  # closed; by whom, NVML may not be able to say
        return GpuOccupancy("foreign" if gpu.processes_known else "unknown", gate.reason)
    waiting = [s for s in over if s.state == "draining"]
    if waiting:
        return GpuOccupancy("draining", f"held for job {drains[waiting[0].name]}"
                            if waiting[0].name in drains else f"held by {waiting[0].key}")
    if not any(s.state == "open" for s in over):
        single = next((s for s in over if len(s.gpus) == 1), None)
        return GpuOccupancy("paused", single.reason if single is not None else "no runner over it is open")
    reserved = [drains[s.name] for s in over if s.state == "open" and s.name in drains]
    return GpuOccupancy("idle", f"reserved for job {reserved[0]}" if reserved else "")
