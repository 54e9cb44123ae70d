"""`runnerctl serve` on a real PostgreSQL store: a server restart under a running serve
(ticks stall, /healthz says so, ticks resume after, nothing lost), ten serves starting
at once on an empty store, and the CLI's one line when the store cannot be reached.

The controller runs on a simulated host (`--gitlab sim --gpu-source sim:4`), which goes
through the same store, loop, liveness and app as production `serve`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from runnerctl.postgres import PostgresServer, libpq_url
from tests.pg import free_port, running_server

RUNNERCTL = [sys.executable, "-m", "runnerctl"]


@pytest.fixture(scope="module")
def own_server() -> Iterator[PostgresServer]:
    """A PostgreSQL of this module's own: it is stopped and started under running serves."""
    with running_server() as server:
        yield server


def config(tmp: Path, url: str) -> Path:
    path = tmp / "runnerctl.toml"
    path.write_text(f"[controller]\nstore_url = {json.dumps(url)}\n")
    return path


def start_serve(tmp: Path, cfg: Path, name: str) -> tuple[subprocess.Popen[bytes], str, Path]:
    port, log = free_port(), tmp / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*RUNNERCTL, "serve", "--gitlab", "sim", "--gpu-source", "sim:4", "--listen",
                                 f"127.0.0.1:{port}", "--state-dir", str(tmp / name), "--interval", "0.2",
                                 "--config", str(cfg)], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "RUNNERCTL_CONFIG": str(cfg)})
    return proc, f"http://127.0.0.1:{port}", log


def health(url: str) -> tuple[int, dict[str, Any]]:
    try:
        answer = httpx.get(f"{url}/healthz", timeout=5)
    except httpx.HTTPError:
        return 0, {}
    body: dict[str, Any] = answer.json()
    return answer.status_code, body


def wait_until(what: str, check: Callable[[], object], proc: subprocess.Popen[bytes], log: Path,
               timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert proc.poll() is None, f"serve exited: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}\n{log.read_text()[-3000:]}"
        time.sleep(0.1)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RUNNERCTL, *args], capture_output=True, text=True, timeout=120, check=False)


def paused(url: str, gpu: int) -> bool:
    state = httpx.get(f"{url}/api/state", timeout=5).json()
    return any(s["name"].endswith(f"/gpu{gpu}") and s["paused_in_gitlab"] for s in state["slots"])


def test_a_postgres_restart_under_serve_stalls_ticks_then_they_resume_and_nothing_is_lost(
        own_server: PostgresServer, tmp_path: Path, spawned: list[subprocess.Popen[bytes]]) -> None:
    url = own_server.create_database("serve_restart")
    cfg = config(tmp_path, url)
    proc, web, log = start_serve(tmp_path, cfg, "serve")
    spawned.append(proc)
    wait_until("serve is healthy", lambda: health(web)[0] == 200, proc, log)
    first = cli("pause", "--gpu", "1", "--why", "fan", "--host-name", "demo", "--config", str(cfg))
    assert first.returncode == 0, first
    wait_until("gpu1 paused", lambda: paused(web, 1), proc, log)

    own_server.stop()  # fast shutdown: serve's connection gets AdminShutdown
    try:
        wait_until("/healthz reports the stall", lambda: health(web)[0] == 503, proc, log)
        status, body = health(web)
        assert "no good tick" in body["problem"] and "controller store" in body["problem"], body
        refused = cli("pause", "--gpu", "2", "--why", "psu", "--host-name", "demo", "--config", str(cfg))
        assert refused.returncode == 6 and refused.stdout == "", refused
        assert refused.stderr.startswith("runnerctl: error: the controller store postgresql://")
        assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr, refused.stderr
        stalled_at = body["tick"]
    finally:
        own_server.start()

    wait_until("ticks resume", lambda: health(web)[0] == 200 and health(web)[1]["tick"] > stalled_at,
               proc, log)
    second = cli("pause", "--gpu", "2", "--why", "psu", "--host-name", "demo", "--config", str(cfg))
    assert second.returncode == 0, second
    wait_until("a toggle after the restart is applied", lambda: paused(web, 2), proc, log)
    assert paused(web, 1)
    with psycopg.connect(libpq_url(url)) as conn:
        toggles = conn.execute("SELECT target, who, why FROM toggles ORDER BY target").fetchall()
        events = [r[0] for r in conn.execute("SELECT subject FROM events WHERE kind = 'pause'").fetchall()]
    assert [t[0] for t in toggles] == ["gpu:1", "gpu:2"] and toggles[0][2] == "fan"
    assert {"gpu:1", "gpu:2"} <= set(events)
    text = log.read_text()
    assert text.count("failed, retrying") == 1, text[-3000:]  # logged once while it lasted
    assert "ticks work again" in text


def test_ten_serves_starting_at_once_on_an_empty_postgres_store_all_come_up(
        own_server: PostgresServer, tmp_path: Path, spawned: list[subprocess.Popen[bytes]]) -> None:
    url = own_server.create_database("serve_ten")
    cfg = config(tmp_path, url)
    serves = [start_serve(tmp_path, cfg, f"serve{i}") for i in range(10)]
    spawned.extend(proc for proc, _, _ in serves)
    for proc, web, log in serves:
        wait_until(f"{web} healthy", lambda web=web: health(web)[0] == 200, proc, log, timeout_s=300)
    with psycopg.connect(libpq_url(url)) as conn:
        versions = conn.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()
    assert [v[0] for v in versions] == list(range(1, len(versions) + 1))


def test_an_unreachable_store_is_one_line_for_pause_user_list_and_serve(tmp_path: Path) -> None:
    cfg = config(tmp_path, f"postgresql+psycopg://runnerctl:s3cret@127.0.0.1:{free_port()}/controller")
    for args in (["pause", "--gpu", "0"], ["user", "list"],
                 ["serve", "--gitlab", "sim", "--gpu-source", "sim:2", "--listen", f"127.0.0.1:{free_port()}",
                  "--state-dir", str(tmp_path / "serve")]):
        done = cli(*args, "--config", str(cfg))
        assert done.returncode == 6, (args, done)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, (args, done.stderr)
        assert done.stderr.startswith("runnerctl: error: the controller store postgresql://127.0.0.1:"), done
        assert "s3cret" not in done.stderr
