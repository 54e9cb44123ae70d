"""GitLab as an OAuth 2.0 provider, simulated: what "Sign in with GitLab" talks to.

Follows docs.gitlab.com/api/oauth2 (authorization code flow, with PKCE):
`GET /oauth/authorize?client_id&redirect_uri&response_type=code&state&scope[&code_challenge
&code_challenge_method=S256]` lets the signed-in GitLab user approve and redirects to
`redirect_uri?code=...&state=...`; `POST /oauth/token` (grant_type=authorization_code,
client_id, client_secret, code, redirect_uri[, code_verifier]) answers
`{access_token, token_type: "Bearer", expires_in: 7200, refresh_token, scope, created_at}`
and an invalid grant with 400 `{"error": "invalid_grant"}`; the token then works as
`Authorization: Bearer` on API v4 with exactly the scopes asked for in `scope`
(space-separated; Doorkeeper as configured in gitlabhq/gitlabhq
config/initializers/doorkeeper.rb), and the API checks them like a personal access
token's (runnerctl.sim.gitlab_access): a `read_user` token may read `/user` but not
`/groups/:id/members/all/:user_id`, which needs `read_api` or `api`. A scope the
application was not registered with is `invalid_scope`; no `scope` means all of the
application's.

The approval page stands in for GitLab's sign-in and consent: it lists the simulated
users, and posting one approves as that user.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import html
import secrets
import urllib.parse
from typing import Any

from runnerctl.sim.gitlab_directory import Directory


@dataclasses.dataclass(frozen=True)
class OAuthApp:
    client_id: str
    secret: str
    redirect_uri: str
    scopes: tuple[str, ...] = ("api", "read_api", "read_user", "openid", "profile", "email")
    """What the application may ask for; a request for more is `invalid_scope`."""


class OAuthProvider:
    """`users` and `groups` (full path -> username -> access level) are the directory's own
    tables, so what a test writes there is what the API answers."""

    def __init__(self, directory: Directory | None = None) -> None:
        self.directory = directory or Directory()
        self.apps: dict[str, OAuthApp] = {}
        self.codes: dict[str, tuple[str, str, str, str, tuple[str, ...]]] = {}
        self.tokens: dict[str, str] = {}  # access token -> username

    @property
    def users(self) -> dict[str, int]:
        return self.directory.users

    @property
    def groups(self) -> dict[str, dict[str, int]]:
        return self.directory.group_members

    def handle(self, method: str, path: str, query: dict[str, list[str]],
               body: dict[str, Any]) -> tuple[int, Any, dict[str, str]]:
        """(status, JSON payload or HTML str, headers) for a path under /oauth."""
        if path == "/oauth/authorize":
            params = {k: v[-1] for k, v in query.items()} | {k: str(v) for k, v in body.items()}
            app = self.apps.get(params.get("client_id", ""))
            if app is None or params.get("redirect_uri") != app.redirect_uri:
                return 400, {"error": "invalid_client"}, {}
            if params.get("response_type") != "code":
                return 400, {"error": "unsupported_response_type"}, {}
            scopes = tuple(params.get("scope", "").split()) or app.scopes
            if not set(scopes) <= set(app.scopes):
                return 400, {"error": "invalid_scope"}, {}
            if method == "GET":
                return 200, self._consent(params), {}
            login = params.get("login", "")
            if login not in self.users:
                return 400, {"error": "access_denied"}, {}
            code = secrets.token_urlsafe(24)
            challenge = params.get("code_challenge", "")
            self.codes[code] = (app.client_id, app.redirect_uri, login, challenge, scopes)
            target = app.redirect_uri + "?" + urllib.parse.urlencode({"code": code,
                                                                      "state": params.get("state", "")})
            return 302, None, {"Location": target}
        if path == "/oauth/token" and method == "POST":
            return self._token(body)
        return 404, {"message": "404 Not found"}, {}

    def _token(self, body: dict[str, Any]) -> tuple[int, Any, dict[str, str]]:
        app = self.apps.get(str(body.get("client_id", "")))
        if app is None or not secrets.compare_digest(app.secret, str(body.get("client_secret", ""))):
            return 401, {"error": "invalid_client"}, {}
        found = self.codes.pop(str(body.get("code", "")), None)
        if (body.get("grant_type") != "authorization_code" or found is None or found[0] != app.client_id
                or found[1] != body.get("redirect_uri")):
            return 400, {"error": "invalid_grant"}, {}
        if found[3]:
            digest = hashlib.sha256(str(body.get("code_verifier", "")).encode()).digest()
            if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != found[3]:
                return 400, {"error": "invalid_grant"}, {}
        made = self.directory.add_token(found[2], found[4], name=app.client_id, kind="oauth")
        self.tokens[made.token] = found[2]
        return 200, {"access_token": made.token, "token_type": "Bearer", "expires_in": 7200,
                     "refresh_token": secrets.token_urlsafe(32), "scope": " ".join(found[4]),
                     "created_at": 0}, {}

    def _consent(self, params: dict[str, str]) -> str:
        hidden = "".join(f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
                         for k, v in params.items() if k != "login")
        buttons = "".join(f'<button name="login" value="{html.escape(u)}">'
                          f'Authorize as {html.escape(u)}</button>' for u in sorted(self.users))
        return (f"<!doctype html><title>Simulated GitLab: authorize</title><h1>Authorize "
                f"{html.escape(params['client_id'])}?</h1><form method=post action=/oauth/authorize>"
                f"{hidden}{buttons}</form>")
