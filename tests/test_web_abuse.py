"""Bad and hostile requests to every route get a 4xx, never a 500 (issue 14): lone
surrogates, deep nesting, huge bodies, odd headers; the webhook token is checked before
the body is parsed; a reason cannot forge a log line; 422s never echo what was sent."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from runnerctl.controller.app import create_app
from runnerctl.controller.store import Store
from runnerctl.logline import OneLineFormatter
from runnerctl.settings import ControllerSettings, WebSettings
from runnerctl.sim.world import PROJECT, World, build_world
from runnerctl.web import auth
from runnerctl.web.auth import add_user
from runnerctl.web.routes import install
from tests.serve_proc import concurrently
from tests.test_web import PASSWORD, _sign_in

DEEP = b"[" * 100_000 + b"]" * 100_000
HOOK = "hook-secret-of-the-test"
SURROGATE = b'{"name": "olga", "password": "\\ud800 and more"}'


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    world = build_world(tmp_path, settings=ControllerSettings(projects=(PROJECT,), interval_s=1.0),
                        webhook_secret=HOOK)
    add_user(world.store, "olga", PASSWORD, "operator")
    world.advance(2.0)
    yield world
    world.close()


def _client(world: World, state_dir: Path, web: WebSettings | None = None) -> TestClient:
    """The app as `serve` builds it, the body limit included."""
    web = web or WebSettings()
    return TestClient(create_app(lambda: world.controller.view, world.controller.demand.webhook, extend=[
        lambda app: install(app, view=lambda: world.controller.view, store=world.store, settings=web,
                            state_dir=state_dir)], max_body_bytes=web.max_body_bytes))


def _operator(world: World, tmp_path: Path, web: WebSettings | None = None) -> tuple[TestClient, str]:
    client = _client(world, tmp_path, web)
    status, csrf = _sign_in(client, "olga")
    assert status == 200
    return client, csrf


def _post(client: TestClient, path: str, body: bytes, csrf: str = "", **headers: str) -> int:
    return client.post(path, content=body, headers={"Content-Type": "application/json",
                                                     "X-CSRF-Token": csrf, **headers}).status_code


def test_lone_surrogates_are_422_on_every_body(world: World, tmp_path: Path) -> None:
    client, csrf = _operator(world, tmp_path)
    assert _post(client, "/api/session", SURROGATE, csrf) == 422
    toggle = b'{"action": "drain", "target": "gpu:1", "reason": "fan \\udfff"}'
    assert _post(client, "/api/toggles", toggle, csrf) == 422
    assert world.store.toggles(world.controller.host) == []
    name = b'{"name": "\\ud83d", "password": "whatever long"}'
    anonymous = _client(world, tmp_path)
    assert _post(anonymous, "/api/session", name, anonymous.get("/api/session").json()["csrf"]) == 422


@pytest.mark.parametrize("path", ["/api/session", "/api/toggles", "/webhooks/gitlab"])
def test_deep_nesting_is_a_400_everywhere(world: World, tmp_path: Path, path: str) -> None:
    client, csrf = _operator(world, tmp_path, WebSettings(max_body_bytes=1_000_000))
    headers = {"X-Gitlab-Token": HOOK} if path.startswith("/webhooks") else {}
    assert _post(client, path, DEEP, csrf, **headers) in (400, 422)


def test_the_webhook_token_is_checked_before_the_body_is_parsed(world: World, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[bytes] = []
    real = __import__("json").loads
    monkeypatch.setattr("runnerctl.controller.app.json.loads", lambda raw: parsed.append(raw) or real(raw))
    client = _client(world, tmp_path, WebSettings(max_body_bytes=1_000_000))
    assert _post(client, "/webhooks/gitlab", DEEP) == 401
    assert _post(client, "/webhooks/gitlab", DEEP, **{"X-Gitlab-Token": "wrong"}) == 401
    assert parsed == []
    secret = HOOK
    assert _post(client, "/webhooks/gitlab", b"[1]", **{"X-Gitlab-Token": secret}) == 400
    pending = (b'{"object_kind": "build", "project_id": 1, "build_id": 9, "build_status": "pending", '
               b'"build_tags": ["gpus:2", "\\ud800"]}')
    assert _post(client, "/webhooks/gitlab", pending, **{"X-Gitlab-Token": secret}) == 400
    assert client.get("/api/state").status_code == 200
    assert _post(client, "/webhooks/gitlab", b'{"object_kind": "push"}', **{"X-Gitlab-Token": secret}) == 200


def test_bodies_over_the_limit_get_413_unread(world: World, tmp_path: Path) -> None:
    client, csrf = _operator(world, tmp_path, WebSettings(max_body_bytes=4096))
    big = b'{"name": "olga", "password": "' + b"x" * 10_000 + b'"}'
    for path in ("/api/session", "/api/toggles", "/webhooks/gitlab", "/api/session/end"):
        assert _post(client, path, big, csrf) == 413, path

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"name": "olga", "password": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'

    response = client.post("/api/session", content=chunks(), headers={"X-CSRF-Token": csrf,
                                                                      "Content-Type": "application/json"})
    assert response.status_code == 413
    assert client.get("/api/session").json()["user"] == "olga"  # the session is untouched


def test_odd_headers_are_4xx(world: World, tmp_path: Path) -> None:
    client, csrf = _operator(world, tmp_path)
    body = b'{"action": "drain", "target": "gpu:1", "reason": "x"}'
    for forged in ("t\xe9st".encode("latin-1"), b"\xff\xfe", csrf.encode() + b"\xe9"):  # non-ASCII
        assert client.post("/api/toggles", content=body, headers={
            "X-CSRF-Token": forged, "Content-Type": "application/json"}).status_code == 403  # type: ignore[dict-item]
    assert client.get("/api/events?limit=99999999999999999999").status_code == 422


def test_a_422_never_echoes_the_password(world: World, tmp_path: Path) -> None:
    client = _client(world, tmp_path)
    csrf = client.get("/api/session").json()["csrf"]
    response = client.post("/api/session", json={"name": "", "password": "hunter2-secret"},
                           headers={"X-CSRF-Token": csrf})
    assert response.status_code == 422
    assert "hunter2-secret" not in response.text and "name" in response.text


def test_no_input_can_forge_a_log_line(world: World, tmp_path: Path,
                                       caplog: pytest.LogCaptureFixture) -> None:
    """A reason, a user name or a toggle target with a newline: refused, or logged on one line."""
    client, csrf = _operator(world, tmp_path)
    forged = "\nrunnerctl: WARNING runnerctl.web.routes: mallory signed in from 10.0.0.1\x1b[2K"
    with caplog.at_level(logging.WARNING):
        toggle = {"action": "drain", "target": "gpu:1", "reason": "fan" + forged}
        assert client.post("/api/toggles", json=toggle, headers={"X-CSRF-Token": csrf}).status_code == 422
        assert client.post("/api/session", json={"name": "olga" + forged, "password": "wrong password"},
                           headers={"X-CSRF-Token": csrf}).status_code in (401, 422)
    one_line = OneLineFormatter("%(message)s")
    lines = [one_line.format(r) for r in caplog.records]
    assert lines and not any("\n" in line or "\x1b" in line for line in lines)
    assert not any(line.startswith("runnerctl: WARNING") for line in "\n".join(lines).splitlines())
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "failed for %s", ("a\nb\r\x00",), None)
    assert one_line.format(record) == "failed for a\\nb\\r\\x00"


def test_concurrent_sign_ins_evaluate_at_most_the_limit(world: World, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """40 at once, same name: `signin_attempts` are evaluated, never more than
    `max_concurrent_signins` hashing at the same time (the others wait for a slot); the
    rest get 429 at once."""
    running, peak, evaluated = [0], [0], [0]
    lock = threading.Lock()
    real = auth.check_password

    def counting(*args: object) -> auth.Principal | None:
        with lock:
            running[0] += 1
            evaluated[0] += 1
            peak[0] = max(peak[0], running[0])
        try:
            time.sleep(0.2)  # a slow hash: the others arrive while it runs
            return real(*args)  # type: ignore[arg-type]
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(auth, "check_password", counting)
    client = _client(world, tmp_path, WebSettings(signin_attempts=5, max_concurrent_signins=2))
    csrf = client.get("/api/session").json()["csrf"]

    def attempt(i: int) -> int:
        return client.post("/api/session", json={"name": "olga", "password": f"wrong {i:04d}"},
                           headers={"X-CSRF-Token": csrf}).status_code

    codes = concurrently(attempt, 40)
    assert sorted(codes) == [401] * 5 + [429] * 35, codes
    assert evaluated[0] == 5 and peak[0] <= 2
    assert _sign_in(client, "olga")[0] == 429  # also the right password, for a minute


def test_rotating_names_do_not_grow_the_limiter_without_bound() -> None:
    now = [0.0]
    limiter = auth.SignInLimiter(5, lambda: now[0])
    for i in range(20_000):
        now[0] = i * 0.1  # 10 new names a second, each failing, from ever new addresses
        assert limiter.begin(f"10.0.{i // 256 % 256}.{i % 256}", f"name{i}")
    assert len(limiter._failures) <= limiter.KEYS + 2
    assert [limiter.begin("10.1.0.2", "olga") for _ in range(6)] == [True] * 5 + [False]  # still counts


def test_one_client_trying_many_names_is_stopped_before_hashing(world: World, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A new name per attempt (unknown names are hashed like known ones) would keep the
    hashing slots busy for everyone: after PER_CLIENT x signin_attempts failures a minute
    the client gets 429 before any hashing, for every name; other clients sign in."""
    hashed: list[str] = []
    real = auth.check_password

    def counted(store: Store, name: str, password: str) -> auth.Principal | None:
        hashed.append(name)
        return real(store, name, password)

    class Patient(auth.SignInLimiter):  # a slow machine's hashing must not turn into 503s here
        def __init__(self, attempts: int, *, hashing: int) -> None:
            super().__init__(attempts, hashing=hashing, wait_s=60.0)

    monkeypatch.setattr(auth, "check_password", counted)
    monkeypatch.setattr(auth, "SignInLimiter", Patient)
    web = WebSettings(signin_attempts=2)
    client = _client(world, tmp_path, web)
    allowed = auth.SignInLimiter.PER_CLIENT * web.signin_attempts
    for i in range(allowed):
        assert _sign_in(client, f"guess{i}", "wrong password")[0] == 401
    assert _sign_in(client, "guess-next", "wrong password")[0] == 429
    assert _sign_in(client, "olga")[0] == 429
    assert len(hashed) == allowed
    elsewhere = TestClient(client.app, client=("192.0.2.8", 50000))
    assert _sign_in(elsewhere, "olga")[0] == 200


