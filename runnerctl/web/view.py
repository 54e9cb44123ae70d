"""What the page shows, computed from the controller's frozen view and the store.

The page and scripts read these pydantic models through the JSON API (so they are the
OpenAPI schema too). Nothing here calls NVML or GitLab: a GPU's state is derived from
the last `ControllerView` (gate, slots, running jobs, toggles, drains) and the store's
events; a GPU's state and its detail are the view's own (`ControllerView.occupancy`),
displayed, never decided again here. Secrets never enter these models: only names,
numbers and reasons.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from pydantic import BaseModel

from runnerctl.controller.store import Event, Toggle
from runnerctl.controller.view import ControllerView, GpuOccupancy, Occupancy, SlotView
from runnerctl.model import Gpu


class ProcessOut(BaseModel):
    pid: int
    user: str | None
    memory_mib: int | None
    command: str | None


class JobOut(BaseModel):
    job_id: int
    slot: str
    user: str | None
    url: str | None
    runtime_s: float
    unused: bool = False  # "requested but unused": GPUs held, idle (controller/history.py)


class ToggleOut(BaseModel):
    target: str
    action: str
    who: str
    at: float
    why: str
    status: str


class GpuOut(BaseModel):
    index: int
    name: str
    state: Occupancy
    detail: str
    utilization: float | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    processes: list[ProcessOut]
    jobs: list[JobOut]
    toggle: ToggleOut | None


class SlotOut(BaseModel):
    name: str
    key: str
    gpus: list[int]
    state: str
    open: bool
    reason: str
    running_jobs: list[int]


class DemandOut(BaseModel):
    job_id: int
    gpus: int
    project_id: int
    priority: str
    user: str | None
    url: str | None
    waiting_s: float


class EventOut(BaseModel):
    at: float
    host: str
    kind: str
    subject: str
    detail: str


class HostOut(BaseModel):
    host: str
    at: float
    tick: int
    gitlab_error: str
    gpus: list[GpuOut]
    slots: list[SlotOut]
    demand: list[DemandOut]
    activity: list[str]
    toggles: list[ToggleOut]
    events: list[EventOut]


class JobMemory:
    """Who submitted a job and its link, remembered from demand (GitLab forgets neither,
    but the controller stops listing a job once it runs); and when it was first seen running
    (a job's run time where its lease does not say when it started).

    The page's request threads share one: `update` holds a lock (two at once raised
    "dictionary changed size during iteration", a 500; found by a review as a concurrency
    engineer), and forgets the jobs neither pending nor running here (those that ran on
    another host were kept for ever)."""

    def __init__(self) -> None:
        self.owner: dict[int, tuple[str | None, str | None]] = {}
        self.first_seen: dict[int, float] = {}
        self._lock = threading.Lock()

    def update(self, view: ControllerView) -> None:
        with self._lock:
            for job in view.demand:
                self.owner[job.job_id] = (job.user, job.web_url)
            for job_id, (user, url) in view.owners.items():  # the lease's: jobs never seen pending
                known = self.owner.get(job_id, (None, None))
                self.owner[job_id] = (known[0] or user or None, known[1] or url or None)
            running = {j for s in view.slots for j in s.running_jobs}
            for job_id in running:
                self.first_seen.setdefault(job_id, view.at)
            for job_id in [j for j in self.first_seen if j not in running]:
                del self.first_seen[job_id]
            keep = running | {job.job_id for job in view.demand} | set(view.owners)
            for job_id in [j for j in self.owner if j not in keep]:
                del self.owner[job_id]


def host_page(view: ControllerView, events: Iterable[Event], jobs: JobMemory) -> HostOut:
    jobs.update(view)
    toggles = [ToggleOut(target=t.target, action=t.action, who=t.who, at=t.at, why=t.why, status=status)
               for t, status in view.toggles]
    gpus = [_gpu(gpu, view, toggles, jobs) for gpu in (view.snapshot.gpus if view.snapshot else ())]
    return HostOut(
        host=view.host, at=view.at, tick=view.tick, gitlab_error=view.gitlab_error, gpus=gpus,
        slots=[_slot(s) for s in view.slots],
        demand=[DemandOut(job_id=d.job_id, gpus=d.gpus, project_id=d.project_id, priority=d.priority,
                          user=d.user, url=d.web_url, waiting_s=max(0.0, view.at - d.pending_since))
                for d in view.demand],
        activity=activity(view), toggles=toggles, events=[event_out(e) for e in events])


def event_out(event: Event) -> EventOut:
    return EventOut(at=event.at, host=event.host, kind=event.kind, subject=event.subject, detail=event.detail)


def toggle_out(toggle: Toggle, status: str = "") -> ToggleOut:
    return ToggleOut(target=toggle.target, action=toggle.action, who=toggle.who, at=toggle.at,
                     why=toggle.why, status=status)


def activity(view: ControllerView) -> list[str]:
    """What the controller is doing, one sentence per drain ("draining GPUs 4-7 for job 1234,
    waiting on 2 jobs")."""
    lines = []
    by_name = {s.name: s for s in view.slots}
    for name, job in sorted(view.drains.items()):
        slot = by_name.get(name)
        if slot is None:
            continue
        busy = sum(len(s.running_jobs) for s in view.slots
                   if s.name != name and set(s.gpus) & set(slot.gpus))
        if busy:
            lines.append(f"draining GPUs {_span(slot.gpus)} for job {job}, "
                         f"waiting on {busy} job{'s' if busy != 1 else ''}")
        else:
            lines.append(f"reserved GPUs {_span(slot.gpus)} for job {job}, opening")
    closed = [g for g in view.gpus if not g.open]
    lines.extend(f"GPU {g.index} closed: {g.reason}" for g in closed)
    if not lines:
        lines.append("nothing pending: every free runner is open" if view.tick else "starting")
    return lines


def _gpu(gpu: Gpu, view: ControllerView, toggles: list[ToggleOut], jobs: JobMemory) -> GpuOut:
    slots = [s for s in view.slots if gpu.index in s.gpus]
    running = [JobOut(job_id=j, slot=s.key, user=jobs.owner.get(j, (None, None))[0],
                      url=jobs.owner.get(j, (None, None))[1],
                      runtime_s=max(0.0, view.at - view.started.get(j, jobs.first_seen.get(j, view.at))),
                      unused=j in view.unused)
               for s in slots for j in s.running_jobs]
    procs = [ProcessOut(pid=p.pid, user=p.user, command=p.command,
                        memory_mib=None if p.used_memory_bytes is None else p.used_memory_bytes >> 20)
             for p in gpu.processes]
    occupancy = view.occupancy.get(gpu.index, GpuOccupancy("unknown", "no GPU snapshot"))
    state, detail, over = occupancy
    toggle = next((t for t in toggles if over and (t.target, t.action) == (over.target, over.action)), None)
    return GpuOut(index=gpu.index, name=gpu.name, state=state, detail=detail, utilization=gpu.utilization,
                  memory_used_mib=_mib(gpu.memory_used_bytes), memory_total_mib=_mib(gpu.memory_total_bytes),
                  processes=procs, jobs=running, toggle=toggle)


def _slot(slot: SlotView) -> SlotOut:
    return SlotOut(name=slot.name, key=slot.key, gpus=list(slot.gpus), state=slot.state,
                   open=slot.state == "open", reason=slot.reason, running_jobs=list(slot.running_jobs))


def _span(gpus: tuple[int, ...]) -> str:
    if len(gpus) > 1 and list(gpus) == list(range(gpus[0], gpus[-1] + 1)):
        return f"{gpus[0]}-{gpus[-1]}"
    return ",".join(str(g) for g in gpus)


def _mib(value: int | None) -> int | None:
    return None if value is None else value >> 20
