"""What the controller knows of a job's timeout, and the backfill it allows, as in production.

GitLab's jobs API does not say a pending job's timeout, but every job a runner takes is
cut at the runner's maximum job timeout, and a running job's timeout reaches the
executor as the job response's `runner_info.timeout` (CI_JOB_TIMEOUT), which the lease
records. Until these were read, `Demand.timeout_s` and `SlotState.ends_by` were set by
the simulator alone, and the real controller never backfilled a draining block.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from runnerctl.executors.driver import Job
from runnerctl.executors.lease import Lease
from runnerctl.sim.world import World


def test_the_job_timeout_comes_from_the_job_response_else_the_variable(tmp_path: Path) -> None:
    response = tmp_path / "job.json"
    response.write_text(json.dumps({"id": 7, "runner_info": {"timeout": 5400},
                                    "variables": [{"key": "CI_JOB_TIMEOUT", "value": "60"}]}))
    assert Job.from_env({"JOB_RESPONSE_FILE": str(response)}).timeout_s == 5400
    assert Job.from_env({"CUSTOM_ENV_CI_JOB_ID": "7", "CUSTOM_ENV_CI_JOB_TIMEOUT": "900"}).timeout_s == 900
    for junk in ("", "0", "-5", "1h", "nan", "\u00b2"):  # a superscript two is a digit to str.isdigit
        env = {"CUSTOM_ENV_CI_JOB_ID": "7", "CUSTOM_ENV_CI_JOB_TIMEOUT": junk}
        assert Job.from_env(env).timeout_s is None


def test_a_lease_keeps_the_timeout_and_an_older_lease_without_one_still_reads() -> None:
    fields = {"gpu": 2, "job_id": "7", "slot": "h/gpu2", "driver": "shell", "owner_pid": 1,
              "owner_started": 1.0, "created_at": 100.0}
    assert Lease.parse(2, json.dumps({**fields, "timeout_s": 3600})).timeout_s == 3600
    assert Lease.parse(2, json.dumps({**fields, "timeout_s": 3600.0})).timeout_s == 3600  # a later writer's
    older = Lease.parse(2, json.dumps(fields))
    assert not older.problem and older.timeout_s is None
    assert Lease.parse(2, json.dumps({**fields, "timeout_s": "soon"})).problem  # held, fail closed


@pytest.fixture
def world(lease_world: World) -> World:
    return lease_world


def _cap(world: World, size: int, seconds: int) -> None:
    """The maximum job timeout an admin set on the host's `size`-GPU runners in GitLab."""
    for name, runner_id in world.fleet.runner_ids.items():
        if world.fleet.slots[name].size == size:
            world.state.runners[runner_id].maximum_timeout = seconds


def _until(world: World, done: object, limit_s: float) -> None:
    end = world.clock.now + limit_s
    while not done() and world.clock.now < end:  # type: ignore[operator]
        world.advance(1)


@pytest.mark.parametrize("capped", [True, False])
def test_a_short_job_backfills_a_block_drained_for_an_eight_gpu_job_only_when_its_end_is_known(
        world: World, capped: bool) -> None:
    """A quad runs (its runners cut jobs at an hour); an 8-GPU job drains the host and its
    four idle GPUs wait for the quad. A 1-GPU job whose runners cut jobs at 10 minutes
    ends long before the quad's hour is up, so one idle GPU runs it meanwhile. Without the
    runners' maximum timeouts nothing is known and it waits behind the 8-GPU job."""
    if capped:
        _cap(world, 1, 600)  # GitLab's smallest maximum timeout: 10 minutes
        for size in (2, 4, 8):
            _cap(world, size, 3600)
    quad = world.submit(4, 300.0)
    _until(world, lambda: quad in world.fleet.started, 120)
    assert quad in world.fleet.started
    eight = world.submit(8, 60.0)
    world.advance(15)  # the 8-GPU job drains the host: GPUs 4-7 stay idle for it
    single = world.submit(1, 60.0)
    _until(world, lambda: single in world.fleet.started, 600)
    assert single in world.fleet.started
    quad_end = world.fleet.finished.get(quad, float("inf"))
    if capped:
        assert world.fleet.started[single] < quad_end  # it ran in the drained block's idle time
        assert world.fleet.started[single] - world.fleet.started[quad] < 120
    else:
        assert world.fleet.started[single] > world.fleet.started[eight]  # it waited behind
    _until(world, lambda: eight in world.fleet.finished, 900)
    assert eight in world.fleet.finished  # and the drained job still ran
    assert world.fleet.double_allocations == 0


def test_bounds_on_some_sizes_only_are_not_used_and_say_so_once(world: World,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Only the 1-GPU runners have a maximum timeout: a known timeout would take the size
    credit from 1-GPU jobs alone, so the controller uses none, and warns once."""
    _cap(world, 1, 600)
    quad = world.submit(4, 300.0)
    _until(world, lambda: quad in world.fleet.started, 120)
    eight = world.submit(8, 60.0)
    world.advance(15)
    single = world.submit(1, 60.0)
    with caplog.at_level(logging.WARNING, logger="runnerctl.controller.loop"):
        _until(world, lambda: single in world.fleet.started, 600)
    assert world.fleet.started[single] > world.fleet.started[eight]  # no backfill: as with no bounds
    warned = [r for r in caplog.records if "maximum job timeout and others not" in r.getMessage()]
    assert len(warned) == 1 and "1 GPUs" in warned[0].getMessage()


def test_a_job_that_runs_into_its_runners_maximum_timeout_is_failed_there(world: World) -> None:
    for size in (1, 2, 4, 8):
        _cap(world, size, 600)
    job = world.submit(1, 900.0)
    _until(world, lambda: job in world.fleet.finished, 1000)
    assert world.fleet.finished[job] - world.fleet.started[job] == pytest.approx(600, abs=3)
    assert world.state.jobs[job].status == "failed"
    assert world.state.jobs[job].failure_reason == "job_execution_timeout"
