"""The files a batch job writes back (its output, the GPU set it got) are read by the
driver as root on the runner host: a job that replaces one with a link or a device must
not make the driver copy another file, or endless bytes, into the job log. The scripts
and output sit in a directory only the submitting user reads. The job's own variables
(RUNNERCTL_NODES, SCHEDULER_PARAMETERS, its timeout) that make no sense are the job's
error in one line, never a traceback."""

from __future__ import annotations

import os
import subprocess
import types
from pathlib import Path
from typing import Any

import pytest

from runnerctl.executors import batch
from runnerctl.executors.apptainer import run_line
from runnerctl.executors.batch import (
    BadParameters,
    Outcome,
    _gpus_written,
    _Paths,
    _stream,
    stage_code,
    time_limit,
)
from runnerctl.executors.driver import SystemFailure
from runnerctl.executors.pbs import scheduler_parameters as pbs_parameters
from runnerctl.executors.pjm import scheduler_parameters as pjm_parameters
from runnerctl.executors.rendezvous import BadNodes, nodes_requested
from runnerctl.executors.sge import scheduler_parameters as sge_parameters
from runnerctl.executors.slurm import scheduler_parameters as slurm_parameters


def test_the_output_is_streamed_from_where_it_stopped(tmp_path: Path,
                                                      capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    out = tmp_path / "job.out"
    out.write_bytes(b"epoch 1\n")
    assert _stream(out, 0) == 8
    with out.open("ab") as handle:
        handle.write(b"epoch 2\n")
    assert _stream(out, 8) == 16 and _stream(tmp_path / "absent.out", 5) == 5
    assert capfdbinary.readouterr().out == b"epoch 1\nepoch 2\n"


def test_a_link_or_a_device_in_place_of_the_output_is_not_read(
        tmp_path: Path, capfdbinary: pytest.CaptureFixture[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch, "_REFUSED", set())  # one stage per process: nothing refused before
    secret = tmp_path / "config.toml"
    secret.write_text('token = "glrt-secret"\n')
    (tmp_path / "job.out").symlink_to(secret)
    (tmp_path / "zero.out").symlink_to("/dev/zero")
    (tmp_path / "job.gpus").symlink_to(secret)
    assert _stream(tmp_path / "job.out", 0) == 0 and _stream(tmp_path / "zero.out", 0) == 0
    assert _stream(Path("/dev/zero"), 0) == 0
    assert _gpus_written(tmp_path / "job.gpus") is None
    assert _stream(tmp_path / "job.out", 0) == 0
    out = capfdbinary.readouterr().out
    assert b"glrt" not in out
    assert out.splitlines() == [  # said in the job log, once each
        b"runnerctl: not reading job.out: the batch job made it a link",
        b"runnerctl: not reading zero.out: the batch job made it a link",
        b"runnerctl: not reading zero: the batch job made it no regular file",
        b"runnerctl: not reading job.gpus: the batch job made it a link"]
    (tmp_path / "real.gpus").write_text("2,3\n")
    assert _gpus_written(tmp_path / "real.gpus") == "2,3"


def test_the_batch_files_directory_is_the_submitting_users_alone(tmp_path: Path) -> None:
    work = tmp_path / "builds" / ".runnerctl"
    work.mkdir(parents=True, mode=0o755)
    paths = _Paths(work, "901-build_script")
    assert os.stat(paths.work).st_mode & 0o777 == 0o700


def test_a_stage_file_that_cannot_be_removed_is_said_and_changes_no_result(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The removal runs in `BatchDriver.run`'s `finally`: an unlink that raised there
    replaced the stage's exit code with a traceback. Now each file that can go goes, and
    the one that cannot is named in the job's log."""
    paths = _Paths(tmp_path / ".runnerctl", "902-build_script")
    for name in ("copy", "output", "rc"):
        paths.write(getattr(paths, name), b"CI_JOB_TOKEN=secret\n")
    paths.log.mkdir()  # not a file: unlink fails (EISDIR) as it would on a read-only share
    (paths.log / "kept").write_text("x")
    paths.remove()
    assert not paths.copy.exists() and not paths.output.exists() and not paths.rc.exists()
    said = capsys.readouterr().err
    assert "could not remove 902-build_script.log (" in said and said.count("\n") == 1
    batch._remove_job_files(tmp_path / ".runnerctl", "902")
    assert "could not remove 902-build_script.log" not in capsys.readouterr().err  # a directory: left alone
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    batch._remove_job_files(not_a_dir, "902")
    assert f"could not list {not_a_dir} to remove job 902's batch files" in capsys.readouterr().err
    batch._remove_job_files(tmp_path / "absent", "902")
    assert capsys.readouterr().err == ""


def test_a_long_job_is_asked_of_its_scheduler_rarely_and_its_end_seen_soon(tmp_path: Path) -> None:
    """squeue or qstat every half second for the whole job: about 170,000 calls a day per
    job against the site's controller (found by a review as a researcher running
    multi-day jobs). Every POLL_S for the first minute, then every STATE_EVERY_S, and at
    once when the script's exit code appears; the output is read every POLL_S all along."""
    now = [0.0]
    asked: list[float] = []
    paths = _Paths(tmp_path / ".runnerctl", "904-build_script")

    class Scheduler:
        name = "slurm"

        def active(self, job_id: str) -> bool:
            asked.append(now[0])
            return now[0] < ends[0]

        def never_runs(self, job_id: str) -> None:
            return None

    def sleep(seconds: float) -> None:
        now[0] += seconds
        if now[0] >= ends[0] and not paths.rc.exists():
            paths.write(paths.rc, b"0\n")  # the wrapper's last word, then the scheduler's

    ends = [3600.0]  # an hour: a week would only take longer
    driver = batch.BatchDriver(Scheduler())  # type: ignore[arg-type]
    assert driver._follow("77", paths, lambda gpus: None, clock=lambda: now[0], sleep=sleep) is None
    assert len(asked) < 60 / batch.POLL_S + 3600 / batch.STATE_EVERY_S + 5  # about 480, not 7200
    assert now[0] - ends[0] <= 2 * batch.POLL_S  # the exit code: seen at once, not 10 s on
    assert asked[:3] == [0.0, 0.5, 1.0] and asked[-2] - asked[-3] == batch.STATE_EVERY_S


@pytest.mark.parametrize("raw", ["two", "0", "²", "٣", "1" * 5000, "10001", "-1"])
def test_a_job_asking_for_no_sane_number_of_nodes_is_told_so(raw: str) -> None:
    with pytest.raises(BadNodes, match="is not a number of nodes"):
        nodes_requested({"CUSTOM_ENV_RUNNERCTL_NODES": raw})
    assert nodes_requested({"CUSTOM_ENV_RUNNERCTL_NODES": " 4 "}) == 4 and nodes_requested({}) == 1


def test_the_time_limit_is_the_payloads_timeout_not_the_jobs_variable() -> None:
    """A job's own CI_JOB_TIMEOUT variable comes after gitlab-runner's in the stage's
    environment and replaced it (found by a review as a gitlab-runner maintainer)."""
    assert time_limit({"CUSTOM_ENV_CI_JOB_TIMEOUT": "5"}, 3600) == 3600
    assert time_limit({}, None) is None and time_limit({}, 0) is None


@pytest.mark.parametrize(("env", "stage", "limit"), [
    ({"CI_JOB_TIMEOUT": "7200"}, "after_script", 300),  # gitlab-runner's own 5 minutes
    ({"CI_JOB_TIMEOUT": "120"}, "after_script", 120),  # never over the job's timeout
    ({}, "after_script", 300),
    ({"CI_JOB_TIMEOUT": "7200", "RUNNER_AFTER_SCRIPT_TIMEOUT": "10m"}, "after_script", 600),
    ({"CI_JOB_TIMEOUT": "7200", "RUNNER_AFTER_SCRIPT_TIMEOUT": "1.5m30s"}, "after_script", 120),
    ({"CI_JOB_TIMEOUT": "7200", "RUNNER_AFTER_SCRIPT_TIMEOUT": "ten"}, "after_script", 300),  # ignored
    ({"CI_JOB_TIMEOUT": "7200", "RUNNER_AFTER_SCRIPT_TIMEOUT": "0"}, "after_script", 300),
    ({"CI_JOB_TIMEOUT": "7200", "RUNNER_SCRIPT_TIMEOUT": "15m"}, "build_script", 900),
    ({"CI_JOB_TIMEOUT": "7200", "RUNNER_SCRIPT_TIMEOUT": "15m"}, "step_train", 900),
    ({"CI_JOB_TIMEOUT": "600", "RUNNER_SCRIPT_TIMEOUT": "2h"}, "build_script", 600),
    ({"CI_JOB_TIMEOUT": "3600", "RUNNER_AFTER_SCRIPT_TIMEOUT": "2h"}, "after_script", 300),  # the default
    ({"RUNNER_SCRIPT_TIMEOUT": "90s"}, "build_script", 90),
    ({"CI_JOB_TIMEOUT": "7200", "RUNNER_SCRIPT_TIMEOUT": "-5m"}, "build_script", 7200),  # ignored
    ({"CI_JOB_TIMEOUT": "7200", "RUNNER_SCRIPT_TIMEOUT": "500ms"}, "build_script", 1),  # whole seconds
    ({"CI_JOB_TIMEOUT": "7200"}, "build_script", 7200),
])
def test_each_stage_asks_for_the_limit_gitlab_runner_gives_it(env: dict[str, str], stage: str,
                                                              limit: int) -> None:
    env = dict(env)
    job = int(env.pop("CI_JOB_TIMEOUT")) if "CI_JOB_TIMEOUT" in env else None
    assert time_limit({f"CUSTOM_ENV_{k}": v for k, v in env.items()}, job, stage) == limit


@pytest.mark.parametrize("scheduler", [slurm_parameters, sge_parameters, pbs_parameters, pjm_parameters])
def test_scheduler_parameters_with_an_unclosed_quote_are_the_jobs_error(scheduler: Any) -> None:
    with pytest.raises(BadParameters, match="SCHEDULER_PARAMETERS cannot be split into words"):
        scheduler("--partition 'gpu")


@pytest.mark.parametrize("image", ["x'; touch {marker}; echo '", "a\nb; touch {marker}"])
def test_an_image_name_is_only_ever_text_in_the_wrapper(tmp_path: Path, image: str) -> None:
    """Without apptainer on the node the wrapper says so, naming the image: as text, so
    a quote or newline in the job's `image:` runs nothing."""
    marker = tmp_path / "ran"
    line = run_line(image=image.format(marker=marker), script=tmp_path / "s.sh", binds=(str(tmp_path),),
                    guard="", started=tmp_path / "started")
    done = subprocess.run(["bash", "-c", "command() { return 1; }\n" + line + 'echo "rc=$rc"'],
                          capture_output=True, text=True, check=False)
    assert done.stdout.endswith("needs apptainer or singularity on this node\nrc=127\n"), done
    assert not marker.exists()


@pytest.mark.parametrize(("outcome", "own", "reserved", "code", "failure"), [
    (Outcome(0), 0, (), 0, None),
    (Outcome(0), None, (), 0, None),  # a scheduler whose record is the job's own
    (Outcome(0), 3, (), 3, None),  # a task's or an older job's record: never a pass
    (Outcome(0, confirm=True), 0, (), 0, None),
    (Outcome(0, confirm=True), None, (), None, "wrote no exit code"),  # killed before it said
    (Outcome(3), 3, (), 3, None),
    (Outcome(1), 99, (99, 100), 99, None),  # the wrapper masked a code the scheduler acts on
    (Outcome(1), 99, (), 1, None),
    (Outcome(None, "was cancelled"), 0, (), None, "was cancelled"),
])
def test_a_stage_passes_only_when_the_record_and_the_scripts_own_code_agree(
        outcome: Outcome, own: int | None, reserved: tuple[int, ...], code: int | None,
        failure: str | None) -> None:
    """(found by reviews as a Grid Engine admin and of the day's changes: a parallel task's
    record of 0, read before the job's own, passed a failed job)"""
    scheduler = types.SimpleNamespace(title="Grid Engine", reserved_exits=reserved)
    if failure is not None:
        with pytest.raises(SystemFailure, match=failure):
            stage_code(scheduler, "7", outcome, own)  # type: ignore[arg-type]
    else:
        assert stage_code(scheduler, "7", outcome, own) == code  # type: ignore[arg-type]
