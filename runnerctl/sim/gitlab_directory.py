"""Who and what exists in the simulated GitLab: users, groups, projects and member roles.

Kept apart from runners and jobs (`gitlab_state`) because both the job queue (which
group runners serve a project) and the HTTP fake (who may do what) read it, and the
OAuth provider shares its user and member tables.

Rules followed, each from GitLab's source (gitlabhq/gitlabhq):
- Access levels are `Gitlab::Access` (lib/gitlab/access.rb): 10 Guest, 20 Reporter,
  30 Developer, 40 Maintainer, 50 Owner.
- `GET /groups/:id/members/all/:user_id` (lib/api/members.rb, `all` variant) returns a
  member's effective level including what is inherited from ancestor groups
  (app/finders/members_finder.rb / group_members_finder.rb: direct and inherited
  members); the highest level wins. A group's `:id` is its id or URL-encoded full path
  (lib/api/helpers.rb `find_group`).
- A project's members include those of its group and that group's ancestors
  (app/models/project_team.rb via `members_in_project_and_ancestors`).
- Administrators (`users.admin`) pass every policy check (app/policies/base_policy.rb
  `admin` condition, used by group_policy.rb and project_policy.rb).

`strict=False` (the default for a bare `GitLabState()`) creates a group or project the
first time an id is used, as the administrators would have (they become its Owners, as
a group's creator does): unit tests of runnerctl's client code then need no setup.
A project made that way belongs to no group (group runners do not serve it); `add_project`
with `group_id` puts it in one. `runnerctl sim gitlab` and the tests of GitLab's rules use
`strict=True`, where an unknown id is 404 as in GitLab.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import secrets
import urllib.parse
from collections.abc import Iterable

GUEST, REPORTER, DEVELOPER, MAINTAINER, OWNER = 10, 20, 30, 40, 50


@dataclasses.dataclass
class SimGroup:
    id: int
    path: str
    parent_id: int | None = None
    full_path: str = ""


@dataclasses.dataclass
class AccessToken:
    """A personal access token or an OAuth access token, with its scopes.

    app/models/personal_access_token.rb (scopes from lib/gitlab/auth.rb: `api`,
    `read_api`, `read_user`, `create_runner`, `manage_runner`, ...); OAuth tokens carry
    the scopes the application asked for (Doorkeeper, lib/gitlab/auth/oauth).
    """

    id: int
    token: str = dataclasses.field(repr=False)
    username: str
    scopes: frozenset[str]
    name: str = ""
    kind: str = "personal"  # or "oauth"
    created_at: float = 0.0
    revoked: bool = False
    expires_at: str | None = None
    """A date (`YYYY-MM-DD`); refused from the start of that day, UTC (`expired`)."""

    def expired(self, now: float) -> bool:
        """PersonalAccessToken's `expired?` as unified by gitlab-org/gitlab MR 93504: at
        the beginning of its `expires_at` day (server time; UTC here)."""
        if self.expires_at is None:
            return False
        today = datetime.datetime.fromtimestamp(now, datetime.UTC).date()
        return datetime.date.fromisoformat(self.expires_at) <= today


@dataclasses.dataclass
class SimProject:
    id: int
    path: str
    group_id: int | None = None
    path_with_namespace: str = ""


class Directory:
    """Users, groups, projects and member levels.

    `users` (username -> id) and `group_members` (group full path -> username -> access
    level) are plain dicts the OAuth provider shares, so a test may fill them directly.
    """

    def __init__(self, *, strict: bool = False) -> None:
        self.strict = strict
        self.users: dict[str, int] = {}
        self.admins: set[str] = set()
        self.groups: dict[int, SimGroup] = {}
        self.group_members: dict[str, dict[str, int]] = {}
        self.projects: dict[int, SimProject] = {}
        self.project_members: dict[int, dict[str, int]] = {}
        self.tokens: dict[str, AccessToken] = {}
        self._ids = itertools.count(100)
        self._token_ids = itertools.count(1)

    # -- users -------------------------------------------------------------------
    def add_user(self, username: str, *, admin: bool = False, user_id: int | None = None) -> int:
        if username not in self.users:
            self.users[username] = user_id if user_id is not None else self._next_id(self.users.values())
        if admin:
            self.admins.add(username)
        return self.users[username]

    def user_name(self, user_id: int) -> str | None:
        return next((name for name, uid in self.users.items() if uid == user_id), None)

    def is_admin(self, username: str) -> bool:
        return username in self.admins

    def add_token(self, username: str, scopes: Iterable[str], *, name: str = "", token: str | None = None,
                  kind: str = "personal", created_at: float = 0.0,
                  expires_at: str | None = None) -> AccessToken:
        """A token for a user (created if unknown); `glpat-` tokens as GitLab writes them."""
        self.add_user(username)
        value = token or ("glpat-" if kind == "personal" else "") + secrets.token_urlsafe(20)
        found = AccessToken(next(self._token_ids), value, username, frozenset(scopes), name, kind, created_at,
                            expires_at=expires_at)
        self.tokens[value] = found
        return found

    def token(self, value: str) -> AccessToken | None:
        """The token, revoked and expired ones too (auth_finders.rb `find_personal_access_token`
        finds them; `validate_access_token!` refuses them later)."""
        return self.tokens.get(value) if value else None

    # -- groups and projects -----------------------------------------------------
    def add_group(self, path: str, *, parent_id: int | None = None, group_id: int | None = None) -> SimGroup:
        gid = group_id if group_id is not None else self._next_id(self.groups)
        parent = self.groups.get(parent_id) if parent_id is not None else None
        full = f"{parent.full_path}/{path}" if parent else path
        group = SimGroup(gid, path, parent_id, full)
        self.groups[gid] = group
        self.group_members.setdefault(full, {})
        return group

    def add_project(self, path: str, *, group_id: int | None = None,
                    project_id: int | None = None) -> SimProject:
        pid = project_id if project_id is not None else self._next_id(self.projects)
        group = self.groups.get(group_id) if group_id is not None else None
        project = SimProject(pid, path, group_id, f"{group.full_path}/{path}" if group else path)
        self.projects[pid] = project
        self.project_members.setdefault(pid, {})
        return project

    def project_ref(self, ref: str) -> int | None:
        """A project's id from a route's `:id`: the id, or its URL-encoded full path
        (lib/api/helpers.rb `find_project`: digits are an id, else a path); None when no
        project has that path."""
        text = urllib.parse.unquote(ref)
        if text.isdigit():
            return int(text)
        return next((p.id for p in self.projects.values() if p.path_with_namespace == text), None)

    def group(self, ref: str | int) -> SimGroup | None:
        """A group by id or (URL-encoded) full path; in lenient mode an unknown id is created."""
        text = urllib.parse.unquote(str(ref))
        if text.isdigit():
            found = self.groups.get(int(text))
            if found is None and not self.strict:
                found = self.add_group(f"group-{text}", group_id=int(text))
                self.group_members[found.full_path].update(dict.fromkeys(self.admins, OWNER))
            return found
        found = next((g for g in self.groups.values() if g.full_path == text), None)
        if found is None and text in self.group_members:  # a members table filled in directly
            found = self.add_group(text)
        return found

    def project(self, project_id: int) -> SimProject | None:
        found = self.projects.get(project_id)
        if found is None and not self.strict:
            found = self.add_project(f"project-{project_id}", project_id=project_id)
            self.project_members[project_id].update(dict.fromkeys(self.admins, OWNER))
        return found

    def ancestors(self, group_id: int | None) -> list[SimGroup]:
        """The group itself, then its parent, up to the top-level group."""
        chain: list[SimGroup] = []
        while group_id is not None and group_id in self.groups and len(chain) < 32:
            chain.append(self.groups[group_id])
            group_id = self.groups[group_id].parent_id
        return chain

    def descendants(self, group_id: int) -> set[int]:
        found = {group_id}
        grew = True
        while grew:
            more = {g.id for g in self.groups.values() if g.parent_id in found} - found
            found |= more
            grew = bool(more)
        return found

    def project_group_ids(self, project_id: int) -> set[int]:
        project = self.project(project_id)
        return {g.id for g in self.ancestors(project.group_id if project else None)}

    # -- member levels -----------------------------------------------------------
    def group_level(self, group: SimGroup, username: str) -> int:
        """Effective level in a group: direct or inherited from an ancestor, highest wins."""
        return max((self.group_members.get(g.full_path, {}).get(username, 0)
                    for g in self.ancestors(group.id)), default=0)

    def project_level(self, project: SimProject, username: str) -> int:
        direct = self.project_members.get(project.id, {}).get(username, 0)
        inherited = max((self.group_members.get(g.full_path, {}).get(username, 0)
                         for g in self.ancestors(project.group_id)), default=0)
        return max(direct, inherited)

    def _next_id(self, taken: Iterable[int]) -> int:
        used = set(taken)
        while True:
            candidate = next(self._ids)
            if candidate not in used:
                return candidate
