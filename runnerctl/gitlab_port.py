"""What runnerctl needs from GitLab (`GitLabPort`) and the plain records it answers with.

The port and its records live apart from their python-gitlab implementation (gitlab.py,
the one door to GitLab, which re-exports them) so the door stays one screen of HTTP and
error mapping. Nothing here talks to GitLab.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any, Literal, Protocol

RunnerType = Literal["instance_type", "group_type", "project_type"]


@dataclasses.dataclass(frozen=True)
class RunnerScope:
    """Where runners are created: a group, a project, or the instance (admins only)."""

    runner_type: RunnerType = "instance_type"
    group_id: int | None = None
    project_id: int | None = None

    def create_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"runner_type": self.runner_type}
        if self.group_id is not None:
            fields["group_id"] = self.group_id
        if self.project_id is not None:
            fields["project_id"] = self.project_id
        return fields


@dataclasses.dataclass(frozen=True)
class RunnerInfo:
    id: int
    description: str
    paused: bool
    tags: tuple[str, ...]
    online: bool | None = None
    maximum_timeout: int | None = None
    """The runner's maximum job timeout (s; None: not set): GitLab caps the timeout of
    every job the runner takes at it (gitlabhq doc/ci/runners/configure_runners.md, "Set
    the maximum job timeout"), so a job this runner may start ends by then."""


@dataclasses.dataclass(frozen=True)
class RunnerReach:
    """Where a runner takes jobs from (`GET /runners/:id`: `runner_type`, `groups`,
    `projects`): a group runner serves the projects of its group and its subgroups, a
    project runner the projects it is assigned to, an instance runner every project."""

    runner_type: str
    group_ids: tuple[int, ...] = ()
    project_ids: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class TokenUser:
    """The token's user (`GET /user`; `is_admin` is only sent to administrators)."""

    id: int
    username: str
    is_admin: bool = False


@dataclasses.dataclass(frozen=True)
class TokenInfo:
    """What `GET /personal_access_tokens/self` says of the token
    (lib/api/personal_access_tokens/self_information.rb, PersonalAccessTokenEntity)."""

    scopes: tuple[str, ...]
    expires_on: datetime.date | None
    """Its `expires_at`, a date: GitLab refuses the token from the start of that day
    (PersonalAccessToken `active` scope, gitlab-org/gitlab MR 93504) with 401
    `invalid_token` "Token is expired." (lib/api/api_guard.rb); None: it never expires."""


@dataclasses.dataclass(frozen=True, repr=False)
class CreatedRunner:
    id: int
    token: str
    token_expires_at: str | None

    def __repr__(self) -> str:  # never show the token
        return f"CreatedRunner(id={self.id}, token=<hidden>)"


@dataclasses.dataclass(frozen=True)
class JobInfo:
    id: int
    project_id: int | None
    status: str
    tags: tuple[str, ...]
    created_at: str | None
    user: str | None
    web_url: str | None
    runner_id: int | None = None
    name: str | None = None
    queued_duration: float | None = None
    """Seconds it has been pending, as GitLab answered (lib/api/entities/ci/job_basic.rb;
    app/models/commit_status.rb: from `queued_at` to its start or now)."""


class GitLabPort(Protocol):
    """What runnerctl needs from GitLab; the simulator implements it in memory."""

    def create_runner(self, *, description: str, tags: list[str], paused: bool,
                      scope: RunnerScope, maximum_timeout: int | None = None) -> CreatedRunner: ...
    def get_runner(self, runner_id: int) -> RunnerInfo | None: ...
    def list_runners(self, scope: RunnerScope) -> list[RunnerInfo]: ...
    def set_paused(self, runner_id: int, paused: bool) -> None: ...
    def set_tags(self, runner_id: int, tags: list[str]) -> None: ...
    def set_maximum_timeout(self, runner_id: int, seconds: int | None) -> None: ...
    def delete_runner(self, runner_id: int) -> None: ...
    def running_jobs(self, runner_id: int, status: str = "running") -> list[JobInfo]: ...
    def pending_jobs(self, project_id: int) -> list[JobInfo]: ...
    def job(self, project_id: int | str, job_id: int) -> JobInfo | None: ...
    def runner_reach(self, runner_id: int) -> RunnerReach | None: ...
    def group_projects(self, group_id: int) -> list[int]: ...
    def heartbeat_runner(self, token: str, *, system_id: str) -> None: ...
    def contact_runner(self, token: str) -> None: ...
    def token_info(self) -> TokenInfo | None: ...
