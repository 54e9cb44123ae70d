"""The batch drivers' acceptance, the same for every scheduler (issue 18).

Each check drives the custom-executor stages as gitlab-runner does
(tests/harness_custom_executor.py) against one batch system, described by a `Cluster`:
how to find the batch jobs of a label (the name the driver gives them), how an
administrator deletes one, and a command that prints the job's time limit from inside.
The test modules (test_executor_slurm.py, _sge, _pbs, _pjm) call these with their cluster.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from runnerctl.executors.lease import LeaseTable
from tests.harness_custom_executor import BUILD_FAILURE, SYSTEM_FAILURE, FakeJob, Harness, harness_for

WAIT_S = 120.0
"""How long a state may take to come on a loaded machine; well under the 300 s the sleepers sleep,
so a job gone within it was cancelled, not finished."""


@dataclasses.dataclass(frozen=True)
class Cluster:
    driver: str
    jobs: Callable[[str], list[str]]  # label -> ids of its pending or running batch jobs
    admin_delete: Callable[[str], None]  # what an administrator does to a job (scancel, qdel)
    limit_probe: str  # bash run inside the job that prints its time limit
    limit_seen: str  # what limit_probe prints for a 120 s limit
    title: str  # as the driver names it in messages
    node_gpus: int = 8  # the most GPUs one node has


def harness(host: Path, cluster: Cluster, gpus: tuple[int, ...]) -> Harness:
    return harness_for(host, gpus, cluster.driver)


def label(host: Path, job: FakeJob) -> str:
    leases = LeaseTable(host / "state").held_by(str(job.id))
    assert leases, f"job {job.id} holds no lease"
    return f"runnerctl-{job.id}-{leases[0].nonce}"


def wait_until(what: str, check: Callable[[], bool], timeout: float = WAIT_S) -> float:
    """Poll `check` until it holds; returns the seconds it took."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
        time.sleep(0.2)
    return time.monotonic() - started


def start_sleeper(host: Path, cluster: Cluster, job: FakeJob, gpus: tuple[int, ...]
                  ) -> tuple[Harness, subprocess.Popen[str], str]:
    """prepare, then a run stage whose batch job sleeps; returns once the job is queued."""
    h = harness(host, cluster, gpus)
    prepared = h.stage("prepare", job)
    assert prepared.code == 0, prepared.output
    body = 'echo "cuda=$CUDA_VISIBLE_DEVICES"; sleep 300'
    driver = h.start("run", job, str(h.script(job, "build_script", body)), "build_script")
    name = label(host, job)
    wait_until(f"{cluster.title} job {name}", lambda: bool(cluster.jobs(name)))
    return h, driver, name


def exit_code_is_a_build_failure(host: Path, cluster: Cluster) -> None:
    h = harness(host, cluster, (0,))
    job = FakeJob(id=901, after_script=[cluster.limit_probe])
    results = h.run_job(job, f'echo before; {cluster.limit_probe}; exit 3', timeout=120)
    build = results["build_script"]
    assert build.code == BUILD_FAILURE, build.output
    assert "before" in build.output and cluster.limit_seen in build.output, build.output
    after = results["after_script"].output  # its own 5 minutes, never over the job's 120 s
    assert cluster.limit_seen in after, after
    assert f"{cluster.title} job" in build.output
    assert h.outcomes[901].exit_code == 3
    assert results["cleanup"].code == 0 and LeaseTable(host / "state").all() == []


def stage_limits_are_gitlab_runners(host: Path, cluster: Cluster) -> None:
    """gitlab-runner ends build_script at the job's RUNNER_SCRIPT_TIMEOUT and after_script at
    RUNNER_AFTER_SCRIPT_TIMEOUT (5 minutes unset), not at the job's timeout: the batch
    jobs ask for those limits (2 minutes each here, under a 1-hour job timeout)."""
    h = harness(host, cluster, (0,))
    limits = {"RUNNER_SCRIPT_TIMEOUT": "2m", "RUNNER_AFTER_SCRIPT_TIMEOUT": "1m60s"}
    job = FakeJob(id=906, variables=limits, after_script=[cluster.limit_probe])
    results = h.run_job(job, cluster.limit_probe, timeout=3600)
    for stage in ("build_script", "after_script"):
        assert results[stage].code == 0 and cluster.limit_seen in results[stage].output, results[stage]


