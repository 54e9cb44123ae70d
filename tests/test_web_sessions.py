"""Sessions end when they should (issue 14): sign-out ends every copy of the cookie; a new
password, a new role or removing the account ends that user's sessions at once; a
demotion in GitLab reaches a "Sign in with GitLab" session within the re-check period;
the store never holds a usable session id."""

from __future__ import annotations

import base64
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from runnerctl.controller.app import create_app
from runnerctl.controller.migrations import MIGRATIONS
from runnerctl.controller.store import Store
from runnerctl.settings import WebSettings
from runnerctl.sim.gitlab_oauth import OAuthApp
from runnerctl.sim.world import TOKEN, World
from runnerctl.web.auth import add_user
from runnerctl.web.oauth import GitLabOAuth
from runnerctl.web.routes import install
from tests.test_web import PASSWORD, _sign_in, _world
from tests.test_web_oauth import SECRET, _approve

TOGGLE = {"action": "pause", "target": "gpu:1", "reason": "sessions test"}


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    world = _world(tmp_path)
    add_user(world.store, "olga", PASSWORD, "operator")
    provider = world.server.oauth
    provider.apps["app"] = OAuthApp("app", SECRET, "http://testserver/oauth/gitlab/callback")
    provider.users.update({"mia": 11})
    provider.groups["ml/team"] = {"mia": 40}
    world.advance(2.0)
    yield world
    world.close()


def _app(world: World, state_dir: Path, clock: Clock, *, api_token: str = TOKEN) -> TestClient:
    oauth = GitLabOAuth(world.server.url, "app", SECRET, "ml/team", api_token=api_token)
    app = create_app(lambda: world.controller.view, world.controller.demand.webhook, extend=[
        lambda app: install(app, view=lambda: world.controller.view, store=world.store,
                            settings=WebSettings(gitlab_role_check_s=300), state_dir=state_dir, oauth=oauth,
                            clock=clock)])
    return TestClient(app, follow_redirects=False)


def _copy(client: TestClient, world: World, tmp_path: Path, clock: Clock) -> TestClient:
    """Another browser (or a thief) holding the same cookie."""
    other = _app(world, tmp_path, clock)
    other.cookies.update(dict(client.cookies.items()))
    return other


def _who(client: TestClient) -> tuple[str | None, str | None]:
    session = client.get("/api/session").json()
    return session["user"], session["role"]


def _can_toggle(client: TestClient, csrf: str) -> bool:
    status = client.post("/api/toggles", json=TOGGLE, headers={"X-CSRF-Token": csrf}).status_code
    assert status in (200, 403)
    return status == 200


def test_sign_out_ends_every_copy_of_the_cookie(world: World, tmp_path: Path) -> None:
    clock = Clock()
    client = _app(world, tmp_path, clock)
    _, csrf = _sign_in(client, "olga")
    stolen = _copy(client, world, tmp_path, clock)
    assert _who(stolen) == ("olga", "operator") and _can_toggle(stolen, csrf)
    assert client.post("/api/session/end", headers={"X-CSRF-Token": csrf}).status_code == 200
    assert _who(client) == (None, None)
    assert _who(stolen) == (None, None) and not _can_toggle(stolen, csrf)


@pytest.mark.parametrize("change", ["new password", "demoted", "removed"])
def test_account_changes_end_its_sessions_at_once(world: World, tmp_path: Path, change: str) -> None:
    clock = Clock()
    client = _app(world, tmp_path, clock)
    _, csrf = _sign_in(client, "olga")
    other = _app(world, tmp_path, clock)
    add_user(world.store, "victor", PASSWORD, "operator")
    _, other_csrf = _sign_in(other, "victor")
    if change == "new password":
        add_user(world.store, "olga", "a brand new password", "operator")
    elif change == "demoted":
        add_user(world.store, "olga", PASSWORD, "viewer")
    else:
        world.store.remove_user("olga")
    assert _who(client) == (None, None) and not _can_toggle(client, csrf)
    assert _who(other) == ("victor", "operator") and _can_toggle(other, other_csrf)  # others stay


def test_the_store_keeps_no_usable_session_id(world: World, tmp_path: Path) -> None:
    client = _app(world, tmp_path, Clock())
    _sign_in(client, "olga")
    raw = (tmp_path / "controller.sqlite").read_bytes() + b"".join(
        p.read_bytes() for p in tmp_path.glob("controller.sqlite-*"))
    cookie = client.cookies["runnerctl_session"]
    session_id = json.loads(base64.b64decode(cookie.split(".")[0] + "==="))["sid"]
    assert session_id.encode() not in raw
    assert b"olga" in raw  # the read reached the rows


