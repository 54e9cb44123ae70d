"""The web page's API in process: access, CSRF, sign-in limits, headers, toggles that
persist, and no secret in any response or log line."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from runnerctl.cli import main
from runnerctl.controller.app import create_app
from runnerctl.controller.store import Store
from runnerctl.exporter import endpoint
from runnerctl.settings import ControllerSettings, WebSettings
from runnerctl.sim.world import PROJECT, TOKEN, World, build_world
from runnerctl.web.auth import add_user, check_password
from runnerctl.web.routes import install

PASSWORD = "correct horse battery"


def _world(state_dir: Path) -> World:
    return build_world(state_dir, settings=ControllerSettings(projects=(PROJECT,), interval_s=1.0))


def _client(world: World, state_dir: Path, web: WebSettings | None = None) -> TestClient:
    metrics = endpoint(lambda: world.controller.stats.view)  # as `serve` mounts it: the secret grep reads it
    app = create_app(lambda: world.controller.view, world.controller.demand.webhook, metrics, extend=[
        lambda app: install(app, view=lambda: world.controller.view, store=world.store,
                            settings=web or WebSettings(), state_dir=state_dir)])
    return TestClient(app)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    world = _world(tmp_path)
    add_user(world.store, "olga", PASSWORD, "operator")
    add_user(world.store, "victor", PASSWORD, "viewer")
    world.submit(4, 3600.0, user="carol")
    world.gpus.foreign[7] = (4242, "alice")
    world.advance(20.0)
    yield world
    world.close()


def _sign_in(client: TestClient, name: str, password: str = PASSWORD) -> tuple[int, str]:
    csrf = client.get("/api/session").json()["csrf"]
    response = client.post("/api/session", json={"name": name, "password": password},
                           headers={"X-CSRF-Token": csrf})
    return response.status_code, response.json().get("csrf", "")


def test_page_data_shows_job_foreign_process_and_block(world: World, tmp_path: Path) -> None:
    host = _client(world, tmp_path).get("/api/host").json()
    states = {g["index"]: g["state"] for g in host["gpus"]}
    assert [states[i] for i in range(4)] == ["ci"] * 4
    assert states[7] == "foreign"
    assert host["gpus"][7]["processes"][0]["user"] == "alice"
    assert host["gpus"][7]["processes"][0]["memory_mib"] == 2048
    block = next(s for s in host["slots"] if s["key"] == "gpu0-3")
    assert block["running_jobs"] == [host["gpus"][0]["jobs"][0]["job_id"]]


def test_a_running_job_shows_its_user_and_link_even_if_never_seen_pending(world: World,
                                                                         tmp_path: Path) -> None:
    """A 1-GPU job is not multi-GPU demand, so the controller learns who runs it from the
    executor's lease (the simulated host's fleet stands in for it)."""
    job = world.submit(1, 3600.0, user="dora")
    world.advance(10.0)
    host = _client(world, tmp_path).get("/api/host").json()
    shown = [j for g in host["gpus"] for j in g["jobs"] if j["job_id"] == job]
    assert shown, host["gpus"]
    assert shown[0]["user"] == "dora"
    assert shown[0]["url"].endswith(f"/-/jobs/{job}")


def test_security_headers_and_cookie_flags(world: World, tmp_path: Path) -> None:
    client = _client(world, tmp_path)
    response = client.get("/")
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    assert "script-src 'self'" in response.headers["content-security-policy"]
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "no-referrer"
    cookie = client.get("/api/session").headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=lax" in cookie


def test_toggles_need_an_operator_and_the_csrf_token(world: World, tmp_path: Path) -> None:
    body = {"action": "drain", "target": "gpu:2", "reason": "fan noise"}
    anonymous = _client(world, tmp_path)
    csrf = anonymous.get("/api/session").json()["csrf"]
    assert anonymous.post("/api/toggles", json=body, headers={"X-CSRF-Token": csrf}).status_code == 403
    viewer = _client(world, tmp_path)
    status, csrf = _sign_in(viewer, "victor")
    assert status == 200
    assert viewer.post("/api/toggles", json=body, headers={"X-CSRF-Token": csrf}).status_code == 403
    operator = _client(world, tmp_path)
    status, csrf = _sign_in(operator, "olga")
    assert status == 200
    assert operator.post("/api/toggles", json=body).status_code == 403
    assert operator.post("/api/toggles", json=body, headers={"X-CSRF-Token": "forged"}).status_code == 403
    assert world.store.toggles(world.controller.host) == []
    assert operator.post("/api/toggles", json={**body, "reason": ""},
                         headers={"X-CSRF-Token": csrf}).status_code == 422
    response = operator.post("/api/toggles", json=body, headers={"X-CSRF-Token": csrf})
    assert response.status_code == 200, response.text
    [toggle] = world.store.toggles(world.controller.host)
    assert (toggle.target, toggle.action, toggle.who, toggle.why) == ("gpu:2", "drain", "olga", "fan noise")
    world.advance(2.0)
    host = operator.get("/api/host").json()
    assert host["gpus"][2]["state"] == "draining"
    assert any(e["kind"] == "drain" and "olga: fan noise" in e["detail"] for e in host["events"])


def test_a_toggle_survives_a_restart(tmp_path: Path) -> None:
    world = _world(tmp_path)
    add_user(world.store, "olga", PASSWORD, "operator")
    client = _client(world, tmp_path)
    _, csrf = _sign_in(client, "olga")
    assert client.post("/api/toggles", json={"action": "pause", "target": "gpu:5", "reason": "reboot"},
                       headers={"X-CSRF-Token": csrf}).status_code == 200
    world.close()
    again = _world(tmp_path)
    try:
        again.advance(3.0)
        host = _client(again, tmp_path).get("/api/host").json()
        assert host["gpus"][5]["state"] == "paused"
        assert host["gpus"][5]["toggle"]["who"] == "olga" and host["gpus"][5]["toggle"]["why"] == "reboot"
        assert any(e["kind"] == "pause" and e["subject"] == "gpu:5" for e in host["events"])
        slot = next(s for s in host["slots"] if s["key"] == "gpu5")
        assert not slot["open"]
    finally:
        again.close()


def test_sign_in_is_rate_limited(world: World, tmp_path: Path) -> None:
    client = _client(world, tmp_path)
    for _ in range(5):
        assert _sign_in(client, "olga", "wrong password")[0] == 401
    assert _sign_in(client, "olga")[0] == 429
    assert _sign_in(client, "victor")[0] == 200


def test_sign_in_limits_count_an_ipv6_clients_whole_64() -> None:
    """One ordinary IPv6 connection gives a client a whole /64: counted per address, 30
    tries from one /64 were 30 401s and no 429 (found by a review as a lab admin behind
    a reverse proxy)."""
    from runnerctl.web.auth import SignInLimiter, client_key

    assert client_key("2001:db8:1:2::1") == client_key("2001:db8:1:2:ffff::1e") == "2001:db8:1:2::/64"
    assert client_key("2001:db8:1:3::1") != client_key("2001:db8:1:2::1")
    assert client_key("203.0.113.7") == client_key("::ffff:203.0.113.7") == "203.0.113.7"
    assert client_key("testclient") == "testclient"
    limiter = SignInLimiter(5, clock=lambda: 0.0)
    tries = [limiter.begin(f"2001:db8:1:2::{n:x}", "olga") for n in range(1, 61)]  # one address each
    cap = SignInLimiter.PER_CLIENT * 5 * SignInLimiter.PER_NETWORK
    assert tries == [True] * cap + [False] * (60 - cap)  # the /64 adds up
    assert limiter.begin("2001:db8:9:9::1", "olga")  # another network: its own count
    # a name's own limit is per address: one machine of the LAN does not lock it for the rest
    one = SignInLimiter(5, clock=lambda: 0.0)
    assert [one.begin("2001:db8:1:2::1", "mia") for _ in range(6)] == [True] * 5 + [False]
    assert one.begin("2001:db8:1:2::2", "mia")


def test_the_page_names_its_own_files_relative_to_itself(world: World, tmp_path: Path) -> None:
    """Under a proxy's sub-path (https://lab.example/gpus/) every absolute /static or /api
    address left the page's path (found by a review as a lab admin behind a proxy)."""
    client = _client(world, tmp_path)
    page, script = client.get("/").text, client.get("/static/app.js").text
    assert "static/app.js" in page and "api/session" in script
    for text in (page, script):
        for absolute in ('href="/', 'src="/', '"/api/', '`/api/', 'action="/'):
            assert absolute not in text, absolute


