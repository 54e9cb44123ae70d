"""Issue 18's acceptance for every batch driver, driven as gitlab-runner drives the stages.

slurm and sge run against the real Slurm and Grid Engine that .ci/setup/slurm.sh and
gridengine.sh start (a missing one fails the test, no skip); pbs and pjm against the
stand-ins in tests/fakes (OpenPBS and Fujitsu PJM do not install here), put first on
PATH with their own job table per test.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import batch_acceptance
from tests.batch_acceptance import Cluster
from tests.harness_custom_executor import BUILD_FAILURE, FakeJob, make_host
from tests.unix_users import unix_user

__all__ = ["unix_user"]  # the fixture

FAKES = Path(__file__).parent / "fakes"


def _out(*command: str) -> str:
    return subprocess.run(list(command), capture_output=True, text=True, check=False, timeout=60).stdout


def _delete(*command: str) -> None:
    subprocess.run(list(command), check=True, capture_output=True, timeout=60)


def _sge_jobs(label: str) -> list[str]:
    return [line.split()[1] for line in _out("qstat", "-j", label).splitlines()
            if line.startswith("job_number:")]


def _pjm_jobs(label: str) -> list[str]:
    return [row.split()[0] for row in _out("pjstat", "--filter", f"jnam={label}").splitlines()[1:]]


CLUSTERS = {
    "slurm": Cluster(driver="slurm", title="Slurm", jobs=lambda label: _out("squeue", "-h", "-n", label,
                                                                             "-o", "%i").split(),
                     admin_delete=lambda job: _delete("scancel", job),
                     limit_probe='scontrol show job "$SLURM_JOB_ID" | grep -o "TimeLimit=[^ ]*"',
                     limit_seen="TimeLimit=00:02:00"),
    "sge": Cluster(driver="sge", title="Grid Engine", jobs=_sge_jobs,
                   admin_delete=lambda job: _delete("qdel", job),
                   limit_probe='qstat -j "$JOB_ID" | grep -o "h_rt=[0-9]*"', limit_seen="h_rt=120"),
    "pbs": Cluster(driver="pbs", title="PBS", jobs=lambda label: _out("qselect", "-N", label).split(),
                   admin_delete=lambda job: _delete("qdel", job),
                   limit_probe='qstat -f "$PBS_JOBID" | grep -o "walltime = .*"',
                   limit_seen="walltime = 0:02:00"),
    "pjm": Cluster(driver="pjm", title="PJM", jobs=_pjm_jobs,
                   admin_delete=lambda job: _delete("pjdel", job),
                   limit_probe='echo "elapse=$PJM_ELAPSE_LIMIT"',  # pjstat runs on login nodes only
                   limit_seen="elapse=120"),
}


def _stand_in(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str) -> None:
    """The PBS or PJM stand-in first on PATH, with a job table of this test's own."""
    monkeypatch.setenv("PATH", f"{FAKES / 'bin' / name}:{os.environ['PATH']}")
    monkeypatch.setenv("RUNNERCTL_FAKE_BATCH", str(tmp_path / f"fake-{name}"))


@pytest.fixture(params=sorted(CLUSTERS))
def cluster(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
            ) -> Iterator[Cluster]:
    name = str(request.param)
    if name in ("pbs", "pjm"):
        _stand_in(monkeypatch, tmp_path, name)
    elif name == "slurm":
        assert "gpu:8" in _out("sinfo", "-h", "-o", "%G"), "Slurm is not running: bash .ci/setup/slurm.sh"
    else:
        assert "gpu=8" in _out("qhost", "-F", "gpu"), "Grid Engine is not running: .ci/setup/gridengine.sh"
    yield CLUSTERS[name]
    if name in ("pbs", "pjm"):  # end what a failed test left running in the stand-in
        from tests.fakes import batch_engine

        for job in batch_engine.all_jobs():
            batch_engine.delete(job["id"], by="test teardown")


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return make_host(tmp_path)


def test_exit_3_is_a_build_failure_with_3_recorded_and_the_timeout_as_limit(host: Path, cluster: Cluster
                                                                            ) -> None:
    batch_acceptance.exit_code_is_a_build_failure(host, cluster)


