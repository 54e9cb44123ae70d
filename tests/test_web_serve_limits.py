"""Sign-in limits and body limits of a real `runnerctl serve` (uvicorn, not the test
client): X-Forwarded-For from an untrusted peer changes nothing, 40 concurrent sign-ins
evaluate at most the configured limit and the process stays under 500 MiB, a 100 MiB
body is refused unread, connections past the limit get 503 at once."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request

from runnerctl.controller.serve import MAX_CONNECTIONS, LoopbackHosts, http_config
from runnerctl.settings import WebSettings
from tests.serve_proc import Serve, concurrently

PASSWORD = "correct horse battery"
MIB = 1024 * 1024


def _peak_rss(serve: Serve) -> int:
    status = Path(f"/proc/{serve.proc.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) * 1024


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    config = tmp_path / "runnerctl.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp_path / "state"}"\n'
                      "[web]\nsignin_attempts = 5\nmax_concurrent_signins = 2\nmax_body_bytes = 65536\n")
    subprocess.run([sys.executable, "-m", "runnerctl", "user", "add", "olga", "--role", "operator",
                    "--password-stdin", "--config", str(config)],
                   input=PASSWORD + "\n", text=True, check=True)
    server = Serve(tmp_path, "--config", str(config), env={**os.environ, "FORWARDED_ALLOW_IPS": "*"})
    yield server
    server.stop()


def _csrf(client: httpx.Client, url: str) -> str:
    return str(client.get(f"{url}/api/session").json()["csrf"])


def test_forty_concurrent_sign_ins_with_rotating_forwarded_for(serve: Serve) -> None:
    """uvicorn would believe X-Forwarded-For from 127.0.0.1 by default (and from anyone with
    FORWARDED_ALLOW_IPS=*, set here): without [web] trusted_proxies it believes nobody."""
    client = httpx.Client(timeout=60)
    csrf = _csrf(client, serve.url)

    def attempt(i: int) -> int:
        return client.post(f"{serve.url}/api/session", json={"name": "olga", "password": f"wrong {i}"},
                           headers={"X-CSRF-Token": csrf, "X-Forwarded-For": f"10.{i}.0.1"}).status_code

    codes = concurrently(attempt, 40)
    assert len(codes) == 40 and set(codes) <= {401, 429, 503}, codes
    assert 1 <= codes.count(401) <= 5, codes
    for i in range(40, 80):  # one by one, each from a "new address": the minute fills up
        codes.append(attempt(i))
        if codes[-1] == 429:
            break
    assert codes.count(401) == 5 and codes[-1] == 429, codes
    right = client.post(f"{serve.url}/api/session", json={"name": "olga", "password": PASSWORD},
                        headers={"X-CSRF-Token": csrf, "X-Forwarded-For": "192.0.2.77"})
    assert right.status_code == 429
    assert _peak_rss(serve) < 500 * MIB, _peak_rss(serve) / MIB
    assert "failed sign-in for 'olga' from 127.0.0.1" in serve.output()


def test_a_100_mib_body_is_refused_unread(serve: Serve) -> None:
    client = httpx.Client(timeout=60)
    csrf = _csrf(client, serve.url)
    before = _peak_rss(serve)

    def body() -> Iterator[bytes]:
        yield b'{"name": "olga", "password": "'
        for _ in range(100):
            yield b"x" * MIB
        yield b'"}'

    for path in ("/api/session", "/webhooks/gitlab"):
        sized = client.post(f"{serve.url}{path}", content=b"x" * (100 * MIB),
                            headers={"X-CSRF-Token": csrf, "Content-Type": "application/json"})
        assert sized.status_code == 413, path
    try:
        chunked = client.post(f"{serve.url}/api/session", content=body(),
                              headers={"X-CSRF-Token": csrf, "Content-Type": "application/json"})
        assert chunked.status_code == 413
    except httpx.HTTPError:
        pass  # the server may close the connection while the client still sends: also refused
    assert _peak_rss(serve) - before < 50 * MIB, (before / MIB, _peak_rss(serve) / MIB)
    assert client.get(f"{serve.url}/healthz").status_code == 200


def test_connections_past_the_limit_get_503_at_once(serve: Serve) -> None:
    """Slow clients that do not finish their headers hold their connections until the
    headers' deadline (20 s, tests/test_web_header_timeout.py): past MAX_CONNECTIONS a
    request gets 503 at once instead of more work piling up, and is served again once
    they close."""
    held = [socket.create_connection(("127.0.0.1", serve.port), timeout=10) for _ in range(MAX_CONNECTIONS)]
    try:
        for conn in held:
            conn.sendall(b"GET /api/session HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never ends its headers
        refused = httpx.get(f"{serve.url}/api/session", timeout=10)
        assert refused.status_code == 503 and refused.text == "Service Unavailable"
    finally:
        for conn in held:
            conn.close()
    deadline = time.monotonic() + 30
    while (status := httpx.get(f"{serve.url}/api/session", timeout=10).status_code) != 200:
        assert time.monotonic() < deadline, status
        time.sleep(0.2)


def test_a_page_on_loopback_answers_only_under_a_loopback_name(serve: Serve) -> None:
    """DNS rebinding: another site points its own name at 127.0.0.1 and reads the page
    from the user's browser; its requests name that site in Host, and get 400."""
    for host in ("evil.example", f"evil.example:{serve.port}", "127.0.0.1.evil.example", "localhost.evil"):
        refused = httpx.get(f"{serve.url}/api/host", headers={"Host": host}, timeout=10)
        assert refused.status_code == 400 and "loopback name" in refused.text, host
    for host in (f"127.0.0.1:{serve.port}", "localhost", f"LOCALHOST:{serve.port}", "[::1]:1"):
        assert httpx.get(f"{serve.url}/healthz", headers={"Host": host}, timeout=10).status_code in (200, 503)


