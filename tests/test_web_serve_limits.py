"""Sign-in limits and body limits of a real `runnerctl serve` (uvicorn, not the test
client): X-Forwarded-For from an untrusted peer changes nothing, 40 concurrent sign-ins
evaluate at most the configured limit and the process stays under 500 MiB, a 100 MiB
body is refused unread."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

PASSWORD = "correct horse battery"
MIB = 1024 * 1024


def _runnerctl(*args: str, stdin: str = "") -> None:
    subprocess.run([sys.executable, "-m", "runnerctl", *args], input=stdin, text=True, check=True)


class Serve:
    def __init__(self, root: Path, web: str) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = root / "runnerctl.toml"
        config.write_text(f'[paths]\nstate_dir = "{root / "state"}"\n[web]\n{web}\n')
        _runnerctl("user", "add", "olga", "--role", "operator", "--password-stdin", "--config", str(config),
                   stdin=PASSWORD + "\n")
        self.log = open(root / "serve.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runnerctl", "serve", "--gitlab", "sim", "--gpu-source", "sim:8",
             "--listen", f"127.0.0.1:{self.port}", "--config", str(config), "--interval", "1"],
            stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "FORWARDED_ALLOW_IPS": "*"})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (root / "serve.log").read_text()
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise AssertionError("serve did not answer /healthz within 60 s")

    def peak_rss(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) * 1024

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    server = Serve(tmp_path, "signin_attempts = 5\nmax_concurrent_signins = 2\nmax_body_bytes = 65536")
    yield server
    server.stop()


def _csrf(client: httpx.Client, url: str) -> str:
    return str(client.get(f"{url}/api/session").json()["csrf"])


def test_forty_concurrent_sign_ins_with_rotating_forwarded_for(serve: Serve) -> None:
    """uvicorn would believe X-Forwarded-For from 127.0.0.1 by default (and from anyone with
    FORWARDED_ALLOW_IPS=*, set here): without [web] trusted_proxies it believes nobody."""
    client = httpx.Client(timeout=60)
    csrf = _csrf(client, serve.url)
    codes: list[int] = []
    lock = threading.Lock()

    def attempt(i: int) -> None:
        response = client.post(f"{serve.url}/api/session", json={"name": "olga", "password": f"wrong {i}"},
                               headers={"X-CSRF-Token": csrf, "X-Forwarded-For": f"10.{i}.0.1"})
        with lock:
            codes.append(response.status_code)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(codes) == 40 and set(codes) <= {401, 429, 503}, codes
    assert 1 <= codes.count(401) <= 5, codes
    for i in range(40, 80):  # one by one, each from a "new address": the minute fills up
        attempt(i)
        if codes[-1] == 429:
            break
    assert codes.count(401) == 5 and codes[-1] == 429, codes
    right = client.post(f"{serve.url}/api/session", json={"name": "olga", "password": PASSWORD},
                        headers={"X-CSRF-Token": csrf, "X-Forwarded-For": "192.0.2.77"})
    assert right.status_code == 429
    assert serve.peak_rss() < 500 * MIB, serve.peak_rss() / MIB
    assert "failed sign-in for 'olga' from 127.0.0.1" in Path(serve.log.name).read_text()


def test_a_100_mib_body_is_refused_unread(serve: Serve) -> None:
    client = httpx.Client(timeout=60)
    csrf = _csrf(client, serve.url)
    before = serve.peak_rss()

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
    assert serve.peak_rss() - before < 50 * MIB, (before / MIB, serve.peak_rss() / MIB)
    assert client.get(f"{serve.url}/healthz").status_code == 200
