"""Pending GPU demand: found by polling the projects this host's runners serve, within
an API budget; webhooks only make it sooner.

Which projects. GitLab has no group- or instance-wide list of pending jobs (gitlab
issues 323316, 554251), only `GET /projects/:id/jobs?scope[]=pending` per project
(docs.gitlab.com/api/jobs). So the tracker learns what the runners serve from GitLab
itself, rarely (every `discover_s`): `GET /runners/:id` of one of this host's runners
gives its type, groups and projects; a group runner serves its group's projects and
those of its subgroups (`GET /groups/:id/projects?include_subgroups=true`), a project
runner the projects it is assigned to. An instance runner serves every project, which
GitLab cannot list as such: then only `[controller] projects` and the projects webhooks
name are polled (warned once). `[controller] projects`, when set, replaces discovery.

Polling: one request per `poll`, never faster than a token bucket of
`api_budget_per_min` requests per minute allows (shared with the runner refreshes of
the loop). The project polled is the one longest unpolled, a project with recent
activity (a pending job or a job event within `active_window_s`) counting as
`ACTIVE_WEIGHT` times as overdue, so quiet projects are still polled, only less often.
While a project's job events arrive, it is polled at most once per `webhook_fresh_s`, a
slow safety net; a project whose events stopped (no hook, a hook GitLab disabled after
failed deliveries, a delivery lost: GitLab never resends one, web_hook_service.rb) is
polled as if it had none. Errors go to the loop, which logs them once and backs off.

Webhooks (GitLab "Job Hook", `object_kind: build`): the `X-Gitlab-Token` header must
equal the configured secret (constant-time compare). A job event carries no job tags in
any GitLab version (gitlabhq lib/gitlab/data_builder/build.rb: only `runner.tags`,
null while pending), so it is never read as demand: a pending job's event queues a look
at GitLab itself before any other poll (one job: `GET /projects/:id/jobs/:job_id`;
several of one project: one poll of that project) and wakes the loop for an early tick,
so a multi-GPU job's block is reserved before runners hand out smaller jobs on it. An
event of a job that left pending (LEFT_PENDING) drops it from the demand at once; GitLab
sends each event from its own Sidekiq job, so they may arrive out of order, and a late
`created` (Ci::ExecutePipelineBuildHooksWorker, sent after the pipeline is made) changes
nothing. A final
`build_status` (success, failed, canceled) is kept as the job's outcome for the job
history (the same payload's `build_id`, `build_status`).
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from runnerctl.controller.plan import Demand
from runnerctl.errors import NotFoundError
from runnerctl.gitlab import GitLabPort, JobInfo
from runnerctl.tags import NORMAL, PRIORITY_RANK, gpus_of, host_of, priority_of, runner_tag_set

log = logging.getLogger(__name__)
FINAL = frozenset({"success", "failed", "canceled"})
"""A job's statuses once it is over (GitLab's Ci::HasStatus COMPLETED_STATUSES, less skipped)."""
LEFT_PENDING = frozenset({"running", "canceling", "success", "failed", "canceled", "skipped"})
"""Statuses a job reaches only after pending (app/models/ci/build.rb's state machine): an
event with one says the job was taken or ended. `created`, `preparing`, `scheduled`,
`manual` and `waiting_for_resource` come before; a late `created` dropped a pending job
from the demand for five minutes (found by a review as a webhook integration engineer)."""
Clock = Callable[[], float]
DISCOVER_S = 900.0
"""How often (s) the projects the runners serve are read again: a project added to the
group is polled within this (at once when a webhook names it)."""
DISCOVER_RETRY_S = 60.0
"""After a failed discovery, the next try comes this much later (s)."""
ACTIVE_WEIGHT = 4.0
"""A project with recent activity counts as this many times as overdue for its poll."""


def due(now: float, at: float, period: float) -> bool:
    """Is a thing planned for `at`, at most `period` after it was planned, due at `now`?
    Also when `at` lies further ahead than `period`: the wall clock stepped back (NTP),
    and waiting for it to catch up would stop the thing for as long as the step."""
    return now >= at or period < at - now < math.inf  # inf: never


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
        now = self._clock()  # a clock stepped back adds nothing (no debt of the step's length)
        self._tokens = min(self.capacity, self._tokens + max(0.0, now - self._at) * self.rate)
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
    name: str | None = None  # the job's name in .gitlab-ci.yml (job history keeps it)
    queued_at: float | None = None  # when it became pending (GitLab's queued_duration), if given
    tags: tuple[str, ...] = ()  # its tags as GitLab lists them (empty: not known)

    def takes(self, host: str) -> bool:
        """Would a slot runner of `host` take it? GitLab gives a job only to a runner that has
        every one of its tags: a job tagged `gpu` and `gpus:8`, which no runner has, counted
        as an 8-GPU job, and its host stayed drained for it until GitLab dropped it a day
        later (found by a review as a hostile CI job author)."""
        return self.host in (None, host) and not self.missing_tags(host)

    def missing_tags(self, host: str) -> list[str]:
        """Its tags that no slot runner of its size on `host` has (the page names them)."""
        have = runner_tag_set(self.gpus, host)
        return sorted(tag for tag in set(self.tags) if tag not in have)

    @property
    def pending_since(self) -> float:
        """Since when it waits (a later stage's job is created with its pipeline, hours
        before it is queued): what the page, metrics and history call its wait."""
        return self.created_at if self.queued_at is None else self.queued_at


def pending_job(job: JobInfo, *, project_id: int, priorities: Mapping[str, str],
                seen_at: float, now: float) -> PendingJob | None:
    """The job as demand, None when it asks for no GPU. A job whose creation time GitLab did
    not give in a form we read counts from `seen_at`, when runnerctl first saw it pending:
    it never jumps ahead of jobs that waited, as a time of 0 (1970) would make it. It has
    been pending since `now` (when GitLab answered) less its `queued_duration`: a duration
    on GitLab's clock, so the hosts' clocks need not agree with it."""
    gpus = gpus_of(job.tags)
    if gpus < 1:
        return None
    priority = priority_of(job.tags) or priorities.get(str(project_id), NORMAL)
    host = host_of(job.tags)
    created = _timestamp(job.created_at)
    queued = None if job.queued_duration is None else now - job.queued_duration
    return PendingJob(job.id, project_id, gpus, seen_at if created is None else created, priority, host,
                      job.web_url, job.user, job.name, queued, tuple(job.tags))


class DemandTracker:
    def __init__(self, *, projects: Iterable[int], priorities: Mapping[str, str], budget: ApiBudget,
                 clock: Clock, runner_ids: Iterable[int] = (), active_window_s: float = 3600.0,
                 webhook_fresh_s: float = 300.0, discover_s: float = DISCOVER_S, secret: str = "",
                 on_demand: Callable[[], None] = lambda: None) -> None:
        """`projects`: the `[controller] projects` override (empty: discover them from the
        runners `runner_ids`, see the module docstring)."""
        self.override = tuple(projects)
        self.projects = list(self.override)
        self.priorities = dict(priorities)
        self.budget = budget
        self.secret = secret
        self.on_demand = on_demand
        self._clock = clock
        self._runner_ids = list(runner_ids)
        self._active_window = active_window_s
        self._webhook_fresh = webhook_fresh_s
        self._discover_s = discover_s
        self._discover_at = float("inf") if self.override or not self._runner_ids else clock()
        self._discovered = self._discover_at == float("inf")  # the projects are known
        self._said_no_runner = False  # "none of this host's runners is in GitLab", logged once
        self._named: set[int] = set()  # projects webhooks told of (kept across discoveries)
        self._served: set[int] = set(self.override)  # projects the runners serve or the settings name
        self._forgotten: set[int] = set()  # webhook-named projects found invisible (said once each)
        self._jobs: dict[int, PendingJob] = {}
        self._outcomes: dict[int, str] = {}  # job id -> final status from a webhook (job history)
        self._left: dict[int, float] = {}  # job id -> when a webhook said it left pending (bounded)
        self._active: dict[int, float] = {}  # project -> last activity
        self._polled: dict[int, float] = {}
        self._lookups: dict[int, set[int]] = {}  # project -> pending jobs webhooks told of
        self._webhook_at: dict[int, float] = {}  # project -> its last job event
        self._warned_instance = False
        self.polls = 0
        self.answered = 0
        """Polls GitLab answered with something found (a 404 is no answer: `_talk_to_gitlab`)."""
        self._lock = threading.Lock()  # webhooks arrive on the web server's thread

    @property
    def complete(self) -> bool:
        """Is every watched project polled since the start (its projects discovered
        first)? Before, a pending job may just not be read yet: a restarted controller
        keeps the drains it stored for such jobs until then (`Controller._observed`)."""
        with self._lock:
            projects = list(self.projects)
        return self._discovered and all(p in self._polled for p in projects)

    @property
    def jobs(self) -> list[PendingJob]:
        with self._lock:
            found = list(self._jobs.values())
        return sorted(found, key=lambda j: (PRIORITY_RANK[j.priority], j.created_at))

    def demand(self, host: str, fair: Mapping[int, float] | None = None,
               estimates: Mapping[int, float] | None = None) -> tuple[Demand, ...]:
        """Pending jobs for this host; `fair`: job id -> seconds it counts younger (fair
        share); `estimates`: job id -> its expected run time (`controller.estimates`)."""
        fair, estimates = fair or {}, estimates or {}
        return tuple(Demand(j.job_id, j.gpus, j.created_at, j.priority, fair_s=fair.get(j.job_id, 0.0),
                            estimate_s=estimates.get(j.job_id), queued_at=j.queued_at)
                     for j in self.jobs if j.takes(host))

    def poll(self, gitlab: GitLabPort) -> None:
        """At most one look per call (a discovery may take a second request), when the
        budget allows: jobs webhooks told of first, then discovery when due, then the
        most overdue project. A GitLabError propagates: the loop logs it once and backs off."""
        now = self._clock()
        if self._lookups:
            if not self.budget.try_take():
                return
            with self._lock:
                if not self._lookups:  # a webhook emptied it since: the request is spent, no look
                    return
                first = next(iter(self._lookups))
                job_ids = self._lookups.pop(first)
            self._look(gitlab, first, job_ids, now)
            return
        if due(now, self._discover_at, max(self._discover_s, DISCOVER_RETRY_S)):
            if self.budget.try_take():
                self._discover(gitlab, now)
            return
        project = self._due_project(now)
        if project is None or not self.budget.try_take():
            return
        self._poll_project(gitlab, project, now)

    def _look(self, gitlab: GitLabPort, project: int, job_ids: set[int], now: float) -> None:
        if len(job_ids) > 1:  # one poll answers for all of them
            self._poll_project(gitlab, project, now)
            return
        (job_id,) = job_ids
        found = gitlab.job(project, job_id)
        self.polls += 1
        self.answered += found is not None
        with self._lock:
            known = self._jobs.get(job_id)
            pending = None if found is None or found.status != "pending" else pending_job(
                found, project_id=project, priorities=self.priorities,
                seen_at=known.created_at if known else now, now=now)
            self._jobs.pop(job_id, None)
            if pending is not None and not self._left_since(job_id, now):
                self._jobs[job_id] = pending

    def _poll_project(self, gitlab: GitLabPort, project: int, now: float) -> None:
        self._polled[project] = now
        try:
            jobs = gitlab.pending_jobs(project)
        except NotFoundError:
            if project in self._served:
                raise  # a project the runners serve or the settings name: the loop says so
            self._forget(project)
            return
        self.polls += 1
        self.answered += 1
        with self._lock:
            self._replace(project, jobs, now)

    def _forget(self, project: int) -> None:
        """A project only a webhook named that runnerctl's token cannot see (404: another
        GitLab's hook, a project deleted or moved since): no longer polled, until a webhook
        names it again. Kept, its 404 failed every GitLab step: GitLab's health flapped and
        the other projects were polled half as often (found by a review hunting leaks in a
        long-running serve)."""
        with self._lock:
            self._named.discard(project)
            self.projects = [p for p in self.projects if p != project]
            self._polled.pop(project, None)
            self._active.pop(project, None)
            self._lookups.pop(project, None)
            self._jobs = {k: j for k, j in self._jobs.items() if j.project_id != project}
        if project not in self._forgotten:
            self._forgotten.add(project)
            log.warning("project %d, named by a webhook, is not visible to runnerctl's GitLab token (404): "
                        "not polled until a webhook names it again", project)

    def _discover(self, gitlab: GitLabPort, now: float) -> None:
        """Read which projects the runners serve (the first call's request is taken)."""
        self._discover_at = now + DISCOVER_RETRY_S  # until it succeeds
        reach = None
        for n, runner_id in enumerate(self._runner_ids):
            if n:
                self.budget.charge()
            reach = gitlab.runner_reach(runner_id)
            if reach is not None:
                break
        if reach is None:
            if not self._said_no_runner:  # once while it lasts, not at every retry (a minute)
                log.warning("none of this host's runners is in GitLab; demand is polled only in the "
                            "projects webhooks name (run `runnerctl init`)")
            self._said_no_runner = True
            return
        if self._said_no_runner:
            log.warning("this host's runners are in GitLab again")
        self._said_no_runner = False
        served: list[int] = list(reach.project_ids)
        if reach.runner_type == "group_type":
            served = []
            for group in reach.group_ids:
                self.budget.charge()
                served += gitlab.group_projects(group)
        elif reach.runner_type == "instance_type" and not self._warned_instance:
            self._warned_instance = True
            log.warning("instance runners serve every project, and GitLab has no instance-wide "
                        "list of pending jobs: set [controller] projects, or send job events "
                        "(webhook) from the projects that use GPUs")
        self._discover_at = now + self._discover_s
        self._discovered = True
        with self._lock:
            self._served = set(served)
            self.projects = list(dict.fromkeys([*served, *sorted(self._named)]))
        log.info("watching %d projects for pending GPU jobs (%s runners)", len(self.projects),
                 reach.runner_type)

    def _due_project(self, now: float) -> int | None:
        """The most overdue project (recently active ones count ACTIVE_WEIGHT times)."""
        best, best_score = None, -1.0
        for project in list(self.projects):
            polled = self._polled.get(project, float("-inf"))
            if polled > now:  # the clock stepped back: polled just now, as every project polled "later"
                polled = self._polled[project] = now
            age = now - polled
            event = self._webhook_at.get(project)  # its own events only: one project's hook
            fresh = event is not None and now - event < self._webhook_fresh  # holds no other back
            if fresh and age < self._webhook_fresh:
                continue
            active = now - self._active.get(project, float("-inf")) <= self._active_window
            score = age * (ACTIVE_WEIGHT if active else 1.0)
            if score > best_score:
                best, best_score = project, score
        return best

    def _replace(self, project: int, jobs: list[JobInfo], now: float) -> None:
        seen = {j: p.created_at for j, p in self._jobs.items() if p.project_id == project}
        for job_id in seen:
            del self._jobs[job_id]
        for job in jobs:
            pending = pending_job(job, project_id=project, priorities=self.priorities,
                                  seen_at=seen.get(job.id, now), now=now)
            if pending is not None and not self._left_since(job.id, now):
                self._jobs[job.id] = pending
        if jobs:
            self._active[project] = now

    def _left_since(self, job_id: int, asked_at: float) -> bool:
        """A webhook said the job left pending after a GitLab read began at `asked_at`: the
        read's "pending" is older news (it brought a running job back as pending, and a host
        could drain a block for it; found by a review as a concurrency engineer)."""
        left = self._left.get(job_id)
        return left is not None and left >= asked_at

    def forget(self, job_ids: Iterable[int]) -> None:
        """Jobs seen running or finished elsewhere (e.g. picked by a runner)."""
        with self._lock:
            for job_id in job_ids:
                self._jobs.pop(job_id, None)

    def take_outcomes(self) -> dict[int, str]:
        """Final statuses (success, failed, canceled) that job webhooks brought since the
        last call, for the job history; a GitLab without webhooks brings none."""
        with self._lock:
            found, self._outcomes = self._outcomes, {}
        return found

    def refusal(self, token: str | None) -> str:
        """Why `webhook` refuses a request with this token ("" when it would not)."""
        if not self.secret:
            return "serve has no webhook secret (--webhook-secret or RUNNERCTL_WEBHOOK_SECRET)"
        if not token:
            return "no X-Gitlab-Token (the webhook's secret token in GitLab)"
        try:  # Starlette decodes a header's bytes as latin-1: these are the bytes GitLab sent
            sent = token.encode("latin-1")
        except UnicodeEncodeError:
            sent = token.encode()
        if not hmac.compare_digest(sent, self.secret.encode()):  # a secret of any letters
            return "a wrong X-Gitlab-Token (the webhook's secret token in GitLab differs from serve's)"
        return ""

    def webhook(self, token: str | None, payload: Mapping[str, Any]) -> bool:
        """Apply one job event; False (and nothing changes) when the token is wrong."""
        if self.refusal(token):
            return False
        with self._lock:
            wake = self._event(payload)
        if wake:
            self.on_demand()
        return True

    def _event(self, payload: Mapping[str, Any]) -> bool:
        """Apply the event; True when it queued a new look (the loop should tick now)."""
        now = self._clock()
        project, job_id = payload.get("project_id"), payload.get("build_id")
        if payload.get("object_kind") != "build" or not isinstance(project, int):
            return False
        if not isinstance(job_id, int):
            return False
        self._webhook_at[project] = now
        self._active[project] = now
        self._named.add(project)
        if project not in self.projects:
            self.projects.append(project)
        if payload.get("build_status") in FINAL and len(self._outcomes) < 10_000:
            self._outcomes[job_id] = str(payload["build_status"])
        status = payload.get("build_status")
        if status != "pending" and status not in LEFT_PENDING:
            return False  # before pending, or a late event of it: nothing to drop
        if status != "pending":
            self._jobs.pop(job_id, None)
            if len(self._left) >= 10_000:
                self._left.pop(next(iter(self._left)))
            self._left[job_id] = now
            self._lookups.get(project, set()).discard(job_id)
            if not self._lookups.get(project, True):
                del self._lookups[project]
            return False
        new = project not in self._lookups
        self._lookups.setdefault(project, set()).add(job_id)
        return new


def _timestamp(value: str | None) -> float | None:
    """GitLab's ISO time as seconds since the epoch; None when missing or unreadable."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace(" UTC", "+00:00").replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
