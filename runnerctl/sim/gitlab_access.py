"""Who may call what in the simulated GitLab: token scopes, roles, and GitLab's error bodies.

Kept apart from the routes so that each rule is written once, with its source
(gitlabhq/gitlabhq):

Scopes, checked before any route runs (lib/api/api_guard.rb `validate_and_save_access_token!`;
each API class declares what it lets in with `allow_access_with_scope`):
- lib/api/api.rb: `api` everywhere; `read_api` for GET and HEAD.
- lib/api/user_runners.rb: `create_runner` for `POST /user/runners`.
- lib/api/ci/runners.rb: `manage_runner` where the path is `/api/v4/runners/:id...`
  (`request.params.key?(:id) && path =~ %r{/api/v[34]/runners/}`), so not `GET /runners`
  nor `GET /runners/all`.
- lib/api/users.rb: `read_user` for GET and HEAD on `/user` and `/users`.
- lib/api/personal_access_tokens/self_information.rb: any scope for
  `/personal_access_tokens/self` (personal access tokens only).
- A token lacking them gets 403 `{"error": "insufficient_scope", "error_description":
  "The request requires higher privileges than provided by the access token.", "scope":
  "..."}` and a `WWW-Authenticate: Bearer ...` header (api_guard.rb
  `InsufficientScopeError` through Rack::OAuth2's Bearer::Forbidden).

Error bodies (lib/api/helpers.rb): `forbidden!(reason)` -> 403 `{"message": "403 Forbidden -
reason"}`, `not_found!(thing)` -> 404 `{"message": "404 Thing Not Found"}`,
`bad_request!(reason)` -> 400 `{"message": "400 Bad request - reason"}`, `unauthorized!`
-> 401 `{"message": "401 Unauthorized"}` (an unknown token too); a known token that expired
or was revoked -> 401 `{"error": "invalid_token", "error_description": "Token is expired.
..."}` (lib/api/api_guard.rb, checked in auth_finders.rb `validate_access_token!`); Grape's
own parameter validation answers 400 `{"error": "x is missing"}` (lib/api/api.rb
`rescue_from Grape::Exceptions::ValidationErrors`).

Roles (app/policies/group_policy.rb, project_policy.rb, ci/runner_policy.rb): creating
and managing a group runner needs Owner of the group; a project runner Maintainer of the
project; instance runners an administrator (`GET /runners/all`, `POST /user/runners` with
`instance_type`, `POST /users/:id/personal_access_tokens` use `authenticated_as_admin!`).
Reading a private project's jobs needs Reporter (`read_build`), cancelling one Developer
(`cancel_build`), project hooks Maintainer (`admin_project`); reading a private group
(its projects, its members) any membership.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from runnerctl.sim.gitlab_directory import (
    DEVELOPER,
    MAINTAINER,
    OWNER,
    REPORTER,
    Directory,
    SimGroup,
    SimProject,
)

INSUFFICIENT = "The request requires higher privileges than provided by the access token."


class ApiError(Exception):
    """An answer other than success: status, JSON body, headers."""

    def __init__(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        super().__init__(str(body))
        self.status, self.body, self.headers = status, body, dict(headers or {})


def forbidden(reason: str = "") -> ApiError:
    return ApiError(403, {"message": "403 Forbidden" + (f" - {reason}" if reason else "")})


def not_found(thing: str = "") -> ApiError:
    return ApiError(404, {"message": f"404 {thing} Not Found" if thing else "404 Not found"})


def bad_request(reason: str) -> ApiError:
    return ApiError(400, {"message": f"400 Bad request - {reason}"})


def invalid(reason: str) -> ApiError:
    """Grape's parameter validation error."""
    return ApiError(400, {"error": reason})


def unauthorized() -> ApiError:
    return ApiError(401, {"message": "401 Unauthorized"})


def invalid_token(description: str) -> ApiError:
    """A token GitLab knows but refuses, expired or revoked (lib/api/api_guard.rb
    `ExpiredError`/`RevokedError` through Rack::OAuth2's Bearer::Unauthorized)."""
    return ApiError(401, {"error": "invalid_token", "error_description": description},
                    {"WWW-Authenticate": f'Bearer realm="The API", error="invalid_token", '
                                         f'error_description="{description}"'})


