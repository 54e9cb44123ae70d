"""Project webhooks of the simulated GitLab: Job events, sent as GitLab sends them.

- Hooks are made with `POST /projects/:id/hooks` (lib/api/project_hooks.rb: url, token,
  job_events; the answer never shows the token).
- A job's status change runs the project's job hooks (app/models/ci/build.rb
  `execute_hooks`, after each status transition) with the payload of
  lib/gitlab/data_builder/build.rb: `object_kind: "build"`, `build_id`, `build_name`,
  `build_stage`, `build_status`, `build_created_at`, `build_started_at`,
  `build_finished_at`, `build_duration`, `build_queued_duration`, `build_allow_failure`,
  `build_failure_reason`, `pipeline_id`, `project_id`, `project_name`, `ref`, `tag`,
  `sha`, `before_sha`, `user`, `commit`, `repository`, `environment`, and `runner`
  (`id`, `description`, `runner_type`, `active`, `is_shared`, `tags`), which is null while
  the job is pending. The job's own tags are not in it.
- Delivery (app/services/web_hook_service.rb): an HTTP POST with `Content-Type:
  application/json`, `X-Gitlab-Event: Job Hook`, `X-Gitlab-Token` (the hook's secret
  token), `X-Gitlab-Event-UUID`, `X-Gitlab-Webhook-UUID`, from a background worker
  (WebHookWorker, Sidekiq), so a slow receiver never delays the job.

- Auto-disabling (app/models/concerns/web_hooks/auto_disabling.rb): a delivery that fails
  counts against the hook (`recent_failures`, reset by a success); after 3 failures
  each further one disables the hook for 1 minute, doubling up to 1 day
  (`disabled_until`), and past 39 failures it is disabled for good. A disabled hook is
  skipped (not queued) when a job changes; `alert_status` shows it.

The sender thread is watched: a failed delivery is counted and logged once per hook, and
`alive()` says whether the thread still runs.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import logging
import queue
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

from runnerctl.sim.gitlab_directory import Directory
from runnerctl.sim.gitlab_rest_ci import _iso as iso
from runnerctl.sim.gitlab_state import SimJob, SimRunner

KEEP_DELIVERIES = 10_000

log = logging.getLogger(__name__)


@dataclasses.dataclass
class ProjectHook:
    id: int
    project_id: int
    url: str
    token: str = dataclasses.field(repr=False)
    job_events: bool
    uuid: str
    created_at: float
    recent_failures: int = 0
    disabled_until: float | None = None


TEMPORARILY_DISABLED_FAILURE_THRESHOLD = 3
PERMANENTLY_DISABLED_FAILURE_THRESHOLD = 39
INITIAL_BACKOFF_S = 60.0
MAX_BACKOFF_S = 86400.0


@dataclasses.dataclass(frozen=True)
class Delivery:
    hook_id: int
    build_id: int
    build_status: str
    status: int | None  # the receiver's HTTP status; None when it could not be reached


class Hooks:
    def __init__(self, directory: Directory, runners: Callable[[int], SimRunner | None],
                 clock: Callable[[], float], *, base_url: str = "http://gitlab.sim") -> None:
        self.directory = directory
        self.runners = runners
        self.clock = clock
        self.base_url = base_url
        self.hooks: dict[int, ProjectHook] = {}
        self.deliveries: list[Delivery] = []  # the newest KEEP_DELIVERIES or more (a list: tests read
        # it while the sender appends, which a deque refuses)
        self._ids = itertools.count(1)
        self._queue: queue.Queue[tuple[ProjectHook, dict[str, Any]] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._warned: set[int] = set()
        self._lock = threading.Lock()

    def add(self, project_id: int, *, url: str, token: str, job_events: bool) -> ProjectHook:
        hook = ProjectHook(next(self._ids), project_id, url, token, job_events, str(uuid.uuid4()),
                           self.clock())
        self.hooks[hook.id] = hook
        return hook

    def of_project(self, project_id: int) -> list[ProjectHook]:
        return [h for h in self.hooks.values() if h.project_id == project_id]

    def json(self, hook: ProjectHook) -> dict[str, Any]:
        return {"id": hook.id, "url": hook.url, "project_id": hook.project_id, "job_events": hook.job_events,
                "push_events": False, "enable_ssl_verification": True, "created_at": iso(hook.created_at),
                "alert_status": self.alert_status(hook), "disabled_until": iso(hook.disabled_until)}

    def alert_status(self, hook: ProjectHook) -> str:
        with self._lock:
            if hook.recent_failures > PERMANENTLY_DISABLED_FAILURE_THRESHOLD:
                return "disabled"
            temporarily = (hook.disabled_until is not None and hook.disabled_until >= self.clock()
                           and hook.recent_failures > TEMPORARILY_DISABLED_FAILURE_THRESHOLD)
            return "temporarily_disabled" if temporarily else "executable"

    def _record(self, hook: ProjectHook, ok: bool) -> None:
        """auto_disabling.rb `enable!` after a success, `backoff!` after a failure."""
        with self._lock:
            if ok:
                hook.recent_failures, hook.disabled_until = 0, None
                return
            before = hook.recent_failures
            hook.recent_failures = min(before + 1, PERMANENTLY_DISABLED_FAILURE_THRESHOLD + 1)
            if hook.recent_failures > TEMPORARILY_DISABLED_FAILURE_THRESHOLD:
                backoff = INITIAL_BACKOFF_S * 2.0 ** (before - TEMPORARILY_DISABLED_FAILURE_THRESHOLD)
                hook.disabled_until = self.clock() + min(max(backoff, INITIAL_BACKOFF_S), MAX_BACKOFF_S)

    # -- delivery ----------------------------------------------------------------
    def job_changed(self, job: SimJob) -> None:
        """A `GitLabState` listener: queue the Job Hook for every hook of the job's project."""
        hooks = [h for h in self.of_project(job.project_id)
                 if h.job_events and self.alert_status(h) == "executable"]
        if not hooks:
            return
        payload = self.payload(job)
        for hook in hooks:
            self._queue.put((hook, payload))

    def payload(self, job: SimJob) -> dict[str, Any]:
        project = self.directory.projects.get(job.project_id)
        name = project.path_with_namespace if project else f"p{job.project_id}"
        runner = self.runners(job.runner_id) if job.runner_id is not None else None
        now = self.clock()
        sha = f"{job.pipeline_id:040x}"
        user_id = self.directory.users.get(job.user, 0)
        return {
            "object_kind": "build", "ref": job.ref, "tag": False, "before_sha": "0" * 40, "sha": sha,
            "build_id": job.id, "build_name": job.name, "build_stage": job.stage, "build_status": job.status,
            "build_created_at": _iso(job.created_at), "build_started_at": _iso(job.started_at),
            "build_finished_at": _iso(job.finished_at),
            "build_duration": None if job.started_at is None else (job.finished_at or now) - job.started_at,
            "build_queued_duration": (job.started_at or now) - job.pending_since,
            "build_allow_failure": False, "build_failure_reason": job.failure_reason or "unknown_failure",
            "pipeline_id": job.pipeline_id,
            "runner": None if runner is None else {
                "id": runner.id, "description": runner.description, "runner_type": runner.runner_type,
                "active": not runner.paused, "is_shared": runner.runner_type == "instance_type",
                "tags": sorted(runner.tags)},
            "project_id": job.project_id, "project_name": name.replace("/", " / "),
            "user": {"id": user_id, "name": job.user, "username": job.user, "avatar_url": None,
                     "email": "[REDACTED]"},
            "commit": {"id": job.pipeline_id, "name": None, "sha": sha, "message": "simulated commit",
                       "author_name": job.user, "author_email": "[REDACTED]", "author_url": None,
                       "status": job.status, "duration": None, "started_at": _iso(job.started_at),
                       "finished_at": _iso(job.finished_at)},
            "repository": {"name": project.path if project else name, "url": f"{self.base_url}/{name}.git",
                           "description": "", "homepage": f"{self.base_url}/{name}",
                           "git_http_url": f"{self.base_url}/{name}.git",
                           "git_ssh_url": f"git@gitlab.sim:{name}.git",
                           "visibility_level": 0},
            "environment": None,
        }

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gitlab-sim-hooks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=5)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def pending(self) -> int:
        return self._queue.qsize()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            hook, payload = item
            if self.alert_status(hook) != "executable":  # disabled since it was queued: not sent
                continue                                   # (web_hook_service.rb #execute)
            status = self._send(hook, payload)
            self._record(hook, status is not None and 200 <= status < 400)  # a redirect is no failure
            self.deliveries.append(Delivery(hook.id, int(payload["build_id"]), str(payload["build_status"]),
                                            status))
            if len(self.deliveries) > 2 * KEEP_DELIVERIES:
                del self.deliveries[:-KEEP_DELIVERIES]

    def _send(self, hook: ProjectHook, payload: dict[str, Any]) -> int | None:
        headers = {"Content-Type": "application/json", "User-Agent": "GitLab/19.0.0",
                   "X-Gitlab-Event": "Job Hook", "X-Gitlab-Webhook-UUID": hook.uuid,
                   "X-Gitlab-Event-UUID": str(uuid.uuid4()), "X-Gitlab-Instance": self.base_url}
        if hook.token:  # its UTF-8 bytes, as GitLab sends them (urllib writes a header as latin-1)
            headers["X-Gitlab-Token"] = hook.token.encode().decode("latin-1")
        request = urllib.request.Request(hook.url, data=json.dumps(payload).encode(), headers=headers,
                                         method="POST")
        try:
            with _NO_REDIRECTS.open(request, timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:  # a redirect is an answer (response_category: redirection)
                return int(exc.code)
            self._warn(hook, f"answered {exc.code}")
            return int(exc.code)
        except (OSError, ValueError) as exc:
            self._warn(hook, f"could not be reached: {exc}")
            return None

    def _warn(self, hook: ProjectHook, what: str) -> None:
        if hook.id not in self._warned:
            self._warned.add(hook.id)
            log.warning("simulated GitLab: job hook %s (%s) %s; later failures are counted only",
                        hook.id, hook.url, what)


class _KeepRedirects(urllib.request.HTTPRedirectHandler):
    """A hook's 3xx is its answer, not a place to go: urllib followed it as a GET."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_NO_REDIRECTS = urllib.request.build_opener(_KeepRedirects)


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
