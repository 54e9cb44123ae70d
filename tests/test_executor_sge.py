"""The sge driver against the real single-node Grid Engine that .ci/setup/gridengine.sh starts."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from runnerctl.executors.sge import GridEngine, scheduler_parameters
from tests.harness_custom_executor import BUILD_FAILURE, FakeJob, harness_for, make_host


@pytest.fixture(scope="module", autouse=True)
def gridengine() -> None:
    result = subprocess.run(["qhost", "-F", "gpu"], capture_output=True, text=True, timeout=30,
                            check=False)
    assert result.returncode == 0 and "gpu=8" in result.stdout, result.stdout + result.stderr  # no skip


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return make_host(tmp_path)



def test_scheduler_parameters_that_slipped_past_a_list_of_dangers_are_dropped() -> None:
    kept, dropped = scheduler_parameters("-lgpu=8 -t 1-64 -@ opts -q gpu.q -pe mpi 2 -l")
    assert kept == ["-q", "gpu.q", "-pe", "mpi", "2"]
    assert dropped == ["-lgpu=8", "-t", "1-64", "-@", "opts", "-l"]  # a trailing -l would take the script


def test_scheduler_parameters_keep_all_but_gpus_and_bookkeeping() -> None:
    kept, dropped = scheduler_parameters("-pe smp 4 -l gpu=2 -q all.q -N mine -l h_rt=60 -cwd "
                                         "-o /x -l mem_free=1G,gpu=1 -sync y")
    assert kept == ["-pe", "smp", "4", "-q", "all.q", "-l", "h_rt=60"]
    assert dropped == ["-l", "gpu=2", "-N", "mine", "-cwd", "-o", "/x", "-l", "mem_free=1G,gpu=1",
                       "-sync", "y"]


def test_job_runs_with_the_gpus_the_driver_picked(host: Path) -> None:
    harness = harness_for(host, (5, 6), "sge")
    job = FakeJob(id=910, variables={"CUDA_VISIBLE_DEVICES": "0", "SCHEDULER_PARAMETERS": "-l gpu=8 -N x"})
    results = harness.run_job(job, 'echo "cuda=$CUDA_VISIBLE_DEVICES job=$JOB_ID"; '
                                   'qstat -j "$JOB_ID" | grep -o "gpu=[0-9]*"')
    build = results["build_script"]
    assert build.code == 0, build.output
    assert "cuda=5,6 job=" in build.output and "gpu=2" in build.output
    assert "ignoring SCHEDULER_PARAMETERS -l gpu=8 -N x" in build.output


@pytest.mark.parametrize(("job_id", "code"), [(911, 99), (912, 100)])
def test_exit_99_and_100_are_the_scripts_codes_not_a_requeue_or_error_state(host: Path, job_id: int,
                                                                             code: int) -> None:
    """queue_conf(5): a job script's exit 99 requeues the job and 100 puts it in error
    state, where it waits for an administrator; the stage ran until GitLab's timeout."""
    harness = harness_for(host, (1,), "sge")
    results = harness.run_job(FakeJob(id=job_id), f"echo ran; exit {code}", timeout=120)
    build = results["build_script"]
    assert build.code == BUILD_FAILURE and build.output.count("ran\n") == 1, build.output
    assert harness.outcomes[job_id].exit_code == code


def test_a_job_past_its_h_rt_is_the_jobs_build_failure(host: Path) -> None:
    harness = harness_for(host, (2,), "sge")
    job = FakeJob(id=913, variables={"SCHEDULER_PARAMETERS": "-l h_rt=3"})
    results = harness.run_job(job, "echo started; sleep 120", timeout=150)
    build = results["build_script"]
    assert build.code == BUILD_FAILURE and "ran past its limit" in build.output, build.output
    assert harness.outcomes[913].failure_reason == "script_failure"


def test_a_request_the_qmaster_rejects_is_the_jobs_build_failure(host: Path) -> None:
    harness = harness_for(host, (3,), "sge")
    job = FakeJob(id=914, variables={"SCHEDULER_PARAMETERS": "-l no_such_resource=1"})
    build = harness.run_job(job, "echo should-not-run")["build_script"]
    assert build.code == BUILD_FAILURE and "unknown resource" in build.output, build.output
    assert "should-not-run" not in build.output and harness.outcomes[914].failure_reason == "script_failure"


def test_a_job_in_error_state_can_never_run(tmp_path: Path) -> None:
    """A job Grid Engine put in error state (here: its working directory is gone) waits
    for an administrator's qmod -cj; never_runs says so, with qstat's reason."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\necho hi\n")
    job_id = subprocess.run(["qsub", "-terse", "-wd", "/nonexistent/runnerctl-wd", "-o", "/dev/null",
                             "-j", "y", "-l", "gpu=1", str(script)],
                            capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    try:
        engine, deadline, said = GridEngine(), time.monotonic() + 120, None
        while said is None and time.monotonic() < deadline:
            said = engine.never_runs(job_id)
            time.sleep(0.5)
        assert said is not None and said.startswith("it is in error state (") and "runnerctl-wd" in said, said
    finally:
        subprocess.run(["qdel", job_id], capture_output=True, timeout=30, check=False)


def test_a_parallel_environment_does_not_multiply_the_gpus_counted(host: Path) -> None:
    """docs/hpc.md's complex is consumable per job: a 4-GPU slot with `-pe smp 2` counts 4
    of the host's 8 GPUs (per slot it counted 8, and `-pe smp 4` could never run)."""
    harness = harness_for(host, (0, 1, 2, 3), "sge")
    job = FakeJob(id=915, variables={"SCHEDULER_PARAMETERS": "-pe smp 2"})
    results = harness.run_job(job, 'echo "slots=$NSLOTS"; qstat -F gpu | grep -o "hc:gpu=[0-9]*"')
    build = results["build_script"]
    assert build.code == 0 and "slots=2" in build.output and "hc:gpu=4" in build.output, build.output


def test_a_sites_own_gpu_consumable_is_asked_for_by_its_name(host: Path) -> None:
    """Sites name their GPU consumable (`qconf -sc`); the driver always asked for `gpu=N`,
    so on a site without one every job failed as the job's own fault. `[executor]
    sge_gpu_resource` names it; empty asks for none (a node type the job names carries the
    GPUs), and a name the qmaster does not know is the site's failure, with the setting."""
    settings = host / "runnerctl.toml"
    base = settings.read_text()
    settings.write_text(base + 'sge_gpu_resource = ""\n')
    harness = harness_for(host, (4,), "sge")
    job = FakeJob(id=916, variables={"SCHEDULER_PARAMETERS": "-l gpu=3"})  # here: the node type's
    results = harness.run_job(job, 'qstat -j "$JOB_ID" | grep -o "gpu=[0-9]*"')
    build = results["build_script"]
    assert build.code == 0 and "gpu=3" in build.output, build.output
    assert "ignoring" not in build.output

    settings.write_text(base + 'sge_gpu_resource = "cuda_cards"\n')
    harness = harness_for(host, (4,), "sge")
    build = harness.run_job(FakeJob(id=917), "echo should-not-run")["build_script"]
    assert "no consumable 'cuda_cards'" in build.output and "sge_gpu_resource" in build.output, build.output
    assert "should-not-run" not in build.output
    assert harness.outcomes[917].failure_reason == "runner_system_failure"
