"""OAuth tokens of the simulated GitLab carry the scopes asked for and are checked like any token."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from runnerctl.sim.gitlab_oauth import OAuthApp
from tests.sim_gitlab import SimGitLab, running_sim

REDIRECT = "http://app/cb"


@pytest.fixture
def gl() -> Iterator[SimGitLab]:
    with running_sim() as (server, info):
        server.oauth.apps["app"] = OAuthApp("app", "secret", REDIRECT)
        server.oauth.users["mia"] = 501
        server.oauth.groups[info["group_path"]]["mia"] = 40
        yield server, info


def _oauth_token(url: str, scope: str) -> dict[str, Any]:
    approve = {"client_id": "app", "redirect_uri": REDIRECT, "response_type": "code", "scope": scope,
               "login": "mia"}
    back = httpx.post(f"{url}/oauth/authorize", data=approve)
    assert back.status_code == 302, back.text
    code = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(back.headers["location"]).query))["code"]
    grant = {"client_id": "app", "client_secret": "secret", "code": code, "grant_type": "authorization_code",
             "redirect_uri": REDIRECT}
    token = httpx.post(f"{url}/oauth/token", data=grant)
    assert token.status_code == 200
    return dict(token.json())


@pytest.mark.parametrize(("scope", "members_status"), [("read_user", 403), ("read_user read_api", 200)])
def test_oauth_scopes_decide_what_the_token_reads(gl: SimGitLab, scope: str,
                                                  members_status: int) -> None:
    _, info = gl
    token = _oauth_token(info["url"], scope)
    assert token["scope"] == scope
    bearer = {"Authorization": f"Bearer {token['access_token']}"}
    api = info["url"] + "/api/v4"
    assert httpx.get(f"{api}/user", headers=bearer).json()["username"] == "mia"
    members = httpx.get(f"{api}/groups/{urllib.parse.quote(info['group_path'], safe='')}/members/all/501",
                        headers=bearer)
    assert members.status_code == members_status
    if members_status == 200:
        assert members.json()["access_level"] == 40
    assert httpx.get(f"{api}/personal_access_tokens/self", headers=bearer).json() == {
        "message": "400 Bad request - This endpoint requires token type to be a personal access token"}


def test_scope_the_app_may_not_ask_for_is_refused(gl: SimGitLab) -> None:
    server, info = gl
    server.oauth.apps["narrow"] = OAuthApp("narrow", "s", REDIRECT, scopes=("read_user",))
    ask = {"client_id": "narrow", "redirect_uri": REDIRECT, "response_type": "code", "scope": "api"}
    refused = httpx.get(f"{info['url']}/oauth/authorize", params=ask)
    assert refused.status_code == 400 and refused.json() == {"error": "invalid_scope"}
