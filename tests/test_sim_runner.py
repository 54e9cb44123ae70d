"""`runnerctl sim runner`: gitlab-runner's rules, against runnerctl's real custom executor.

The stage driver (runnerctl/sim/runner_build.py) runs `python -m runnerctl.executors`
with the shell driver on a simulated 8-GPU host, from a job JSON shaped as GitLab's.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from runnerctl.executors.contract import DriverArgs, parse_duration
from runnerctl.executors.lease import LeaseTable
from runnerctl.sim.runner_build import Build
from runnerctl.sim.runner_exec import Ctx, classify, run_command
from runnerctl.sim.runner_script import ScriptInfo, generate
from runnerctl.sim.runner_toml import load_system_id
from runnerctl.sim.runner_trace import LocalTrace
from tests.harness_custom_executor import (
    FakeJob,
    Harness,
    harness_for,
    make_host,
    runner_entry,
    write_runner_config,
)
from tests.sim_runner_process import RunnerProcess, StubGitLab

SUCCESS_ORDER = ["config", "prepare", "prepare_script", "get_sources", "restore_cache", "build_script",
                 "after_script", "archive_cache", "upload_artifacts_on_success", "cleanup_file_variables",
                 "cleanup"]
FAILURE_ORDER = ["config", "prepare", "prepare_script", "get_sources", "restore_cache", "build_script",
                 "after_script", "archive_cache_on_failure", "upload_artifacts_on_failure",
                 "cleanup_file_variables", "cleanup"]
AFTER = ['echo "status=$CI_JOB_STATUS tmp=$TMPDIR pwd=$(pwd)"']
STORE: dict[str, Any] = {"cache_paths": ["cache/"], "artifact_paths": ["out/"]}  # cache and upload stages run


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return make_host(tmp_path, gate_wait_s=1)


def _names(harness: Harness, job_id: int) -> list[str]:
    return [name for name, _ in harness.commands[job_id]]


def _after(harness: Harness, job_id: int) -> dict[str, str]:
    line = next(x for x in harness.traces[job_id].splitlines() if x.startswith("status="))
    return dict(part.split("=", 1) for part in line.split())


def test_jobs_run_every_stage_in_order_each_with_its_own_tmpdir(host: Path) -> None:
    harness = harness_for(host, (0,), "shell")
    for job_id in (11, 12):
        harness.run_job(FakeJob(id=job_id, after_script=AFTER, **STORE), 'echo "cuda=$CUDA_VISIBLE_DEVICES"')
        assert harness.outcomes[job_id].state == "success", harness.traces[job_id]
        assert _names(harness, job_id) == SUCCESS_ORDER
        assert all(code == 0 for _, code in harness.commands[job_id])
    first, second = _after(harness, 11), _after(harness, 12)
    assert first["status"] == "success"
    assert first["tmp"] != second["tmp"] and Path(first["tmp"]).name.startswith("custom-executor")
    assert not Path(first["tmp"]).exists() and not Path(second["tmp"]).exists()  # removed after cleanup
    assert first["pwd"].endswith("/ml/experiments")  # the job's project directory
    assert "cuda=0" in harness.traces[11]
    assert LeaseTable(host / "state").all() == []


def test_failed_step_still_runs_after_script_failure_stages_and_cleanup(host: Path) -> None:
    harness = harness_for(host, (1,), "shell")
    harness.run_job(FakeJob(id=21, after_script=AFTER, **STORE),
                    "if read line; then echo got-stdin; else echo no-stdin; fi; exit 7")
    outcome = harness.outcomes[21]
    assert (outcome.state, outcome.failure_reason, outcome.exit_code) == ("failed", "script_failure", 7)
    assert _names(harness, 21) == FAILURE_ORDER
    assert _after(harness, 21)["status"] == "failed"
    assert "no-stdin" in harness.traces[21]  # the user's script reads /dev/null
    assert LeaseTable(host / "state").all() == []


def test_prepare_system_failure_is_retried_three_times_each_with_cleanup(host: Path) -> None:
    colleague = subprocess.Popen(["sleep", "120"], user="nobody")
    try:
        (host / "gpus.yaml").write_text(
            f"host: gpu-a\ngpus: 8\nprocesses:\n  - {{gpu: 2, pid: {colleague.pid}}}\n")
        harness = harness_for(host, (2,), "shell")
        started = time.monotonic()
        harness.run_job(FakeJob(id=31), "echo never", timeout=300)  # three tries' waits fit, loaded too
        elapsed = time.monotonic() - started
    finally:
        colleague.kill()
        colleague.wait()
    assert harness.commands[31] == [("config", 0), ("prepare", 2), ("cleanup", 0)] * 3
    assert harness.outcomes[31].failure_reason == "runner_system_failure"
    # build.go retryCreateExecutor waits its 3 s after the last try too
    assert harness.traces[31].count("Will be retried in 3s") == 3
    assert elapsed >= 3 * 3 + 3 * 1  # three 3 s pauses and three 1 s gate waits
    assert LeaseTable(host / "state").all() == []


def test_cancel_stops_the_step_then_after_script_and_cleanup_still_run(host: Path) -> None:
    harness = harness_for(host, (3,), "shell")
    mark = host / "started"
    cancel = threading.Event()
    job = threading.Thread(target=harness.run_job, args=(
        FakeJob(id=41, after_script=AFTER, **STORE), f"touch {mark}; sleep 300"), kwargs={"cancel": cancel})
    job.start()
    deadline = time.monotonic() + 60
    while not mark.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mark.exists()
    cancel.set()  # GitLab answered Job-Status: canceling
    job.join(timeout=60)
    assert not job.is_alive()
    assert _names(harness, 41) == FAILURE_ORDER
    assert _after(harness, 41)["status"] == "canceled"
    assert harness.outcomes[41].state == "failed"
    assert harness.outcomes[41].failure_reason == "unknown_failure"  # job_canceled: not a GitLab reason
    assert "script canceled externally" in harness.traces[41]


def test_job_timeout_kills_the_step_and_skips_to_cleanup(host: Path) -> None:
    harness = harness_for(host, (4,), "shell")
    started = time.monotonic()
    harness.run_job(FakeJob(id=51, after_script=AFTER), "sleep 300", timeout=30)  # the stages before fit
    assert time.monotonic() - started < 200  # not the script's 300 s
    assert harness.outcomes[51].failure_reason == "job_execution_timeout"
    names = _names(harness, 51)
    assert names[-2:] == ["build_script", "cleanup"]  # no after_script: the job's context is over
    assert LeaseTable(host / "state").all() == []


def test_a_stage_timeout_longer_than_the_job_keeps_the_default(host: Path) -> None:
    """build.go getStageTimeoutContexts: RUNNER_*_TIMEOUT over the time the job has left is
    ignored with a warning (the default stays: none for the script, 5 minutes after it);
    one inside it is used."""
    harness = harness_for(host, (4,), "shell")
    long = {"RUNNER_SCRIPT_TIMEOUT": "2h", "RUNNER_AFTER_SCRIPT_TIMEOUT": "3h"}
    harness.run_job(FakeJob(id=52, variables=long), "true", timeout=600)
    trace = harness.traces[52]
    assert "RUNNER_SCRIPT_TIMEOUT timeout: 2h is longer than job timeout" in trace
    assert "RUNNER_AFTER_SCRIPT_TIMEOUT timeout: 3h is longer than job timeout" in trace
    harness.run_job(FakeJob(id=53, variables={"RUNNER_SCRIPT_TIMEOUT": "2s"}), "sleep 60", timeout=600)
    assert harness.outcomes[53].failure_reason == "job_execution_timeout"  # the 2 s, not the job's 600
    assert "longer than job timeout" not in harness.traces[53]


def test_stage_scripts_are_wrapped_as_bash_go_writes_them() -> None:
    info = ScriptInfo(variables=(), project_dir="/b/p", hostname="h",
                      steps=({"name": "script", "script": ["make test"]},))
    script = generate("step_script", info)
    assert script is not None
    lines = script.splitlines()
    assert lines[0] == "#!/usr/bin/env bash" and lines[2] == "trap 'exit 1' TERM"
    assert re.search(r"^\(trap 'exit 1' TERM; eval '.*'\) < /dev/null$", script, re.M | re.S)
    assert lines[-1] == "exit 0"
    assert generate("after_script", info) is None  # no after_script: gitlab-runner skips the stage
    assert generate("restore_cache", info) is None  # no cache paths
    assert generate("upload_artifacts_on_success", info) is None


def test_sigterm_ends_a_wrapped_script_with_exit_1(tmp_path: Path) -> None:
    info = ScriptInfo(variables=(), project_dir=str(tmp_path), hostname="h",
                      steps=({"name": "script", "script": ["sleep 30"]},))
    path = tmp_path / "script"
    path.write_text(generate("step_script", info) or "")
    proc = subprocess.Popen(["bash", str(path)], process_group=0)
    deadline = time.monotonic() + 120

    def named(child: psutil.Process) -> str:
        try:
            return child.name()
        except psutil.NoSuchProcess:  # a short-lived child of the script ended as it was listed
            return ""

    while not any(named(c) == "sleep" for c in psutil.Process(proc.pid).children(recursive=True)):
        assert time.monotonic() < deadline, "the script never reached its step"
        time.sleep(0.05)  # bash has set its traps once the step runs
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=10) == 1


def test_failure_reasons_are_mapped_to_what_gitlab_lists() -> None:
    job = {"features": {"failure_reasons": ["script_failure", "unknown_failure"]}}
    runner = runner_entry(DriverArgs("runnerctl/gpu-a/gpu0", (0,), "sim:8", "/none", "shell"))
    build = Build(job, runner, trace=LocalTrace())
    assert build.map_reason("runner_configuration_error") == "script_failure"
    assert build.map_reason("image_pull_failure") == "runner_system_failure"
    assert build.map_reason("job_canceled") == "unknown_failure"
    assert build.map_reason("job_execution_timeout") == "job_execution_timeout"


def test_masked_variables_never_reach_the_trace() -> None:
    job = {"variables": [{"key": "CI_JOB_TOKEN", "value": "glcbt-secret-123", "masked": True},
                         {"key": "LR", "value": "0.1", "masked": False}]}
    trace = LocalTrace()
    runner = runner_entry(DriverArgs("runnerctl/gpu-a/gpu0", (0,), "sim:8", "/none", "shell"))
    Build(job, runner, trace=trace).trace.write("token=glcbt-secret-123 lr=0.1\n")
    assert trace.text() == "token=[MASKED] lr=0.1\n"


def test_go_durations() -> None:
    assert parse_duration("1h30m") == 5400 and parse_duration("90s") == 90 and parse_duration("0") == 0
    assert parse_duration("10") is None and parse_duration("-5s") is None
    # full-width digits (a Japanese IME): Go's ParseDuration refuses them, and gitlab-runner
    # keeps the job's timeout, so a batch job limited to 1 h by "１h" was killed early
    assert parse_duration("１h") is None and parse_duration("1h３0m") is None


# -- the process: config.toml, polling, reporting, signals (against a stub of GitLab's runner API) --


@pytest.fixture
def stub() -> Iterator[StubGitLab]:
    gitlab = StubGitLab()
    yield gitlab
    gitlab.server.shutdown()


def test_runner_polls_runs_reports_and_stops_on_sigquit_after_its_jobs(stub: StubGitLab,
                                                                      tmp_path: Path) -> None:
    config = write_runner_config(tmp_path, stub.url, [{"token": "glrt-aaaa", "limit": 1},
                                          {"token": "glrt-bbbb", "request_concurrency": 1}])
    stub.enqueue("glrt-aaaa", 101, 'echo "hello from $CI_JOB_ID"')
    stub.enqueue("glrt-aaaa", 102, "sleep 2; exit 3")
    runner = RunnerProcess(config)
    try:
        assert stub.wait(101, ("success",))["state"] == "success"
        failed = stub.wait(102, ("success", "failed"))
        assert (failed["state"], failed["failure_reason"], failed["exit_code"]) == (
            "failed", "script_failure", 3)
        stub.enqueue("glrt-bbbb", 103, "sleep 5")
        stub.wait(103, ("running",))
        runner.wait_line(r"job 103 started")
        assert runner.stop(signal.SIGQUIT) == 0  # graceful: job 103 finishes
    finally:
        runner.kill()
    stderr = runner.stderr
    assert stub.jobs[103]["state"] == "success", stderr
    assert b"hello from 101" in stub.jobs[101]["trace"]
    assert stub.max_running["glrt-aaaa"] == 1  # limit = 1
    assert stub.max_in_flight["glrt-bbbb"] == 1  # request_concurrency = 1
    system_id = (tmp_path / ".runner_system_id").read_text()
    assert re.fullmatch(r"[sr]_[0-9a-zA-Z]{12}", system_id)
    assert {r["system_id"] for r in stub.requests} == {system_id}
    assert all(r["info"]["executor"] == "custom" and r["info"]["features"]["cancel_gracefully"]
               for r in stub.requests)
    for job_id in (101, 102, 103):
        assert len(re.findall(rf"^runnerctl sim runner: job {job_id} started", stderr, re.M)) == 1, stderr
        assert len(re.findall(rf"^runnerctl sim runner: job {job_id} ended", stderr, re.M)) == 1, stderr


def test_canceling_runs_after_script_then_reports(stub: StubGitLab, tmp_path: Path) -> None:
    config = write_runner_config(tmp_path, stub.url, [{"token": "glrt-cccc"}])
    stub.enqueue("glrt-cccc", 201, "sleep 300", after=["echo after_script saw $CI_JOB_STATUS"])
    runner = RunnerProcess(config)
    try:
        stub.wait_trace(201, b"$ sleep 300")
        with stub.lock:
            stub.jobs[201]["state"] = "canceling"  # POST /projects/:id/jobs/:id/cancel
        job = stub.wait(201, ("canceled",), timeout_s=90)  # a quiet job is touched every 30 s
        assert b"after_script saw canceled" in job["trace"]
        runner.wait_line(r"job 201: GitLab asks to cancel it")
        assert runner.stop(signal.SIGTERM) == 0
    finally:
        runner.kill()


def test_config_reload_and_sigterm_aborts_running_jobs(stub: StubGitLab, tmp_path: Path) -> None:
    config = write_runner_config(tmp_path, stub.url, [{"token": "glrt-dddd"}], concurrent=1)
    runner = RunnerProcess(config)
    try:
        runner.wait_line(r"loaded .*concurrent=1, 1 runner")
        text = config.read_text()
        time.sleep(0.01)  # a later mtime
        config.write_text(text.replace('executor = "custom"', 'executor = "docker"'))
        runner.wait_line(r"failed to load config: .*uses executor 'docker'")  # refused, still running
        write_runner_config(tmp_path, stub.url, [{"token": "glrt-dddd"}, {"token": "glrt-eeee"}],
                            concurrent=2)
        runner.wait_line(r"configuration reloaded: concurrent=2, 2 runner")
        stub.enqueue("glrt-eeee", 301, "sleep 300")
        stub.wait(301, ("running",), timeout_s=30)  # the new runner asks for jobs
        runner.wait_line(r"job 301 started")
        assert runner.stop(signal.SIGTERM) == 0  # forceful: the running job is aborted, cleanup runs
    finally:
        runner.kill()
    aborted = stub.jobs[301]
    # runner_interrupted, which GitLab does not list in features.failure_reasons
    assert (aborted["state"], aborted["failure_reason"]) == ("failed", "unknown_failure")
    assert LeaseTable(tmp_path / "host" / "state").all() == []


def test_sigterm_after_sigquit_aborts_the_jobs_and_cleans_up(stub: StubGitLab, tmp_path: Path) -> None:
    """multi.go: a signal other than SIGQUIT during a graceful shutdown turns it forceful
    (abort the jobs, cleanup_exec, wait up to shutdown_timeout); a SIGQUIT again goes on
    waiting. The stand-in exited at once on any second signal, leaving the job running in
    GitLab and its lease behind (found by a review of cancellation)."""
    config = write_runner_config(tmp_path, stub.url, [{"token": "glrt-ffff"}], concurrent=1)
    runner = RunnerProcess(config)
    try:
        stub.enqueue("glrt-ffff", 401, "sleep 300")
        stub.wait(401, ("running",), timeout_s=30)
        runner.wait_line(r"job 401 started")
        runner.proc.send_signal(signal.SIGQUIT)
        runner.wait_line(r"SIGQUIT: graceful shutdown")
        runner.proc.send_signal(signal.SIGQUIT)  # still waiting
        deadline = time.monotonic() + 60
        while runner.stderr.count("SIGQUIT: graceful shutdown") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert runner.stderr.count("SIGQUIT: graceful shutdown") == 2 and runner.proc.poll() is None
        assert runner.stop(signal.SIGTERM) == 0
    finally:
        runner.kill()
    aborted = stub.jobs[401]
    assert (aborted["state"], aborted["failure_reason"]) == ("failed", "unknown_failure"), runner.stderr
    assert "forced exit" not in runner.stderr
    assert LeaseTable(tmp_path / "host" / "state").all() == []


def test_concurrent_bounds_the_jobs_of_all_runners(stub: StubGitLab, tmp_path: Path) -> None:
    config = write_runner_config(tmp_path, stub.url, [{"token": "glrt-ffff"}, {"token": "glrt-gggg"}],
                                 concurrent=1)
    stub.enqueue("glrt-ffff", 401, "sleep 2")
    stub.enqueue("glrt-gggg", 402, "sleep 2")
    runner = RunnerProcess(config)
    try:
        for job_id in (401, 402):
            assert stub.wait(job_id, ("success", "failed"))["state"] == "success"
        assert runner.stop(signal.SIGTERM) == 0
    finally:
        runner.kill()
    assert stub.max_total_running == 1  # one worker: one job at a time, whichever runner


def test_a_runner_refused_three_times_is_left_out(stub: StubGitLab, tmp_path: Path) -> None:
    stub.forbidden.add("glrt-gone")  # deleted in GitLab
    config = write_runner_config(tmp_path, stub.url, [{"token": "glrt-gone"}, {"token": "glrt-here"}])
    runner = RunnerProcess(config)

    def asked(token: str) -> int:
        with stub.lock:
            return sum(1 for r in stub.requests if r["token"] == token)

    try:
        runner.wait_line(r"runner runnerctl/gpu-a/gpu0 is unhealthy after 3 failed job requests")
        refused, healthy = asked("glrt-gone"), asked("glrt-here")
        deadline = time.monotonic() + 120
        while asked("glrt-here") < healthy + 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert asked("glrt-here") >= healthy + 4  # the other runner goes on asking
        assert asked("glrt-gone") == refused == 3  # this one is left out (for an hour)
        assert runner.stop(signal.SIGTERM) == 0
    finally:
        runner.kill()


def test_a_stage_ignoring_sigterm_is_sigkilled_after_graceful_kill_timeout() -> None:
    started = time.monotonic()
    codes: list[int | None] = []
    argv = ["bash", "-c", 'trap "" TERM; sleep 60 & wait']
    err = run_command(Ctx(timeout_s=5.0), argv, env=dict(os.environ), cwd="/", graceful_s=1.0,
                      force_s=5.0, stdout=lambda _: None, stderr=lambda _: None, on_exit=codes.append)
    assert time.monotonic() - started < 50  # not the script's 60 s: bash's trap is set by 5 s
    assert codes == [-signal.SIGKILL]
    assert err is not None and err.reason is None  # killed: not a build failure


def test_a_stage_ends_when_its_output_closes_not_when_its_shell_exits(tmp_path: Path) -> None:
    """Go's cmd.Wait returns once the output pipes close too (os/exec; helpers/process sets
    no WaitDelay): a process the stage left behind keeps it running. The stand-in gave up
    5 s after the shell's exit, which hid every leftover a driver did not stop (found by
    a review of cancellation). The leftover here writes once it is let go, 6 s on."""
    go = tmp_path / "go"
    out: list[str] = []
    timer = threading.Timer(6.0, go.touch)  # past the 5 s the stand-in waited before
    timer.start()
    try:
        err = run_command(Ctx(timeout_s=120.0), ["sh", "-c", f"(while [ ! -e {go} ]; do sleep 0.05; done; "
                                                            "echo late) & echo early"],
                          env=dict(os.environ), cwd="/", graceful_s=1.0, force_s=1.0, stdout=out.append,
                          stderr=out.append)
    finally:
        timer.cancel()
        go.touch()
    assert err is None and out == ["early\n", "late\n"]


def test_exit_codes_as_command_go_reads_them(tmp_path: Path) -> None:
    code_file = tmp_path / "build_exit_code"
    assert classify(0, str(code_file)) is None
    missing = classify(1, str(code_file))
    assert missing is not None and (missing.reason, missing.exit_code) == ("script_failure", 1)
    code_file.write_text("7\n")
    seven = classify(1, str(code_file))
    assert seven is not None and (seven.reason, seven.exit_code) == ("script_failure", 7)
    code_file.write_text("seven\n")
    assert (garbled := classify(1, str(code_file))) is not None and garbled.reason is None
    assert (system := classify(2, None)) is not None and system.reason is None
    assert (other := classify(3, None)) is not None and "unknown Custom executor" in str(other)


def test_system_id_is_kept_beside_config_toml(tmp_path: Path) -> None:
    first = load_system_id(tmp_path)
    assert re.fullmatch(r"[sr]_[0-9a-zA-Z]{12}", first)
    assert (tmp_path / ".runner_system_id").read_text() == first
    assert load_system_id(tmp_path) == first  # stable across restarts
    (tmp_path / ".runner_system_id").write_text("not an id")
    assert re.fullmatch(r"[sr]_[0-9a-zA-Z]{12}", load_system_id(tmp_path))


def test_job_failed_in_gitlab_is_aborted_without_after_script(stub: StubGitLab, tmp_path: Path) -> None:
    """Job-Status: failed on a trace PATCH (GitLab dropped the job) aborts the whole job."""
    config = write_runner_config(tmp_path, stub.url, [{"token": "glrt-hhhh"}])
    stub.enqueue("glrt-hhhh", 501, "while true; do echo tick; sleep 1; done",
                 after=["echo after_script ran"])
    runner = RunnerProcess(config)
    try:
        stub.wait_trace(501, b"tick")
        with stub.lock:
            stub.jobs[501]["state"] = "failed"  # e.g. stuck_or_timeout_failure, no_updates_running
        runner.wait_line(r"job 501 ended .*final update answered 403", timeout_s=60)
        assert runner.stop(signal.SIGTERM) == 0
    finally:
        runner.kill()
    assert b"after_script ran" not in stub.jobs[501]["trace"]
    assert LeaseTable(tmp_path / "host" / "state").all() == []  # cleanup_exec still ran
