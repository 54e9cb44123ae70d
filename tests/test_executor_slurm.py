"""The slurm driver against the real single-node Slurm that .ci/setup/slurm.sh starts."""

from __future__ import annotations

import os
import pwd
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from runnerctl.executors.lease import LeaseTable
from runnerctl.executors.slurm import scheduler_parameters
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


def _slurm_jobs(host: Path, job: int) -> list[str]:
    """State of the job's Slurm jobs, found by the name the driver gives them (job + nonce)."""
    leases = LeaseTable(host / "state").held_by(str(job))
    if not leases:
        return []
    name = f"runnerctl-{job}-{leases[0].nonce}"
    out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%T"], capture_output=True,
                         text=True, check=False).stdout
    return out.split()


def _slurm_jobs_named_for(job: int) -> list[str]:
    """Every pending or running Slurm job whose name the driver gave for this GitLab job, lease or none: after
    cleanup released the lease, `_slurm_jobs` finds nothing whatever is queued."""
    out = subprocess.run(["squeue", "-h", "-t", "PENDING,RUNNING,SUSPENDED", "-o", "%j"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return [name for name in out.split() if name.startswith(f"runnerctl-{job}-")]


def _wait_for(host: Path, job: int, state: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and state not in _slurm_jobs(host, job):
        time.sleep(0.2)
    assert state in _slurm_jobs(host, job)


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


def test_one_gpu_slot_gets_one_gpu_whatever_the_job_asks(host: Path) -> None:
    harness = _harness(host, (7,))
    job = FakeJob(id=805, variables={"CUDA_VISIBLE_DEVICES": "0,1,2,3",
                                     "SCHEDULER_PARAMETERS": "--gpus=8 --gres gpu:4 -J mine"})
    results = harness.run_job(job, 'echo "cuda=$CUDA_VISIBLE_DEVICES"; '
                                   'scontrol show job "$SLURM_JOB_ID" | grep -o "TresPerNode=.*"')
    build = results["build_script"]
    assert build.code == 0, build.output
    line = next(x for x in build.output.splitlines() if x.startswith("cuda="))
    assert len(line.removeprefix("cuda=").split(",")) == 1
    assert re.search(r"TresPerNode=gres[:/]gpu[:=]1$", build.output, re.M), build.output
    assert "ignoring SCHEDULER_PARAMETERS --gpus=8 --gres gpu:4 -J mine" in build.output


def test_scheduler_parameters_pass_only_what_a_site_needs() -> None:
    kept, dropped = scheduler_parameters("--nodes=2 -G 4 --time 10 --gpus-per-node=2 -o/x "
                                         "--partition gpu --parsable --tres-per-task=gres/gpu:1")
    assert kept == ["--time", "10", "--partition", "gpu"]
    assert dropped == ["--nodes=2", "-G", "4", "--gpus-per-node=2", "-o/x", "--parsable",
                       "--tres-per-task=gres/gpu:1"]


def test_scheduler_parameters_that_slipped_past_a_list_of_dangers_are_dropped() -> None:
    """sbatch reads more than a list of dangers names: arrays, getopt's abbreviations,
    clustered short options, another cluster, and a bare word or `--`, after which the
    runner's own --gres and --output would be the script's arguments."""
    kept, dropped = scheduler_parameters("--array=0-63 -N64 -sG8 --gpus-per-no=8 --tres-per-n=gres/gpu:8 "
                                         "-M other train.sh -- --mem=4G -pgpu --comment")
    assert kept == ["--mem=4G", "-pgpu"]
    assert dropped == ["--array=0-63", "-N64", "-sG8", "--gpus-per-no=8", "--tres-per-n=gres/gpu:8",
                       "-M", "other", "train.sh", "--", "--comment"]


def test_failing_script_fails_the_job_with_its_code(host: Path) -> None:
    harness = _harness(host, (0,))
    results = harness.run_job(FakeJob(id=802), "echo before; exit 5")
    assert results["build_script"].code == BUILD_FAILURE
    assert "before" in results["build_script"].output
    assert harness.outcomes[802].exit_code == 5


def test_cancel_from_gitlab_cancels_the_slurm_job(host: Path) -> None:
    harness = _harness(host, (4, 5))
    job = FakeJob(id=803)
    assert harness.stage("prepare", job).code == 0
    driver = harness.start("run", job, str(harness.script(job, "build_script", "sleep 300")),
                           "build_script")
    _wait_for(host, 803, "RUNNING")
    os.killpg(driver.pid, signal.SIGTERM)  # what gitlab-runner does when the job is cancelled
    driver.communicate(timeout=120)
    _wait_for_none(host, 803)  # cancelled: `sleep 300` would still be RUNNING
    assert driver.returncode == BUILD_FAILURE
    harness.stage("cleanup", job)


def test_sigterm_as_the_job_is_submitted_cancels_it(host: Path) -> None:
    """SIGTERM between sbatch and arming the stop: the Slurm job is cancelled, the lease freed."""
    harness = _harness(host, (7,))
    job = FakeJob(id=805)
    assert harness.stage("prepare", job).code == 0
    driver = harness.start("run", job, str(harness.script(job, "build_script", "sleep 300")),
                           "build_script", stopped_at_start=True)
    out, _ = driver.communicate(timeout=120)
    assert driver.returncode == BUILD_FAILURE and "submitted" in out, out
    _wait_for_none(host, 805)
    assert harness.stage("cleanup", job).code == 0
    assert LeaseTable(host / "state").all() == []


def _wait_for_none(host: Path, job: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and _slurm_jobs(host, job):
        time.sleep(0.2)
    assert _slurm_jobs(host, job) == []


def test_driver_killed_then_cleanup_leaves_no_slurm_job(host: Path) -> None:
    harness = _harness(host, (6,))
    job = FakeJob(id=804)
    assert harness.stage("prepare", job).code == 0
    driver = harness.start("run", job, str(harness.script(job, "build_script", "sleep 300")),
                           "build_script")
    _wait_for(host, 804, "RUNNING")
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    assert _slurm_jobs(host, 804)  # the driver's death cancels nothing by itself
    name = f"runnerctl-804-{LeaseTable(host / 'state').held_by('804')[0].nonce}"
    assert harness.stage("cleanup", job).code == 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and _squeue_name(name):
        time.sleep(0.2)
    assert _squeue_name(name) == [] and LeaseTable(host / "state").all() == []


def _squeue_name(name: str) -> list[str]:
    return subprocess.run(["squeue", "-h", "-n", name, "-o", "%T"], capture_output=True, text=True,
                          check=False).stdout.split()



def test_a_request_the_controller_rejects_is_the_jobs_build_failure(host: Path) -> None:
    """An unknown partition or a malformed --time in SCHEDULER_PARAMETERS is the job's own
    mistake: a build failure with sbatch's words, not a runner system failure (which GitLab
    blames on the runner and may retry)."""
    harness = _harness(host, (0,))
    for job_id, parameters, said in ((806, "--partition=no-such-partition", "Invalid partition name"),
                                     (807, "--time=abc", "Invalid --time specification")):
        results = harness.run_job(FakeJob(id=job_id, variables={"SCHEDULER_PARAMETERS": parameters}),
                                  "echo should-not-run")
        build = results["build_script"]
        assert build.code == BUILD_FAILURE and said in build.output, build.output
        assert "should-not-run" not in build.output and "Traceback" not in build.output


def test_a_time_over_the_partitions_limit_fails_at_once_instead_of_pending(host: Path) -> None:
    """sbatch(1): a --time over the partition's MaxTime leaves the job PENDING (reason
    PartitionTimeLimit), possibly for ever; the driver's --time is GitLab's timeout, often
    hours. The stage fails at once with the reason instead of waiting for GitLab's timeout."""
    node = subprocess.run(["sinfo", "-h", "-p", "gpu", "-o", "%N"], capture_output=True, text=True,
                          check=True, timeout=30).stdout.strip()
    subprocess.run(["scontrol", "create", "PartitionName=rc-short", f"Nodes={node}", "MaxTime=1",
                    "State=UP"], capture_output=True, text=True, check=True, timeout=30)
    try:
        harness = _harness(host, (0,))
        job = FakeJob(id=808, variables={"SCHEDULER_PARAMETERS": "--partition=rc-short"})
        started = time.monotonic()
        results = harness.run_job(job, "echo should-not-run", timeout=120)
        build = results["build_script"]
        # PartitionConfig for a moment after submitting, PartitionTimeLimit from the first
        # scheduling pass on: either is final
        assert build.code == BUILD_FAILURE and re.search(
            r"can never run: pending for reason Partition(Config|TimeLimit)", build.output), build.output
        assert time.monotonic() - started < 100 and "should-not-run" not in build.output
        assert _slurm_jobs_named_for(808) == []  # cancelled, not left pending
    finally:
        subprocess.run(["scontrol", "delete", "PartitionName=rc-short"], capture_output=True, timeout=30,
                       check=False)


@pytest.mark.parametrize(("fields", "code", "failure"), [
    ({"JobState": "COMPLETED", "ExitCode": "0:0"}, 0, None),
    ({"JobState": "FAILED", "ExitCode": "3:0"}, 3, None),
    ({"JobState": "FAILED", "ExitCode": "0:9"}, 137, None),  # killed by a signal: never a pass
    ({"JobState": "TIMEOUT", "ExitCode": "0:0"}, 1, None),  # ran out of time: never a pass
    ({"JobState": "OUT_OF_MEMORY", "ExitCode": "0:0"}, 1, None),
    ({"JobState": "COMPLETED"}, 1, None),  # no exit code to read: not a pass
    ({"JobState": "NODE_FAIL", "ExitCode": "0:0"}, None, "ended NODE_FAIL"),  # the cluster's doing
    ({"JobState": "PREEMPTED", "ExitCode": "0:0"}, None, "ended PREEMPTED"),
    ({"JobState": "CANCELLED", "ExitCode": "0:15"}, None, "was cancelled outside runnerctl"),
])
def test_slurm_outcomes_never_turn_a_failure_into_a_pass(monkeypatch: pytest.MonkeyPatch,
                                                         fields: dict[str, str], code: int | None,
                                                         failure: str | None) -> None:
    """`scontrol show job`'s fields -> the stage's result (mutations that read a signal, a
    timeout or a missing exit code as 0 went unnoticed; found by a review as a mutation
    tester)."""
    from runnerctl.executors import slurm

    monkeypatch.setattr(slurm, "_job_fields", lambda job_id: fields)
    outcome = slurm.Slurm().outcome("42")
    assert outcome.code == code
    assert (outcome.failure is None) if failure is None else (failure in (outcome.failure or ""))


def test_slurm_keeps_a_job_it_cannot_ask_about_reaps_by_id_and_name_and_rounds_the_limit_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """squeue failing (slurmctld down) keeps the job active, so its lease holds, while one
    Slurm no longer knows is gone; reap cancels the recorded id and the label's jobs;
    a controller that did not answer sbatch is a system failure, a refusal a build
    failure; `--time` is in minutes, rounded up (a 30 s limit floored to `--time=0` is
    no limit at all). Mutations of each went unnoticed (found by a review as a mutation
    tester)."""
    from unittest import mock

    from runnerctl.executors import slurm
    from runnerctl.executors.batch import Refused, Request
    from runnerctl.executors.driver import SystemFailure

    def answer(code: int, stdout: str = "", stderr: str = "") -> Any:
        return mock.patch.object(slurm, "run_command", return_value=subprocess.CompletedProcess(
            [], code, stdout=stdout, stderr=stderr))

    with answer(1, stderr="slurm_load_jobs error: Unable to contact slurm controller (connect failure)"):
        assert slurm.Slurm().active("7")
    with answer(1, stderr="slurm_load_jobs error: Invalid job id specified"):
        assert not slurm.Slurm().active("7")
    with answer(0, stdout="RUNNING\n"):
        assert slurm.Slurm().active("7")
    ran: list[list[str]] = []
    with mock.patch.object(slurm, "run_command", side_effect=lambda command, **kw: ran.append(command)):
        slurm.Slurm().reap("runnerctl-1-x", "9", pwd.getpwuid(os.getuid()))
    assert ["scancel", "9"] in ran and any(c[:3] == ["scancel", "--name", "runnerctl-1-x"] for c in ran)
    request = mock.Mock(spec=Request, label="runnerctl-1-x", time_limit_s=None, nodes=1, gpus=1, options=[],
                        log=Path("/l"),
                        wrapper=Path("/w"), env={}, workdir=Path("/"), runas={})
    for stderr, error in [("sbatch: error: Batch job submission failed: Unable to contact slurm controller "
                           "(connect failure)", SystemFailure),
                          ("sbatch: error: Batch job submission failed: Invalid partition name specified",
                           Refused)]:
        with answer(1, stderr=stderr), pytest.raises(error):
            slurm.Slurm().submit(request)
    for seconds, minutes in [(30, 1), (60, 1), (90, 2), (7200, 120)]:
        request.time_limit_s = seconds
        with answer(0, stdout="12\n") as run:
            assert slurm.Slurm().submit(request) == "12"
        assert f"--time={minutes}" in run.call_args.args[0]
