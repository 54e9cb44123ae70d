"""The slurm driver against the real single-node Slurm that .ci/setup/slurm.sh starts."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from runnerctl.executors.lease import LeaseTable
from tests.harness_custom_executor import BUILD_FAILURE, FakeJob, Harness, harness_for, make_host


@pytest.fixture(scope="module", autouse=True)
def slurm() -> None:
    result = subprocess.run(["sinfo", "-h", "-o", "%T %G"], capture_output=True, text=True,
                            timeout=30, check=False)
    assert result.returncode == 0 and "gpu:8" in result.stdout, result.stderr  # no skip


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return make_host(tmp_path)


def _harness(host: Path, gpus: tuple[int, ...]) -> Harness:
    return harness_for(host, gpus, "slurm")


def _slurm_jobs(name: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i %T"], capture_output=True,
                         text=True, check=False).stdout
    return out.split()


def test_two_gpu_job_runs_under_slurm_with_two_gpus(host: Path) -> None:
    harness = _harness(host, (2, 3))
    job = FakeJob(id=801, variables={"CUDA_VISIBLE_DEVICES": "0,1,2,3",
                                     "SCHEDULER_PARAMETERS": "--time=10 --nodes=1"})
    results = harness.run_job(job, 'echo "cuda=$CUDA_VISIBLE_DEVICES job=$SLURM_JOB_ID"; '
                                   'srun printenv SLURM_STEP_ID')
    build = results["build_script"]
    assert build.code == 0, build.output
    line = next(x for x in build.output.splitlines() if x.startswith("cuda="))
    gpus = line.split()[0].removeprefix("cuda=").split(",")
    assert len(gpus) == 2 and all(g.isdigit() for g in gpus)  # Slurm's allocation, not the job's
    assert "job=" in line and line.split("job=")[1].strip()
    assert "Slurm job" in build.output
    assert results["cleanup"].code == 0 and LeaseTable(host / "state").all() == []


def test_failing_script_fails_the_job_with_its_code(host: Path) -> None:
    harness = _harness(host, (0,))
    results = harness.run_job(FakeJob(id=802), "echo before; exit 5")
    assert results["build_script"].code == BUILD_FAILURE
    assert "before" in results["build_script"].output
    assert (harness.workdir / "exit-802").read_text().strip() == "5"


def test_cancel_from_gitlab_cancels_the_slurm_job(host: Path) -> None:
    harness = _harness(host, (4, 5))
    job = FakeJob(id=803)
    assert harness.stage("prepare", job).code == 0
    driver = harness.start("run", job, str(harness.script(job, "build_script", "sleep 300")),
                           "build_script")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "RUNNING" not in _slurm_jobs("runnerctl-803"):
        time.sleep(0.2)
    assert "RUNNING" in _slurm_jobs("runnerctl-803")
    cancelled_at = time.monotonic()
    driver.send_signal(signal.SIGTERM)  # what gitlab-runner does when the job is cancelled
    driver.communicate(timeout=30)
    while time.monotonic() - cancelled_at < 10 and _slurm_jobs("runnerctl-803"):
        time.sleep(0.2)
    assert _slurm_jobs("runnerctl-803") == []
    assert time.monotonic() - cancelled_at < 10
    assert driver.returncode == BUILD_FAILURE
    harness.stage("cleanup", job)


def test_driver_killed_then_cleanup_leaves_no_slurm_job(host: Path) -> None:
    harness = _harness(host, (6,))
    job = FakeJob(id=804)
    assert harness.stage("prepare", job).code == 0
    driver = harness.start("run", job, str(harness.script(job, "build_script", "sleep 300")),
                           "build_script")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not _slurm_jobs("runnerctl-804"):
        time.sleep(0.2)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    assert _slurm_jobs("runnerctl-804")  # the driver's death cancels nothing by itself
    assert harness.stage("cleanup", job).code == 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _slurm_jobs("runnerctl-804"):
        time.sleep(0.2)
    assert _slurm_jobs("runnerctl-804") == [] and LeaseTable(host / "state").all() == []