def sigterm_cancels_and_lease_holds_the_gpus(host: Path, cluster: Cluster) -> None:
    job = FakeJob(id=902)
    h, driver, name = start_sleeper(host, cluster, job, (2, 3))
    table = LeaseTable(host / "state")
    # update writes one lease file per GPU: wait until both name the set, not only the first
    wait_until("the GPU set in both leases",
               lambda: [bool(x.batch_gpus) for x in table.held_by("902")] == [True, True])
    leases = table.held_by("902")
    got = leases[0].batch_gpus or ""
    assert len(got.split(",")) == 2 and {x.batch_gpus for x in leases} == {got}
    assert all(x.batch_job and x.batch_job.startswith(f"{cluster.driver}:") for x in leases)
    # the wrapper records the GPU set before the script prints it: wait for the line itself
    out_file = (host / "state" / "builds").resolve() / ".runnerctl" / "902-build_script.out"
    wait_until("the job's cuda= line", lambda: out_file.exists() and "cuda=" in out_file.read_text())
    os.killpg(driver.pid, signal.SIGTERM)  # what gitlab-runner does on a cancel or timeout
    wait_until(f"{name} to be cancelled", lambda: not cluster.jobs(name))  # it sleeps 300 s
    out, _ = driver.communicate(timeout=WAIT_S)
    assert driver.returncode == BUILD_FAILURE, out
    assert f"cuda={got}" in out, out  # the lease names the GPUs the job really got
    assert h.stage("cleanup", job).code == 0


def admin_delete_is_a_system_failure(host: Path, cluster: Cluster) -> None:
    job = FakeJob(id=903)
    h, driver, name = start_sleeper(host, cluster, job, (4,))
    job_id = cluster.jobs(name)[0]
    wait_until("the job to start", lambda: bool(LeaseTable(host / "state").held_by("903")[0].batch_gpus))
    cluster.admin_delete(job_id)
    out, _ = driver.communicate(timeout=WAIT_S)
    assert driver.returncode == SYSTEM_FAILURE, out
    assert f"{cluster.title} job {job_id}" in out, out
    assert h.stage("cleanup", job).code == 0


def too_many_gpus_fail_at_once(host: Path, cluster: Cluster) -> None:
    gpus = 2 * cluster.node_gpus
    (host / "gpus.yaml").write_text(f"host: gpu-a\ngpus: {gpus}\n")
    h = harness(host, cluster, tuple(range(gpus)))
    job = FakeJob(id=904)
    results = h.run_job(job, "echo never", timeout=300)  # "at once": not queued until the timeout
    build = results["build_script"]
    assert build.code == BUILD_FAILURE, build.output
    assert f"{cluster.title} refused the job" in build.output or "can never run" in build.output, build.output
    assert "never" not in build.output.replace("can never run", "")
    assert LeaseTable(host / "state").all() == []


def killed_driver_is_reaped_by_next_prepare(host: Path, cluster: Cluster) -> None:
    job = FakeJob(id=905)
    h, driver, name = start_sleeper(host, cluster, job, (6,))
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    assert cluster.jobs(name)  # the driver's death cancels nothing by itself
    # gitlab-runner retries the job's prepare: it replaces the dead attempt's lease and reaps
    assert h.stage("prepare", job).code == 0
    wait_until(f"{name} to be reaped", lambda: not cluster.jobs(name))
    assert label(host, job) != name
    assert h.stage("cleanup", job).code == 0 and LeaseTable(host / "state").all() == []
