"""REST API v4 routes for runners and jobs, as a user's token sees them.

Shapes and rules from gitlabhq/gitlabhq:
- lib/api/user_runners.rb `POST /user/runners` (runner_type, group_id / project_id
  required by type, Grape `{"error": ...}` otherwise; a group or project that does not
  exist is `400 Bad request - Missing/invalid group|project`, a caller without the role
  `403 Forbidden - Insufficient permissions`, app/services/ci/runners/create_runner_service.rb
  and runner_creation_strategies/*); `run_untagged` defaults to true there.
- lib/api/ci/runners.rb: `GET /runners` (the caller's owned runners: an administrator
  who is no member sees none of a group's), `GET /runners/all` (admins), `GET
  /groups/:id/runners` and `GET /projects/:id/runners` (what the group or project can
  use), `GET/PUT/DELETE /runners/:id`, `GET /runners/:id/jobs`, `GET /runners/:id/managers`
  (Entities::Ci::RunnerManager), 404 `Runner Not Found`, 403 `No access granted`;
  entities lib/api/entities/ci/runner.rb and runner_details.rb.
- lib/api/ci/jobs.rb: `GET /projects/:id/jobs?scope[]=`, `GET /projects/:id/jobs/:job_id`,
  `POST /projects/:id/jobs/:job_id/cancel` (201 with the job); lib/api/entities/ci/job.rb.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

from runnerctl.sim.gitlab_access import (
    DEVELOPER,
    MAINTAINER,
    OWNER,
    REPORTER,
    Access,
    ApiError,
    Caller,
    bad_request,
    forbidden,
    invalid,
    not_found,
    require_admin,
)
from runnerctl.sim.gitlab_state import GitLabState, SimJob, SimManager, SimRunner

Answer = tuple[int, Any, dict[str, str]]
Page = tuple[list[Any], None]
RUNNER_TYPES = ("instance_type", "group_type", "project_type")
JOB_STATUSES = frozenset({"created", "waiting_for_resource", "preparing", "waiting_for_callback", "pending",
                          "running", "success", "failed", "canceling", "canceled", "skipped", "manual",
                          "scheduled"})
"""lib/api/ci/jobs.rb `scope` values (app/models/concerns/ci/has_status.rb AVAILABLE_STATUSES)."""


class CiRoutes:
    def __init__(self, state: GitLabState, access: Access) -> None:
        self.state = state
        self.access = access

    def route(self, caller: Caller, method: str, path: str, query: dict[str, list[str]],
              body: dict[str, Any]) -> tuple[int, Any] | None:
        """(status, payload) for a path this module serves (a list is paginated); None if not ours."""
        s = self.state
        if method == "POST" and path == "/user/runners":
            return 201, self._create(caller, body)
        if method == "GET" and path in ("/runners", "/runners/all"):
            if path == "/runners/all":
                require_admin(caller)
                runners = list(s.runners.values())
            else:
                groups, projects = self.access.owned_runner_scopes(caller)
                runners = [r for r in s.runners.values() if r.group_id in groups or r.project_id in projects]
            return 200, [self.runner_brief(r) for r in runners if _runner_matches(r, query)]
        match = re.fullmatch(r"/(groups|projects)/([^/]+)/runners", path)
        if match and method == "GET":
            return 200, [self.runner_brief(r) for r in self._available(caller, match.group(1), match.group(2))
                         if _runner_matches(r, query)]
        match = re.fullmatch(r"/runners/(\d+)(/jobs|/managers)?", path)
        if match:
            runner = s.runners.get(int(match.group(1)))
            if runner is None:
                raise not_found("Runner")
            if method == "GET" and runner.runner_type == "instance_type" and not match.group(2):
                return 200, self.runner_detail(runner)  # instance runners are shown to everyone
            if not self.access.can_manage_runner(caller, runner.runner_type, runner.group_id,
                                                 runner.project_id):
                raise forbidden("No access granted")
            if match.group(2) == "/jobs" and method == "GET":
                status = query.get("status", [None])[0]
                # app/finders/ci/runner_jobs_finder.rb `by_permission`: only an administrator
                # sees every job; others only those of projects where they are Reporter or more
                return 200, [self.job(j) for j in s.jobs_of_runner(runner.id, status)
                             if caller.admin or self.access.reads_project(caller, j.project_id)]
            if match.group(2) == "/managers" and method == "GET":
                return 200, [self._manager(m) for m in s.managers_of(runner.id)]
            if method == "GET" and not match.group(2):
                return 200, self.runner_detail(runner)
            if method == "PUT" and not match.group(2):
                s.update_runner(runner.id, paused=_bool(body.get("paused")),
                                tags=_tags(body["tag_list"]) if "tag_list" in body else None,
                                description=body.get("description"),
                                maximum_timeout=_max_timeout(body),
                                clear_maximum_timeout=body.get("maximum_timeout", 0) is None)
                return 200, self.runner_detail(runner)
            if method == "DELETE" and not match.group(2):
                s.delete_runner(runner.id)
                return 204, None
            raise not_found()
        match = re.fullmatch(r"/projects/([^/]+)/jobs(?:/(\d+)(/cancel)?)?", path)
        if match:
            project_id = self.access.d.project_ref(match.group(1))  # an id or a URL-encoded path
            if project_id is None:
                raise not_found("Project")
            project = self.access.project(caller, project_id, level=DEVELOPER if match.group(3) else REPORTER)
            if match.group(2) is None and method == "GET":
                scopes = query.get("scope[]", []) + query.get("scope", [])
                if not set(scopes) <= JOB_STATUSES:
                    raise invalid("scope does not have a valid value")
                return 200, [self.job(j) for j in s.project_jobs(project.id, scopes)]
            job = s.jobs.get(int(match.group(2) or 0))
            if job is None or job.project_id != project.id:
                raise not_found("Job")
            if match.group(3) and method == "POST":
                return 201, self.job(s.cancel_job(job.id))
            if not match.group(3) and method == "GET":
                return 200, self.job(job)
            raise not_found()
        return None

    def _available(self, caller: Caller, kind: str, ref: str) -> list[SimRunner]:
        """lib/api/ci/runners.rb `GET /groups/:id/runners` (`authorize! :read_group_runners`:
        Owner, app/policies/group_policy.rb; `Ci::Runner.group_or_instance_wide`: the group's
        and its ancestors' runners and the instance's) and `GET /projects/:id/runners`
        (`read_project_runners`: Maintainer; `owned_or_instance_wide`: the project's, its
        groups' and the instance's). Unlike `GET /runners`, an administrator sees them
        without being a member."""
        d = self.access.d
        if kind == "groups":
            group = self.access.group(caller, ref, level=OWNER)
            groups = {g.id for g in d.ancestors(group.id)}
            return [r for r in self.state.runners.values()
                    if r.runner_type == "instance_type" or r.group_id in groups]
        if not ref.isdigit():
            raise not_found("Project")
        project = self.access.project(caller, int(ref), level=MAINTAINER)
        groups = d.project_group_ids(project.id)
        return [r for r in self.state.runners.values()
                if r.runner_type == "instance_type" or r.group_id in groups or r.project_id == project.id]

    def _create(self, caller: Caller, body: dict[str, Any]) -> dict[str, Any]:
        kind = body.get("runner_type")
        if kind is None:
            raise invalid("runner_type is missing, runner_type does not have a valid value")
        if kind not in RUNNER_TYPES:
            raise invalid("runner_type does not have a valid value")
        group_id, project_id = _int(body.get("group_id")), _int(body.get("project_id"))
        if kind == "group_type" and group_id is None:
            raise invalid("group_id is missing")
        if kind == "project_type" and project_id is None:
            raise invalid("project_id is missing")
        if kind == "group_type" and self.access.d.group(str(group_id)) is None:
            raise bad_request("Missing/invalid group")
        if kind == "project_type" and self.access.d.project(project_id or 0) is None:
            raise bad_request("Missing/invalid project")
        if not self.access.can_manage_runner(caller, kind, group_id, project_id):
            raise forbidden("Insufficient permissions")
        if not caller.admin and kind != "instance_type" and \
                kind.removesuffix("_type") not in self.state.runner_registrars:
            raise forbidden("Insufficient permissions")
        runner = self.state.create_runner(
            description=str(body.get("description", "")), tags=_tags(body.get("tag_list", [])),
            paused=bool(_bool(body.get("paused")) or False), runner_type=kind,
            group_id=group_id if kind == "group_type" else None,
            project_id=project_id if kind == "project_type" else None,
            run_untagged=bool(_bool(body.get("run_untagged", True))),
            locked=bool(_bool(body.get("locked", False))),
            maximum_timeout=_max_timeout(body, create=True), creator=caller.username)
        return {"id": runner.id, "token": runner.token, "token_expires_at": None}

    def runner_brief(self, r: SimRunner) -> dict[str, Any]:
        online = self.state.online(r)
        status = ("never_contacted" if r.contacted_at is None else "paused" if r.paused
                  else "online" if online else "offline")
        return {"id": r.id, "description": r.description, "ip_address": None, "active": not r.paused,
                "paused": r.paused, "is_shared": r.runner_type == "instance_type",
                "runner_type": r.runner_type, "name": "gitlab-runner", "online": online, "status": status}

    def runner_detail(self, r: SimRunner) -> dict[str, Any]:
        return {**self.runner_brief(r), "tag_list": sorted(r.tags), "run_untagged": r.run_untagged,
                "locked": r.locked, "maximum_timeout": r.maximum_timeout, "access_level": "not_protected",
                "contacted_at": _iso(r.contacted_at), "version": None,
                "groups": [{"id": r.group_id}] if r.group_id else [],
                "projects": [{"id": r.project_id}] if r.project_id else []}

    def _manager(self, m: SimManager) -> dict[str, Any]:
        return {"id": hash((m.runner_id, m.system_id)) % 1_000_000, "system_id": m.system_id,
                "version": None, "revision": None, "platform": None, "architecture": None,
                "created_at": _iso(m.created_at), "contacted_at": _iso(m.contacted_at), "ip_address": None,
                "status": "online" if self.state.manager_online(m) else "offline"}

    def job(self, j: SimJob) -> dict[str, Any]:
        """lib/api/entities/ci/job.rb (JobBasic plus runner, pipeline, project)."""
        runner = self.state.runners.get(j.runner_id) if j.runner_id else None
        user_id = self.access.d.users.get(j.user, 0)
        started = j.started_at
        return {"id": j.id, "status": j.status, "stage": j.stage, "name": j.name, "ref": j.ref,
                "tag": False, "allow_failure": False, "tag_list": sorted(j.tags),
                "created_at": _iso(j.created_at), "started_at": _iso(started),
                "finished_at": _iso(j.finished_at),
                "duration": None if started is None else (j.finished_at or self.state.clock()) - started,
                "queued_duration": (started or self.state.clock()) - j.pending_since,
                "failure_reason": j.failure_reason,
                "user": {"id": user_id, "username": j.user, "name": j.user, "state": "active"},
                "web_url": self.state.web_url(j), "project": {"id": j.project_id},
                "pipeline": {"id": j.pipeline_id, "project_id": j.project_id, "ref": j.ref,
                             "status": j.status},
                "runner": None if runner is None else self.runner_brief(runner),
                "runner_manager": None if runner is None or j.system_id is None else
                {"system_id": j.system_id}}


def _runner_matches(r: SimRunner, query: dict[str, list[str]]) -> bool:
    if "paused" in query and _bool(query["paused"][0]) != r.paused:
        return False
    if "type" in query and query["type"][0] != r.runner_type:
        return False
    return not ("tag_list" in query and not _tags(query["tag_list"][0]) <= r.tags)


def _tags(value: Any) -> frozenset[str]:
    items = value.split(",") if isinstance(value, str) else list(value or [])
    return frozenset(str(t).strip() for t in items if str(t).strip())


def _bool(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    return str(value).lower() in ("true", "1", "yes")


def _int(value: Any) -> int | None:
    if value in (None, ""):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise invalid("id is invalid") from None


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat().replace("+00:00", "Z")


__all__ = ["ApiError", "CiRoutes"]



def _max_timeout(body: dict[str, Any], *, create: bool = False) -> int | None:
    """`maximum_timeout` of a runner create or update. Grape checks the type (Integer:
    "maximum_timeout is invalid"); Ci::Runner validates it at least 600 s
    (app/models/ci/runner.rb). A failed validation: `PUT /runners/:id` answers 400 with
    the model's errors (`render_validation_error!`, lib/api/ci/runners.rb), `POST
    /user/runners` 400 with them as one sentence (`bad_request!(result.errors.to_sentence)`,
    lib/api/user_runners.rb). Given as null on an update, it clears the runner's
    (`declared_params(include_missing: false)` keeps a key given as null, and the model
    allows nil: the caller's `clear_maximum_timeout`)."""
    raw = body.get("maximum_timeout")
    if raw is None or raw == "":
        return None
    try:
        seconds = int(raw)
    except (TypeError, ValueError):
        raise invalid("maximum_timeout is invalid") from None
    if seconds < 600:
        if create:
            raise bad_request("Maximum timeout needs to be at least 10 minutes")
        raise ApiError(400, {"message": {"maximum_timeout": ["needs to be at least 10 minutes"]}})
    return seconds
