"""The one door to GitLab: a small port, and its python-gitlab implementation.

Only this module talks HTTP to GitLab. Errors become `PermanentError` (fix the token or
permissions first) or `TemporaryError(delay)` (rate limit, 5xx, network), so callers
decide how to retry; python-gitlab's own sleeping retries are switched off, and the
`Retry-After` of a 429 is read from the response through a requests session hook.
Tokens are never put in messages or logs.

Sources: docs.gitlab.com/api/runners (create via POST /user/runners, list, get, update
`paused`, delete, jobs of a runner, verify), docs.gitlab.com/api/jobs (pending jobs of a
project, one job), docs.gitlab.com/api/groups (a group's projects), docs.gitlab.com/api/users
(current user), docs.gitlab.com/api/members (`GET /groups/:id/members/all/:user_id`,
`access_level`), docs.gitlab.com/api/personal_access_tokens (`GET
/personal_access_tokens/self`: the token's own scopes), docs.gitlab.com/api/oauth2
(`POST /oauth/token`: authorization code with PKCE, for the web page's "Sign in with GitLab").

Scopes, as GitLab checks them (gitlabhq): `lib/api/api.rb` lets `api` reach every endpoint
and `read_api` only GET/HEAD; `lib/api/user_runners.rb` adds `create_runner` for `POST
/user/runners` alone; `lib/api/ci/runners.rb` adds `manage_runner` only for paths under
`/runners/:id`. So runnerctl, which also lists runners and reads project jobs, needs `api`.
A token without the scope an endpoint accepts gets 403 with the body
`{"error": "insufficient_scope", ..., "scope": "<the scopes it accepts>"}`
(`lib/api/api_guard.rb`, Rack::OAuth2 Bearer::Forbidden): `InsufficientScope` names them.
"""

from __future__ import annotations

import collections
import datetime
import email.utils
import json
import logging
import math
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, TypeVar

import gitlab
import gitlab.exceptions
import requests
from gitlab.v4.objects import CurrentUserRunnerManager

from runnerctl.errors import NotFoundError, PermanentError, TemporaryError, redact
from runnerctl.gitlab_port import (
    CreatedRunner,
    GitLabPort,
    JobInfo,
    RunnerInfo,
    RunnerReach,
    RunnerScope,
    RunnerType,
    TokenInfo,
    TokenUser,
)

__all__ = ["REQUIRED_SCOPE", "CreatedRunner", "GitLabPort", "InsufficientScope", "JobInfo", "PythonGitLab",
           "RunnerInfo", "RunnerReach", "RunnerScope", "RunnerType", "TokenInfo", "TokenUser",
           "exchange_oauth_code"]

log = logging.getLogger(__name__)

REQUIRED_SCOPE = "api"
"""The one token scope runnerctl's GitLab token needs (see the module docstring)."""
DEFAULT_TIMEOUT_S = 10.0
"""Per-request timeout: long enough for a busy GitLab, short enough to keep a tick alive."""
DEFAULT_RETRY_S = 5.0
"""Delay suggested after a 5xx or network failure without Retry-After."""
RATE_LIMIT_RETRY_S = 60.0
"""Delay after a 429 without Retry-After, which GitLab's own rate limits mostly send
(lib/api/helpers/rate_limiter.rb): their windows are a minute (`project_jobs_api_rate_limit`
per minute and user for `GET /projects/:id/jobs`), so an earlier try is refused again."""

T = TypeVar("T")
_NO_RETRY: dict[str, Any] = {"obey_rate_limit": False, "max_retries": 0}
"""Per-request options: python-gitlab must not sleep and retry by itself; callers do."""
CONTACT_ONLY_SYSTEM_ID = "r_runnerctl-contact-only"
"""A system_id no gitlab-runner makes (theirs are `r_` or `s_` and 12 letters and digits:
gitlab-runner commands/internal/configfile/system_id_state.go) and runnerctl never
verifies with, so GitLab never has a manager of it: `contact_runner` deletes nothing."""