def test_script_and_after_script_ask_gitlab_runners_stage_limits(host: Path, cluster: Cluster) -> None:
    batch_acceptance.stage_limits_are_gitlab_runners(host, cluster)


def test_sigterm_cancels_the_batch_job_and_the_lease_names_its_gpus(host: Path, cluster: Cluster) -> None:
    batch_acceptance.sigterm_cancels_and_lease_holds_the_gpus(host, cluster)


def test_batch_job_deleted_by_an_admin_is_a_system_failure(host: Path, cluster: Cluster) -> None:
    batch_acceptance.admin_delete_is_a_system_failure(host, cluster)


def test_more_gpus_than_any_node_has_fail_at_once(host: Path, cluster: Cluster) -> None:
    batch_acceptance.too_many_gpus_fail_at_once(host, cluster)


def test_killed_drivers_batch_job_is_reaped_by_the_next_prepare(host: Path, cluster: Cluster) -> None:
    batch_acceptance.killed_driver_is_reaped_by_next_prepare(host, cluster)


def test_a_slurm_job_is_never_requeued_to_run_its_script_twice(tmp_path: Path) -> None:
    """Slurm requeues a job after a node failure, on preemption or at an administrator's
    `scontrol requeue`, and runs its script again from the start: the stage ran the CI
    script twice and passed on the second run (found by a review as a Slurm site admin).
    Submitted with --no-requeue, a requeue is refused and the script runs once."""
    assert "gpu:8" in _out("sinfo", "-h", "-o", "%G"), "Slurm is not running: bash .ci/setup/slurm.sh"
    host = make_host(tmp_path)
    h = batch_acceptance.harness(host, CLUSTERS["slurm"], (6,))
    job = FakeJob(id=932, variables={"SCHEDULER_PARAMETERS": "--requeue"})
    assert h.stage("prepare", job).code == 0
    started, asked = host / "started", host / "asked"  # the job runs until the requeue was asked for
    body = (f'echo "attempt $SLURM_RESTART_COUNT"; touch {started}; '
            f'until [ -e {asked} ]; do sleep 0.1; done')
    driver = h.start("run", job, str(h.script(job, "build_script", body)), "build_script")
    name = batch_acceptance.label(host, job)
    batch_acceptance.wait_until("the script to start", started.exists)
    [job_id] = CLUSTERS["slurm"].jobs(name)
    requeue = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, check=False)
    asked.touch()
    assert requeue.returncode != 0 and "disabled" in requeue.stderr, requeue.stderr
    out, _ = driver.communicate(timeout=batch_acceptance.WAIT_S)
    assert driver.returncode == 0, out
    assert out.count("attempt") == 1 and "ignoring SCHEDULER_PARAMETERS --requeue" in out, out
    assert h.stage("cleanup", job).code == 0


def test_slurms_record_is_read_by_each_fields_first_value() -> None:
    """`scontrol show job` prints a job's own text (its --wckey, --comment) after JobState
    and ExitCode; read last-wins, `--comment="ok ExitCode=0:0"` turned a failed job into a
    success (found by a review as a Slurm site admin). --comment is no longer passed, and
    each field's first value is read."""
    from unittest import mock

    from runnerctl.executors import slurm

    shown = ("JobId=7 JobName=runnerctl-1-x\n   JobState=FAILED Reason=NonZeroExitCode\n   ExitCode=3:0\n"
             "   WorkDir=/w Comment=ok ExitCode=0:0 JobState=COMPLETED\n")
    with mock.patch.object(slurm, "run_command",
                           return_value=subprocess.CompletedProcess([], 0, stdout=shown, stderr="")):
        assert slurm.Slurm().outcome("7").code == 3
    assert slurm.scheduler_parameters('--comment "ok ExitCode=0:0" --requeue -p gpu') == (
        ["-p", "gpu"], ["--comment", "ok ExitCode=0:0", "--requeue"])


