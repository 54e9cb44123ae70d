"""One GPU host end to end, as README.md sets it up, every part its own process.

`runnerctl sim gitlab`; `runnerctl init --gitlab-url URL --group G` with the token in
RUNNERCTL_GITLAB_TOKEN (custom executor, shell driver, 8 simulated GPUs, settings and
config.toml in a temp dir through RUNNERCTL_CONFIG); `runnerctl sim runner
--runner-config ...`; `runnerctl serve --gitlab URL`. Jobs of 1, 2, 4 and 8 GPUs in both
projects of the group all end `success`, none is dropped, and each held exactly as many
GPUs as it asked for while no GPU was leased twice. A multi-GPU job still pending more
than an hour behind a drain is not dropped by GitLab's stuck-jobs rule.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.e2e_fleet import FINAL, Host, LeaseWatch, SimGitLab, all_final, wait_for

SIZES = (1, 2, 4, 8)


def _runner_count(gitlab: SimGitLab) -> int:
    return len(gitlab.request("GET", "/api/v4/runners/all?per_page=100"))


def test_init_names_the_missing_scope_before_creating_anything(
        tmp_path: Path, spawned: list[subprocess.Popen[bytes]]) -> None:
    gitlab = SimGitLab(spawned)
    host = Host("gpu-a", tmp_path / "gpu-a", gitlab)
    refused = host.init(token=gitlab.token_with(["create_runner"]))
    assert refused.returncode != 0
    assert "api" in refused.stderr and "scope" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) <= 2
    assert _runner_count(gitlab) == 0
    assert not host.runner_config.exists()

    done = host.init(token=gitlab.token_with(["api"]))
    assert done.returncode == 0, done.stderr
    assert _runner_count(gitlab) > 8  # 8 singles, the blocks and the stand-by


def test_jobs_of_every_size_in_both_projects_succeed(tmp_path: Path,
                                                     spawned: list[subprocess.Popen[bytes]]) -> None:
    gitlab = SimGitLab(spawned)
    host = Host("gpu-a", tmp_path / "gpu-a", gitlab)
    done = host.init()
    assert done.returncode == 0, done.stderr
    host.start_runner(spawned)
    host.start_serve(spawned)
    wait_for("serve's /healthz", host.healthy, timeout=120)

    projects = gitlab.info["project_ids"]
    with LeaseWatch([host]) as leases:
        jobs = {(project, gitlab.enqueue(project, [f"gpus:{n}"], duration_s=1.5, user=f"user{n}")): n
                for project in projects for n in SIZES}
        final = wait_for("every job to end", lambda: all_final(gitlab, jobs), timeout=300)
    statuses = {job: (info["status"], info.get("failure_reason")) for job, info in final.items()}
    assert all(status == "success" for status, _ in statuses.values()), (statuses, host.logs())
    held = leases.gpus_of_jobs()
    for (_, job_id), gpus in jobs.items():
        assert len(held.get(str(job_id), set())) == gpus, (job_id, held.get(str(job_id)))
    for sample in leases.samples:  # one job per GPU at every instant, by construction of the files
        assert len(sample) <= 8


def test_a_multi_gpu_job_waiting_over_an_hour_behind_a_drain_is_not_dropped(
        tmp_path: Path, spawned: list[subprocess.Popen[bytes]]) -> None:
    gitlab = SimGitLab(spawned)
    host = Host("gpu-a", tmp_path / "gpu-a", gitlab)
    assert host.init().returncode == 0
    host.start_runner(spawned)
    host.start_serve(spawned)
    wait_for("serve's /healthz", host.healthy, timeout=120)
    project = gitlab.info["project_ids"][0]

    long_job = gitlab.enqueue(project, ["gpu"], duration_s=600, user="alice")
    wait_for("the 1-GPU job to run", lambda: gitlab.job(project, long_job)["status"] == "running")
    big = gitlab.enqueue(project, ["gpus:8"], duration_s=1, user="bob")
    wait_for("the host to drain for the 8-GPU job",
             lambda: big in ((host.get("/api/state") or {}).get("drains") or {}).values())
    gitlab.request("POST", "/-/sim/clock", {"advance_s": 3900})  # 65 minutes later
    gitlab.request("POST", "/-/sim/drop")  # GitLab's StuckBuildsDropWorker runs
    assert gitlab.job(project, big)["status"] == "pending", host.logs()

    gitlab.request("POST", f"/api/v4/projects/{project}/jobs/{long_job}/cancel")
    wait_for("the 8-GPU job to succeed", lambda: gitlab.job(project, big)["status"] in FINAL, timeout=240)
    assert gitlab.job(project, big)["status"] == "success", host.logs()

