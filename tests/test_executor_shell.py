"""The custom executor with the shell driver, driven as gitlab-runner drives it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from runnerctl.executors.lease import Lease, LeaseTable, environ_token
from tests.harness_custom_executor import (
    BUILD_FAILURE,
    SYSTEM_FAILURE,
    TERM_TRAP,
    FakeJob,
    Harness,
    harness_for,
    make_host,
)


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return make_host(tmp_path)


def _patient(host: Path) -> Path:
    """The host with a prepare that outwaits the other side's cleanup on a loaded machine."""
    return make_host(host, gate_wait_s=300)


def _harness(host: Path, gpus: tuple[int, ...]) -> Harness:
    return harness_for(host, gpus, "shell")


def _leases(host: Path) -> LeaseTable:
    return LeaseTable(host / "state")


def test_job_runs_on_its_gpu_even_when_it_asks_for_more(host: Path) -> None:
    harness = _harness(host, (5,))
    job = FakeJob(id=101, variables={"CUDA_VISIBLE_DEVICES": "0,1,2,3", "LR": "0.1"})
    results = harness.run_job(job, 'echo "cuda=$CUDA_VISIBLE_DEVICES lr=$LR lease=$RUNNERCTL_LEASE"')
    assert results["config"].code == 0 and '"builds_dir"' in results["config"].output
    assert results["prepare"].code == 0, results["prepare"].output
    build = results["build_script"]
    assert build.code == 0, build.output
    assert "cuda=5 lr=0.1 lease=101@runnerctl/gpu-a/gpu5:" in build.output  # + the lease's nonce
    assert "ignoring the job's CUDA_VISIBLE_DEVICES" in build.output
    assert results["cleanup"].code == 0
    assert _leases(host).all() == []


def test_failing_script_is_a_build_failure_with_its_code(host: Path) -> None:
    harness = _harness(host, (0,))
    results = harness.run_job(FakeJob(id=102), "exit 7")
    assert results["build_script"].code == BUILD_FAILURE
    outcome = harness.outcomes[102]
    assert (outcome.state, outcome.failure_reason, outcome.exit_code) == ("failed", "script_failure", 7)
    assert _leases(host).all() == []


def test_a_script_killed_by_a_signal_reports_128_plus_it(host: Path) -> None:
    """Popen gave -9 for a shell killed by SIGKILL (the OOM killer, say), written as is to
    BUILD_EXIT_CODE_FILE: GitLab showed "exit code -9". A shell reports 128 + the signal."""
    harness = _harness(host, (0,))
    results = harness.run_job(FakeJob(id=103), "kill -9 $$")
    assert results["build_script"].code == BUILD_FAILURE
    assert harness.outcomes[103].exit_code == 137


def test_run_without_prepare_is_a_system_failure(host: Path) -> None:
    harness = _harness(host, (1,))
    job = FakeJob(id=103)
    result = harness.stage("run", job, str(harness.script(job, "build_script", "true")),
                           "build_script")
    assert result.code == SYSTEM_FAILURE and "holds no lease" in result.output


def test_overlapping_job_waits_for_cleanup_then_starts(host: Path) -> None:
    host = _patient(host)
    first, second = _harness(host, (0, 1)), _harness(host, (1,))
    job_a, job_b = FakeJob(id=201), FakeJob(id=202)
    assert first.stage("prepare", job_a).code == 0
    waiting = second.start("prepare", job_b)
    assert {(lease.job_id, lease.user, lease.url) for lease in _leases(host).all()} == {
        ("201", "alice", "https://gitlab.example/ml/experiments/-/jobs/201")}  # who and where, for the page
    freed_at = time.time()
    assert first.stage("cleanup", job_a).code == 0
    out, _ = waiting.communicate(timeout=120)
    assert waiting.returncode == 0, out
    (lease,) = _leases(host).all()
    assert (lease.gpu, lease.job_id) == (1, "202")
    assert lease.created_at >= freed_at  # taken once job 201's cleanup began, however slow the start
    second.stage("cleanup", job_b)


