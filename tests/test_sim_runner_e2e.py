"""End to end with real processes: `runnerctl sim gitlab`, a config.toml with custom runners
of runnerctl's own executor (shell driver, simulated GPUs), `runnerctl sim runner`.

Runners are created through GitLab's `POST /api/v4/user/runners`, jobs enqueued through
the simulated GitLab's test hook, and read back with `GET /api/v4/projects/:id/jobs/:id`.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runnerctl.executors.lease import LeaseTable
from tests.harness_custom_executor import write_runner_config
from tests.sim_runner_process import RunnerProcess


class GitLabProcess:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "runnerctl", "sim", "gitlab", "--listen",
                                      "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.info: dict[str, Any] = json.loads(self.proc.stdout.readline())
        self.url = str(self.info["url"])

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        url = self.url + ("" if path.startswith("/-/") else "/api/v4") + path
        request = urllib.request.Request(url, method=method, data=json.dumps(body or {}).encode(), headers={
            "PRIVATE-TOKEN": self.info["admin_token"], "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
        return json.loads(raw) if raw else None

    def job(self, project_id: int, job_id: int) -> dict[str, Any]:
        return dict(self.call("GET", f"/projects/{project_id}/jobs/{job_id}"))

    def wait(self, project_id: int, job_id: int, statuses: tuple[str, ...],
             timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        job = self.job(project_id, job_id)
        while job["status"] not in statuses and time.monotonic() < deadline:
            time.sleep(0.2)
            job = self.job(project_id, job_id)
        assert job["status"] in statuses, job
        return job

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def gitlab() -> Iterator[GitLabProcess]:
    server = GitLabProcess()
    yield server
    server.stop()


def _runner(gitlab: GitLabProcess, tag: str) -> str:
    created = gitlab.call("POST", "/user/runners", {"runner_type": "group_type",
                                                    "group_id": gitlab.info["group_id"],
                                                    "tag_list": tag, "description": f"sim {tag}"})
    return str(created["token"])


def test_jobs_succeed_fail_and_cancel_through_real_processes(gitlab: GitLabProcess, tmp_path: Path) -> None:
    good, broken = _runner(gitlab, "gpus:1"), _runner(gitlab, "broken")
    config = write_runner_config(tmp_path, gitlab.url, [
        {"token": good, "limit": 1},
        {"token": broken, "pre_build_script": json.dumps("echo failing on purpose; exit 3")}])
    first, second = gitlab.info["project_ids"]
    runner = RunnerProcess(config)
    try:
        ok = gitlab.call("POST", "/-/sim/jobs", {"project_id": first, "tags": ["gpus:1"], "duration_s": 1,
                                                 "user": "alice"})["id"]
        bad = gitlab.call("POST", "/-/sim/jobs", {"project_id": second, "tags": ["broken"], "duration_s": 1,
                                                  "user": "bob"})["id"]
        long = gitlab.call("POST", "/-/sim/jobs", {"project_id": second, "tags": ["gpus:1"],
                                                   "duration_s": 300, "after_script_s": 10,
                                                   "user": "carol"})["id"]
        done = gitlab.wait(first, ok, ("success", "failed", "canceled"), 120)
        assert done["status"] == "success", (done, runner.stderr)
        failed = gitlab.wait(second, bad, ("success", "failed", "canceled"), 120)
        assert (failed["status"], failed["failure_reason"]) == ("failed", "script_failure"), runner.stderr
        assert failed["runner"]["description"] == "sim broken"

        gitlab.wait(second, long, ("running",), 60)
        runner.wait_line(rf"job {long} started")
        assert gitlab.call("POST", f"/projects/{second}/jobs/{long}/cancel")["status"] == "canceling"
        runner.wait_line(rf"job {long}: GitLab asks to cancel it", timeout_s=90)  # touched every 30 s
        still = gitlab.job(second, long)["status"]
        canceled = gitlab.wait(second, long, ("canceled", "failed", "success"), 60)
        assert canceled["status"] == "canceled"
        assert still == "canceling"  # while after_script (10 s: read well inside it) and cleanup run
        assert runner.stop(signal.SIGQUIT) == 0
    finally:
        runner.kill()
    assert LeaseTable(tmp_path / "host" / "state").all() == []  # cleanup released every GPU
    for job_id in (ok, bad, long):
        assert f"job {job_id} ended" in runner.stderr


def test_bad_runner_config_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    argv = [sys.executable, "-m", "runnerctl", "sim", "runner", "--runner-config", str(config)]
    config.write_text('concurrent = 1\n[[runners]]\nname = "x"\nurl = "http://127.0.0.1:9"\n'
                      'token = "glrt-x"\nexecutor = "shell"\n')
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert proc.stderr.strip().splitlines() == [
        f"runnerctl: error: {config}: runner 'x' uses executor 'shell'; "
        "runnerctl sim runner drives only the custom executor"]
    config.write_text("concurrent = [")
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and len(proc.stderr.strip().splitlines()) == 1
    assert "is not valid TOML" in proc.stderr