@pytest.mark.parametrize(("reason", "never", "site"), [
    ("QOSMaxGRESPerJob", True, False), ("InvalidAccount", True, False),
    ("launch failed requeued held", True, True), ("PartitionTimeLimit", True, False),
    ("ReqNodeNotAvail, UnavailableNodes:node1", False, False),
    ("QOSMaxGRESPerUser", False, False), ("Resources", False, False), ("JobHeldAdmin", False, False)])
def test_slurm_pending_reasons_that_never_run_fail_at_once(reason: str, never: bool, site: bool) -> None:
    """A request over a per-job limit, an account or QOS the job may not use, or a job held
    after its launch failed waited until GitLab's timeout (found by a review as a Slurm
    site admin); limits of a group or user, and holds an administrator may release, wait.
    A launch that failed (a Prolog, a node) is the cluster's doing: a system failure."""
    from unittest import mock

    from runnerctl.executors import slurm
    from runnerctl.executors.batch import SiteFault

    with mock.patch.object(slurm, "run_command",
                           return_value=subprocess.CompletedProcess([], 0, stdout=reason + "\n", stderr="")):
        said = slurm.Slurm().never_runs("7")
    assert (said is not None) == never and isinstance(said, SiteFault) == site


def test_pbs_and_pjm_parameters_keep_all_but_gpus_nodes_and_bookkeeping() -> None:
    from runnerctl.executors import pbs, pjm

    kept, dropped = pbs.scheduler_parameters("-q gpu -l select=2:ngpus=4 -l walltime=1:00:00 -N x "
                                             "-W block=true -A proj -V")
    assert kept == ["-q", "gpu", "-l", "walltime=1:00:00", "-A", "proj"]
    assert dropped == ["-l", "select=2:ngpus=4", "-N", "x", "-W", "block=true", "-V"]
    kept, dropped = pjm.scheduler_parameters('-L rscgrp=small -L node=4,gpu=8 --mpi "proc=8" -j '
                                             "-L elapse=1:00:00 -N x")
    assert kept == ["-L", "rscgrp=small", "--mpi", "proc=8", "-L", "elapse=1:00:00"]
    assert dropped == ["-L", "node=4,gpu=8", "-j", "-N", "x"]
    assert pbs.scheduler_parameters("-lselect=1:ngpus=8 -J 0-63 -- exe -q gpu") == (
        ["-q", "gpu"], ["-lselect=1:ngpus=8", "-J", "0-63", "--", "exe"])
    # a select's own chunk resources pass (submit puts them into its chunk); a second chunk does not
    given = "-l select=2:ncpus=16:ngpus=4:mem=64gb -lselect=1:vmem=2gb+1:ncpus=2"
    assert pbs.scheduler_parameters(given) == (
        ["-l", "ncpus=16,mem=64gb", "-l", "vmem=2gb"], ["-l", "select=2:ngpus=4", "-lselect=1+1:ncpus=2"])
    # one -l holds several resources, a walltime's colons too (its select split it to walltime=01: 1 s)
    assert pbs.scheduler_parameters("-l select=1:ncpus=16,walltime=01:00:00") == (
        ["-l", "ncpus=16,walltime=01:00:00"], ["-l", "select=1"])
    # a GPU count beside the select in the same -l is dropped with it, never passed on
    assert pbs.scheduler_parameters("-l select=1:ncpus=2,ngpus=4,walltime=1:00:00") == (
        ["-l", "ncpus=2,walltime=1:00:00"], ["-l", "select=1,ngpus=4"])
    assert pjm.scheduler_parameters("-Lgpu=8 --bulk --sparam 0-63 -g lab") == (
        ["-g", "lab"], ["-Lgpu=8", "--bulk", "--sparam", "0-63"])


