"""What runnerctl's GitLab token needs, checked before anything is created.

`init` would otherwise learn of a missing scope or role from a 403 halfway through
(after deleting orphans, say), and `serve` only from failed polls. So `init` and
`doctor` ask GitLab first and name what is missing in one line.

What GitLab really demands (gitlabhq/gitlabhq):
- scope `api`: `lib/api/api.rb` admits `api` everywhere and `read_api` only for GET;
  `create_runner` reaches nothing but `POST /user/runners` (`lib/api/user_runners.rb`) and
  `manage_runner` only paths under `/runners/:id` (`lib/api/ci/runners.rb`), while
  runnerctl also lists runners (`GET /runners`) and reads jobs (`GET /projects/:id/jobs`);
- role: Owner of the group for group runners (`app/policies/group_policy.rb`: only
  `owner` enables `create_runner` and `admin_runner`), Maintainer of the project for project
  runners (`app/policies/project_policy.rb`: `maintainer` enables `create_runner` and
  `admin_project_runners`), an administrator for instance runners
  (`Ci::Runners::CreateRunnerService`, instance strategy).
The scopes come from `GET /personal_access_tokens/self`, the role from `GET
/groups|projects/:id/members/all/:user_id` (lib/api/members.rb; inherited memberships
included).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from runnerctl.errors import PermanentError
from runnerctl.gitlab import REQUIRED_SCOPE, RunnerScope, TokenInfo, TokenUser

MAINTAINER = 40
OWNER = 50
ROLE_NAMES = {0: "no membership", 10: "Guest", 15: "Planner", 20: "Reporter", 30: "Developer",
              MAINTAINER: "Maintainer", OWNER: "Owner"}
"""GitLab's access levels (lib/gitlab/access.rb)."""


class AccessReader(Protocol):
    """The reads the check needs (runnerctl.gitlab.PythonGitLab has them)."""

    def token_info(self) -> TokenInfo | None: ...
    def token_user(self) -> TokenUser: ...
    def group_access_level(self, group: str, user_id: int) -> int: ...
    def project_access_level(self, project: str, user_id: int) -> int: ...


@dataclasses.dataclass(frozen=True)
class Access:
    """What the token has, as GitLab reported it."""

    scopes: tuple[str, ...] | None  # None: GitLab could not say (not a personal access token)
    user: TokenUser
    level: int  # in the group or project of the scope; 0 for instance runners

    def describe(self) -> str:
        scopes = "unknown scopes" if self.scopes is None else "scopes " + (", ".join(self.scopes) or "none")
        if self.user.id == 0:
            return f"token with {scopes} (its user cannot be read with them)"
        role = "administrator" if self.user.is_admin else role_name(self.level)
        return f"token of {self.user.username} ({role}), {scopes}"


def role_name(level: int) -> str:
    return ROLE_NAMES.get(level, f"access level {level}")


def needed_role(scope: RunnerScope) -> tuple[int, str]:
    """(access level, what) the token's user needs to create and manage these runners."""
    if scope.group_id is not None:
        return OWNER, f"Owner of group {scope.group_id}"
    if scope.project_id is not None:
        return MAINTAINER, f"Maintainer of project {scope.project_id}"
    return 0, "an administrator (instance runners)"


def read_access(gitlab: AccessReader, scope: RunnerScope) -> Access:
    """Scopes first: a token without `read_user`, `read_api` or `api` cannot even read
    its user (lib/api/users.rb), and its scopes are the news then."""
    info = gitlab.token_info()
    scopes = None if info is None else info.scopes
    if scopes is not None and not {REQUIRED_SCOPE, "read_api", "read_user"} & set(scopes):
        return Access(scopes, TokenUser(0, "?"), 0)
    user = gitlab.token_user()
    level = 0
    if scope.group_id is not None:
        level = gitlab.group_access_level(str(scope.group_id), user.id)
    elif scope.project_id is not None:
        level = gitlab.project_access_level(str(scope.project_id), user.id)
    return Access(scopes, user, level)


def missing(access: Access, scope: RunnerScope) -> list[str]:
    """What the token lacks, each as one phrase; empty when it has all it needs."""
    found = []
    if access.scopes is not None and REQUIRED_SCOPE not in access.scopes:
        has = ", ".join(access.scopes) or "none"
        found.append(f"the `{REQUIRED_SCOPE}` scope (the token has: {has})")
    level, role = needed_role(scope)
    if access.user.id == 0:  # not readable with these scopes: the scope is what to fix first
        return found
    if not access.user.is_admin and (level == 0 or access.level < level):
        found.append(f"the role {role} (user {access.user.username} has "
                     f"{role_name(access.level)})")
    return found


def require(gitlab: AccessReader, scope: RunnerScope) -> Access:
    """The token's access, or PermanentError naming what is missing (nothing was changed)."""
    access = read_access(gitlab, scope)
    lacking = missing(access, scope)
    if lacking:
        admin_mode = "" if scope.group_id is not None or scope.project_id is not None else (
            "; where Admin Mode is on, GitLab counts a token as an administrator's only with the "
            "admin_mode scope too")
        raise PermanentError("the GitLab token is missing " + " and ".join(lacking) + "; nothing was changed",
                             hint=f"make a token with the {REQUIRED_SCOPE} scope as a user who is "
                                  f"{needed_role(scope)[1]}{admin_mode}")
    return access
