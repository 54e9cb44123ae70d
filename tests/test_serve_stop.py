"""How `runnerctl serve` stops: systemd's SIGTERM ends the loop and closes the store."""

from __future__ import annotations

import re
import shutil
import signal
from pathlib import Path

import pytest

from runnerctl.cli import main
from tests.e2e_fleet import wait_for
from tests.serve_proc import Serve


def test_sigterm_stops_the_loop_closes_the_store_and_exits_0(tmp_path: Path) -> None:
    state = tmp_path / "state"
    serve = Serve(tmp_path, "--state-dir", str(state))
    assert (state / "controller.sqlite-wal").exists()  # written while serving
    serve.proc.send_signal(signal.SIGTERM)  # `systemctl stop runnerctl-serve`
    code = serve.proc.wait(timeout=60)
    serve.log.close()
    assert code == 0, serve.output()  # was -15: uvicorn raised SIGTERM again, before serve's clean-up
    assert "runnerctl serve: stopped (SIGTERM)" in serve.output()
    assert not (state / "controller.sqlite-wal").exists()  # the store's last close moved it into the file


def test_sighup_stops_it_cleanly_saying_so_and_sigusr1_is_ignored(tmp_path: Path) -> None:
    """A closed terminal (SIGHUP) and a stray SIGUSR1 killed serve without a log line (found
    by a review as an operator sending signals)."""
    state = tmp_path / "state"
    serve = Serve(tmp_path, "--state-dir", str(state))
    serve.proc.send_signal(signal.SIGUSR1)
    wait_for("serve to say it ignored SIGUSR1", lambda: "SIGUSR1 ignored" in serve.output(), timeout=60)
    assert serve.proc.poll() is None
    serve.proc.send_signal(signal.SIGHUP)
    code = serve.proc.wait(timeout=60)
    serve.log.close()
    assert code == 0, serve.output()
    assert "runnerctl serve: stopped (SIGHUP); it has no reload" in serve.output()
    assert not (state / "controller.sqlite-wal").exists()


def test_port_0_is_announced_as_the_port_it_got(tmp_path: Path) -> None:
    """`--listen 127.0.0.1:0` announced `http://127.0.0.1:0/`, where no page answers (found by
    a review as an operator reading the log)."""
    serve = Serve(tmp_path, "--state-dir", str(tmp_path / "state"), port=0)
    try:
        assert serve.port > 0
        assert f"runnerctl serve: http://127.0.0.1:{serve.port}/ (page)" in serve.output()
    finally:
        serve.stop()


def test_a_state_dir_deleted_under_serve_stops_it_saying_why(tmp_path: Path) -> None:
    """`rm -rf` of the state directory while serve ran: it went on with a store and leases
    nobody else saw, /healthz said ok, and a second serve could lock the new directory
    beside it (found by a review as a disaster-recovery engineer). It now stops, exit 3."""
    state = tmp_path / "state"
    serve = Serve(tmp_path, "--state-dir", str(state))
    shutil.rmtree(state)
    try:
        code = serve.proc.wait(timeout=60)
    finally:
        if serve.proc.poll() is None:
            serve.proc.kill()
        serve.log.close()
    assert code == 3, serve.output()
    assert f"the state directory {state} was deleted while serve ran: stopping serve" in serve.output()
    assert f"runnerctl: error: the state directory {state} was deleted while serve ran: serve stopped" \
        in serve.output()


def test_the_demo_announces_the_port_it_listens_on(capsys: pytest.CaptureFixture[str]) -> None:
    """`demo --listen 127.0.0.1:0` printed `http://127.0.0.1:0/`, where no page answers."""
    assert main(["demo", "--duration", "0", "--listen", "127.0.0.1:0"]) == 0
    announced = re.search(r"web page: http://127\.0\.0\.1:(\d+)/", capsys.readouterr().out)
    assert announced is not None and int(announced.group(1)) > 0


def test_a_name_of_two_addresses_is_listened_on_at_both_on_one_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--listen localhost:8080` where localhost is ::1 and 127.0.0.1 (/etc/hosts on Debian
    lists both): serve bound the first only, and Prometheus's 127.0.0.1:8080 was refused
    (found by the final review of the session). Both are bound, on the port the first got."""
    import socket

    from runnerctl.controller.serve import bound_address, listening_sockets

    both = [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", 0, 0, 0)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0))]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: both)
    socks = listening_sockets("localhost", 0)
    try:
        assert sorted(s.getsockname()[0] for s in socks) == ["127.0.0.1", "::1"]
        port = socks[0].getsockname()[1]
        assert port > 0 and all(s.getsockname()[1] == port for s in socks)
        assert bound_address("localhost", socks) == f"localhost:{port}"
    finally:
        for sock in socks:
            sock.close()