@pytest.mark.parametrize("name", ["slurm", "sge"])
def test_batch_jobs_run_as_the_configured_user_and_are_cancelled_and_reaped_as_theirs(
        name: str, unix_user: pwd.struct_passwd) -> None:
    """With `[executor] run_as_user` (needed when gitlab-runner runs as root), the batch job
    runs as that user, not as the driver's root; a cancel and a later prepare's reap reach
    it as theirs. Before, the submission ran as root, and so did the job on the cluster."""
    cluster = CLUSTERS[name]
    root = Path(tempfile.mkdtemp(prefix="runnerctl-batch-user-"))
    root.chmod(0o755)  # pytest's tmp dirs are root's alone
    try:
        host = make_host(root, shell_user=unix_user.pw_name)
        h = batch_acceptance.harness(host, cluster, (1,))
        job = FakeJob(id=920)
        results = h.run_job(job, 'echo "as=$(id -un) home=$HOME"; touch mine; exit 4', timeout=120)
        build = results["build_script"]
        assert build.code == BUILD_FAILURE and h.outcomes[920].exit_code == 4, build.output
        assert f"as={unix_user.pw_name} home={unix_user.pw_dir}" in build.output, build.output
        made = next((host / "state" / "builds").rglob("mine"))
        assert made.stat().st_uid == unix_user.pw_uid
        assert (host / "state" / "builds" / ".runnerctl").stat().st_uid == unix_user.pw_uid
        batch_acceptance.sigterm_cancels_and_lease_holds_the_gpus(host, cluster)
        batch_acceptance.killed_driver_is_reaped_by_next_prepare(host, cluster)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_link_planted_in_the_job_users_batch_directory_is_never_followed(tmp_path: Path) -> None:
    """The batch directory is the job user's: a link they leave where the driver (root)
    writes the next stage's wrapper is replaced, and the file it pointed at is untouched."""
    from runnerctl.executors.batch import _Paths

    victim = tmp_path / "config.toml"
    victim.write_text("root's own\n")
    paths = _Paths(tmp_path / "work", "7-build_script")
    paths.wrapper.symlink_to(victim)
    paths.write(paths.wrapper, b"#!/bin/bash\n")
    assert victim.read_text() == "root's own\n"
    assert not paths.wrapper.is_symlink() and paths.wrapper.read_bytes() == b"#!/bin/bash\n"
    assert (paths.wrapper.stat().st_mode & 0o777) == 0o600


