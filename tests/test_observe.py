"""The controller's gate and the executors' prepare gate call the same processes CI.

Real processes (a job's process group without the lease token in its environment, a
process carrying the token, a colleague's), a simulated GPU listing them, real lease
files: `LeaseJobs.is_ci` (what `serve` feeds the controller's gate) must agree with
`executors.gate.classify` (what prepare waits on) for every process.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from pathlib import Path

import psutil

from runnerctl.controller.gate import GateState, GateThresholds, step
from runnerctl.controller.observe import LeaseJobs
from runnerctl.executors.gate import classify
from runnerctl.executors.lease import LEASE_ENV, Lease, LeaseTable, new_nonce, read_leases
from tests.gpu_procs import sim_snapshot


def test_controller_and_prepare_gate_agree_on_ci_and_foreign(
        tmp_path: Path, spawned: list[subprocess.Popen[bytes]]) -> None:
    state = tmp_path / "state"
    lease = Lease(gpu=0, job_id="900", slot="runnerctl/gpu-a/gpu0-1", driver="shell",
                  owner_pid=os.getpid(), owner_started=0.0, created_at=time.time() - 1, nonce=new_nonce())
    table = LeaseTable(state)
    assert table.try_acquire((0, 1), lease) == []
    group = subprocess.Popen(["bash", "-c", "sleep 60 & wait"], start_new_session=True)
    carrier = subprocess.Popen(["sleep", "60"], env={LEASE_ENV: lease.token})
    colleague = subprocess.Popen(["sleep", "60"])
    spawned += [group, carrier, colleague]
    table.update(lease.token, pgid=group.pid)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not psutil.Process(group.pid).children():
        time.sleep(0.05)
    (child,) = psutil.Process(group.pid).children()  # the job's, without the token
    snapshot = sim_snapshot(tmp_path, {0: [child.pid, carrier.pid, colleague.pid], 1: [child.pid],
                                    2: [carrier.pid]})
    jobs = LeaseJobs(state)
    assert jobs.running() == {lease.slot: (900,)}
    uses = classify(snapshot, read_leases(state))
    for gpu in snapshot.gpus:
        controller = {p.pid for p in gpu.processes if jobs.is_ci(gpu.index, p)}
        assert controller == {p.pid for p in uses[gpu.index].ci}, gpu.index
    assert {p.pid for p in uses[0].ci} == {child.pid, carrier.pid}  # by process group and by token
    assert {p.pid for p in uses[0].foreign} == {colleague.pid}
    assert [p.pid for p in uses[2].foreign] == [carrier.pid]  # a GPU its lease does not hold
    # so the controller's gate closes GPU 0 (a colleague) and GPU 2, never GPU 1 (the job)
    limits = GateThresholds.from_settings()
    closed = {g.index for g in snapshot.gpus if step(GateState(), g, now=0.0, is_ci=jobs.is_ci,
                                                        owned=g.index in (0, 1), limits=limits).closed}
    assert closed == {0, 2}
    assert dataclasses.replace(lease, pgid=group.pid) in read_leases(state)


def test_a_process_that_ended_mid_tick_on_a_leased_gpu_is_not_foreign(tmp_path: Path) -> None:
    """NVML's list is read before the leases in a tick: a job's own process that exited in
    between failed every CI test and closed the GPU as foreign for the cool-down (found by
    a review as a concurrency engineer). Gone, it uses no GPU; a live one of another user
    on the same GPU stays foreign, and a gone one on a GPU no lease holds is not CI."""
    from runnerctl.model import GpuProcess, ProcessKind

    jobs = LeaseJobs(tmp_path)
    jobs.table.acquire((0,), Lease(gpu=-1, job_id="7", slot="runnerctl/h/gpu0", driver="shell", owner_pid=1,
                                   owner_started=0.0, created_at=time.time(), nonce=new_nonce()), wait_s=0)
    jobs.running()
    ended = subprocess.Popen(["true"])
    ended.wait()
    colleague = subprocess.Popen(["sleep", "60"], user="nobody")
    try:
        gone = GpuProcess(ended.pid, ProcessKind.COMPUTE, None, "root", "python train.py")
        alive = GpuProcess(colleague.pid, ProcessKind.COMPUTE, None, "nobody", "sleep 60")
        assert jobs.is_ci(0, gone) and not jobs.is_ci(0, alive)
        assert not jobs.is_ci(1, gone)  # no lease on GPU 1
    finally:
        colleague.kill()
        colleague.wait()
