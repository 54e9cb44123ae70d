"""What serve, the exporter and the web page write to their log, as an SRE reads it in
journald (found by a review as an SRE reading the logs for a week): priorities journald
understands, the controller's decisions, no password, the cause named right, and a
condition that lasts said once, not at every tick or scrape."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from runnerctl.controller.app import create_app
from runnerctl.controller.liveness import Liveness
from runnerctl.controller.serve import log_event
from runnerctl.controller.store import Event, StoreError
from runnerctl.errors import TemporaryError
from runnerctl.exporter import build_registry
from runnerctl.exporter.scrape import ALL_PARTS
from runnerctl.gitlab import PythonGitLab
from runnerctl.logline import OneLineFormatter
from runnerctl.settings import ControllerSettings
from runnerctl.sim.world import build_world
from tests.pg import free_port

ROOT = Path(__file__).resolve().parents[1]


def test_under_systemd_each_line_carries_its_syslog_priority(tmp_path: Path) -> None:
    """Every line went to journald at priority info: `journalctl -p err` showed no failed
    tick. systemd gives a service JOURNAL_STREAM, the device and inode of its stderr."""
    script = ("import logging, sys\nfrom runnerctl.logline import configure\n"
              "configure(logging.INFO, 'runnerctl: %(levelname)s %(name)s: %(message)s')\n"
              "log = logging.getLogger('x')\nlog.info('fine')\nlog.warning('odd')\n"
              "try:\n    1 / 0\nexcept ZeroDivisionError:\n    log.exception('broke')\n")
    err = tmp_path / "stderr"
    for journal in (True, False):
        with err.open("w") as handle:
            found = os.fstat(handle.fileno())
            env = {**os.environ, "PYTHONPATH": str(ROOT),
                   "JOURNAL_STREAM": f"{found.st_dev}:{found.st_ino}" if journal else ""}
            subprocess.run([sys.executable, "-c", script], stderr=handle, env=env, check=True, timeout=60)
        lines = err.read_text().splitlines()
        if journal:
            assert lines[0] == "<6>runnerctl: INFO x: fine" and lines[1] == "<4>runnerctl: WARNING x: odd"
            assert lines[2] == "<3>runnerctl: ERROR x: broke"
            assert all(line.startswith("<3>") for line in lines[3:]) and "ZeroDivisionError" in lines[-1]
        else:  # a terminal, a pipe, a file: as before
            assert lines[0] == "runnerctl: INFO x: fine" and not any(line.startswith("<") for line in lines)
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "a\nforged line", None, None)
    assert OneLineFormatter("%(message)s", journal=True).format(record) == "<4>a\\nforged line"


def test_a_command_that_cannot_start_says_why_at_priority_err_under_systemd(tmp_path: Path) -> None:
    """serve's reason for not starting (no token, a store it cannot reach) went to journald
    at priority info: `journalctl -p err`, as docs/operations.md says to read, showed
    nothing while it restarted every few seconds (found by a review as an on-call engineer)."""
    err = tmp_path / "stderr"
    for journal in (True, False):
        with err.open("w") as handle:
            found = os.fstat(handle.fileno())
            env = {**os.environ, "PYTHONPATH": str(ROOT), "RUNNERCTL_GITLAB_TOKEN": "",
                   "JOURNAL_STREAM": f"{found.st_dev}:{found.st_ino}" if journal else ""}
            subprocess.run([sys.executable, "-m", "runnerctl", "serve", "--gitlab", "https://gitlab.example",
                            "--gpu-source", "sim:2", "--state-dir", str(tmp_path / "state")],
                           stderr=handle, env=env, check=False, timeout=60)
        said = err.read_text()
        assert said.startswith("<3>runnerctl: error: " if journal else "runnerctl: error: "), said
        assert "token" in said


def test_a_password_in_the_gitlab_url_stays_out_of_messages() -> None:
    url = f"http://admin:s3cretpw@127.0.0.1:{free_port()}"
    with pytest.raises(TemporaryError) as caught:
        PythonGitLab(url, "glpat-x", timeout=2.0).token_user()
    assert "admin:***@127.0.0.1" in str(caught.value) and "s3cretpw" not in str(caught.value)
    assert "check the GitLab URL" in str(caught.value.hint)  # serve's flag is --gitlab, init's --gitlab-url


def test_the_controllers_decisions_reach_its_log(caplog: pytest.LogCaptureFixture) -> None:
    """They were only in the store: a GPU closed for foreign use, a job reaped."""
    with caplog.at_level(logging.INFO, logger="runnerctl.controller.serve"):
        log_event(Event(1.0, "gpu-a", "gate-close", "gpu5", "foreign process 4242 (alice, python train.py)"))
        log_event(Event(1.0, "gpu-a", "resume", "runnerctl/gpu-a/gpu0-3", "open for job 1000"))
        log_event(Event(1.0, "gpu-a", "pause-failed", "runnerctl/gpu-a/gpu1", "GitLab answered 500"))
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "gate-close gpu5: foreign process 4242 (alice, python train.py)"),
        (logging.INFO, "resume runnerctl/gpu-a/gpu0-3: open for job 1000"),
        (logging.WARNING, "pause-failed runnerctl/gpu-a/gpu1: GitLab answered 500")]


def test_a_webhook_refused_says_why_and_whence_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Without a secret on serve, every webhook said "missing or wrong X-Gitlab-Token"
    although GitLab sent the right one, once per job event, naming no client."""
    world = build_world(tmp_path)  # no webhook secret
    try:
        demand = world.controller.demand
        client = TestClient(create_app(lambda: world.controller.view, demand.webhook,
                                       webhook_refusal=demand.refusal))
        with caplog.at_level(logging.WARNING):
            for _ in range(5):
                answer = client.post("/webhooks/gitlab", json={}, headers={"X-Gitlab-Token": "t"})
                assert answer.status_code == 401
        said = [r.getMessage() for r in caplog.records if "webhook from" in r.getMessage()]
        assert len(said) == 1 and "refused: serve has no webhook secret (--webhook-secret" in said[0], said
        assert "testclient" in said[0]
        demand.secret = "s3cret"
        assert "a wrong X-Gitlab-Token" in demand.refusal("t") and "no X-Gitlab-Token" in demand.refusal(None)
        assert demand.refusal("s3cret") == ""
    finally:
        world.close()


