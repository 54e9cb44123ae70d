"""The custom executor with the shell driver, driven as gitlab-runner drives it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from runnerctl.executors.lease import LeaseTable, environ_token
from tests.harness_custom_executor import (
    BUILD_FAILURE,
    SYSTEM_FAILURE,
    FakeJob,
    Harness,
    harness_for,
    make_host,
)


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return make_host(tmp_path)


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


def test_run_without_prepare_is_a_system_failure(host: Path) -> None:
    harness = _harness(host, (1,))
    job = FakeJob(id=103)
    result = harness.stage("run", job, str(harness.script(job, "build_script", "true")),
                           "build_script")
    assert result.code == SYSTEM_FAILURE and "holds no lease" in result.output


def test_overlapping_job_waits_for_cleanup_then_starts(host: Path) -> None:
    first, second = _harness(host, (0, 1)), _harness(host, (1,))
    job_a, job_b = FakeJob(id=201), FakeJob(id=202)
    assert first.stage("prepare", job_a).code == 0
    waiting = second.start("prepare", job_b)
    time.sleep(1.0)
    assert waiting.poll() is None  # blocked on GPU 1's lease
    assert {(lease.job_id, lease.user, lease.url) for lease in _leases(host).all()} == {
        ("201", "alice", "https://gitlab.example/ml/experiments/-/jobs/201")}  # who and where, for the page
    assert first.stage("cleanup", job_a).code == 0
    out, _ = waiting.communicate(timeout=30)
    assert waiting.returncode == 0, out
    assert [(lease.gpu, lease.job_id) for lease in _leases(host).all()] == [(1, "202")]
    second.stage("cleanup", job_b)


def test_overlapping_job_fails_as_system_failure_when_lease_stays(host: Path) -> None:
    first, second = _harness(host, (2, 3)), _harness(host, (3,))
    assert first.stage("prepare", FakeJob(id=301, user="bob")).code == 0
    result = second.stage("prepare", FakeJob(id=302))
    assert result.code == SYSTEM_FAILURE
    assert "GPU 3 held by job 301 (bob)" in result.output
    first.stage("cleanup", FakeJob(id=301))


def test_foreign_process_makes_prepare_wait_then_fail_naming_it(host: Path) -> None:
    colleague = subprocess.Popen(["sleep", "60"], user="nobody")
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


def test_foreign_process_leaving_lets_the_job_start(host: Path) -> None:
    colleague = subprocess.Popen(["sleep", "60"], user="nobody")
    (host / "gpus.yaml").write_text(
        f"host: gpu-a\ngpus: 8\nprocesses:\n  - {{gpu: 6, pid: {colleague.pid}}}\n")
    harness = _harness(host, (6,))
    waiting = harness.start("prepare", FakeJob(id=402))
    time.sleep(1.0)
    assert waiting.poll() is None
    (host / "gpus.yaml").write_text("host: gpu-a\ngpus: 8\n")  # the colleague is done
    colleague.kill()
    colleague.wait()
    out, _ = waiting.communicate(timeout=30)
    assert waiting.returncode == 0, out
    harness.stage("cleanup", FakeJob(id=402))


def test_driver_killed_mid_script_then_cleanup_leaves_nothing(host: Path) -> None:
    harness = _harness(host, (7,))
    job = FakeJob(id=501)
    assert harness.stage("prepare", job).code == 0
    (lease,) = _leases(host).held_by("501")
    script = harness.script(job, "build_script", "sleep 300")
    driver = harness.start("run", job, str(script), "build_script")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not _job_processes(lease.token):
        time.sleep(0.1)
    assert _job_processes(lease.token)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    assert harness.stage("cleanup", job).code == 0
    time.sleep(0.2)
    assert _job_processes(lease.token) == []
    assert _leases(host).all() == []


def test_timeout_sigterm_stops_the_job_group(host: Path) -> None:
    harness = _harness(host, (0,))
    job = FakeJob(id=502)
    assert harness.stage("prepare", job).code == 0
    (lease,) = _leases(host).held_by("502")
    script = harness.script(job, "build_script", "sleep 300")
    started = time.monotonic()
    result = harness.stage("run", job, str(script), "build_script", timeout=2, graceful=30)
    assert time.monotonic() - started < 20
    assert result.code == BUILD_FAILURE  # the script died of SIGTERM
    assert _job_processes(lease.token) == []
    harness.stage("cleanup", job)


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
    left, right = _harness(host, (0, 1)), _harness(host, (1, 2))
    job_a, job_b = FakeJob(id=211), FakeJob(id=212)
    procs = {job_a.id: left.start("prepare", job_a), job_b.id: right.start("prepare", job_b)}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and all(p.poll() is None for p in procs.values()):
        time.sleep(0.05)
    winner = next(job for job, p in procs.items() if p.poll() is not None)
    loser = job_b.id if winner == job_a.id else job_a.id
    assert procs[winner].returncode == 0
    assert procs[loser].poll() is None  # still waiting for GPU 1
    holders = {lease.job_id for lease in _leases(host).all()}
    assert holders == {str(winner)}
    (left if winner == job_a.id else right).stage("cleanup", FakeJob(id=winner))
    out, _ = procs[loser].communicate(timeout=30)
    assert procs[loser].returncode == 0, out
    assert {lease.job_id for lease in _leases(host).all()} == {str(loser)}
    (left if loser == job_a.id else right).stage("cleanup", FakeJob(id=loser))


def test_driver_killed_while_prepare_waits_then_cleanup_leaves_no_lease(host: Path) -> None:
    colleague = subprocess.Popen(["sleep", "60"], user="nobody")
    try:
        (host / "gpus.yaml").write_text(
            f"host: gpu-a\ngpus: 8\nprocesses:\n  - {{gpu: 3, pid: {colleague.pid}}}\n")
        harness = _harness(host, (3,))
        job = FakeJob(id=503)
        waiting = harness.start("prepare", job)
        deadline = time.monotonic() + 15
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
    impostor = subprocess.Popen(["sleep", "60"], user="nobody", env={"RUNNERCTL_LEASE": lease.token})
    bystander = subprocess.Popen(["sleep", "60"], env={"RUNNERCTL_LEASE": lease.token + "x"})
    try:
        assert harness.stage("cleanup", job).code == 0
        assert impostor.poll() is None and bystander.poll() is None
        assert _leases(host).all() == []
    finally:
        for proc in (impostor, bystander):
            proc.kill()
            proc.wait()


def test_controller_reclaims_a_stale_lease_only_once_the_job_is_gone(host: Path) -> None:
    from runnerctl.executors.contract import stage_command
    from runnerctl.executors.stages import reclaim_stale
    from runnerctl.settings import load_settings

    harness = _harness(host, (5,))
    exe, argv = stage_command("prepare", harness.args)
    runner = f"import subprocess,sys; sys.exit(subprocess.call({[exe, *argv]!r}))"
    assert subprocess.run([sys.executable, "-c", runner], env=harness.env(FakeJob(id=603)),
                          timeout=60, check=False).returncode == 0
    (lease,) = _leases(host).all()
    leftover = subprocess.Popen(["sleep", "60"], env={"RUNNERCTL_LEASE": lease.token})
    settings = load_settings(host / "runnerctl.toml")
    try:
        assert reclaim_stale(settings) == []  # its gitlab-runner is gone, its process is not
        assert _leases(host).all() == [lease]
    finally:
        leftover.kill()
        leftover.wait()
    assert [x.job_id for x in reclaim_stale(settings)] == ["603"]
    assert _leases(host).all() == []