def test_sign_in_without_csrf_token_is_refused(world: World, tmp_path: Path) -> None:
    client = _client(world, tmp_path)
    response = client.post("/api/session", json={"name": "olga", "password": PASSWORD})
    assert response.status_code == 403
    assert client.get("/api/session").json()["user"] is None


@pytest.mark.parametrize("root", ["", "/gpus"])
def test_private_reads_need_a_session(world: World, tmp_path: Path, root: str) -> None:
    """Also under a proxy's sub-path (`[web] public_url`): uvicorn puts the root path in
    front of the request's, and /gpus/api/state passed the sign-in check unasked (found
    by a review of the day's changes)."""
    web = WebSettings(public_read=False, public_url=f"https://lab.example{root}/")
    client = TestClient(_client(world, tmp_path, web).app, root_path=root)  # as uvicorn: root + path
    for path in ("/api/host", "/api/state", "/api/events"):
        assert client.get(root + path).status_code == 401, path
    assert client.get(root + "/api/session").status_code == 200
    client.cookies.clear()
    csrf = client.get(root + "/api/session").json()["csrf"]
    signed = client.post(root + "/api/session", json={"name": "victor", "password": PASSWORD},
                         headers={"X-CSRF-Token": csrf})
    assert signed.status_code == 200
    for path in ("/api/host", "/api/state", "/api/events"):
        assert client.get(root + path).status_code == 200, path


