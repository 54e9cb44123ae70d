"""REST API v4 routes for users, tokens, groups, projects, members and project hooks.

Shapes and rules from gitlabhq/gitlabhq:
- lib/api/users.rb: `GET /user` (Entities::UserPublic; `is_admin` only for admins),
  `POST /users` (admins: username, name, email), `POST /users/:user_id/personal_access_tokens`
  (admins: name, scopes; 201 with the token, lib/api/entities/personal_access_token_with_token.rb).
- lib/api/personal_access_tokens/self_information.rb: `GET /personal_access_tokens/self`.
- lib/api/groups.rb: `GET /groups` (those the caller can see; all for admins;
  `min_access_level`), `GET /groups/:id`, `GET /groups/:id/projects` (`include_subgroups`).
- lib/api/projects.rb: `GET /projects` (private projects the caller is a member of; all
  for admins; `min_access_level`), `GET /projects/:id`.
- lib/api/members.rb: `GET /groups|projects/:id/members/all/:user_id` (one route for both
  source types; the effective level, inherited group memberships included, highest
  wins; 404 `Member Not Found`; any member of the source may read it),
  `POST /groups|projects/:id/members` (user_id, access_level; needs Owner of a group,
  Maintainer of a project).
- lib/api/project_hooks.rb: `POST /projects/:id/hooks` (url, token, job_events) and
  `GET /projects/:id/hooks`; needs Maintainer (`admin_project`); the token is never shown.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable
from typing import Any

from runnerctl.sim.gitlab_access import (
    MAINTAINER,
    OWNER,
    Access,
    ApiError,
    Caller,
    bad_request,
    invalid,
    not_found,
    require_admin,
)
from runnerctl.sim.gitlab_directory import AccessToken, SimGroup, SimProject
from runnerctl.sim.gitlab_hooks import Hooks
from runnerctl.sim.gitlab_rest_ci import _bool, _int, _iso

SCOPES = frozenset({"api", "read_api", "read_user", "create_runner", "manage_runner", "read_repository",
                    "write_repository", "read_registry", "write_registry", "sudo", "admin_mode",
                    "ai_features", "k8s_proxy", "read_service_ping", "self_rotate"})
"""lib/gitlab/auth.rb: the scopes a personal access token may have."""
LEVELS = frozenset({10, 20, 30, 40, 50})


class UserRoutes:
    def __init__(self, access: Access, hooks: Hooks, clock: Callable[[], float]) -> None:
        self.access = access
        self.d = access.d
        self.hooks = hooks
        self.clock = clock

    def route(self, caller: Caller, token: AccessToken | None, method: str, path: str,
              query: dict[str, list[str]], body: dict[str, Any]) -> tuple[int, Any] | None:
        if method == "GET" and path == "/user":
            return 200, self._user(caller.username, caller.admin)
        if method == "GET" and path == "/personal_access_tokens/self" and token is not None:
            return 200, _token(token, self.d.users.get(token.username, 0), self.clock())
        if method == "POST" and path == "/users":
            require_admin(caller)
            name = str(body.get("username") or "")
            if not name:
                raise invalid("username is missing")
            if name in self.d.users:
                raise _conflict("Username has already been taken")
            self.d.add_user(name, admin=bool(_bool(body.get("admin"))))
            return 201, self._user(name, True)
        match = re.fullmatch(r"/users/(\d+)/personal_access_tokens", path)
        if match and method == "POST":
            require_admin(caller)
            return 201, self._new_token(int(match.group(1)), body)
        if method == "GET" and path in ("/groups", "/projects"):
            return 200, self._listing(caller, path, query)
        match = re.fullmatch(r"/groups/([^/]+)(/projects|/members|/members/all/(\d+))?", path)
        if match:
            tail, member = match.group(2) or "", match.group(3)
            return self._group(caller, method, match.group(1), tail, member, query, body)
        match = re.fullmatch(r"/projects/(\d+)(/members|/hooks|/members/all/(\d+))?", path)
        if match:
            if match.group(3) is not None and method == "GET":
                return self._project_member(caller, int(match.group(1)), int(match.group(3)))
            return self._project(caller, method, int(match.group(1)), match.group(2) or "", body)
        return None

    def _user(self, name: str, show_admin: bool) -> dict[str, Any]:
        user: dict[str, Any] = {"id": self.d.users.get(name, 0), "username": name, "name": name,
                                "state": "active", "web_url": f"http://gitlab.sim/{name}"}
        if show_admin:
            user["is_admin"] = self.d.is_admin(name)
        return user

    def _new_token(self, user_id: int, body: dict[str, Any]) -> dict[str, Any]:
        name = self.d.user_name(user_id)
        if name is None:
            raise not_found("User")
        raw = body.get("scopes", body.get("scopes[]"))
        scopes = raw.split(",") if isinstance(raw, str) else list(raw or [])
        missing = [f for f, v in (("name", body.get("name")), ("scopes", scopes)) if not v]
        if missing:
            raise invalid(", ".join(f"{f} is missing" for f in missing))
        if not set(scopes) <= SCOPES:
            raise invalid("scopes does not have a valid value")
        made = self.d.add_token(name, scopes, name=str(body["name"]), created_at=self.clock(),
                                expires_at=self._expiry(body.get("expires_at")))
        return {**_token(made, user_id, self.clock()), "token": made.token}

    def _expiry(self, raw: object) -> str:
        """`expires_at` as given (a date), else 365 days on: since GitLab 16.0 no token
        is made without one (docs.gitlab.com/user/profile/personal_access_tokens; the
        365-day default of the admin API, gitlab-org/gitlab#429864)."""
        today = datetime.datetime.fromtimestamp(self.clock(), datetime.UTC).date()
        if raw in (None, ""):
            return (today + datetime.timedelta(days=365)).isoformat()
        try:
            return datetime.date.fromisoformat(str(raw)).isoformat()
        except ValueError:
            raise invalid("expires_at is invalid") from None

    def _group(self, caller: Caller, method: str, ref: str, tail: str, member_id: str | None,
               query: dict[str, list[str]], body: dict[str, Any]) -> tuple[int, Any]:
        if member_id is not None and method == "GET":
            group = self.access.group(caller, ref)
            name = self.d.user_name(int(member_id))
            level = self.d.group_level(group, name) if name else 0
            if not name or not level:
                raise not_found("Member")
            return 200, {"id": int(member_id), "username": name, "name": name, "state": "active",
                         "access_level": level}
        if tail == "/members" and method == "POST":
            group = self.access.group(caller, ref, level=OWNER)
            name, level = self._member_args(body)
            self.d.group_members.setdefault(group.full_path, {})[name] = level
            return 201, {"id": self.d.users[name], "username": name, "access_level": level}
        if tail == "/projects" and method == "GET":
            group = self.access.group(caller, ref)
            wanted = (self.d.descendants(group.id) if _bool(query.get("include_subgroups", ["false"])[0])
                      else {group.id})
            found = [p for p in self.d.projects.values() if p.group_id in wanted]
            return 200, [self.project_json(p) for p in sorted(found, key=lambda p: -p.id)]
        if not tail and method == "GET":
            return 200, self._group_json(self.access.group(caller, ref))
        raise not_found()

    def _project_member(self, caller: Caller, project_id: int, user_id: int) -> tuple[int, Any]:
        project = self.access.project(caller, project_id, level=0)  # any member (read_project_member)
        name = self.d.user_name(user_id)
        level = self.d.project_level(project, name) if name else 0
        if not name or not level:
            raise not_found("Member")
        return 200, {"id": user_id, "username": name, "name": name, "state": "active", "access_level": level}

    def _project(self, caller: Caller, method: str, project_id: int, tail: str,
                 body: dict[str, Any]) -> tuple[int, Any]:
        if tail == "/members" and method == "POST":
            project = self.access.project(caller, project_id, level=MAINTAINER)
            name, level = self._member_args(body)
            self.d.project_members.setdefault(project.id, {})[name] = level
            return 201, {"id": self.d.users[name], "username": name, "access_level": level}
        if tail == "/hooks":
            project = self.access.project(caller, project_id, level=MAINTAINER)
            if method == "POST":
                url = str(body.get("url") or "")
                if not url:
                    raise invalid("url is missing")
                if not re.match(r"https?://", url):
                    raise bad_request("Invalid url given")
                hook = self.hooks.add(project.id, url=url, token=str(body.get("token") or ""),
                                      job_events=bool(_bool(body.get("job_events"))))
                return 201, self.hooks.json(hook)
            if method == "GET":
                return 200, [self.hooks.json(h) for h in self.hooks.of_project(project.id)]
        if not tail and method == "GET":
            return 200, self.project_json(self.access.project(caller, project_id))
        raise not_found()

    def _listing(self, caller: Caller, path: str, query: dict[str, list[str]]) -> list[dict[str, Any]]:
        least = _int(query.get("min_access_level", [None])[0]) or 0
        every = caller.admin and not least
        if path == "/groups":
            groups = [g for g in self.d.groups.values()
                      if every or self.d.group_level(g, caller.username) >= max(least, 1)]
            return [self._group_json(g) for g in sorted(groups, key=lambda g: g.full_path)]
        projects = [p for p in self.d.projects.values()
                    if every or self.d.project_level(p, caller.username) >= max(least, 1)]
        return [self.project_json(p) for p in sorted(projects, key=lambda p: -p.id)]

    def _member_args(self, body: dict[str, Any]) -> tuple[str, int]:
        user_id, level = _int(body.get("user_id")), _int(body.get("access_level"))
        if user_id is None or level is None:
            raise invalid("user_id is missing, access_level is missing")
        if level not in LEVELS:
            raise invalid("access_level does not have a valid value")
        name = self.d.user_name(user_id)
        if name is None:
            raise not_found("User")
        return name, level

    def _group_json(self, g: SimGroup) -> dict[str, Any]:
        return {"id": g.id, "name": g.path, "path": g.path, "full_path": g.full_path,
                "full_name": g.full_path,
                "parent_id": g.parent_id, "visibility": "private"}

    def project_json(self, p: SimProject) -> dict[str, Any]:
        group = self.d.groups.get(p.group_id) if p.group_id is not None else None
        return {"id": p.id, "name": p.path, "path": p.path, "path_with_namespace": p.path_with_namespace,
                "visibility": "private", "shared_runners_enabled": True,
                "namespace": None if group is None else {"id": group.id, "path": group.path,
                                                         "full_path": group.full_path, "kind": "group"}}


def _token(t: AccessToken, user_id: int, now: float) -> dict[str, Any]:
    return {"id": t.id, "name": t.name, "revoked": t.revoked, "created_at": _iso(t.created_at),
            "scopes": sorted(t.scopes), "user_id": user_id, "last_used_at": None,
            "active": not t.revoked and not t.expired(now), "expires_at": t.expires_at}


def _conflict(message: str) -> ApiError:
    return ApiError(409, {"message": message})