def test_overlapping_job_fails_as_system_failure_when_lease_stays(host: Path) -> None:
    first, second = _harness(host, (2, 3)), _harness(host, (3,))
    assert first.stage("prepare", FakeJob(id=301, user="bob")).code == 0
    result = second.stage("prepare", FakeJob(id=302))
    assert result.code == SYSTEM_FAILURE
    assert "GPU 3 held by job 301 (bob)" in result.output
    first.stage("cleanup", FakeJob(id=301))


def test_foreign_process_makes_prepare_wait_then_fail_naming_it(host: Path) -> None:
    colleague = subprocess.Popen(["sleep", "600"], user="nobody")
    try:
        (host / "gpus.yaml").write_text(
            f"host: gpu-a\ngpus: 8\nprocesses:\n  - {{gpu: 4, pid: {colleague.pid}, memory: 3GiB}}\n")
        harness = _harness(host, (4,))
        started = time.monotonic()
        result = harness.stage("prepare", FakeJob(id=401))
        assert time.monotonic() - started >= 3  # waited gate_wait_s
        assert result.code == SYSTEM_FAILURE
        assert f"GPU 4 is used by pid {colleague.pid} of user nobody" in result.output
        assert _leases(host).all() == []  # the lease was given back
        assert colleague.poll() is None  # and nothing was signalled (S4)
    finally:
        colleague.kill()
        colleague.wait()


def test_a_lost_gpu_fails_prepare_at_once_and_gives_the_lease_back(host: Path) -> None:
    host = _patient(host)  # 300 s of gate: the failure must not wait for it
    (host / "gpus.yaml").write_text("host: gpu-a\ngpus:\n" + "".join(
        f"  - {{index: {i}{', lost: true' if i == 5 else ''}}}\n" for i in range(8)))
    started = time.monotonic()
    result = _harness(host, (4, 5)).stage("prepare", FakeJob(id=403))
    assert result.code == SYSTEM_FAILURE and time.monotonic() - started < 100
    assert ("GPU 5 fell off the bus (NVML: GPU is lost) (no job runs on a GPU that cannot be read or used)"
            in result.output)
    assert _leases(host).all() == []


def test_foreign_process_leaving_lets_the_job_start(host: Path) -> None:
    host = _patient(host)
    colleague = subprocess.Popen(["sleep", "60"], user="nobody")
    (host / "gpus.yaml").write_text(
        f"host: gpu-a\ngpus: 8\nprocesses:\n  - {{gpu: 6, pid: {colleague.pid}}}\n")
    harness = _harness(host, (6,))
    waiting = harness.start("prepare", FakeJob(id=402))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not _leases(host).held_by("402"):
        time.sleep(0.05)
    assert _leases(host).held_by("402") and waiting.poll() is None  # leased, and held at the gate
    # the colleague is done: written whole at once, as NVML answers (a gate reading the file
    # between a truncate and the write saw no GPU 6 and failed the job; a flaky run in CI)
    (host / "gpus.yaml.new").write_text("host: gpu-a\ngpus: 8\n")
    os.replace(host / "gpus.yaml.new", host / "gpus.yaml")
    colleague.kill()
    colleague.wait()
    out, _ = waiting.communicate(timeout=120)
    assert waiting.returncode == 0, out
    harness.stage("cleanup", FakeJob(id=402))


def test_driver_killed_mid_script_then_cleanup_leaves_nothing(host: Path) -> None:
    harness, job, lease, script = _prepared_sleeper(host, gpu=7, job_id=501)
    driver = harness.start("run", job, str(script), "build_script")
    assert _wait_for(lambda: bool(_job_processes(lease.token)))
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    assert harness.stage("cleanup", job).code == 0
    assert _wait_for(lambda: _job_processes(lease.token) == [])
    assert _leases(host).all() == []


def test_timeout_sigterm_stops_the_job_group(host: Path) -> None:
    harness = _harness(host, (0,))
    job = FakeJob(id=502)
    assert harness.stage("prepare", job).code == 0
    (lease,) = _leases(host).held_by("502")
    ready = host / "trap-set"  # the stop comes once the trap is set (a fixed 2 s raced it)
    script = harness.script(job, "build_script", f"{TERM_TRAP}; touch {ready}; sleep 300 & wait")
    result = harness.stage("run", job, str(script), "build_script", timeout=240, graceful=300,
                           stop_once=ready)
    assert result.code == BUILD_FAILURE
    assert "stopped by TERM" in result.output  # the driver's SIGTERM, not gitlab-runner's SIGKILL
    assert _job_processes(lease.token) == []
    harness.stage("cleanup", job)


