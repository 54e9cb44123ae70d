"""How `runnerctl serve` stops: systemd's SIGTERM ends the loop and closes the store."""

from __future__ import annotations

import signal
from pathlib import Path

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
