"""Sign in with GitLab: the authorization code flow (PKCE) against the simulated GitLab's
OAuth provider (runnerctl.sim.gitlab_oauth, after docs.gitlab.com/api/oauth2), group
Maintainers become operators, everyone else viewers; the token never reaches the browser."""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from runnerctl.controller.app import create_app
from runnerctl.settings import WebSettings
from runnerctl.sim.gitlab_oauth import OAuthApp
from runnerctl.sim.world import World
from runnerctl.web.oauth import GitLabOAuth
from runnerctl.web.routes import install
from tests.test_web import _world

SECRET = "sim-oauth-app-secret-value"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    world = _world(tmp_path)
    provider = world.server.oauth
    provider.apps["app"] = OAuthApp("app", SECRET, "http://testserver/oauth/gitlab/callback")
    provider.users.update({"mia": 11, "dev": 12, "out": 13})
    provider.groups["ml/team"] = {"mia": 40, "dev": 30}
    world.advance(3.0)
    yield world
    world.close()


def _client(world: World, tmp_path: Path, secret: str = SECRET) -> TestClient:
    oauth = GitLabOAuth(world.server.url, "app", secret, "ml/team")
    app = create_app(lambda: world.controller.view, world.controller.demand.webhook, extend=[
        lambda app: install(app, view=lambda: world.controller.view, store=world.store,
                            settings=WebSettings(), state_dir=tmp_path, oauth=oauth)])
    return TestClient(app, follow_redirects=False)


def _approve(client: TestClient, login: str, prefix: str = "") -> httpx.Response:
    """The browser's trip: runnerctl -> GitLab's consent page -> back with a code."""
    start = client.get(f"{prefix}/oauth/gitlab")
    assert start.status_code == 303
    location = start.headers["location"]
    params = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(location).query))
    assert params["response_type"] == "code" and params["code_challenge_method"] == "S256"
    assert params["scope"] == "read_api"  # read_user cannot read group members
    assert "Authorize as mia" in httpx.get(location).text
    back = httpx.post(location.split("?")[0], data={**params, "login": login})
    assert back.status_code == 302
    callback = urllib.parse.urlsplit(back.headers["location"])
    return client.get(f"{callback.path}?{callback.query}")


@pytest.mark.parametrize(("login", "role"), [("mia", "operator"), ("dev", "viewer"), ("out", "viewer")])
def test_group_maintainers_become_operators(world: World, tmp_path: Path, login: str, role: str,
                                            caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    client = _client(world, tmp_path)
    done = _approve(client, login)
    assert done.status_code == 303 and done.headers["location"] == "/"
    session = client.get("/api/session").json()
    assert (session["user"], session["role"], session["can_toggle"]) == (login, role, role == "operator")
    toggle = client.post("/api/toggles", json={"action": "pause", "target": "gpu:1", "reason": "oauth"},
                         headers={"X-CSRF-Token": session["csrf"]})
    assert toggle.status_code == (200 if role == "operator" else 403)
    tokens = list(world.server.oauth.tokens)
    assert tokens
    seen = "\n".join([done.text, client.get("/api/session").text, client.get("/api/host").text]
                     + [r.getMessage() for r in caplog.records] + list(client.cookies.values()))
    for secret in [*tokens, SECRET]:
        assert secret not in seen


def test_forged_state_and_wrong_secret_are_refused(world: World, tmp_path: Path) -> None:
    client = _client(world, tmp_path)
    client.get("/oauth/gitlab")
    assert client.get("/oauth/gitlab/callback?code=x&state=forged").status_code == 403
    assert client.get("/api/session").json()["user"] is None
    wrong = _client(world, tmp_path, secret="not-the-secret")
    assert _approve(wrong, "mia").status_code == 502
    assert wrong.get("/api/session").json()["user"] is None


def test_simulated_provider_keeps_the_documented_contract(world: World) -> None:
    url = world.server.url
    authorize = {"client_id": "app", "redirect_uri": "http://testserver/oauth/gitlab/callback",
                 "response_type": "code", "state": "s1", "code_challenge": "x" * 43,
                 "code_challenge_method": "S256"}
    assert httpx.get(f"{url}/oauth/authorize", params={**authorize, "redirect_uri": "http://evil/cb"}
                     ).status_code == 400
    back = httpx.post(f"{url}/oauth/authorize", data={**authorize, "login": "mia"})
    code = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(back.headers["location"]).query))["code"]
    token = {"client_id": "app", "client_secret": SECRET, "code": code, "grant_type": "authorization_code",
             "redirect_uri": authorize["redirect_uri"], "code_verifier": "wrong"}
    refused = httpx.post(f"{url}/oauth/token", data=token)
    assert refused.status_code == 400 and refused.json()["error"] == "invalid_grant"
    assert httpx.post(f"{url}/oauth/token", data=token).status_code == 400  # a code works once at most
    assert httpx.get(f"{url}/api/v4/user", headers={"Authorization": "Bearer nothing"}).status_code == 401


def test_behind_a_proxy_the_redirect_uri_is_the_public_one(world: World, tmp_path: Path) -> None:
    """GitLab wants the registered redirect_uri exactly: built from the request, a proxy
    sending `Host: 127.0.0.1:8080` (nginx's default) made it the upstream's, and GitLab
    refused every sign-in (found by a review as a lab admin behind a proxy). With `[web]
    public_url` it is the public one, the page's sub-path included, and after sign-in the
    browser goes back to the page under that path."""
    public = "https://lab.example/gpus/"
    world.server.oauth.apps["app"] = OAuthApp("app", SECRET, public + "oauth/gitlab/callback")
    oauth = GitLabOAuth(world.server.url, "app", SECRET, "ml/team")
    app = create_app(lambda: world.controller.view, world.controller.demand.webhook, extend=[
        lambda app: install(app, view=lambda: world.controller.view, store=world.store,
                            settings=WebSettings(public_url=public), state_dir=tmp_path, oauth=oauth)])
    client = TestClient(app, follow_redirects=False, base_url="http://127.0.0.1:8080", root_path="/gpus")
    start = client.get("/gpus/oauth/gitlab")  # the browser's path; the proxy strips /gpus
    params = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(start.headers["location"]).query))
    assert params["redirect_uri"] == "https://lab.example/gpus/oauth/gitlab/callback"
    done = _approve(client, "mia", prefix="/gpus")
    assert done.status_code == 303 and done.headers["location"] == "/gpus/"
    assert client.get("/gpus/api/session").json()["user"] == "mia"
    cookie = next(c for c in client.cookies.jar if c.name == "runnerctl_session_gpus")
    assert cookie.path == "/gpus"  # another page on the domain gets its own