@dataclasses.dataclass(frozen=True)
class Caller:
    username: str
    scopes: frozenset[str]
    kind: str  # "personal" or "oauth"
    admin: bool


def allowed_scopes(method: str, path: str) -> frozenset[str]:
    """The scopes that let a token call `method path` (path without /api/v4)."""
    scopes = {"api"}
    if method in ("GET", "HEAD"):
        scopes.add("read_api")
    if method == "POST" and path == "/user/runners":
        scopes.add("create_runner")
    if re.fullmatch(r"/runners/\d+(/.*)?", path):
        scopes.add("manage_runner")
    if method in ("GET", "HEAD") and (path == "/user" or path.startswith("/users")):
        scopes.add("read_user")
    return frozenset(scopes)


def check_scope(caller: Caller, method: str, path: str) -> None:
    if path == "/personal_access_tokens/self":
        if caller.kind != "personal":
            raise bad_request("This endpoint requires token type to be a personal access token")
        return
    needed = allowed_scopes(method, path)
    if caller.scopes & needed:
        return
    scope = " ".join(sorted(needed))
    raise ApiError(403, {"error": "insufficient_scope", "error_description": INSUFFICIENT, "scope": scope},
                   {"WWW-Authenticate": f'Bearer realm="", error="insufficient_scope", '
                                        f'error_description="{INSUFFICIENT}", scope="{scope}"'})


def require_admin(caller: Caller) -> None:
    if not caller.admin:
        raise forbidden()


def _need(caller: Caller, have: int | None, level: int, thing: str) -> None:
    """`have` None: no such thing. A private group or project is invisible (404) to non-members."""
    if have is None or (not caller.admin and not have):
        raise not_found(thing)
    if not caller.admin and have < level:
        raise forbidden()


class Access:
    """Role checks against the directory: each raises GitLab's error or returns what was asked for."""

    def __init__(self, directory: Directory) -> None:
        self.d = directory

    def group(self, caller: Caller, ref: str, *, level: int = 0) -> SimGroup:
        """A group the caller can see (any member of it or an ancestor), at `level` or more."""
        group = self.d.group(ref)
        _need(caller, None if group is None else self.d.group_level(group, caller.username), level, "Group")
        assert group is not None
        return group

    def project(self, caller: Caller, project_id: int, *, level: int = REPORTER) -> SimProject:
        project = self.d.project(project_id)
        _need(caller, None if project is None else self.d.project_level(project, caller.username), level,
              "Project")
        assert project is not None
        return project

    def reads_project(self, caller: Caller, project_id: int) -> bool:
        """Reporter or more in the project, directly or through its groups."""
        project = self.d.projects.get(project_id)
        return project is not None and self.d.project_level(project, caller.username) >= REPORTER

    def can_manage_runner(self, caller: Caller, runner_type: str, group_id: int | None,
                          project_id: int | None) -> bool:
        if caller.admin:
            return True
        if runner_type == "group_type" and group_id is not None:
            group = self.d.groups.get(group_id)
            return group is not None and self.d.group_level(group, caller.username) >= OWNER
        if runner_type == "project_type" and project_id is not None:
            project = self.d.projects.get(project_id)
            return project is not None and self.d.project_level(project, caller.username) >= MAINTAINER
        return False

    def owned_runner_scopes(self, caller: Caller) -> tuple[set[int], set[int]]:
        """(group ids, project ids) whose runners `GET /runners` lists for the caller
        (app/models/user.rb `ci_owned_runners`: groups where Owner, with subgroups;
        projects where Maintainer)."""
        groups = {g.id for g in self.d.groups.values() if self.d.group_level(g, caller.username) >= OWNER}
        projects = {p.id for p in self.d.projects.values()
                    if self.d.project_level(p, caller.username) >= MAINTAINER}
        return groups, projects


__all__ = ["DEVELOPER", "MAINTAINER", "OWNER", "REPORTER", "Access", "ApiError", "Caller", "allowed_scopes",
           "bad_request", "check_scope", "forbidden", "invalid", "not_found", "require_admin", "unauthorized"]