MAX_RETRY_AFTER_S = 3600.0
"""The longest wait a Retry-After date asks for; one further ahead (a proxy's clock off)
is taken as this."""


def retry_after(header: str | None, now: float) -> float | None:
    """Seconds to wait from a `Retry-After` header (RFC 9110 10.2.3: seconds, or an
    HTTP date, as a proxy in front of GitLab may send), None when absent or unreadable;
    a date already past is 0."""
    if not header:
        return None
    text = header.strip()
    if text.isascii() and text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110: HTTP dates are GMT
        when = when.replace(tzinfo=datetime.UTC)
    return min(max(0.0, when.timestamp() - now), MAX_RETRY_AFTER_S)


class PythonGitLab:
    """GitLabPort over python-gitlab."""

    def __init__(self, url: str, token: str, *, timeout: float = DEFAULT_TIMEOUT_S,
                 oauth: bool = False) -> None:
        """`token`: an access token, or with `oauth` a user's OAuth access token (Bearer)."""
        self.url = url.rstrip("/")
        self.where = redact(self.url)
        """The URL as messages and logs show it: a password in it masked."""
        self.requests_by_status: collections.Counter[str] = collections.Counter()
        self._retry_after: float | None = None
        session = requests.Session()
        session.hooks["response"].append(self._observe)
        self._gl = gitlab.Gitlab(
            self.url, private_token=None if oauth else token, oauth_token=token if oauth else None,
            timeout=timeout, session=session,
            retry_transient_errors=False,
        )

    def _observe(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        self.requests_by_status[str(response.status_code)] += 1
        self._retry_after = retry_after(response.headers.get("Retry-After"), time.time())

    def create_runner(self, *, description: str, tags: list[str], paused: bool,
                      scope: RunnerScope, maximum_timeout: int | None = None) -> CreatedRunner:
        fields = {**scope.create_fields(), "description": description, "paused": paused,
                  "tag_list": tags, "run_untagged": False, "locked": True}
        if maximum_timeout is not None:
            fields["maximum_timeout"] = maximum_timeout
        manager = CurrentUserRunnerManager(self._gl)
        try:
            created = self._call("create a runner", lambda: manager.create(fields, **_NO_RETRY))
        except _Forbidden as exc:
            if scope.runner_type == "instance_type":
                raise
            kind = "group" if scope.runner_type == "group_type" else "project"
            raise PermanentError(exc.message, hint=(  # init checked the role before it created any
                f"a user with the role may still be refused where an administrator turned off 'Members of "
                f"the {kind} can register runners' (Admin area > Settings > CI/CD > Runners), which GitLab's "
                f"{kind} policy applies to creating runners too")) from None
        return CreatedRunner(id=int(created.id), token=str(created.token),
                             token_expires_at=getattr(created, "token_expires_at", None))

    def _runner(self, runner_id: int) -> dict[str, Any] | None:
        """`GET /runners/:id`'s fields; None when the runner is gone."""
        try:
            runner = self._call(f"read runner {runner_id}",
                                lambda: self._gl.runners.get(runner_id, **_NO_RETRY))
        except _NotFound:
            return None
        return dict(runner.attributes)

    def get_runner(self, runner_id: int) -> RunnerInfo | None:
        attrs = self._runner(runner_id)
        if attrs is None:
            return None
        return RunnerInfo(
            id=int(attrs["id"]), description=str(attrs.get("description") or ""),
            paused=bool(attrs.get("paused", not attrs.get("active", True))),
            tags=tuple(attrs.get("tag_list") or ()), online=attrs.get("online"),
            maximum_timeout=_seconds(attrs.get("maximum_timeout")),
        )

    def list_runners(self, scope: RunnerScope) -> list[RunnerInfo]:
        """The runners of the scope's type that its group or project can use (`GET
        /groups/:id/runners`, `GET /projects/:id/runners`; instance runners `GET
        /runners/all`, which needs an admin): its own and its ancestor groups'. Not `GET
        /runners`, which lists only runners of groups and projects the user is a member
        of (`current_user.ci_owned_runners`, lib/api/ci/runners.rb), so none of a group
        an administrator who is no member set up. The list carries no tags: `tags` is empty."""
        manager: Any = self._gl.runners_all
        if scope.group_id is not None:
            manager = self._gl.groups.get(scope.group_id, lazy=True).runners
        elif scope.project_id is not None:
            manager = self._gl.projects.get(scope.project_id, lazy=True).runners
        found = self._call("list runners",
                           lambda: manager.list(type=scope.runner_type, get_all=True, **_NO_RETRY))
        return [RunnerInfo(id=int(a["id"]), description=str(a.get("description") or ""),
                           paused=bool(a.get("paused", not a.get("active", True))), tags=(),
                           online=a.get("online"))
                for a in (r.attributes for r in found)]

    def set_paused(self, runner_id: int, paused: bool) -> None:
        self._call(f"update runner {runner_id}",
                   lambda: self._gl.runners.update(runner_id, {"paused": paused}, **_NO_RETRY))

    def set_tags(self, runner_id: int, tags: list[str]) -> None:
        self._call(f"update runner {runner_id}",
                   lambda: self._gl.runners.update(runner_id, {"tag_list": tags}, **_NO_RETRY))

    def set_maximum_timeout(self, runner_id: int, seconds: int | None) -> None:
        """Set a runner's maximum job timeout; None clears it (sent as JSON null)."""
        self._call(f"update runner {runner_id}",
                   lambda: self._gl.runners.update(runner_id, {"maximum_timeout": seconds}, **_NO_RETRY))

    def delete_runner(self, runner_id: int) -> None:
        try:
            self._call(f"delete runner {runner_id}", lambda: self._gl.runners.delete(runner_id, **_NO_RETRY))
        except _NotFound:
            log.info("runner %s was already gone from GitLab", runner_id)

    def running_jobs(self, runner_id: int, status: str = "running") -> list[JobInfo]:
        """A runner's jobs in one status (`GET /runners/:id/jobs?status=`). `canceling`
        (app/models/concerns/ci/has_status.rb) is refused with 400 by a GitLab too old to
        have it; such a GitLab has no job in it: the answer is then empty."""
        runner = self._gl.runners.get(runner_id, lazy=True)
        try:
            jobs = self._call(f"list {status} jobs of runner {runner_id}",
                              lambda: runner.jobs.list(status=status, get_all=True, **_NO_RETRY))
        except _BadRequest:
            if status != "canceling":
                raise
            return []
        return [_job(j.attributes, runner_id=runner_id) for j in jobs]

    def pending_jobs(self, project_id: int) -> list[JobInfo]:
        project = self._gl.projects.get(project_id, lazy=True)
        jobs = self._call(f"list pending jobs of project {project_id}",
                          lambda: project.jobs.list(scope=["pending"], per_page=100, get_all=True,
                                                    **_NO_RETRY))
        return [_job(j.attributes, project_id=project_id) for j in jobs]

    def job(self, project_id: int | str, job_id: int) -> JobInfo | None:
        """One job (`GET /projects/:id/jobs/:job_id`; `:id` an id or a project's full path),
        None when it is gone."""
        project = self._gl.projects.get(project_id, lazy=True)
        try:
            found = self._call(f"read job {job_id} of project {project_id}",
                               lambda: project.jobs.get(job_id, **_NO_RETRY))
        except _NotFound:
            return None
        return _job(found.attributes, project_id=project_id if isinstance(project_id, int) else None)

    def runner_reach(self, runner_id: int) -> RunnerReach | None:
        """The runner's type, groups and projects (`GET /runners/:id`); None when gone."""
        attrs = self._runner(runner_id)
        if attrs is None:
            return None
        return RunnerReach(str(attrs.get("runner_type") or ""),
                           tuple(int(g["id"]) for g in attrs.get("groups") or ()),
                           tuple(int(p["id"]) for p in attrs.get("projects") or ()))

    def group_projects(self, group_id: int) -> list[int]:
        """Ids of the projects a group runner of this group serves: the group's and its
        subgroups' (`include_subgroups`), not projects shared into it (`with_shared`
        false: group runners serve the group's own hierarchy), not archived ones
        (docs.gitlab.com/api/groups, "List projects"; lib/api/groups.rb)."""
        group = self._gl.groups.get(group_id, lazy=True)
        found = self._call(f"list the projects of group {group_id}", lambda: group.projects.list(
            include_subgroups=True, with_shared=False, archived=False, simple=True, per_page=100,
            get_all=True, **_NO_RETRY))
        return [int(p.attributes["id"]) for p in found]

    def verify_runner_token(self, token: str, *, system_id: str) -> bool:
        """`POST /runners/verify`. GitLab records a contact of the runner manager named by
        `system_id`, creating it when new (lib/api/ci/runner.rb, lib/api/ci/helpers/
        runner.rb `current_runner_manager`), so pass the id gitlab-runner itself uses on
        this host (`runnerctl doctor` reads it from `.runner_system_id` beside config.toml),
        never an invented one."""
        try:
            self._call("verify a runner token", lambda: self._gl.http_post(
                "/runners/verify", post_data={"token": token, "system_id": system_id}, **_NO_RETRY))
        except PermanentError:
            return False
        return True

    def heartbeat_runner(self, token: str, *, system_id: str) -> None:
        """`POST /runners/verify` with the runner's own token and `system_id`: GitLab sets
        the runner's and that one manager's `contacted_at` (online for 2 h). Only for the
        stand-by runner, always with its one stored system_id (a new id would add a
        manager). A refused token raises PermanentError."""
        body = {"token": token, "system_id": system_id}
        try:
            self._call("keep the stand-by runner online",
                       lambda: self._gl.http_post("/runners/verify", post_data=body, **_NO_RETRY))
        except _Forbidden:  # the runner's own token, not the user's rights (lib/api/ci/runner.rb)
            raise PermanentError(f"GitLab at {self.where} refused the stand-by runner's own token (403): "
                                 "the runner was deleted or its token reset") from None

    def contact_runner(self, token: str) -> None:
        """Marks the runner contacted where `POST /runners/verify` does not: GitLab 16 and 17
        skip `contacted_at` on a verify with a `glrt-` token (lib/api/ci/runner.rb,
        `registering_created_runner`), while their `DELETE /runners/managers` heartbeats the
        runner (`authenticate_runner!(ensure_runner_manager: false)`, update_contacted_at
        true by default) before it looks the manager up. Sent with a system_id no
        runner manager has (`CONTACT_ONLY_SYSTEM_ID`), it deletes nothing: GitLab answers
        404 "Runner manager not found". Newer GitLab does not heartbeat there, and needs
        this not. A refused token raises PermanentError."""
        body = {"token": token, "system_id": CONTACT_ONLY_SYSTEM_ID}
        try:
            self._call("keep the stand-by runner online",
                       lambda: self._gl.http_delete("/runners/managers", post_data=body, **_NO_RETRY))
        except _NotFound:  # the answer when no manager has that id: the runner was contacted
            return
        except _Forbidden:
            raise PermanentError(f"GitLab at {self.where} refused the stand-by runner's own token (403): "
                                 "the runner was deleted or its token reset") from None

    def token_info(self) -> TokenInfo | None:
        """The token's scopes and expiry (`GET /personal_access_tokens/self`, which any
        scope may call: lib/api/personal_access_tokens/self_information.rb). None when
        GitLab cannot say: an OAuth token, or a GitLab without the endpoint (400 or 404)."""
        try:
            info = self._call("read the token's scopes", lambda: self._gl.http_get(
                "/personal_access_tokens/self", **_NO_RETRY))
        except (_NotFound, _BadRequest):
            return None
        scopes = info.get("scopes") if isinstance(info, dict) else None
        if not isinstance(scopes, list):
            return None
        expires = info.get("expires_at") if isinstance(info, dict) else None
        try:
            expires_on = datetime.date.fromisoformat(str(expires)[:10]) if expires else None
        except ValueError:
            expires_on = None
        return TokenInfo(tuple(str(s) for s in scopes), expires_on)

    def current_user(self) -> tuple[int, str]:
        """(id, username) of the token's user."""
        user = self.token_user()
        return user.id, user.username

    def token_user(self) -> TokenUser:
        """The token's user (`GET /user`)."""
        user = self._call("read the signed-in user", lambda: self._gl.http_get("/user", **_NO_RETRY))
        if not isinstance(user, dict):
            raise TemporaryError(f"GitLab at {self.where} answered /user with no user", delay=DEFAULT_RETRY_S)
        return TokenUser(int(user["id"]), str(user["username"]), bool(user.get("is_admin")))

    def group_access_level(self, group: str, user_id: int) -> int:
        """The user's access level in the group, inherited ones included (40 = Maintainer,
        50 = Owner); 0 when not a member."""
        return self._access_level("groups", group, user_id)

    def project_access_level(self, project: str, user_id: int) -> int:
        """The user's access level in the project, inherited ones included; 0 when none."""
        return self._access_level("projects", project, user_id)

    def _access_level(self, kind: str, where: str, user_id: int) -> int:
        path = f"/{kind}/{urllib.parse.quote(where, safe='')}/members/all/{user_id}"
        try:
            member = self._call(f"read the membership in {kind[:-1]} {where}",
                                lambda: self._gl.http_get(path, **_NO_RETRY))
        except _NotFound:
            return 0
        return int(member.get("access_level") or 0) if isinstance(member, dict) else 0

    def _call(self, what: str, func: Callable[[], T]) -> T:
        try:
            return func()
        except gitlab.exceptions.GitlabAuthenticationError as exc:
            raise PermanentError(
                f"GitLab at {self.where} rejected the token (401{_why_refused(exc)}) while trying to {what}",
                hint="check the token ($RUNNERCTL_GITLAB_TOKEN or --token-file): a personal, group or "
                f"project access token with the {REQUIRED_SCOPE} scope",
            ) from None
        except gitlab.exceptions.GitlabError as exc:
            raise self._http_error(what, exc) from None
        except requests.exceptions.Timeout:
            self.requests_by_status["unanswered"] += 1
            raise TemporaryError(f"GitLab at {self.where} did not answer in time while trying "
                                 f"to {what}", delay=DEFAULT_RETRY_S) from None
        except requests.exceptions.RequestException as exc:
            self.requests_by_status["unanswered"] += 1
            reason = type(exc).__name__
            raise TemporaryError(
                f"cannot reach GitLab at {self.where} ({reason}) while trying to {what}",
                delay=DEFAULT_RETRY_S, hint="check the GitLab URL and the network",
            ) from None

    def _http_error(self, what: str, exc: gitlab.exceptions.GitlabError) -> Exception:
        code = exc.response_code
        detail = (f"GitLab answered {code} ({exc.error_message}) to a request to {what}" if code is not None
                  else f"GitLab's answer to a request to {what} could not be read ({exc.error_message}): "
                  "is the URL GitLab's, not a proxy's or login page's?")
        if code == 404:
            return _NotFound(detail)
        if code == 400:
            return _BadRequest(detail)
        if code == 403:
            accepted = _insufficient_scope(exc.response_body)
            if accepted is not None:
                return InsufficientScope(self.where, what, accepted)
            return _Forbidden(detail, hint="the token's user lacks permission: it needs Owner "
                                  "on the group (group runners), Maintainer on the project "
                                  "(project runners) or to be an administrator (instance runners)")
        if code == 429 or code is None or code >= 500:
            guess = RATE_LIMIT_RETRY_S if code == 429 else DEFAULT_RETRY_S
            return TemporaryError(detail, delay=self._retry_after or guess,
                                  told=self._retry_after is not None)
        return PermanentError(detail)


class _NotFound(NotFoundError):
    """404: the runner or project does not exist (or is not visible to the token)."""


class _Forbidden(PermanentError):
    """403 without `insufficient_scope`: the token's user may not do this."""


class _BadRequest(PermanentError):
    """400: GitLab refused a parameter (e.g. a status value it does not know)."""


class InsufficientScope(PermanentError):
    """403 `insufficient_scope`: the token lacks every scope the endpoint accepts."""

    def __init__(self, url: str, what: str, accepted: tuple[str, ...]) -> None:
        missing = REQUIRED_SCOPE if REQUIRED_SCOPE in accepted or not accepted else accepted[0]
        super().__init__(f"the GitLab token is missing the `{missing}` scope: GitLab at {url} "
                         f"refused to {what} (403 insufficient_scope)",
                         hint=f"make a token with the {REQUIRED_SCOPE} scope")
        self.missing = missing
        self.accepted = accepted


def _insufficient_scope(body: bytes | str | None) -> tuple[str, ...] | None:
    """The scopes a 403 `insufficient_scope` body says the endpoint accepts; None when
    the 403 is about something else (a role, a locked runner)."""
    try:
        data = json.loads(body or b"")
    except (ValueError, TypeError):
        return None
    if not isinstance(data, dict) or data.get("error") != "insufficient_scope":
        return None
    scope = data.get("scope")
    names = scope.split() if isinstance(scope, str) else scope if isinstance(scope, list) else []
    return tuple(str(n) for n in names)


def _job(attrs: dict[str, Any], *, runner_id: int | None = None,
         project_id: int | None = None) -> JobInfo:
    user = attrs.get("user") or {}
    runner = attrs.get("runner") or {}
    project = attrs.get("project") or {}
    return JobInfo(
        id=int(attrs["id"]),
        project_id=project_id or project.get("id") or attrs.get("project_id"),
        status=str(attrs.get("status")),
        tags=tuple(attrs.get("tag_list") or ()),
        created_at=attrs.get("created_at"),
        user=user.get("username"),
        web_url=attrs.get("web_url"),
        runner_id=runner_id or runner.get("id"),
        name=attrs.get("name"),
        queued_duration=_duration(attrs.get("queued_duration")),
    )


def _duration(value: Any) -> float | None:
    """A duration GitLab gave in seconds (a float for jobs), None unless a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def exchange_oauth_code(url: str, *, client_id: str, secret: str, code: str, verifier: str,
                        redirect_uri: str, timeout: float = DEFAULT_TIMEOUT_S) -> str:
    """An OAuth authorization code (with its PKCE verifier) for the user's access token."""
    url = url.rstrip("/")
    try:
        form = {"client_id": client_id, "client_secret": secret, "code": code,
                "grant_type": "authorization_code", "redirect_uri": redirect_uri, "code_verifier": verifier}
        response = requests.post(f"{url}/oauth/token", data=form, timeout=timeout,
                                 headers={"Accept": "application/json"})
    except requests.exceptions.RequestException as exc:
        raise TemporaryError(f"cannot reach GitLab at {url} ({type(exc).__name__}) to finish the sign-in",
                             delay=DEFAULT_RETRY_S) from None
    token = response.json().get("access_token") if response.ok else None
    if not isinstance(token, str) or not token:
        raise PermanentError(f"GitLab at {url} refused the sign-in ({response.status_code})",
                             hint="start the sign-in again; if it keeps failing, check [web] "
                                  "gitlab_oauth_client_id and $RUNNERCTL_GITLAB_OAUTH_SECRET")
    return token


def _seconds(value: Any) -> int | None:
    """A positive whole number of seconds from GitLab, else None (not set)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _why_refused(exc: gitlab.exceptions.GitlabAuthenticationError) -> str:
    """GitLab's reason for a 401, when it gives one: an expired or revoked token gets
    `{"error": "invalid_token", "error_description": "Token is expired. ..."}`
    (lib/api/api_guard.rb), an unknown one only `{"message": "401 Unauthorized"}`."""
    try:
        body = json.loads(exc.response_body or b"")
    except (ValueError, TypeError):
        return ""
    said = body.get("error_description") if isinstance(body, dict) else None
    return f": {str(said).split('.')[0].strip()[:80]}" if said else ""