def test_a_gitlab_demotion_reaches_the_session_within_the_check_period(world: World, tmp_path: Path) -> None:
    clock = Clock()
    client = _app(world, tmp_path, clock)
    _approve(client, "mia")
    csrf = client.get("/api/session").json()["csrf"]
    assert _who(client) == ("mia", "operator")
    world.server.oauth.groups["ml/team"]["mia"] = 30  # Developer now
    clock.now += 200
    assert _who(client) == ("mia", "operator")  # not due yet: GitLab is not asked
    clock.now += 101
    deadline = time.monotonic() + 120
    while _who(client) != ("mia", "viewer"):  # the re-check runs beside the requests
        assert time.monotonic() < deadline, "the role was not read again"
        time.sleep(0.05)
    assert not _can_toggle(client, csrf)
    world.server.oauth.groups["ml/team"]["mia"] = 40
    clock.now += 301
    deadline = time.monotonic() + 120
    while _who(client) != ("mia", "operator"):
        assert time.monotonic() < deadline, "the promotion was not read"
        time.sleep(0.05)


def test_a_gitlab_role_that_cannot_be_confirmed_falls_back_to_viewer(world: World, tmp_path: Path) -> None:
    clock = Clock()
    client = _app(world, tmp_path, clock, api_token="glpat-revoked")  # GitLab answers 401
    _approve(client, "mia")
    assert _who(client) == ("mia", "operator")
    clock.now += 301
    assert _who(client) == ("mia", "operator")  # one period late: a re-check is under way
    clock.now += 300
    assert _who(client) == ("mia", "viewer")


def test_without_a_token_to_re_check_a_gitlab_session_ends_after_the_period(world: World,
                                                                           tmp_path: Path) -> None:
    clock = Clock()
    client = _app(world, tmp_path, clock, api_token="")
    _approve(client, "mia")
    assert _who(client) == ("mia", "operator")
    clock.now += 301
    assert _who(client) == (None, None)


def test_a_store_from_before_sessions_upgrades_and_keeps_its_accounts(tmp_path: Path) -> None:
    Store.open(state_dir=tmp_path, migrations=MIGRATIONS[:1]).close()
    with sqlite3.connect(tmp_path / "controller.sqlite") as db:
        db.execute("INSERT INTO users VALUES ('olga', '$argon2id$old', 'operator', 0)")
    store = Store.open(state_dir=tmp_path)
    assert store.version == MIGRATIONS[-1].version and store.user("olga") is not None
    store.close()


def test_signing_in_again_ends_the_session_the_cookie_had(world: World) -> None:
    """A second sign-in on a browser (another account, or the same) starts a new session and
    ends the old one for every copy of the old cookie (against fixation; a mutation that
    kept the old one alive went unnoticed; found by a review as a mutation tester)."""
    from runnerctl.web.auth import Principal
    from runnerctl.web.sessions import Sessions

    sessions = Sessions(world.store, max_age_s=3600, recheck_s=300, clock=Clock())
    cookie: dict[str, str] = {}
    sessions.sign_in(cookie, Principal("olga", "operator", "local"))
    planted = dict(cookie)  # what an attacker set, or a copy of it
    add_user(world.store, "victor", PASSWORD, "viewer")
    sessions.sign_in(cookie, Principal("victor", "viewer", "local"))
    assert sessions.principal(planted) is None
    who = sessions.principal(cookie)
    assert who is not None and who.name == "victor" and cookie["csrf"] != planted["csrf"]


def test_a_gitlab_session_with_a_role_runnerctl_does_not_know_is_a_viewer(world: World) -> None:
    """A session row whose role is none of runnerctl's (a store written by another version,
    or edited) grants nothing beyond viewing (a mutation that took any role went unnoticed;
    found by a review as a mutation tester)."""
    from runnerctl.controller.store import WebSession
    from runnerctl.web.sessions import Sessions, _key

    clock = Clock()
    world.store.save_session(WebSession(_key("sid-1"), "mia", "gitlab", "admin", 11, clock.now, clock.now,
                                        clock.now + 3600))
    who = Sessions(world.store, max_age_s=3600, recheck_s=300, clock=clock).principal({"sid": "sid-1"})
    assert who is not None and who.role == "viewer" and not who.can_toggle
