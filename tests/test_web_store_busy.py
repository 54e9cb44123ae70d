"""The page while another process holds the SQLite store's write lock (a `runnerctl
pause` mid-write, a backup): a signed-in read waits for the lock in a thread, never on the
event loop, so /healthz answers meanwhile; when the lock outlasts the store's timeout the
read is a 503 in the store errors' JSON shape, never a 500; a sign-in that could not
read the store does not count as a failed one."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from runnerctl.controller.app import create_app
from runnerctl.controller.store import Store, WebSession
from runnerctl.settings import ControllerSettings, WebSettings
from runnerctl.sim.world import PROJECT, World, build_world
from runnerctl.web.auth import add_user
from runnerctl.web.routes import install
from tests.test_web import PASSWORD, _sign_in

PRIVATE = WebSettings(public_read=False)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    world = build_world(tmp_path, settings=ControllerSettings(projects=(PROJECT,), interval_s=1.0))
    add_user(world.store, "victor", PASSWORD, "viewer")
    world.advance(2.0)
    yield world
    world.close()


def _client(world: World, store: Store, tmp_path: Path, web: WebSettings = PRIVATE) -> TestClient:
    """The page over its own connection to the world's store, as a second `serve` thread would."""
    return TestClient(create_app(lambda: world.controller.view, world.controller.demand.webhook, extend=[
        lambda app: install(app, view=lambda: world.controller.view, store=store, settings=web,
                            state_dir=tmp_path)]))


@contextmanager
def _locked(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    """Another process's write transaction on the store."""
    other = sqlite3.connect(tmp_path / "controller.sqlite", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield other
    finally:
        other.execute("ROLLBACK")
        other.close()


def test_a_busy_store_is_a_503_for_a_signed_in_read(world: World, tmp_path: Path) -> None:
    store = Store.open(state_dir=tmp_path, timeout_s=0.2)
    try:
        client = _client(world, store, tmp_path)
        assert _sign_in(client, "victor")[0] == 200
        with _locked(tmp_path):
            for path in ("/api/events", "/api/host", "/api/state"):
                response = client.get(path)
                assert response.status_code == 503, (path, response.text)
                assert "busy" in response.json()["detail"]
                assert response.headers["x-frame-options"] == "DENY"
        assert client.get("/api/events").status_code == 200  # the lock is gone: served again
    finally:
        store.close()


def test_health_answers_while_a_read_waits_for_the_store(world: World, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store.open(state_dir=tmp_path, timeout_s=20)
    waiting = threading.Event()
    real = store.web_session

    def observed(key: str, now: float) -> WebSession | None:
        waiting.set()
        return real(key, now)

    try:
        with _client(world, store, tmp_path) as client, ThreadPoolExecutor(1) as pool:
            assert _sign_in(client, "victor")[0] == 200
            with _locked(tmp_path):
                monkeypatch.setattr(store, "web_session", observed)
                read = pool.submit(client.get, "/api/events")
                assert waiting.wait(10)
                health = client.get("/healthz")  # served by the same event loop
                assert not read.done()  # answered while the read still waits for the lock
            assert health.status_code in (200, 503) and "tick" in health.json()
            assert read.result(timeout=20).status_code == 200  # it got the store once the lock went
    finally:
        store.close()


def test_a_store_error_during_sign_in_is_no_failed_attempt(world: World, tmp_path: Path) -> None:
    store = Store.open(state_dir=tmp_path, timeout_s=0.2)
    try:
        client = _client(world, store, tmp_path, WebSettings(signin_attempts=2))
        with _locked(tmp_path):
            for _ in range(4):
                assert _sign_in(client, "victor")[0] == 503
        assert _sign_in(client, "victor")[0] == 200
    finally:
        store.close()


def test_reads_the_store_cannot_serve_are_logged_once_a_minute(world: World, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """Every 503 was a WARNING line: one open tab polls four endpoints every 2 s, 7,200 lines
    an hour while the store is down (found by a review hunting leaks in a long-running
    serve). One line a minute says it; every answer is still a 503."""
    import logging

    from runnerctl.controller import app

    now = [1000.0]
    monkeypatch.setattr(app, "_clock", lambda: now[0])  # this module's clock, not everyone's
    monkeypatch.setattr(app, "_store_trouble_logged", {})
    store = Store.open(state_dir=tmp_path, timeout_s=0.2)
    try:
        client = _client(world, store, tmp_path)
        assert _sign_in(client, "victor")[0] == 200
        with _locked(tmp_path), caplog.at_level(logging.WARNING, logger="runnerctl.controller.app"):
            codes = [client.get("/api/host").status_code for _ in range(6)]
            now[0] += 61
            codes.append(client.get("/api/host").status_code)
        assert codes == [503] * 7
        said = [r.getMessage() for r in caplog.records if "/api/host" in r.getMessage()]
        assert len(said) == 2 and "logged once a minute" in said[0], said
        with _locked(tmp_path), caplog.at_level(logging.WARNING, logger="runnerctl.controller.app"):
            assert client.get("/api/events").status_code == 503  # another path: said at once
        assert any("/api/events" in r.getMessage() for r in caplog.records)
    finally:
        store.close()
