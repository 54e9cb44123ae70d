"""The sge driver against the real single-node Grid Engine that .ci/setup/gridengine.sh starts."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from runnerctl.executors.batch import SiteFault
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
        assert isinstance(said, SiteFault)  # the node's doing: a system failure, not the job's
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


def test_the_jobs_variables_are_not_in_what_qstat_shows_every_user(host: Path) -> None:
    """`qstat -j` shows a job's env_list to every user of the cluster, and `qsub -V` put
    every CUSTOM_ENV_ copy of the job's variables there, masked ones and CI_JOB_TOKEN
    included (found by a review as a Grid Engine admin). The job still has its variables:
    its script exports them."""
    harness = harness_for(host, (6,), "sge")
    job = FakeJob(id=931, variables={"DEPLOY_PASSWORD": "hunter2-secret"})
    body = ('echo "length=${#DEPLOY_PASSWORD}"; qstat -j "$JOB_ID" | grep -c "^env_list"; '
            'qstat -j "$JOB_ID" | grep -o "[A-Z_]*DEPLOY_PASSWORD=[^,]*" || echo none-shown')
    build = harness.run_job(job, body)["build_script"]
    assert build.code == 0 and "length=14" in build.output and "\n1\n" in build.output, build.output
    assert "none-shown" in build.output and "hunter2" not in build.output, build.output


def test_a_job_past_its_own_s_rt_is_its_build_failure(host: Path) -> None:
    """At a job's own `-l s_rt` Grid Engine sends SIGUSR1, and qacct says `failed 100`,
    exit_status 138, as after a qdel: it was a system failure blaming an administrator
    (found by a review as a Grid Engine admin)."""
    harness = harness_for(host, (7,), "sge")
    job = FakeJob(id=932, variables={"SCHEDULER_PARAMETERS": "-l s_rt=3"})
    build = harness.run_job(job, "echo started; sleep 120", timeout=150)["build_script"]
    assert build.code == BUILD_FAILURE and "ran past its s_rt (SIGUSR1)" in build.output, build.output
    assert harness.outcomes[932].failure_reason == "script_failure"


def test_a_failed_parallel_job_never_passes_on_its_slave_tasks_record(host: Path) -> None:
    """A tightly integrated `-pe` job writes an accounting record per `qrsh -inherit` task;
    the slave's (exit 0) reached qacct first, and the failed job passed (found by a review
    as a Grid Engine admin). The script's own code, which the batch job wrote, decides."""
    harness = harness_for(host, (5,), "sge")
    job = FakeJob(id=933, variables={"SCHEDULER_PARAMETERS": "-pe mpi 2"})
    slave_done = host / "slave-done"
    body = (f'qrsh -inherit "$(awk \'NR==1{{print $1}}\' "$PE_HOSTFILE")" /bin/echo slave-ran; '
            f'touch {slave_done}; sleep 20; exit 3')
    build = harness.run_job(job, body, timeout=150)["build_script"]
    assert "slave-ran" in build.output and slave_done.exists(), build.output
    assert build.code == BUILD_FAILURE and harness.outcomes[933].exit_code == 3, build.output


def _qacct_text(*records: dict[str, str]) -> str:
    return "".join("=" * 62 + "\n" + "".join(f"{k:<13}{v}\n" for k, v in r.items()) for r in records)


@pytest.mark.parametrize(("records", "code", "failure"), [
    # an older job of the same number (ids wrapped) is no record of this one
    ([{"jobname": "other-job", "failed": "0", "exit_status": "0"},
      {"jobname": "runnerctl-1-x", "failed": "0", "exit_status": "3"}], 3, None),
    # a rescheduled first run (failed 25) is waited past, to the run that ended
    ([{"jobname": "runnerctl-1-x", "failed": "25  : rescheduling", "exit_status": "0"},
      {"jobname": "runnerctl-1-x", "failed": "0", "exit_status": "0"}], 0, None),
    ([{"jobname": "runnerctl-1-x", "failed": "100 : assumedly after job", "exit_status": "137"}], None,
     "was deleted or killed by Grid Engine"),
    ([{"jobname": "runnerctl-1-x", "failed": "100 : assumedly after job", "exit_status": "152"}], 152, None),
])
def test_the_outcome_is_the_jobs_own_record_past_rescheduled_runs(
        monkeypatch: pytest.MonkeyPatch, records: list[dict[str, str]], code: int | None,
        failure: str | None) -> None:
    """(found by a review as a Grid Engine admin: an older record of the job's number, or a
    rescheduled run's, was read as the job's result)"""
    from unittest import mock

    from runnerctl.executors import sge

    engine = GridEngine()
    engine.labels["7"] = "runnerctl-1-x"
    shown = subprocess.CompletedProcess([], 0, stdout=_qacct_text(*records), stderr="")
    with mock.patch.object(sge, "run_command", return_value=shown):
        outcome = engine.outcome("7")
    assert outcome.code == code
    assert (outcome.failure is None) if failure is None else (failure in (outcome.failure or ""))


def test_a_job_whose_every_run_was_rescheduled_or_that_left_no_record_fails_naming_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from unittest import mock

    from runnerctl.executors import batch, sge
    from runnerctl.executors.driver import SystemFailure

    monkeypatch.setattr(sge, "ACCOUNTING_WAIT_S", 0.05)
    monkeypatch.setattr(batch, "POLL_S", 0.01)
    run = _qacct_text({"jobname": "runnerctl-1-x", "failed": "25  : rescheduling", "exit_status": "0"})
    shown = subprocess.CompletedProcess([], 0, stdout=run, stderr="")
    with mock.patch.object(sge, "run_command", return_value=shown):
        assert "was rescheduled" in (GridEngine().outcome("7").failure or "")
    none = subprocess.CompletedProcess([], 1, stdout="", stderr="error: job id 7 not found")
    with mock.patch.object(sge, "run_command", return_value=none), pytest.raises(SystemFailure,
                                                                                 match="deleted before"):
        GridEngine().outcome("7")


def test_a_parallel_jobs_record_of_0_asks_for_the_scripts_own_word() -> None:
    """qacct -j does not say whether a tightly integrated job's record is the job's or a
    task's: a 0 from a parallel job passes only if the script wrote 0 (found by a review of
    the day's changes: the job killed after its task ended passed)."""
    from unittest import mock

    from runnerctl.executors import sge

    for pe, confirm in (("mpi", True), ("NONE", False)):
        shown = _qacct_text({"jobname": "runnerctl-1-x", "granted_pe": pe, "failed": "0", "exit_status": "0"})
        answer = subprocess.CompletedProcess([], 0, stdout=shown, stderr="")
        with mock.patch.object(sge, "run_command", return_value=answer):
            outcome = GridEngine().outcome("7")
        assert outcome.code == 0 and outcome.confirm is confirm
