"""GitLab as an OAuth 2.0 provider, simulated: what "Sign in with GitLab" talks to.

Follows docs.gitlab.com/api/oauth2 (authorization code flow, with PKCE):
`GET /oauth/authorize?client_id&redirect_uri&response_type=code&state&scope[&code_challenge
&code_challenge_method=S256]` lets the signed-in GitLab user approve and redirects to
`redirect_uri?code=...&state=...`; `POST /oauth/token` (grant_type=authorization_code,
client_id, client_secret, code, redirect_uri[, code_verifier]) answers
`{access_token, token_type: "Bearer", expires_in: 7200, refresh_token, scope, created_at}`
and an invalid grant with 400 `{"error": "invalid_grant"}`; the token then works as
`Authorization: Bearer` on API v4. Members: docs.gitlab.com/api/members,
`GET /groups/:id/members/all/:user_id` -> `{id, username, access_level, ...}` (404 for a
non-member; 40 = Maintainer), `:id` being the id or the URL-encoded full path.

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


@dataclasses.dataclass(frozen=True)
class OAuthApp:
    client_id: str
    secret: str
    redirect_uri: str


@dataclasses.dataclass
class OAuthProvider:
    apps: dict[str, OAuthApp] = dataclasses.field(default_factory=dict)
    users: dict[str, int] = dataclasses.field(default_factory=dict)  # username -> id
    groups: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)  # path -> user -> level
    codes: dict[str, tuple[str, str, str, str]] = dataclasses.field(default_factory=dict)
    tokens: dict[str, str] = dataclasses.field(default_factory=dict)  # access token -> username

    def user_of(self, authorization: str | None) -> str | None:
        if not authorization or not authorization.startswith("Bearer "):
            return None
        return self.tokens.get(authorization[7:])

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
            if method == "GET":
                return 200, self._consent(params), {}
            login = params.get("login", "")
            if login not in self.users:
                return 400, {"error": "access_denied"}, {}
            code = secrets.token_urlsafe(24)
            self.codes[code] = (app.client_id, app.redirect_uri, login, params.get("code_challenge", ""))
            target = app.redirect_uri + "?" + urllib.parse.urlencode({"code": code,
                                                                      "state": params.get("state", "")})
            return 302, None, {"Location": target}
        if path == "/oauth/token" and method == "POST":
            return self._token(body)
        return 404, {"message": "404 Not found"}, {}

    def member(self, group: str, user_id: int) -> tuple[int, Any]:
        members = self.groups.get(urllib.parse.unquote(group))
        name = next((n for n, i in self.users.items() if i == user_id), None)
        if members is None or name is None or name not in members:
            return 404, {"message": "404 Not found"}
        return 200, {"id": user_id, "username": name, "name": name, "state": "active",
                     "access_level": members[name]}

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
        token = secrets.token_urlsafe(32)
        self.tokens[token] = found[2]
        return 200, {"access_token": token, "token_type": "Bearer", "expires_in": 7200,
                     "refresh_token": secrets.token_urlsafe(32), "scope": "read_user", "created_at": 0}, {}

    def _consent(self, params: dict[str, str]) -> str:
        hidden = "".join(f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
                         for k, v in params.items() if k != "login")
        buttons = "".join(f'<button name="login" value="{html.escape(u)}">'
                          f'Authorize as {html.escape(u)}</button>' for u in sorted(self.users))
        return (f"<!doctype html><title>Simulated GitLab: authorize</title><h1>Authorize "
                f"{html.escape(params['client_id'])}?</h1><form method=post action=/oauth/authorize>"
                f"{hidden}{buttons}</form>")