def test_what_stays_open_without_public_read_names_nobody(world: World, tmp_path: Path) -> None:
    """README/docs/web.md's security model: the page shell, health and metrics answer
    everyone; they carry no user name (carol runs a job, alice a process) or job link."""
    client = _client(world, tmp_path, WebSettings(public_read=False))
    for path in ("/", "/openapi.json", "/healthz", "/metrics"):
        answer = client.get(path)
        assert answer.status_code in (200, 503), path  # /healthz: 503 while no loop thread ticks
        if path in ("/healthz", "/metrics"):
            assert "carol" not in answer.text and "alice" not in answer.text, path
            assert "/-/jobs/" not in answer.text, path
    assert client.get("/api/host").status_code == 401
    hook = client.post("/webhooks/gitlab", json={"object_kind": "build"}, headers={"X-Gitlab-Token": ""})
    assert hook.status_code in (401, 403)  # no secret configured: every delivery is refused
    assert _sign_in(client, "victor")[0] == 200
    assert "carol" in client.get("/api/host").text  # what the open ones leave out


def test_removed_user_loses_the_session(world: World, tmp_path: Path) -> None:
    client = _client(world, tmp_path)
    _, csrf = _sign_in(client, "olga")
    world.store.remove_user("olga")
    assert client.get("/api/session").json()["user"] is None
    assert client.post("/api/toggles", json={"action": "pause", "target": "host", "reason": "x"},
                       headers={"X-CSRF-Token": csrf}).status_code == 403


