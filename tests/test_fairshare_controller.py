"""Fair share in the controller: the loop reads every host's job history and hands the
planner each pending job's `fair_s` (runnerctl/controller/fair_usage.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from runnerctl.controller import jobs_store
from runnerctl.controller.demand import PendingJob
from runnerctl.controller.fair_usage import FairShare
from runnerctl.controller.jobs_store import JobRecord
from runnerctl.controller.plan import PlanPolicy
from runnerctl.controller.store import Store
from runnerctl.settings import ControllerSettings
from runnerctl.sim.world import PROJECT
from tests.gpu_procs import busy_world

HOUR = 3600.0


def _record(job_id: int, user: str, project: str, now: float) -> JobRecord:
    """A finished job: 8 GPUs for ten hours, ending an hour ago."""
    return JobRecord(host="gpu-a", job_id=job_id, slot="gpu0-7", gpus=tuple(range(8)), project=project,
                     pipeline="1", name="train", user=user, url="", queued_at=None,
                     started_at=now - 11 * HOUR, seen_at=now - 11 * HOUR, ended_at=now - HOUR,
                     outcome="ended")


def test_penalties_come_from_the_users_history(tmp_path: Path) -> None:
    """ann ran 8 GPUs for hours, bob nothing: ann's pending job counts younger, bob's not
    at all; nothing when fair share is off (the default)."""
    store = Store.open(state_dir=tmp_path)
    now = 100 * HOUR
    jobs_store.save_jobs(store, [_record(1, "ann", "g/a", now)])

    def pending(job_id: int, user: str, project: str) -> PendingJob:
        return PendingJob(job_id, 7, 4, now, "normal", None, f"https://gitlab.example/{project}/-/jobs/{job_id}",
                          user)

    jobs = [pending(2, "ann", "g/a"), pending(3, "bob", "g/b")]
    penalties = FairShare(store, ControllerSettings(fair_weight_h=2.0)).penalties(jobs, now)
    assert 0 < penalties[2] < 2 * HOUR and penalties[3] == 0.0
    assert FairShare(store, ControllerSettings()).penalties(jobs, now) == {}
    store.close()


@pytest.mark.parametrize(("weight_h", "drains_for"), [(0.0, "ann"), (4.0, "bob")])
def test_the_controller_drains_for_the_light_users_job(tmp_path: Path, weight_h: float,
                                                       drains_for: str) -> None:
    """Every GPU busy; ann (heavy history) and bob ask for 4 GPUs at the same moment, ann's
    job first. Without fair share ann's job drains a block (it is older by id); with it,
    bob's does. Which job drains, not when: drains start at once (`drain_after_s` 0)."""
    now = time.time()
    settings = ControllerSettings(projects=(PROJECT,), fair_weight_h=weight_h)
    world = busy_world(tmp_path, settings, now, PlanPolicy(drain_after_s=0.0))
    try:
        jobs_store.save_jobs(world.store, [_record(1, "ann", "any", now)])
        jobs = {"ann": world.submit(4, 600.0, user="ann"), "bob": world.submit(4, 600.0, user="bob")}
        world.advance(10, step=5.0)
        drains = [e for e in world.store.events(world.controller.host) if e.kind == "drain"]
        assert drains, "no block drained"
        assert str(jobs[drains_for]) in drains[0].detail, drains
    finally:
        world.close()


def test_an_open_job_of_a_host_gone_for_good_stops_counting_and_is_pruned(tmp_path: Path) -> None:
    """A host retired (or renamed) with a job running leaves an open history row: it
    counted as continuous GPU use up to now in fair share, and retention never pruned it."""
    from runnerctl.controller.history import History
    from runnerctl.controller.observe import LeasedJob

    day = 86400.0
    store = Store.open(state_dir=tmp_path)
    settings = ControllerSettings(fair_weight_h=24.0, history_retention_days=30)
    now = time.time()
    old = History(store, "gpu-old", settings)
    lease = LeasedJob(slot="runnerctl/gpu-old/gpu0-7", gpus=tuple(range(8)), user="alice", project="ml/a",
                      created_at=now - 20 * day)
    for k in range(3):  # seen three ticks, then the host is gone
        old.tick({1: lease}, None, now - 20 * day + 5 * k, lambda *event: None)
    jobs = [PendingJob(10, 1, 1, now - 60, "normal", None, user="alice", web_url="http://g/ml/a/-/jobs/10"),
            PendingJob(11, 1, 1, now - 60, "normal", None, user="bob", web_url="http://g/ml/b/-/jobs/11")]
    fair = FairShare(store, settings)
    fair.penalties(jobs, now)
    assert fair.usage is not None and fair.usage.users["alice"] < 8 * 60  # 8 GPUs for 10 s, decayed
    History(store, "gpu-new", settings)._prune(now + 11 * day)  # last seen 31 days before
    assert jobs_store.open_jobs(store) == []
