"""Following the README with real processes: `runnerctl sim gitlab`, `runnerctl init
--group G`, `runnerctl serve --gitlab URL`, no project list anywhere: a gpus:8 job
pushed to a project of the group is seen and a block drains for it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from runnerctl.cli import main


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_init_group_then_serve_sees_a_gpus_8_job_in_the_group(tmp_path: Path,
                                                              spawned: list[subprocess.Popen[bytes]]) -> None:
    runnerctl = [sys.executable, "-m", "runnerctl"]
    gitlab = subprocess.Popen([*runnerctl, "sim", "gitlab"], stdout=subprocess.PIPE)
    spawned.append(gitlab)
    assert gitlab.stdout is not None
    info = json.loads(gitlab.stdout.readline())
    settings = tmp_path / "runnerctl.toml"
    settings.write_text(f'[host]\nname = "e2e"\ngpu_source = "sim:8"\n'
                        f'[paths]\nstate_dir = "{tmp_path}/state"\n'
                        f'runner_config = "{tmp_path}/config.toml"\n')
    env = {**os.environ, "RUNNERCTL_CONFIG": str(settings), "RUNNERCTL_GITLAB_TOKEN": info["admin_token"]}
    assert main(["init", "--gitlab-url", info["url"], "--token", info["admin_token"], "--group",
                 str(info["group_id"]), "--config", str(settings)]) == 0
    project = info["project_ids"][-1]
    job = httpx.post(f"{info['url']}/-/sim/jobs", json={"project_id": project, "tags": ["gpus:8"],
                                                         "duration_s": 5, "user": "alice"}).json()["id"]
    port = _free_port()
    spawned.append(subprocess.Popen([*runnerctl, "serve", "--gitlab", info["url"], "--listen",
                                     f"127.0.0.1:{port}", "--interval", "1"], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    deadline, state = time.monotonic() + 60, {"demand": [], "drains": {}}
    while time.monotonic() < deadline:
        try:
            state = httpx.get(f"http://127.0.0.1:{port}/api/state", timeout=2).json()
        except httpx.HTTPError:  # not listening yet
            continue
        if state["drains"]:
            break
        time.sleep(0.2)
    assert [(d["job_id"], d["gpus"], d["project_id"]) for d in state["demand"]] == [(job, 8, project)]
    assert state["drains"] == {"runnerctl/e2e/gpu0-7": job}