def test_no_secret_in_responses_or_logs(world: World, tmp_path: Path,
                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    client = _client(world, tmp_path)
    _, csrf = _sign_in(client, "olga")
    _sign_in(_client(world, tmp_path), "olga", "wrong password")
    client.post("/api/toggles", json={"action": "drain", "target": "gpu:1", "reason": "check"},
                headers={"X-CSRF-Token": csrf})
    world.advance(2.0)
    bodies = [client.get(path).text for path in ("/", "/static/app.js", "/api/host", "/api/state",
                                                 "/api/events", "/api/session", "/openapi.json",
                                                 "/metrics")]
    password_hash = world.store.user("olga")
    assert password_hash is not None
    runner_tokens = [runner.token for runner in world.state.runners.values()]
    assert len(runner_tokens) == 16 and all(t.startswith("glrt-") for t in runner_tokens)  # and the stand-by
    secrets = [TOKEN, PASSWORD, password_hash[0], (tmp_path / "web-session.key").read_text().strip(),
               *runner_tokens]
    everything = "\n".join(bodies + [r.getMessage() for r in caplog.records])
    assert "olga" in everything  # the grep reads the right text
    assert "runnerctl_gpu_info{" in everything  # ... the metrics too
    for secret in secrets:
        assert secret not in everything


def test_user_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                       monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    def stdin(data: bytes) -> None:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))

    stdin(PASSWORD.encode() + b"\r\n")  # a file written on Windows: its \r is no part of the password
    assert main(["user", "add", "ann", "--role", "operator", "--password-stdin",
                 "--state-dir", str(tmp_path)]) == 0
    stdin(PASSWORD.encode() + b"\n")
    assert main(["user", "add", "田中", "--role", "viewer", "--password-stdin",
                 "--state-dir", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["user", "list", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "ann" in out and "operator" in out and "argon2" not in out
    from runnerctl.columns import cells  # the role column lines up under a Japanese name too
    assert sorted(cells(line[:line.rindex(" ")]) for line in out.splitlines()) == [24, 24], out
    store = Store.open(state_dir=tmp_path)
    found = store.user("ann")
    store.close()
    assert found is not None and found[0].startswith("$argon2id$") and PASSWORD not in found[0]
    store = Store.open(state_dir=tmp_path)
    assert check_password(store, "ann", PASSWORD) is not None
    store.close()
    stdin(b"short\n")
    assert main(["user", "add", "bo", "--password-stdin", "--state-dir", str(tmp_path)]) != 0
    assert "shorter than 8" in capsys.readouterr().err
    stdin(b"\xff\xfe\xfd\xfcabcdefghijk\n")  # no UTF-8: was "unexpected UnicodeEncodeError"
    assert main(["user", "add", "bo", "--password-stdin", "--state-dir", str(tmp_path)]) == 3
    assert "runnerctl: error: the password on stdin is not UTF-8 text\n" == capsys.readouterr().err
    stdin(PASSWORD.encode() + b"\n")
    assert main(["user", "add", "b" * 100_000, "--password-stdin", "--state-dir", str(tmp_path)]) == 3
    assert "characters; at most 64" in capsys.readouterr().err
    assert main(["user", "remove", "ann", "--state-dir", str(tmp_path)]) == 0
    assert main(["user", "remove", "ann", "--state-dir", str(tmp_path)]) != 0


def test_non_loopback_listen_without_accounts_is_refused(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["serve", "--gitlab", "sim", "--gpu-source", "sim:2", "--listen", "0.0.0.0:0",
                 "--state-dir", str(tmp_path)])
    assert code != 0
    assert "no sign-in is configured" in capsys.readouterr().err


def test_fleet_lists_every_host_of_the_store(world: World, tmp_path: Path) -> None:
    from runnerctl.controller.store import Event, Toggle

    world.store.set_toggle(Toggle("gpu-b", "host", "drain", "olga", 1.0, "kernel update"))
    world.store.record(Event(2.0, "gpu-b", "drain", "host", "by olga: kernel update"))
    fleet = {h["host"]: h for h in _client(world, tmp_path).get("/api/fleet").json()}
    assert set(fleet) == {"demo", "gpu-b"}
    assert fleet["gpu-b"]["toggles"][0]["why"] == "kernel update"
    assert fleet["gpu-b"]["last_event"]["detail"] == "by olga: kernel update"
    assert fleet["demo"]["toggles"] == []


def test_a_pause_or_drain_with_a_blank_reason_is_refused(world: World, tmp_path: Path) -> None:
    """As `runnerctl pause --why '  '` is: whoever finds the runners closed must learn why.
    A resume needs no reason."""
    client = _client(world, tmp_path)
    _, csrf = _sign_in(client, "olga")
    for action in ("pause", "drain"):
        for reason in ("  ", "", None):
            given = {} if reason is None else {"reason": reason}
            body = {"action": action, "target": "slot:gpu0-3", **given}
            response = client.post("/api/toggles", json=body, headers={"X-CSRF-Token": csrf})
            assert response.status_code == 422, (action, reason, response.text)
            assert f"a {action} needs a reason" in response.json()["detail"]
    assert world.store.toggles(world.controller.host) == []
    assert client.post("/api/toggles", json={"action": "pause", "target": "slot:gpu0-3", "reason": " fan "},
                       headers={"X-CSRF-Token": csrf}).status_code == 200
    [toggle] = world.store.toggles(world.controller.host)
    assert toggle.why == "fan"
    resumed = client.post("/api/toggles", json={"action": "resume", "target": "slot:gpu0-3"},
                          headers={"X-CSRF-Token": csrf})
    assert resumed.status_code == 200, resumed.text
    assert world.store.toggles(world.controller.host) == []
    assert world.store.events(world.controller.host, 1)[0].detail == "by olga: no reason given"


@pytest.mark.parametrize("path", ["/", "/healthz", "/api/host", "/api/session", "/static/app.js"])
def test_head_is_answered_like_get_without_a_body(world: World, tmp_path: Path, path: str) -> None:
    client = _client(world, tmp_path)
    got, head = client.get(path), client.head(path)
    assert head.status_code == got.status_code and head.status_code in (200, 503)  # /healthz: no loop here
    assert head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]
    assert head.headers["x-frame-options"] == "DENY"
    assert client.head("/api/toggles").status_code == 405  # POST only, as a GET there is


def test_head_of_private_data_needs_a_session(world: World, tmp_path: Path) -> None:
    client = _client(world, tmp_path, WebSettings(public_read=False))
    assert client.head("/api/host").status_code == 401
    assert client.head("/healthz").status_code in (200, 503)


def test_a_failed_sign_in_logs_a_name_no_account_has_as_such(world: World, tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """The typed name was logged as typed: people put their password in the name field
    (found by a review as an SRE reading the logs)."""
    client = _client(world, tmp_path)
    with caplog.at_level(logging.WARNING):
        assert _sign_in(client, "Tr0ub4dor&3-mypassword", "x")[0] == 401
        assert _sign_in(client, "olga", "wrong")[0] == 401
    said = [r.getMessage() for r in caplog.records if "failed sign-in" in r.getMessage()]
    assert said == ["failed sign-in for a name no account has from testclient",
                    "failed sign-in for 'olga' from testclient"]


def test_sign_out_needs_the_csrf_token_and_the_cookie_is_secure_when_asked(world: World,
                                                                          tmp_path: Path) -> None:
    """Another site's form cannot sign a user out (403 without X-CSRF-Token); `[web]
    https_only_cookies` marks the session cookie Secure, and it is not without it
    (mutations of each went unnoticed; found by a review as a mutation tester)."""
    client = _client(world, tmp_path)
    status, csrf = _sign_in(client, "olga")
    assert status == 200
    assert client.post("/api/session/end").status_code == 403
    assert client.get("/api/session").json()["user"] == "olga"
    assert client.post("/api/session/end", headers={"X-CSRF-Token": csrf}).status_code == 200
    assert client.get("/api/session").json()["user"] is None
    for secure in (False, True):
        answer = _client(world, tmp_path, WebSettings(https_only_cookies=secure)).get("/api/session")
        cookie = answer.headers["set-cookie"].lower()
        assert cookie.startswith("runnerctl_session=") and ("; secure" in cookie) is secure, cookie
