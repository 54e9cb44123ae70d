"""Pending GPU demand: from polling within an API budget, and from webhooks.

Polling: `GET /projects/:id/jobs?scope[]=pending` for the watched projects that had
activity recently (a webhook, a pending job), round robin, never faster than a token
bucket of `api_budget_per_min` requests per minute allows (the bucket is shared with
the runner refreshes of the loop). While webhooks arrive, each project is polled only
as a slow safety net. Errors go to the loop, which logs them once and backs off.

Webhooks (GitLab "Job Hook", `object_kind: build`): the `X-Gitlab-Token` header must
equal the configured secret (constant-time compare). A pending job with tags is demand
at once (new multi-GPU demand also wakes the loop for an early tick, so its block is
reserved before runners hand out smaller jobs on it); a job that left pending is
dropped; a job event without tags (older GitLab versions send none) only marks its
project for the next poll.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from runnerctl.controller.plan import PRIORITY_RANK, Demand
from runnerctl.gitlab import GitLabPort, JobInfo

log = logging.getLogger(__name__)
Clock = Callable[[], float]


class ApiBudget:
    """A token bucket: `per_minute` requests a minute, bursts up to `burst`."""

    def __init__(self, per_minute: float, clock: Clock, *, burst: float | None = None) -> None:
        self.rate = per_minute / 60.0
        self.capacity = burst if burst is not None else max(1.0, per_minute / 6.0)
        self._clock = clock
        self._tokens = self.capacity
        self._at = clock()
        self.spent = 0

    def try_take(self, count: float = 1.0) -> bool:
        self._refill()
        if self._tokens < count:
            return False
        self._tokens -= count
        self.spent += int(count)
        return True

    def charge(self, count: float = 1.0) -> None:
        """Take `count` even when the bucket is empty: a follow-up request that cannot
        wait (the bucket goes into debt, and later requests repay it, so the rate over a
        minute still holds)."""
        self._refill()
        self._tokens -= count
        self.spent += int(count)

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
        self._at = now


@dataclasses.dataclass(frozen=True)
class PendingJob:
    job_id: int
    project_id: int
    gpus: int
    created_at: float
    priority: str
    host: str | None  # a `host:` tag pins the job to one host
    web_url: str | None = None
    user: str | None = None


def gpus_of(tags: Iterable[str]) -> int:
    """N of a `gpus:N` tag; 1 for `gpu`; 0 when the job asks for no GPU."""
    for tag in tags:
        if tag.startswith("gpus:") and tag[5:].isdigit():
            return int(tag[5:])
    return 1 if "gpu" in tags else 0


def pending_job(job: JobInfo, *, project_id: int, priorities: Mapping[str, str]) -> PendingJob | None:
    gpus = gpus_of(job.tags)
    if gpus < 1:
        return None
    priority = next((t[9:] for t in job.tags if t.startswith("priority:") and t[9:] in PRIORITY_RANK),
                    priorities.get(str(project_id), "normal"))
    host = next((t[5:] for t in job.tags if t.startswith("host:")), None)
    return PendingJob(job.id, project_id, gpus, _timestamp(job.created_at), priority, host,
                      job.web_url, job.user)


class DemandTracker:
    def __init__(self, *, projects: Iterable[int], priorities: Mapping[str, str], budget: ApiBudget,
                 clock: Clock, active_window_s: float = 3600.0, webhook_fresh_s: float = 300.0,
                 secret: str = "", on_demand: Callable[[], None] = lambda: None) -> None:
        self.projects = list(projects)
        self.priorities = dict(priorities)
        self.budget = budget
        self.secret = secret
        self.on_demand = on_demand
        self._clock = clock
        self._active_window = active_window_s
        self._webhook_fresh = webhook_fresh_s
        self._jobs: dict[int, PendingJob] = {}
        self._active: dict[int, float] = {p: clock() for p in self.projects}  # project -> last activity
        self._polled: dict[int, float] = {}
        self._last_webhook: float | None = None
        self._next = 0
        self.polls = 0
        self._lock = threading.Lock()  # webhooks arrive on the web server's thread

    @property
    def jobs(self) -> list[PendingJob]:
        with self._lock:
            found = list(self._jobs.values())
        return sorted(found, key=lambda j: (PRIORITY_RANK[j.priority], j.created_at))

    def demand(self, host: str) -> tuple[Demand, ...]:
        return tuple(Demand(j.job_id, j.gpus, j.created_at, j.priority) for j in self.jobs
                     if j.host in (None, host))

    def poll(self, gitlab: GitLabPort) -> None:
        """At most one project per call, when the budget and any back-off allow."""
        now = self._clock()
        project = self._due_project(now)
        if project is None or not self.budget.try_take():
            return
        self._polled[project] = now
        jobs = gitlab.pending_jobs(project)  # GitLabError: the loop logs it once and backs off
        self.polls += 1
        with self._lock:
            self._replace(project, jobs, now)

    def _due_project(self, now: float) -> int | None:
        active = [p for p in self.projects if now - self._active.get(p, -1e18) <= self._active_window]
        fresh = self._last_webhook is not None and now - self._last_webhook < self._webhook_fresh
        min_gap = self._webhook_fresh if fresh else 0.0
        for offset in range(len(active)):
            project = active[(self._next + offset) % len(active)]
            if now - self._polled.get(project, -1e18) >= min_gap:
                self._next = (self._next + offset + 1) % len(active)
                return project
        return None

    def _replace(self, project: int, jobs: list[JobInfo], now: float) -> None:
        for job_id in [j for j, p in self._jobs.items() if p.project_id == project]:
            del self._jobs[job_id]
        for job in jobs:
            pending = pending_job(job, project_id=project, priorities=self.priorities)
            if pending is not None:
                self._jobs[job.id] = pending
        if jobs:
            self._active[project] = now

    def forget(self, job_ids: Iterable[int]) -> None:
        """Jobs seen running or finished elsewhere (e.g. picked by a runner)."""
        with self._lock:
            for job_id in job_ids:
                self._jobs.pop(job_id, None)

    def webhook(self, token: str | None, payload: Mapping[str, Any]) -> bool:
        """Apply one job event; False (and nothing changes) when the token is wrong."""
        if not self.secret or not hmac.compare_digest((token or "").encode(), self.secret.encode()):
            return False
        with self._lock:
            new = self._event(payload)
        if new is not None and new.gpus > 1:
            self.on_demand()
        return True

    def _event(self, payload: Mapping[str, Any]) -> PendingJob | None:
        """Apply the event; the job when it is new pending demand."""
        now = self._clock()
        self._last_webhook = now
        if payload.get("object_kind") != "build" or not isinstance(payload.get("project_id"), int):
            return None
        project = int(payload["project_id"])
        self._active[project] = now
        if project not in self.projects:
            self.projects.append(project)
        job_id = int(payload.get("build_id") or 0)
        tags = payload.get("build_tags") or payload.get("tag_list") or payload.get("tags")
        if payload.get("build_status") != "pending":
            self._jobs.pop(job_id, None)
        elif isinstance(tags, list):
            info = JobInfo(job_id, project, "pending", tuple(str(t) for t in tags),
                           payload.get("build_created_at"), None, None)
            found = pending_job(info, project_id=project, priorities=self.priorities)
            if found is not None:
                new = job_id not in self._jobs
                self._jobs[job_id] = found
                return found if new else None
        else:
            self._polled.pop(project, None)  # no tags in this GitLab's payload: poll it next
        return None


def _timestamp(value: str | None) -> float:
    if not value:
        return 0.0
    try:
        return datetime.fromisoformat(value.replace(" UTC", "+00:00").replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