def test_a_sign_in_waits_briefly_for_a_hashing_slot(world: World, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Both slots busy: a sign-in waits for one (up to `wait_s`) and is checked; after
    `wait_s` it gets 503 with Retry-After, which does not count as a failure."""
    release, queued, entered = threading.Event(), threading.Event(), threading.Semaphore(0)
    real = auth.check_password
    limiters: list[auth.SignInLimiter] = []

    class Watched(threading.BoundedSemaphore):
        def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
            if super().acquire(blocking=False):
                return True
            queued.set()  # every slot is busy: this sign-in waits (or, without waiting, is refused)
            return super().acquire(blocking, timeout)

    class Limiter(auth.SignInLimiter):
        def __init__(self, attempts: int, *, hashing: int) -> None:
            super().__init__(attempts, hashing=hashing)
            self.hashing, self.wait_s = Watched(2), 0.2
            limiters.append(self)

    def slow(store: Store, name: str, password: str) -> auth.Principal | None:
        if name.startswith("busy"):
            entered.release()
            assert release.wait(30)
        return real(store, name, password)

    monkeypatch.setattr(auth, "check_password", slow)
    monkeypatch.setattr(auth, "SignInLimiter", Limiter)
    client = _client(world, tmp_path, WebSettings(signin_attempts=1, max_concurrent_signins=2))
    with ThreadPoolExecutor(3) as pool:
        busy = [pool.submit(_sign_in, TestClient(client.app), name, "wrong password")  # a cookie each
                for name in ("busy-a", "busy-b")]
        assert entered.acquire(timeout=60) and entered.acquire(timeout=60)
        csrf = client.get("/api/session").json()["csrf"]
        refused = client.post("/api/session", json={"name": "olga", "password": PASSWORD},
                              headers={"X-CSRF-Token": csrf})
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        queued.clear()
        limiters[0].wait_s = 30.0
        waiting = pool.submit(_sign_in, client, "olga")  # signin_attempts=1: the 503 did not count
        assert queued.wait(60)
        release.set()
        assert [f.result(timeout=30)[0] for f in busy] == [401, 401]
        assert waiting.result(timeout=30)[0] == 200


def test_a_locked_out_name_signs_in_again_a_minute_later_and_right_passwords_never_count() -> None:
    """The limit is a sliding minute: failures older than 60 s are forgotten, and an
    attempt that succeeded gives its place back (a mutation that kept failures for 100
    minutes went unnoticed; found by a review as a mutation tester)."""
    now = [0.0]
    limiter = auth.SignInLimiter(3, lambda: now[0])
    for _ in range(10):  # right passwords, one after another
        assert limiter.begin("10.1.0.2", "olga")
        limiter.succeeded("10.1.0.2", "olga")
    assert [limiter.begin("10.1.0.2", "olga") for _ in range(4)] == [True] * 3 + [False]
    now[0] = 59.0
    assert not limiter.begin("10.1.0.2", "olga")
    now[0] = 60.5
    assert limiter.begin("10.1.0.2", "olga")


def test_an_account_needs_a_role_runnerctl_knows(world: World) -> None:
    """`add_user` refuses a role that is none of runnerctl's, whatever calls it (the CLI's
    choice list was the only check a mutation left; found by a review as a mutation tester)."""
    from runnerctl.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown role 'admin'"):
        auth.add_user(world.store, "eve", "a long enough password", "admin")
    assert world.store.user("eve") is None


def test_a_client_that_hangs_up_mid_body_costs_no_error_in_the_log(world: World, tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Headers and part of a webhook body, then a hang-up: starlette's ClientDisconnect went
    out of the endpoint as an ERROR traceback of 5 KB, for anyone, with no token (found by
    a review hunting leaks in a long-running serve)."""
    import asyncio

    app = create_app(lambda: world.controller.view, world.controller.demand.webhook)
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/webhooks/gitlab", "raw_path": b"/webhooks/gitlab", "root_path": "",
             "query_string": b"", "headers": [(b"host", b"test"), (b"content-length", b"1000")],
             "client": ("10.1.0.9", 40000), "server": ("test", 80)}
    arriving: list[dict[str, object]] = [{"type": "http.request", "body": b"{", "more_body": True}]
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return arriving.pop(0) if arriving else {"type": "http.disconnect"}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    with caplog.at_level(logging.DEBUG):
        asyncio.run(app(scope, receive, send))  # type: ignore[arg-type]
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert sent and sent[0]["status"] == 400