def test_a_trusted_proxy_may_name_the_public_host() -> None:
    """Caddy passes the client's Host: from a proxy in `[web] trusted_proxies` any name
    passes (the proxy answers only for its own)."""
    seen: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope["path"])

    async def sent(message: dict[str, Any]) -> None:
        statuses.append(message.get("status"))

    statuses: list[Any] = []
    guarded = LoopbackHosts(app, ["10.0.0.0/8"])
    for client in (("10.1.2.3", 40000), ("192.0.2.7", 40000)):
        scope = {"type": "http", "path": f"/from/{client[0]}", "headers": [(b"host", b"gpu-a.lab.example")],
                 "client": client}
        asyncio.run(guarded(scope, None, sent))
    assert seen == ["/from/10.1.2.3"] and statuses == [400, None]


def _through_serve(web: WebSettings, host: str, peer: str,
                   forwarded_for: str | None = None) -> httpx.Response:
    """One request to serve's ASGI stack as `http_config` builds it, from TCP peer `peer`."""
    app = FastAPI()

    @app.get("/api/where")
    def where(request: Request) -> dict[str, Any]:
        return {"client": request.client.host if request.client else None,
                "callback": str(request.url_for("where")), "root": request.scope.get("root_path", "")}

    config = http_config(app, "127.0.0.1", 0, web, "warning")
    config.load()
    headers = {"Host": host, **({"X-Forwarded-For": forwarded_for} if forwarded_for else {})}

    async def ask() -> httpx.Response:
        transport = httpx.ASGITransport(app=config.loaded_app, client=(peer, 40000),
                                        root_path=config.root_path)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return await client.get("/api/where", headers=headers)

    return asyncio.run(ask())


def test_a_trusted_proxy_that_passes_the_public_host_and_forwarded_for_is_answered() -> None:
    """Caddy keeps the client's Host and always adds X-Forwarded-For: uvicorn's proxy
    header handling ran first, so the Host check judged the browser's address, not the
    proxy's, and every request got 400 (found by a review as a lab admin behind a proxy)."""
    web = WebSettings(trusted_proxies=("127.0.0.1",))
    answered = _through_serve(web, "gpu-a.lab.example", "127.0.0.1", "203.0.113.7")
    assert answered.status_code == 200 and answered.json()["client"] == "203.0.113.7"
    assert _through_serve(web, "gpu-a.lab.example", "192.0.2.9", "203.0.113.7").status_code == 400
    # with its public address set, only that name passes, whoever the peer (a rebinding page
    # reaching the port from this host names its own)
    public = WebSettings(trusted_proxies=("127.0.0.1",), public_url="https://gpu-a.lab.example/gpus/")
    assert _through_serve(public, "gpu-a.lab.example", "127.0.0.1", "203.0.113.7").status_code == 200
    assert _through_serve(public, "evil.example", "127.0.0.1").status_code == 400
    # the page lives under the public path the proxy strips: its own addresses carry it
    assert _through_serve(public, "127.0.0.1:8080", "127.0.0.1").json()["root"] == "/gpus"
