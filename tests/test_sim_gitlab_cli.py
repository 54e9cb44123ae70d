"""`runnerctl sim gitlab` as its own process: one JSON line, a GitLab that answers, a clean stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx


def test_sim_gitlab_prints_its_line_serves_and_stops_on_sigterm() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "runnerctl", "sim", "gitlab", "--listen", "127.0.0.1:0",
                             "--drop-interval", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        assert {"url", "admin_token", "group_id", "project_ids"} <= set(info)
        assert len(info["project_ids"]) == 2
        headers = {"PRIVATE-TOKEN": info["admin_token"]}
        me = httpx.get(info["url"] + "/api/v4/personal_access_tokens/self", headers=headers).json()
        assert me["scopes"] == ["api"]
        projects = httpx.get(f"{info['url']}/api/v4/groups/{info['group_id']}/projects",
                             headers=headers).json()
        assert sorted(p["id"] for p in projects) == sorted(info["project_ids"])
        health = httpx.get(info["url"] + "/-/sim/health").json()
        assert health["ok"] and health["drop_timer_alive"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sim_gitlab_bad_listen_is_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "runnerctl", "sim", "gitlab", "--listen", "nope"],
                          check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "--listen" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_sim_gitlab_verify_skips_contact_is_gitlab_16s_verify() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "runnerctl", "sim", "gitlab", "--listen", "127.0.0.1:0",
                             "--verify-skips-contact"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        api = httpx.Client(base_url=info["url"] + "/api/v4", headers={"PRIVATE-TOKEN": info["admin_token"]})
        made = api.post("/user/runners", json={"runner_type": "group_type", "group_id": info["group_id"]})
        runner = made.json()
        verify = httpx.post(info["url"] + "/api/v4/runners/verify",
                            json={"token": runner["token"], "system_id": "s_a"})
        assert verify.status_code == 200
        assert api.get(f"/runners/{runner['id']}").json()["status"] == "never_contacted"
        api.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
