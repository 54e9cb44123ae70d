"""The fleet on one page: every host's GPUs and the whole queue, from the shared store.

Each `serve` publishes its page data after every good tick (`publisher`, hung on the
controller's `on_tick`): its GPU cards and its pending jobs with the reason each one
waits, as its own planner gave it (controller/waiting.py). Any host's page then reads
every host's row (controller/host_views.py): `hosts` marks a host stopped when its
last good tick is older than two of its tick periods, and `queue` merges the hosts'
queues into one, each job with one reason (the most telling one, `waiting.RANK`) and
what every live host said. A stopped host's queue is left out: it is stale. `history`
reads the job history every host writes (controller/jobs_store.py), newest first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel

from runnerctl.controller import host_views, jobs_store
from runnerctl.controller.demand import PendingJob
from runnerctl.controller.store import Store
from runnerctl.controller.view import ControllerView
from runnerctl.controller.waiting import RANK
from runnerctl.tags import PRIORITY_RANK
from runnerctl.web.view import (
    DemandOut,
    EventOut,
    GpuOut,
    JobMemory,
    ToggleOut,
    event_out,
    host_page,
    toggle_out,
)

log = logging.getLogger(__name__)
HostState = Literal["running", "stopped", "unknown"]


class FleetHostOut(BaseModel):
    host: str
    state: HostState
    """`stopped`: no good tick for two of its tick periods; `unknown`: it never published one."""
    last_tick_at: float | None
    age_s: float | None
    interval_s: float | None
    """Its tick period at its last good tick: the interval plus that tick's own time."""
    gitlab_error: str
    gpus: list[GpuOut]
    toggles: list[ToggleOut]
    last_event: EventOut | None


class ReasonOut(BaseModel):
    host: str
    reason: str
    detail: str


class QueueJobOut(DemandOut):
    position: int
    """1 for the job the planners serve first (priority, then age)."""
    reason: str
    """starting, draining, priority, resources, foreign or held (controller/waiting.py)."""
    detail: str
    host: str
    """The host whose reason is shown."""
    hosts: list[ReasonOut]


class HistoryJobOut(BaseModel):
    host: str
    job_id: int
    project: str
    pipeline: str
    name: str
    user: str
    url: str
    gpus: list[int]
    queued_at: float | None
    started_at: float
    ended_at: float | None
    """None while it runs."""
    outcome: str
    gpu_hours: float
    mean_utilization: float | None
    wait_s: float | None
    unused: bool
    """Flagged "requested but unused": it held GPUs that stayed idle."""


def publisher(store: Store, *, interval_s: float,
              clock: Callable[[], float]) -> Callable[[ControllerView], None]:
    """An `on_tick` hook that writes this host's GPUs and queue to the store, with the
    host's tick period (its interval plus how long this tick took)."""
    memory = JobMemory()  # its own: the request threads have theirs

    def publish_fleet_view(view: ControllerView) -> None:
        page = host_page(view, (), memory)
        queue = []
        for job in view.demand:
            why = view.waiting.get(job.job_id)
            reason, detail, elsewhere = (why.code, why.detail, why.elsewhere) if why else (
                ("pinned", f"its host: tag pins it to {job.host}", True) if job.host not in (None, view.host)
                else ("resources", _untaken(job, view.host), False))  # the planner leaves these out
            queue.append({"job_id": job.job_id, "gpus": job.gpus, "project_id": job.project_id,
                          "priority": job.priority, "user": job.user, "url": job.web_url,
                          "created_at": job.created_at, "pending_since": job.pending_since,
                          "reason": reason, "detail": detail,
                          "elsewhere": elsewhere})
        at = clock()  # the loop waits an interval after each tick: its period is the sum
        host_views.save(store, host=view.host, at=at, interval_s=interval_s + max(0.0, at - view.at),
                        tick=view.tick,
                        view={"gpus": [g.model_dump() for g in page.gpus], "queue": queue,
                              "gitlab_error": view.gitlab_error})

    return publish_fleet_view


def _untaken(job: PendingJob, host: str) -> str:
    """Why the planner left out a job not pinned elsewhere: tags no runner has (a hostile
    or mistaken `gpus:8` beside `gpu`, found by a review as a CI job author), which GitLab
    never hands out, so it waits until GitLab drops it as stuck."""
    missing = job.missing_tags(host)
    if not missing:
        return "not planned yet"
    return (f"no runner has all its tags (none of its size has {', '.join(missing)}): GitLab gives it "
            "to none; fix the job's tags")


def hosts(store: Store, now: float) -> list[FleetHostOut]:
    """Every host of the store: state, GPUs of its last good tick, toggles, last event."""
    rows = {row.host: row for row in host_views.load(store)}
    out = []
    for name in sorted(set(rows) | set(store.hosts())):
        row = rows.get(name)
        last = store.events(name, 1)
        state: HostState = "unknown" if row is None else "stopped" if row.stopped(now) else "running"
        out.append(FleetHostOut(
            host=name, state=state, last_tick_at=row.at if row else None,
            age_s=round(row.age_s(now), 3) if row else None, interval_s=row.interval_s if row else None,
            gitlab_error=str(row.view.get("gitlab_error", "")) if row else "",
            gpus=[GpuOut.model_validate(g) for g in row.view.get("gpus", ())] if row else [],
            toggles=[toggle_out(t) for t in store.toggles(name)],
            last_event=event_out(last[0]) if last else None))
    return out


def queue(store: Store, now: float) -> list[QueueJobOut]:
    """The pending GPU jobs every live host sees, most urgent first (priority, then age),
    each with the most telling reason any host gave."""
    seen: dict[int, dict[str, Any]] = {}
    said: dict[int, list[tuple[int, bool, ReasonOut]]] = {}
    for row in host_views.load(store):
        if row.stopped(now):
            continue
        for job in row.view.get("queue", ()):
            said.setdefault(job["job_id"], []).append((
                RANK.get(job["reason"], len(RANK)), bool(job.get("elsewhere")),
                ReasonOut(host=row.host, reason=job["reason"], detail=job["detail"])))
            seen.setdefault(job["job_id"], job)
    jobs = sorted(seen.values(),
                  key=lambda j: (PRIORITY_RANK.get(j["priority"], 1), j["created_at"], j["job_id"]))
    out = []
    for position, job in enumerate(jobs, start=1):
        reasons = [r for *_, r in sorted(said[job["job_id"]], key=lambda r: (r[0], r[1], r[2].host))]
        out.append(QueueJobOut(
            position=position, job_id=job["job_id"], gpus=job["gpus"], project_id=job["project_id"],
            priority=job["priority"], user=job["user"], url=job["url"],
            waiting_s=round(max(0.0, now - job.get("pending_since", job["created_at"])), 3),
            reason=reasons[0].reason,
            detail=reasons[0].detail, host=reasons[0].host, hosts=reasons))
    return out


def history(store: Store, *, limit: int, since: float | None, user: str | None, project: str | None,
            host: str | None) -> list[HistoryJobOut]:
    """The jobs of every host that started last and match the filters, newest first."""
    found = jobs_store.latest(store, limit=limit, since=since, user=user, project=project, host=host)
    return [HistoryJobOut(host=j.host, job_id=j.job_id, project=j.project, pipeline=j.pipeline, name=j.name,
                          user=j.user, url=j.url, gpus=list(j.gpus), queued_at=j.queued_at,
                          started_at=j.started_at, ended_at=j.ended_at, outcome=j.outcome,
                          gpu_hours=round(j.gpu_hours, 4), mean_utilization=j.mean_utilization,
                          wait_s=j.wait_s, unused=j.unused_at is not None) for j in found]
