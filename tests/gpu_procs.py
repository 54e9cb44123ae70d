"""Simulated GPUs listing real processes, for the tests that compare the executors' gate
with the controller's (test_executor_gate, test_observe), and a host whose GPUs all run
leased jobs (the ordering tests: test_estimates, test_fairshare_controller)."""

from __future__ import annotations

import os
from pathlib import Path

from runnerctl.controller.plan import PlanPolicy
from runnerctl.executors.lease import Lease, LeaseTable, new_nonce, process_started
from runnerctl.gpus import open_gpu_source
from runnerctl.model import GpuSnapshot
from runnerctl.settings import ControllerSettings
from runnerctl.sim.world import World, build_world


def sim_snapshot(tmp_path: Path, placed: dict[int, list[int]]) -> GpuSnapshot:
    """Eight simulated GPUs on gpu-a, GPU -> the pids listed on it (a sim:PATH source)."""
    rows = "".join(f"  - {{gpu: {gpu}, pid: {pid}}}\n" for gpu, pids in placed.items() for pid in pids)
    (tmp_path / "gpus.yaml").write_text(f"host: gpu-a\ngpus: 8\nprocesses:\n{rows}")
    return open_gpu_source(f"sim:{tmp_path / 'gpus.yaml'}", host="gpu-a").snapshot()


def busy_world(tmp_path: Path, settings: ControllerSettings, now: float,
               policy: PlanPolicy | None = None) -> World:
    """A controller on one 8-GPU host (lease files under tmp_path/state) where every GPU
    runs a job of "cat" that took its lease a minute ago, as the executor writes it."""
    world = build_world(tmp_path / "store", settings=settings, policy=policy, lease_dir=tmp_path / "state",
                        start=now)
    me = os.getpid()
    for gpu in range(8):
        slot = next(name for name in world.controller.cache.ids if name.endswith(f"/gpu{gpu}"))
        lease = Lease(gpu=-1, job_id=str(100 + gpu), slot=slot, driver="shell", owner_pid=me,
                      owner_started=process_started(me) or 0.0, created_at=now - 60, user="cat",
                      nonce=new_nonce())
        LeaseTable(tmp_path / "state").acquire((gpu,), lease, wait_s=0)
    return world