def test_pbs_jobs_get_the_cpus_and_memory_they_ask_for_inside_the_drivers_chunk(
        host: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PBS refuses a chunk-level resource (ncpus, mem, ...) asked for beside a `select`
    (req_quejob.c, PBSE_INVALJOBRESC), and the driver always gives one: a job's `-l
    vmem=8gb` failed to submit, and the ncpus of its own `select=` were dropped with it, so
    every job ran on PBS's default of one CPU. Both now go into the driver's chunk."""
    _stand_in(monkeypatch, tmp_path, "pbs")
    h = batch_acceptance.harness(host, CLUSTERS["pbs"], (0,))
    given = "-l vmem=8gb -l select=2:ncpus=16:ngpus=8:mem=64gb -l place=scatter"
    job = FakeJob(id=931, variables={"SCHEDULER_PARAMETERS": given})
    results = h.run_job(job, 'qstat -f "$PBS_JOBID" | grep -o "select = .*"', timeout=60)
    build = results["build_script"]
    assert build.code == 0, build.output
    assert "select = 1:ngpus=1:vmem=8gb:ncpus=16:mem=64gb" in build.output
    assert "ignoring SCHEDULER_PARAMETERS -l select=2:ngpus=8:" in build.output


def test_pbs_is_read_from_qstat_text_since_its_json_breaks_on_a_variable_like_point_001(
        host: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenPBS up to 23.06 writes a value strtod() reads whole as a bare number in qstat's
    JSON (`"LR":.001`: no JSON), and qsub -V puts the submitting environment into
    Variable_List; the stage polled the broken JSON until GitLab's timeout. The stand-in
    writes what 23.06 writes; the driver reads `qstat -x -f` text (wrapped long lines too).
    The job's own variables reach it through its script, never as CUSTOM_ENV_ copies in
    Variable_List, which PBS operators (and Grid Engine's `qstat -j`, every user) can read."""
    monkeypatch.setenv("LR", ".001")  # in the runner's environment, which qsub -V passes on
    _stand_in(monkeypatch, tmp_path, "pbs")
    h = batch_acceptance.harness(host, CLUSTERS["pbs"], (0,))
    job = FakeJob(id=930, variables={"LR": ".001", "NOTE": "x" * 300})
    results = h.run_job(job, 'echo "lr=$LR"; exit 6', timeout=60)
    build = results["build_script"]
    assert build.code == BUILD_FAILURE and "lr=.001" in build.output, build.output
    assert h.outcomes[930].exit_code == 6
    job_id = next(line.split()[3] for line in build.output.splitlines() if "PBS job" in line)
    raw = _out("qstat", "-x", "-f", "-F", "json", job_id)
    assert '"LR":.001' in raw  # the stand-in breaks JSON as OpenPBS 23.06 does
    assert "CUSTOM_ENV_" not in raw and "x" * 300 not in raw  # the job's variables: only in its script
    with pytest.raises(ValueError):
        json.loads(raw)
    text = _out("qstat", "-x", "-f", job_id)
    assert "\n\t" in text and "job_state = F" in text  # a long Variable_List goes on after a tab


def _qstat_f(state: str, **attrs: str) -> str:
    lines = [f"    {name} = {value}" for name, value in {"job_state": state, **attrs}.items()]
    return "Job Id: 7.server\n    Job_Name = runnerctl-1-x\n" + "\n".join(lines) + "\n"


@pytest.mark.parametrize(("exit_status", "code", "failure"), [
    ("0", 0, None),
    ("3", 3, None),
    ("271", None, "killed by signal 15"),  # qdel by someone else: the cluster's doing
    ("-29", 1, None),  # JOB_EXEC_KILL_WALLTIME: past its own limit, never a pass
    ("-27", 1, None),  # JOB_EXEC_KILL_MEM: past its own memory, the job's doing
    ("-24", 1, None),  # JOB_EXEC_KILL_NCPUS_BURST
    ("-1", None, "failed in PBS (Exit_status -1"),  # JOB_EXEC_FAIL1: PBS's own failure
    ("-30", None, "failed in PBS (Exit_status -30"),  # JOB_EXEC_JOINJOB
    ("x", None, "failed in PBS"),  # unreadable: never 0
    (None, None, "was deleted before it ran"),
])
def test_pbs_outcomes_never_turn_a_failure_into_a_pass(monkeypatch: pytest.MonkeyPatch,
                                                       exit_status: str | None, code: int | None,
                                                       failure: str | None) -> None:
    """`qstat -x -f`'s Exit_status -> the stage's result (src/include/job.h JOB_EXEC_*; the
    MoM sets JOB_EXEC_KILL_* when a job goes past its own limit, src/resmom/mom_main.c).
    Mutations that read a walltime kill, a missing or unreadable status or PBS's own
    failure as a pass went unnoticed (found by a review as a mutation tester); a job killed
    past its memory was a system failure blaming the cluster."""
    from unittest import mock

    from runnerctl.executors import batch, pbs

    monkeypatch.setattr(batch, "POLL_S", 0.01)
    attrs = {} if exit_status is None else {"Exit_status": exit_status}
    shown = [_qstat_f("R"), _qstat_f("F", **attrs)]  # accounting lags: still R at the first look
    with mock.patch.object(pbs, "run_command", side_effect=lambda command, **kw: subprocess.CompletedProcess(
            command, 0, stdout=shown.pop(0) if len(shown) > 1 else shown[0], stderr="")):
        outcome = pbs.Pbs().outcome("7.server")
    assert outcome.code == code
    assert (outcome.failure is None) if failure is None else (failure in (outcome.failure or ""))


def test_pbs_reads_a_job_it_cannot_ask_about_as_running_and_only_a_queued_one_as_never_running() -> None:
    """Fail closed: qstat failing (server down) keeps the job active, so its lease holds; a
    "Can Never Run" comment counts only while the job is queued (a running job keeps an old
    comment), read whole when qstat wraps it onto tab-led lines (mutations of each went
    unnoticed; found by a review as a mutation tester)."""
    from unittest import mock

    from runnerctl.executors import pbs

    def answer(code: int, text: str = "") -> mock._patch[Any]:
        return mock.patch.object(pbs, "run_command", return_value=subprocess.CompletedProcess(
            [], code, stdout=text, stderr="Connection refused" if code else ""))

    with answer(15010):
        assert pbs.Pbs().active("7.server") and pbs.Pbs().never_runs("7.server") is None
    with answer(0, _qstat_f("F", Exit_status="0")):
        assert not pbs.Pbs().active("7.server")
    never = "Can Never Run: Insufficient amount of resource: ngpus (R: 16 A: 8 T: 8)"
    wrapped = _qstat_f("Q", comment=never[:40]).rstrip("\n") + "\n\t" + never[40:] + "\n"
    with answer(0, wrapped):
        assert pbs.Pbs().never_runs("7.server") == never
    with answer(0, _qstat_f("R", comment=never)):
        assert pbs.Pbs().never_runs("7.server") is None


def test_pbs_reaps_by_name_and_by_the_recorded_id_and_tells_an_unreachable_server_from_a_refusal(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """reap deletes what `qselect -N <label>` finds and the job id the lease recorded (one
    submitted under another name, or one qselect misses); a qsub that reached no server is
    a system failure, a request the server refused a build failure (mutations of each went
    unnoticed; found by a review as a mutation tester)."""
    from unittest import mock

    from runnerctl.executors import pbs
    from runnerctl.executors.batch import Refused, Request
    from runnerctl.executors.driver import SystemFailure

    ran: list[list[str]] = []

    def record(command: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        ran.append(command)
        return subprocess.CompletedProcess(command, 0, stdout="8.server\n" if command[0] == "qselect" else "",
                                           stderr="")

    me = pwd.getpwuid(os.getuid())
    with mock.patch.object(pbs, "run_command", side_effect=record):
        pbs.Pbs().reap("runnerctl-1-x", "9.server", me)
    assert sorted(c[1] for c in ran if c[0] == "qdel") == ["8.server", "9.server"]
    request = mock.Mock(spec=Request, label="runnerctl-1-x", time_limit_s=60, nodes=1, gpus=1, options=[],
                        log=Path("/nonexistent/log"), wrapper=Path("/nonexistent/w"), env={},
                        workdir=Path("/"), runas={})
    for stderr, error in [("qsub: cannot connect to server pbs1 (errno=111)", SystemFailure),
                          ("qsub: Unknown queue", Refused)]:
        with mock.patch.object(pbs, "run_command", return_value=subprocess.CompletedProcess(
                [], 1, stdout="", stderr=stderr)), pytest.raises(error):
            pbs.Pbs().submit(request)


def test_a_pbs_job_no_mom_will_run_fails_at_once_as_the_clusters_failure(
        host: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job the server held after its MoMs refused it over 20 times (a failing prologue
    hook; src/server/req_runjob.c check_failed_attempts) waits for an administrator: the
    stage waited until GitLab's timeout. It is deleted and the stage fails at once, as a
    system failure (the cluster's, not the job's)."""
    from tests.fakes.pbs import MOM_REJECTS

    _stand_in(monkeypatch, tmp_path, "pbs")
    monkeypatch.setenv(MOM_REJECTS, "1")
    h = batch_acceptance.harness(host, CLUSTERS["pbs"], (0,))
    build = h.run_job(FakeJob(id=934), "echo should-not-run", timeout=600)["build_script"]
    assert "too many failed attempts to run" in build.output and "should-not-run" not in build.output
    assert h.outcomes[934].failure_reason == "runner_system_failure", build.output
    from tests.fakes import batch_engine

    jobs = batch_engine.all_jobs()
    assert jobs and all(job["state"] == "done" for job in jobs), jobs  # deleted, not left held


@pytest.mark.parametrize(("record", "code", "failure"), [
    ({"STATE": "EXT", "EXIT CODE": "0", "PJM CODE": "0", "SIGNAL NO": "-"}, 0, None),
    ({"STATE": "EXT", "EXIT CODE": "3", "PJM CODE": "0", "SIGNAL NO": "-"}, 3, None),
    ({"STATE": "EXT", "EXIT CODE": "0", "PJM CODE": "0", "SIGNAL NO": "9"}, 137, None),  # never a pass
    ({"STATE": "EXT", "EXIT CODE": "0", "PJM CODE": "11", "SIGNAL NO": "24"}, 152, None),  # past its elapse
    ({"STATE": "EXT", "EXIT CODE": "-", "PJM CODE": "12", "SIGNAL NO": "-"}, 1, None),  # past its memory
    ({"STATE": "CCL", "EXIT CODE": "-", "PJM CODE": "1", "SIGNAL NO": "-"}, None, "was cancelled"),
    ({"STATE": "RJT", "EXIT CODE": "-", "PJM CODE": "0", "SIGNAL NO": "-"}, None, "ended RJT"),
    ({"STATE": "EXT", "EXIT CODE": "0", "PJM CODE": "20", "SIGNAL NO": "-"}, None, "PJM CODE 20"),
])
def test_pjm_outcomes_from_the_fields_pjstat_prints(record: dict[str, str], code: int | None,
                                                    failure: str | None) -> None:
    """`pjstat -H -s` names the state STATE (Fujitsu's Command Reference); read as "JOB
    STATE", every job on a real PJM ended "unknown", a system failure (found by a review
    as a PJM user). A signal never passes; PJM CODE 11/12/23 (the job's own elapse or
    memory limit) are build failures, as Slurm's TIMEOUT and OUT_OF_MEMORY."""
    from unittest import mock

    from runnerctl.executors import pjm

    shown = " [Job Statistical Information]\n" + "".join(f" {k:<28}: {v}\n" for k, v in record.items())
    with mock.patch.object(pjm, "run_command", return_value=subprocess.CompletedProcess([], 0, stdout=shown,
                                                                                       stderr="")):
        outcome = pjm.Pjm().outcome("7")
    assert outcome.code == code
    assert (outcome.failure is None) if failure is None else (failure in (outcome.failure or ""))


def test_pjm_tells_a_job_manager_that_cannot_take_jobs_from_a_refused_request() -> None:
    from unittest import mock

    from runnerctl.executors import pjm
    from runnerctl.executors.batch import Refused, Request
    from runnerctl.executors.driver import SystemFailure

    request = mock.Mock(spec=Request, label="runnerctl-1-x", time_limit_s=60, nodes=1, gpus=1, options=[],
                        log=Path("/l"), wrapper=Path("/w"), env={}, workdir=Path("/"), runas={})
    for stderr, error in [("[ERR.] PJM 0090 pjsub PJM daemon is not present.", SystemFailure),
                          ("[ERR.] PJM 0057 pjsub gpu=9 is greater than the upper limit (8).", Refused)]:
        with mock.patch.object(pjm, "run_command", return_value=subprocess.CompletedProcess(
                [], 1, stdout="", stderr=stderr)), pytest.raises(error):
            pjm.Pjm().submit(request)


def test_a_pjm_job_in_err_state_fails_at_once_as_the_clusters_failure(
        host: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ERR (stopped by an error PJM detected) is a fixed state: the job waits for ever. It is
    deleted and the stage fails at once as a system failure (found by a review as a PJM
    user); its name, cut to 10 characters in pjstat, is found with --filter."""
    from tests.fakes import batch_engine
    from tests.fakes.pjm import PJM_ERROR

    _stand_in(monkeypatch, tmp_path, "pjm")
    monkeypatch.setenv(PJM_ERROR, "1")
    h = batch_acceptance.harness(host, CLUSTERS["pjm"], (0,))
    build = h.run_job(FakeJob(id=935), "echo should-not-run", timeout=600)["build_script"]
    assert "ERR state" in build.output and "should-not-run" not in build.output, build.output
    assert h.outcomes[935].failure_reason == "runner_system_failure", build.output
    jobs = batch_engine.all_jobs()
    assert jobs and all(job["state"] == "done" for job in jobs), jobs
