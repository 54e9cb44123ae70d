"""The block a multi-GPU job drains is chosen by the same rule in the controller as in the
simulator: fewest busy GPUs, then the block whose latest job started earliest. The
simulator always knew the start times; the controller now reads them from the leases
(when prepare took the GPUs), as in production."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from runnerctl.executors.lease import Lease, LeaseTable, new_nonce, process_started
from runnerctl.model import slot_key
from runnerctl.sim.world import World


@pytest.fixture
def world(lease_world: World) -> World:
    return lease_world


def _lease(world: World, tmp_path: Path, job_id: int, gpu: int, started: float) -> None:
    """A 1-GPU job's lease on single gpuN, taken at `started` by a live runner (us)."""
    slot = next(name for name in world.controller.cache.ids if name.endswith(f"/gpu{gpu}"))
    me = os.getpid()
    lease = Lease(gpu=-1, job_id=str(job_id), slot=slot, driver="shell", owner_pid=me,
                  owner_started=process_started(me) or 0.0, created_at=started, user="bob", nonce=new_nonce())
    LeaseTable(tmp_path / "state").acquire((gpu,), lease, wait_s=0)


def test_the_controller_drains_the_block_whose_latest_job_started_earliest(world: World,
                                                                          tmp_path: Path) -> None:
    now = time.time()
    for gpu in range(4):  # GPUs 0-3: jobs that started a minute ago
        _lease(world, tmp_path, 100 + gpu, gpu, now - 60)
    for gpu in range(4, 8):  # GPUs 4-7: jobs that started two hours ago (the latest 7000 s ago)
        _lease(world, tmp_path, 100 + gpu, gpu, now - 7200 + 50 * (gpu - 4))
    job = world.submit(4, 600.0)
    world.advance(10, step=5.0)
    drains = [e for e in world.store.events(world.controller.host) if e.kind == "drain"]
    assert [slot_key(e.subject) for e in drains] == ["gpu4-7"], drains
    assert str(job) in drains[0].detail
