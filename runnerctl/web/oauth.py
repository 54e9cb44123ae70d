""""Sign in with GitLab": OAuth 2.0 authorization code flow with PKCE against the same GitLab.

Contract: docs.gitlab.com/api/oauth2 (authorize -> code -> POST /oauth/token -> Bearer
token), docs.gitlab.com/api/users (GET /api/v4/user) and docs.gitlab.com/api/members
(GET /api/v4/groups/:id/members/all/:user_id, `access_level` 40 = Maintainer). A member
of the configured group with at least Maintainer becomes an operator, anyone else who
signs in a viewer. The application asks for the `read_api` scope: `read_user` reaches
only the Users, Events, Version and Metadata APIs (gitlabhq lib/api/users.rb,
events.rb, version.rb, metadata.rb `allow_access_with_scope :read_user`), not the
members API, which `read_api` covers for GET (lib/api/api.rb). `read_api` reads, never
writes. The access token is used for these two reads and then dropped: it is
never stored, logged or sent to the browser. GitLab is reached through runnerctl.gitlab,
like everywhere else. `state` and the PKCE verifier live in the
"""

import base64
import dataclasses
import hashlib
import logging
import secrets
import threading
import urllib.parse
from collections.abc import Callable

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import RedirectResponse

from runnerctl.controller.store import Store, StoreError, WebSession
from runnerctl.errors import GitLabError
from runnerctl.gitlab import PythonGitLab, exchange_oauth_code
from runnerctl.web import auth
from runnerctl.web.sessions import Sessions

log = logging.getLogger(__name__)
MAINTAINER = 40
SCOPE = "read_api"
"""The OAuth scope asked for (see the module docstring)."""


@dataclasses.dataclass(frozen=True)
class GitLabOAuth:
    url: str  # GitLab base URL
    client_id: str
    secret: str = dataclasses.field(repr=False)
    group: str  # full path of the group whose Maintainers may toggle
    api_token: str = dataclasses.field(default="", repr=False)  # re-reads roles; "" = sign in again


class RoleCheck:
    """Reads a GitLab session's role again on a short-lived thread, one per user at a time."""

    def __init__(self, oauth: GitLabOAuth, store: Store, clock: Callable[[], float]) -> None:
        self.oauth, self.store, self.clock = oauth, store, clock
        self._running: set[int] = set()
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    def __call__(self, session: WebSession) -> None:
        user_id = session.gitlab_id
        with self._lock:
            if user_id is None or user_id in self._running:
                return
            self._running.add(user_id)
        threading.Thread(target=self._check, args=(user_id,), name=f"role-check-{user_id}",
                         daemon=True).start()

    def _check(self, user_id: int) -> None:
        try:
            gitlab = PythonGitLab(self.oauth.url, self.oauth.api_token)
            level = gitlab.group_access_level(self.oauth.group, user_id)
            role = "operator" if level >= MAINTAINER else "viewer"
            self.store.recheck_sessions(user_id, role, self.clock())
            self._warned.clear()
        except (GitLabError, StoreError) as exc:  # the role stays unconfirmed: sessions.py fails closed
            if type(exc).__name__ not in self._warned:
                self._warned.add(type(exc).__name__)
                log.warning("cannot re-read GitLab roles (sessions fall back to viewer): %s", exc)
        finally:
            with self._lock:
                self._running.discard(user_id)


def install(app: FastAPI, oauth: GitLabOAuth, sessions: Sessions, public_url: str = "") -> None:
    """`public_url` (`[web] public_url`): where users open the page through a proxy; the
    redirect_uri GitLab gets is built from it, as GitLab matches the registered one
    exactly. Without it, from the request (a proxy's `Host: 127.0.0.1:8080` made the
    redirect_uri the upstream's; found by a review as a lab admin behind a proxy)."""

    def callback_uri(request: Request) -> str:
        if public_url:
            return public_url.rstrip("/") + "/oauth/gitlab/callback"
        return str(request.url_for("gitlab_callback"))

    @app.get("/oauth/gitlab", include_in_schema=False)
    def start(request: Request) -> RedirectResponse:
        verifier = secrets.token_urlsafe(48)
        request.session["oauth"] = {"state": secrets.token_urlsafe(24), "verifier": verifier}
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        query = urllib.parse.urlencode({
            "client_id": oauth.client_id, "redirect_uri": callback_uri(request),
            "response_type": "code", "state": request.session["oauth"]["state"], "scope": SCOPE,
            "code_challenge": challenge, "code_challenge_method": "S256"})
        return RedirectResponse(f"{oauth.url}/oauth/authorize?{query}", status_code=303)

    @app.get("/oauth/gitlab/callback", name="gitlab_callback", include_in_schema=False)
    def callback(request: Request, code: str = "", state: str = "") -> RedirectResponse:
        pending = request.session.pop("oauth", None)
        sent = state.encode("utf-8", "surrogateescape")
        if not isinstance(pending, dict) or not code or not secrets.compare_digest(
                str(pending["state"]).encode(), sent):
            raise HTTPException(403, "GitLab sign-in failed: stale or forged state; start again")
        who, user_id = _principal(oauth, code, pending["verifier"], callback_uri(request))
        sessions.sign_in(request.session, who, gitlab_id=user_id)
        log.warning("%s signed in with GitLab as %s", who.name, who.role)
        return RedirectResponse(request.scope.get("root_path", "") + "/", status_code=303)  # the page


def _principal(oauth: GitLabOAuth, code: str, verifier: str, redirect_uri: str) -> tuple[auth.Principal, int]:
    try:
        token = exchange_oauth_code(oauth.url, client_id=oauth.client_id, secret=oauth.secret, code=code,
                                    verifier=verifier, redirect_uri=redirect_uri)
        gitlab = PythonGitLab(oauth.url, token, oauth=True)
        user_id, username = gitlab.current_user()
        level = gitlab.group_access_level(oauth.group, user_id)
    except GitLabError as exc:
        raise HTTPException(502, f"GitLab sign-in failed: {exc}") from None
    return auth.Principal(username, "operator" if level >= MAINTAINER else "viewer", "gitlab"), user_id
