"""Following the README with real processes: `runnerctl sim gitlab`, `runnerctl init
--group G`, `runnerctl serve --gitlab URL`, no project list anywhere: a gpus:8 job
pushed to a project of the group is seen and a block drains for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from runnerctl.cli import main
from tests.conftest import token_file
from tests.pg import free_port

RUNNERCTL = [sys.executable, "-m", "runnerctl"]


def _start(tmp_path: Path, spawned: list[subprocess.Popen[bytes]],
           *serve: str) -> tuple[dict[str, Any], str]:
    """`runnerctl sim gitlab`, `init --group G`, `serve`: (the sim's JSON line, serve's URL)."""
    gitlab = subprocess.Popen([*RUNNERCTL, "sim", "gitlab"], stdout=subprocess.PIPE)
    spawned.append(gitlab)
    assert gitlab.stdout is not None
    info = json.loads(gitlab.stdout.readline())
    settings = tmp_path / "runnerctl.toml"
    settings.write_text(f'[host]\nname = "e2e"\ngpu_source = "sim:8"\n'
                        f'[paths]\nstate_dir = "{tmp_path}/state"\n'
                        f'runner_config = "{tmp_path}/config.toml"\n')
    env = {**os.environ, "RUNNERCTL_CONFIG": str(settings), "RUNNERCTL_GITLAB_TOKEN": info["admin_token"]}
    token = token_file(tmp_path, info["admin_token"])
    assert main(["init", "--gitlab-url", info["url"], "--token-file", token, "--group",
                 str(info["group_id"]), "--config", str(settings)]) == 0
    serve_url = f"http://127.0.0.1:{free_port()}"
    spawned.append(subprocess.Popen([*RUNNERCTL, "serve", "--gitlab", info["url"], "--listen",
                                     serve_url.removeprefix("http://"), "--interval", "1", *serve], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return info, serve_url


def _enqueue(info: dict[str, Any], project: int, tags: list[str]) -> int:
    answer = httpx.post(f"{info['url']}/-/sim/jobs", json={"project_id": project, "tags": tags,
                                                          "duration_s": 5, "user": "alice"})
    return int(answer.json()["id"])


def _state_until(serve_url: str, done: Callable[[dict[str, Any]], bool], timeout_s: float) -> dict[str, Any]:
    """serve's /api/state once `done` holds, or the last one seen at the deadline."""
    deadline, state = time.monotonic() + timeout_s, {"demand": [], "drains": {}}
    while time.monotonic() < deadline:
        try:
            state = httpx.get(f"{serve_url}/api/state", timeout=2).json()
        except httpx.HTTPError:  # not listening yet
            time.sleep(0.2)
            continue
        if done(state):
            break
        time.sleep(0.2)
    return state


def test_init_group_then_serve_sees_a_gpus_8_job_in_the_group(tmp_path: Path,
                                                              spawned: list[subprocess.Popen[bytes]]) -> None:
    info, serve_url = _start(tmp_path, spawned)
    project = info["project_ids"][-1]
    job = _enqueue(info, project, ["gpus:8"])
    state = _state_until(serve_url, lambda s: bool(s["drains"]), 60)
    assert [(d["job_id"], d["gpus"], d["project_id"]) for d in state["demand"]] == [(job, 8, project)]
    assert state["drains"] == {"runnerctl/e2e/gpu0-7": job}


def test_a_job_webhook_makes_a_job_seen_within_seconds(tmp_path: Path,
                                                       spawned: list[subprocess.Popen[bytes]]) -> None:
    """GitLab's job event (sent by the simulated GitLab's project hook, with GitLab's
    payload: no job tags) makes serve read the job at once, while its polls have become
    a safety net of one a project per 5 minutes."""
    info, serve_url = _start(tmp_path, spawned, "--webhook-secret", "hook-secret")
    project = info["project_ids"][0]
    _state_until(serve_url, lambda s: s["tick"] > 0, 60)
    hook = httpx.post(f"{info['url']}/api/v4/projects/{project}/hooks",
                      headers={"PRIVATE-TOKEN": info["admin_token"]},
                      json={"url": f"{serve_url}/webhooks/gitlab", "token": "hook-secret",
                            "job_events": True})
    assert hook.status_code == 201, hook.text
    first = _enqueue(info, project, ["gpus:2"])  # its event makes webhooks fresh: polling slows down
    seen = _state_until(serve_url, lambda s: first in {d["job_id"] for d in s["demand"]}, 30)
    assert first in {d["job_id"] for d in seen["demand"]}
    second = _enqueue(info, project, ["gpus:4"])
    state = _state_until(serve_url, lambda s: second in {d["job_id"] for d in s["demand"]}, 120)
    assert second in {d["job_id"] for d in state["demand"]}  # the project's next poll is 300 s away
