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
signed session cookie.
"""

import base64
import dataclasses
import hashlib
import logging
import secrets
import urllib.parse

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import RedirectResponse

from runnerctl.errors import GitLabError
from runnerctl.gitlab import PythonGitLab, exchange_oauth_code
from runnerctl.web import auth

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


def install(app: FastAPI, oauth: GitLabOAuth) -> None:
    @app.get("/oauth/gitlab", include_in_schema=False)
    def start(request: Request) -> RedirectResponse:
        verifier = secrets.token_urlsafe(48)
        request.session["oauth"] = {"state": secrets.token_urlsafe(24), "verifier": verifier}
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        query = urllib.parse.urlencode({
            "client_id": oauth.client_id, "redirect_uri": str(request.url_for("gitlab_callback")),
            "response_type": "code", "state": request.session["oauth"]["state"], "scope": SCOPE,
            "code_challenge": challenge, "code_challenge_method": "S256"})
        return RedirectResponse(f"{oauth.url}/oauth/authorize?{query}", status_code=303)

    @app.get("/oauth/gitlab/callback", name="gitlab_callback", include_in_schema=False)
    def callback(request: Request, code: str = "", state: str = "") -> RedirectResponse:
        pending = request.session.pop("oauth", None)
        if not isinstance(pending, dict) or not code or not secrets.compare_digest(pending["state"], state):
            raise HTTPException(403, "GitLab sign-in failed: stale or forged state; start again")
        who = _principal(oauth, code, pending["verifier"], str(request.url_for("gitlab_callback")))
        auth.sign_in(request.session, who)
        log.warning("%s signed in with GitLab as %s", who.name, who.role)
        return RedirectResponse("/", status_code=303)


def _principal(oauth: GitLabOAuth, code: str, verifier: str, redirect_uri: str) -> auth.Principal:
    try:
        token = exchange_oauth_code(oauth.url, client_id=oauth.client_id, secret=oauth.secret, code=code,
                                    verifier=verifier, redirect_uri=redirect_uri)
        gitlab = PythonGitLab(oauth.url, token, oauth=True)
        user_id, username = gitlab.current_user()
        level = gitlab.group_access_level(oauth.group, user_id)
    except GitLabError as exc:
        raise HTTPException(502, f"GitLab sign-in failed: {exc}") from None
    return auth.Principal(username, "operator" if level >= MAINTAINER else "viewer", "gitlab")