def test_a_worker_that_outlives_the_stages_shell_is_stopped_before_the_stage_ends(host: Path) -> None:
    """gitlab-runner's `trap 'exit 1' TERM` ends a `worker & wait` script at once on a
    cancel. The SIGKILL for what ignored the SIGTERM was a timer thread of the driver,
    which died with it, and a worker that left the group (setsid) got no signal at all:
    both held the GPU through after_script and the uploads, until cleanup (found by a
    review of cancellation). The stage now ends with none of the job's processes left."""
    harness = _harness(host, (4,))
    job = FakeJob(id=503)
    assert harness.stage("prepare", job).code == 0
    (lease,) = _leases(host).held_by("503")
    ignoring, ready = host / "ignoring", host / "trap-set"
    worker = (f"python3 -c 'import signal, time, pathlib; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              f"pathlib.Path(\"{ignoring}\").touch(); time.sleep(600)'")
    script = harness.script(job, "build_script", f"{worker} & setsid sleep 600 & {TERM_TRAP}; "
                            f"while [ ! -e {ignoring} ]; do sleep 0.05; done; touch {ready}; wait")
    try:
        result = harness.stage("run", job, str(script), "build_script", timeout=240, graceful=300,
                               stop_once=ready)
        assert result.code == BUILD_FAILURE and "stopped by TERM" in result.output
        assert _job_processes(lease.token) == []  # as the stage ended, not once cleanup came
    finally:
        for pid in _job_processes(lease.token):
            os.kill(pid, signal.SIGKILL)
    assert harness.stage("cleanup", job).code == 0


def test_gitlab_runners_graceful_stop_lets_the_job_finish(host: Path) -> None:
    """gitlab-runner's docs have systemd stop it with SIGQUIT (finish the running builds),
    which systemd sends to every process of its unit: the driver died of it (-3, a
    system failure) and the job's shell with it (found by a review of cancellation)."""
    harness = _harness(host, (6,))
    job = FakeJob(id=506)
    assert harness.stage("prepare", job).code == 0
    (lease,) = _leases(host).held_by("506")
    started, go = host / "started", host / "go"
    body = f"touch {started}; while [ ! -e {go} ]; do sleep 0.05; done; echo finished"
    script = harness.script(job, "build_script", body)
    driver = harness.start("run", job, str(script), "build_script")
    try:
        assert _wait_for(started.exists)
        for pid in [driver.pid, *_job_processes(lease.token)]:  # the unit's whole cgroup
            os.kill(pid, signal.SIGQUIT)
        go.touch()
        out, _ = driver.communicate(timeout=120)
    finally:
        for pid in _job_processes(lease.token):
            os.kill(pid, signal.SIGKILL)
    assert driver.returncode == 0 and "finished" in out, out
    assert harness.stage("cleanup", job).code == 0


def test_sigterm_as_the_job_starts_stops_it_and_cleanup_releases_the_lease(host: Path) -> None:
    """SIGTERM between starting the job's process group and arming the stop: nothing survives."""
    harness, job, lease, script = _prepared_sleeper(host, gpu=3, job_id=505)
    driver = harness.start("run", job, str(script), "build_script", stopped_at_start=True)
    try:  # the driver's own end first: an orphaned job would hold its output pipe open
        assert driver.wait(timeout=120) == BUILD_FAILURE  # it lived to stop the job (was: -15)
        assert _wait_for(lambda: _job_processes(lease.token) == [])
    finally:
        for pid in _job_processes(lease.token):  # a failed run leaves no sleep behind
            os.kill(pid, signal.SIGKILL)
    driver.communicate(timeout=60)
    assert [held.gpu for held in _leases(host).held_by("505")] == [3]  # until cleanup
    assert harness.stage("cleanup", job).code == 0
    assert _leases(host).all() == []


def _prepared_sleeper(host: Path, *, gpu: int, job_id: int) -> tuple[Harness, FakeJob, Lease, Path]:
    """A prepared job on `gpu` and its build_script, which sleeps until it is stopped."""
    harness = _harness(host, (gpu,))
    job = FakeJob(id=job_id)
    assert harness.stage("prepare", job).code == 0
    (lease,) = _leases(host).held_by(str(job_id))
    return harness, job, lease, harness.script(job, "build_script", "sleep 300")


def _wait_for(condition: Callable[[], bool], deadline_s: float = 60) -> bool:
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_stale_lease_of_a_dead_runner_is_reclaimed_by_next_prepare(host: Path) -> None:
    """gitlab-runner dies after prepare: no cleanup ever comes for that job."""
    harness = _harness(host, (2,))
    env = harness.env(FakeJob(id=601))
    from runnerctl.executors.contract import stage_command

    exe, argv = stage_command("prepare", harness.args)
    runner = f"import subprocess,sys; sys.exit(subprocess.call({[exe, *argv]!r}))"
    assert subprocess.run([sys.executable, "-c", runner], env=env, timeout=60,
                          check=False).returncode == 0
    assert [lease.job_id for lease in _leases(host).all()] == ["601"]  # left behind
    assert harness.stage("prepare", FakeJob(id=602)).code == 0
    assert [lease.job_id for lease in _leases(host).all()] == ["602"]
    harness.stage("cleanup", FakeJob(id=602))


def _job_processes(token: str) -> list[int]:
    return [p.pid for p in psutil.process_iter() if environ_token(p.pid) == token]


def test_two_prepares_at_once_exactly_one_gets_the_gpus(host: Path) -> None:
    host = _patient(host)
    left, right = _harness(host, (0, 1)), _harness(host, (1, 2))
    job_a, job_b = FakeJob(id=211), FakeJob(id=212)
    procs = {job_a.id: left.start("prepare", job_a), job_b.id: right.start("prepare", job_b)}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and all(p.poll() is None for p in procs.values()):
        time.sleep(0.05)
    winner = next(job for job, p in procs.items() if p.poll() is not None)
    loser = job_b.id if winner == job_a.id else job_a.id
    assert procs[winner].returncode == 0
    assert procs[loser].poll() is None  # still waiting for GPU 1
    holders = {lease.job_id for lease in _leases(host).all()}
    assert holders == {str(winner)}
    (left if winner == job_a.id else right).stage("cleanup", FakeJob(id=winner))
    out, _ = procs[loser].communicate(timeout=120)
    assert procs[loser].returncode == 0, out
    assert {lease.job_id for lease in _leases(host).all()} == {str(loser)}
    (left if loser == job_a.id else right).stage("cleanup", FakeJob(id=loser))


def test_driver_killed_while_prepare_waits_then_cleanup_leaves_no_lease(host: Path) -> None:
    colleague = subprocess.Popen(["sleep", "600"], user="nobody")
    try:
        _patient(host)  # 3 s of gate could end before the kill
        (host / "gpus.yaml").write_text(
            f"host: gpu-a\ngpus: 8\nprocesses:\n  - {{gpu: 3, pid: {colleague.pid}}}\n")
        harness = _harness(host, (3,))
        job = FakeJob(id=503)
        waiting = harness.start("prepare", job)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not _leases(host).all():
            time.sleep(0.05)
        assert [lease.job_id for lease in _leases(host).all()] == ["503"]  # leased, gated
        assert waiting.poll() is None
        os.killpg(waiting.pid, signal.SIGKILL)
        waiting.wait()
        assert harness.stage("cleanup", job).code == 0
        assert _leases(host).all() == []
    finally:
        colleague.kill()
        colleague.wait()


def test_cleanup_signals_only_processes_it_started(host: Path) -> None:
    """S4: a process of another user carrying the token, or ours with another token, survives."""
    harness = _harness(host, (4,))
    job = FakeJob(id=504)
    assert harness.stage("prepare", job).code == 0
    (lease,) = _leases(host).held_by("504")
    impostor = subprocess.Popen(["sleep", "600"], user="nobody", env={"RUNNERCTL_LEASE": lease.token})
    bystander = subprocess.Popen(["sleep", "600"], env={"RUNNERCTL_LEASE": lease.token + "x"})
    try:
        assert harness.stage("cleanup", job).code == 0
        assert impostor.poll() is None and bystander.poll() is None
        assert _leases(host).all() == []
    finally:
        for proc in (impostor, bystander):
            proc.kill()
            proc.wait()


def test_a_stale_lease_is_replaced_only_once_its_job_is_gone(host: Path) -> None:
    """A lease whose gitlab-runner died is stale only when no process of its job is left;
    the next prepare on its GPU then replaces it (LeaseTable.acquire)."""
    from runnerctl.executors.contract import stage_command
    from runnerctl.executors.lease import is_stale

    harness = _harness(host, (5,))
    exe, argv = stage_command("prepare", harness.args)
    runner = f"import subprocess,sys; sys.exit(subprocess.call({[exe, *argv]!r}))"
    assert subprocess.run([sys.executable, "-c", runner], env=harness.env(FakeJob(id=603)),
                          timeout=60, check=False).returncode == 0
    (lease,) = _leases(host).all()
    leftover = subprocess.Popen(["sleep", "600"], env={"RUNNERCTL_LEASE": lease.token})
    try:
        assert not is_stale(lease)  # its gitlab-runner is gone, its process is not
    finally:
        leftover.kill()
        leftover.wait()
    assert is_stale(lease)
    assert subprocess.run([sys.executable, "-c", runner], env=harness.env(FakeJob(id=604)),
                          timeout=60, check=False).returncode == 0
    assert [x.job_id for x in _leases(host).all()] == ["604"]


def test_a_lease_with_a_string_owner_pid_fails_prepare_in_one_line(host: Path) -> None:
    """Issue 14: a lease file with `"owner_pid": "1234"` once raised a traceback; it holds its GPU."""
    table = _leases(host)
    assert table.try_acquire((6,), Lease(gpu=-1, job_id="610", slot="runnerctl/gpu-a/gpu6", driver="shell",
                                         owner_pid=os.getpid(), owner_started=0.0, created_at=0.0)) == []
    path = table.dir / "gpu6.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "owner_pid": "1234"}))
    result = _harness(host, (6,)).stage("prepare", FakeJob(id=611))
    assert result.code == SYSTEM_FAILURE
    assert "GPU 6 has an unreadable lease (owner_pid is '1234')" in result.output, result.output
    assert "Traceback" not in result.output and path.exists()
    assert "GPUs 6 are held: GPU 6" in result.output  # not "leased to another job": none holds it


def test_a_lease_that_cannot_note_the_job_leaves_the_job_watched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """A full disk as the run stage notes the job's process group in its lease: the stage
    used to return at once, leaving the job running unwatched beside after_script."""
    import errno

    from runnerctl.executors import shell
    from runnerctl.executors.contract import DriverArgs
    from runnerctl.executors.driver import Job, StageContext
    from runnerctl.settings import ExecutorSettings, PathSettings, Settings

    settings = Settings(paths=PathSettings(state_dir=str(tmp_path / "state")),
                        executor=ExecutorSettings(driver="shell", allow_root=True, run_as_user=""))
    lease = Lease(gpu=0, job_id="7", slot="runnerctl/gpu-a/gpu0", driver="shell", owner_pid=os.getpid(),
                  owner_started=0.0, created_at=0.0, nonce="n0")
    ctx = StageContext(args=DriverArgs("runnerctl/gpu-a/gpu0", (0,), "sim:1", "", "shell"), settings=settings,
                       env={"PATH": os.environ["PATH"]}, job=Job("7", "1", "g/p", "ann", None), lease=lease)

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(shell.LeaseTable, "update", full)
    done = tmp_path / "done"
    script = tmp_path / "step.sh"
    script.write_text(f"sleep 0.5; touch {done}; exit 3\n")
    (tmp_path / "state" / "builds").mkdir(parents=True)
    assert shell.ShellDriver().run(ctx, script, "build_script") == 3
    assert done.exists()  # the stage waited for the job, as without the failure
    assert "cannot note the job's process group in its lease (No space left on device); the job runs on" \
        in capfd.readouterr().err
