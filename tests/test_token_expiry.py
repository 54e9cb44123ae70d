"""The GitLab token's expiry, said before GitLab refuses it.

Since GitLab 16.0 every access token expires (365 days by default), and from the start of
that day every request is 401: serve could no longer pause or resume a runner, and the
first word of it was the 401 itself (a gap a review as a GitLab admin left open). serve
now reads the expiry, names it on /healthz and in the log from 14 days before, and serves
it as a metric; and a 401 says why GitLab refused the token.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from pathlib import Path

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from runnerctl.controller.token_expiry import CHECK_S, WARN_DAYS
from runnerctl.errors import PermanentError
from runnerctl.exporter import build_registry
from runnerctl.gitlab import PythonGitLab
from runnerctl.sim.gitlab_server import Fault
from runnerctl.sim.world import TOKEN, World, build_world
from tests.sim_gitlab import running_sim

START = datetime.datetime(2026, 11, 20, 9, 0, tzinfo=datetime.UTC)


def _world(tmp_path: Path, expires_at: str | None) -> World:
    world = build_world(tmp_path, start=START.timestamp())
    world.state.directory.tokens[TOKEN].expires_at = expires_at
    world.controller.wiring = dataclasses.replace(world.controller.wiring, check_token=True)  # as serve
    return world


def _expiry_metric(world: World) -> float | None:
    registry = build_registry(lambda: world.controller.stats.view, liveness=world.controller.liveness)
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        if family.name == "runnerctl_gitlab_token_expiry_timestamp_seconds":
            (sample,) = family.samples
            assert sample.labels == {"Hostname": "demo"}
            return float(sample.value)
    return None


def test_a_token_expiring_soon_is_named_on_healthz_logged_and_served(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    world = _world(tmp_path, "2026-11-25")  # refused from 2026-11-25T00:00Z: in 4 days 15 hours
    try:
        with caplog.at_level(logging.WARNING):
            world.advance(30.0, step=5.0)
        healthy, shown = world.controller.liveness.report()
        assert healthy, shown  # a notice, not a failure: the host still works
        notice = shown["notices"]["token"]
        assert "the GitLab token expires on 2026-11-25 (in 5 days)" in notice, notice
        assert "Rotating the GitLab token" in notice
        said = [r.getMessage() for r in caplog.records if "GitLab token expires" in r.getMessage()]
        assert len(said) == 1, said  # once, not at every tick
        expiry = datetime.datetime(2026, 11, 25, tzinfo=datetime.UTC).timestamp()
        assert _expiry_metric(world) == expiry
        asked = [r for r in world.server.requests if r.path.endswith("/personal_access_tokens/self")]
        assert len(asked) == 1  # once per check, not per tick
        world.advance(CHECK_S + 30, step=60.0)
        asked = [r for r in world.server.requests if r.path.endswith("/personal_access_tokens/self")]
        assert len(asked) == 2
    finally:
        world.close()


def test_a_token_far_from_its_expiry_says_nothing(tmp_path: Path) -> None:
    world = _world(tmp_path, (START + datetime.timedelta(days=WARN_DAYS + 2)).date().isoformat())
    try:
        world.advance(30.0, step=5.0)
        healthy, shown = world.controller.liveness.report()
        assert healthy and shown["notices"] == {}, shown
        assert _expiry_metric(world) is not None  # for the alert
    finally:
        world.close()


def test_an_expired_token_is_named_as_expired(tmp_path: Path) -> None:
    """GitLab answers 401 `invalid_token` "Token is expired." from the start of the day;
    the trouble said only "rejected the token (401)", as for a mistyped one."""
    world = _world(tmp_path, "2026-11-21")
    try:
        world.advance(30.0, step=5.0)
        assert world.controller.liveness.report()[0]
        world.advance(86400.0, step=600.0)  # into 2026-11-21, UTC
        healthy, shown = world.controller.liveness.report()
        error = shown["troubles"]["gitlab"]["error"]
        assert "rejected the token (401: Token is expired)" in error, shown
        assert "expired on 2026-11-21" in shown["notices"]["token"], shown
    finally:
        world.close()


def test_the_simulated_gitlab_refuses_expired_and_revoked_tokens_as_gitlab_does() -> None:
    """lib/api/api_guard.rb: ExpiredError and RevokedError are 401 `invalid_token` with a
    description; an unknown token only `401 Unauthorized`."""
    with running_sim() as (server, info):
        today = datetime.datetime.now(datetime.UTC).date()
        expired = server.add_token("ann", ["api"], expires_at=today.isoformat())
        later = server.add_token("ann", ["api"], expires_at=(today + datetime.timedelta(days=1)).isoformat())
        answer = httpx.get(f"{server.url}/api/v4/user", headers={"PRIVATE-TOKEN": expired})
        assert answer.status_code == 401 and answer.json() == {
            "error": "invalid_token",
            "error_description": "Token is expired. You can either do re-authorization or token refresh."}
        assert 'error="invalid_token"' in answer.headers["WWW-Authenticate"]
        assert httpx.get(f"{server.url}/api/v4/user", headers={"PRIVATE-TOKEN": later}).status_code == 200
        with pytest.raises(PermanentError, match=r"rejected the token \(401: Token is expired\)"):
            PythonGitLab(server.url, expired).token_user()
        with pytest.raises(PermanentError, match=r"rejected the token \(401\) while"):
            PythonGitLab(server.url, "glpat-nobody").token_user()
        info_later = PythonGitLab(server.url, later).token_info()
        assert info_later is not None and info_later.expires_on == today + datetime.timedelta(days=1)
        server.state.directory.tokens[later].revoked = True
        answer = httpx.get(f"{server.url}/api/v4/user", headers={"PRIVATE-TOKEN": later})
        assert answer.status_code == 401
        assert answer.json()["error_description"].startswith("Token was revoked")


def test_a_token_made_without_an_expiry_gets_365_days() -> None:
    """Since GitLab 16.0 no token is made without an expiry (gitlab-org/gitlab#429864)."""
    with running_sim() as (server, info):
        admin = PythonGitLab(server.url, info["admin_token"])
        user_id = admin.token_user().id
        base = f"{server.url}/api/v4/users/{user_id}/personal_access_tokens"
        headers = {"PRIVATE-TOKEN": info["admin_token"]}
        made = httpx.post(base, headers=headers, json={"name": "ci", "scopes": ["api"]}).json()
        today = datetime.datetime.now(datetime.UTC).date()
        assert made["expires_at"] == (today + datetime.timedelta(days=365)).isoformat()
        bad = httpx.post(base, headers=headers, json={"name": "ci", "scopes": ["api"], "expires_at": "soon"})
        assert bad.status_code == 400 and bad.json() == {"error": "expires_at is invalid"}


def test_a_failed_read_of_the_expiry_is_tried_again_at_once_not_hours_later(tmp_path: Path) -> None:
    """The check was marked done before GitLab answered: a 500 at serve's first tick left
    the expiry unread for six hours."""
    world = _world(tmp_path, "2026-11-25")
    world.server.faults.append(Fault("GET", r"/personal_access_tokens/self", "500", count=1))
    try:
        world.advance(60.0, step=5.0)
        asked = [r.status for r in world.server.requests if r.path.endswith("/personal_access_tokens/self")]
        assert asked == [500, 200], asked
        assert "expires on 2026-11-25" in world.controller.liveness.report()[1]["notices"]["token"]
    finally:
        world.close()