def test_a_store_failure_is_one_line_and_a_bug_keeps_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """A locked store logged a 20-line traceback each time it came back."""
    live = Liveness(host="gpu-a", interval_s=5.0)
    with caplog.at_level(logging.ERROR):
        live.failed(StoreError("the controller store is busy: database is locked"), 57)
        live.failed(KeyError("a bug"), 58)
    busy, bug = caplog.records
    assert busy.exc_info is None and "database is locked" in busy.getMessage()
    assert bug.exc_info is not None


def test_a_failing_collector_is_logged_once_while_it_fails(tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """It logged a traceback at every scrape: about 2,000 lines an hour at 15 s."""
    from prometheus_client import generate_latest

    world = build_world(tmp_path)
    broken = {"yes": True}

    def flaky(stats: object) -> list[object]:
        if broken["yes"]:
            raise KeyError("a bug in a collector")
        return []

    try:
        world.advance(6)
        registry = build_registry(lambda: world.controller.stats.view, {**ALL_PARTS, "flaky": flaky})
        with caplog.at_level(logging.WARNING):
            for _ in range(4):
                generate_latest(registry)
            broken["yes"] = False
            generate_latest(registry)
        said = [r.getMessage() for r in caplog.records if "flaky" in r.getMessage()]
        assert len(said) == 2 and "logged once" in said[0] and said[1] == "collector flaky works again", said
    finally:
        world.close()


def test_none_of_the_runners_in_gitlab_is_said_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """It was said again at every retry, once a minute, while the fifteen per-runner lines
    were said once."""
    world = build_world(tmp_path, settings=ControllerSettings())  # no projects set: found from the runners
    try:
        for runner_id in list(world.state.runners):
            world.state.delete_runner(runner_id)
        with caplog.at_level(logging.WARNING):
            world.advance(600, step=5.0)
        said = [r for r in caplog.records if "none of this host's runners is in GitLab" in r.getMessage()]
        assert len(said) == 1
    finally:
        world.close()
