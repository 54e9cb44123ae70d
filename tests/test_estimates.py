"""Run-time estimates from the job history (runnerctl/controller/estimates.py): what they
are, where they come from, and the one thing they change: which multi-GPU jobs get size
credits in the planner's order."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from runnerctl.controller import jobs_store
from runnerctl.controller.demand import PendingJob
from runnerctl.controller.estimates import REFRESH_S, RUNS_KEPT, Estimates, RunTimes
from runnerctl.controller.history import project_of
from runnerctl.controller.jobs_store import JobRecord
from runnerctl.controller.order import credited, drain_order, idle_claim
from runnerctl.controller.plan import Demand, PlanPolicy
from runnerctl.controller.store import Store
from runnerctl.executors.driver import Job
from runnerctl.executors.lease import Lease
from runnerctl.settings import ControllerSettings
from runnerctl.sim.world import PROJECT
from tests.gpu_procs import busy_world

HOUR = 3600.0


def _run(job_id: int, project: str, name: str, seconds: float, ended_at: float,
         outcome: str = "success") -> JobRecord:
    return JobRecord(host="gpu-a", job_id=job_id, slot="gpu0-7", gpus=tuple(range(8)), project=project,
                     pipeline="1", name=name, user="ann", url="", queued_at=None,
                     started_at=ended_at - seconds, seen_at=ended_at, ended_at=ended_at, outcome=outcome)


def test_run_times_give_the_longest_of_the_latest_runs() -> None:
    times = RunTimes()
    key = ("g/a", "train")
    assert times.estimate(key) is None  # no run yet
    times.add(key, 100.0)
    assert times.estimate(key) == 100.0
    times.add(key, 600.0)
    times.add(key, 200.0)
    assert times.estimate(key) == 600.0
    for _ in range(RUNS_KEPT - 1):
        times.add(key, 50.0)
    assert times.estimate(key) == 200.0  # only the latest RUNS_KEPT count: the 600 s run fell out
    times.add(key, 50.0)
    assert times.estimate(key) == 50.0
    assert times.estimate(("g/a", "lint")) is None


def test_estimates_come_from_every_hosts_history(tmp_path: Path) -> None:
    """Ended runs of the same project and job name give the estimate (the longest of the
    latest RUNS_KEPT, over 30 days); cancelled and freed runs (here the longest: they
    would set the estimate) and other names do not; the store is read again once per
    REFRESH_S."""
    store = Store.open(state_dir=tmp_path)
    now = 100 * HOUR
    old = [_run(100 + i, "g/a", "eval", 60.0 if i else 9 * HOUR, now - 2 * HOUR + i)
           for i in range(RUNS_KEPT + 1)]
    jobs_store.save_jobs(store, [
        _run(1, "g/a", "train", 2 * HOUR, now - 3 * HOUR), _run(2, "g/a", "train", 4 * HOUR, now - 2 * HOUR),
        _run(3, "g/a", "train", 3 * HOUR, now - HOUR),
        _run(4, "g/a", "train", 9 * HOUR, now - 60, "canceled"),
        _run(5, "g/a", "train", 8 * HOUR, now - 30, "freed"), _run(6, "g/a", "lint", 60.0, now - 30),
        _run(8, "g/a", "lint", 9 * HOUR, now - 31 * 24 * HOUR), *old])

    def pending(job_id: int, name: str) -> PendingJob:
        return PendingJob(job_id, 7, 4, now, "normal", None, f"https://gitlab.example/g/a/-/jobs/{job_id}",
                          "ann", name)

    estimates = Estimates(store)
    jobs = [pending(10, "train"), pending(11, "lint"), pending(12, "eval"), pending(13, "docs")]  # docs: none
    assert estimates.of(jobs, now) == {10: 4 * HOUR, 11: 60.0, 12: 60.0}  # eval's long run is 21st latest
    jobs_store.save_jobs(store, [_run(7, "g/a", "train", 7 * HOUR, now)])
    assert estimates.of(jobs, now + REFRESH_S / 2)[10] == 4 * HOUR  # not read again yet
    assert estimates.of(jobs, now + REFRESH_S) == {10: 7 * HOUR, 11: 60.0, 12: 60.0}
    store.close()


def test_the_job_name_reaches_the_history_through_the_lease(tmp_path: Path) -> None:
    """The run-time history is keyed by job name, which a job picked before any poll saw
    it pending has only from its executor: CI_JOB_NAME, kept in the lease."""
    response = {"id": 7, "variables": [{"key": "CI_JOB_NAME", "value": "train"}]}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(response))
    assert Job.from_env({"JOB_RESPONSE_FILE": str(path)}).name == "train"
    assert Job.from_env({"CUSTOM_ENV_CI_JOB_ID": "7", "CUSTOM_ENV_CI_JOB_NAME": "lint"}).name == "lint"
    fields = {"gpu": 2, "job_id": "7", "slot": "h/gpu2", "driver": "shell", "owner_pid": 1,
              "owner_started": 1.0, "created_at": 100.0}
    assert Lease.parse(2, json.dumps({**fields, "job_name": "train"})).job_name == "train"
    older = Lease.parse(2, json.dumps(fields))  # an older executor's lease
    assert not older.problem and older.job_name == ""


@pytest.mark.parametrize(("estimate", "gets_credit"), [(None, True), (600.0, True), (1800.0, True),
                                                       (1801.0, False), (5 * HOUR, False)])
def test_a_job_expected_to_run_long_gets_no_size_credit(estimate: float | None, gets_credit: bool) -> None:
    """An 8-GPU job 30 minutes younger than a 1-GPU job: with a size credit it goes first
    (to idle GPUs and to a drain); when its recent runs took long it waits its turn by age."""
    policy = PlanPolicy()
    small = Demand(1, 1, 1000.0)
    big = Demand(2, 8, 1000.0 + 1800.0, estimate_s=estimate)
    assert credited(big, policy) is gets_credit
    assert (idle_claim(big, policy) < idle_claim(small, policy)) is gets_credit
    other = Demand(3, 2, 1000.0)
    assert (drain_order(big, (), policy) < drain_order(other, (), policy)) is gets_credit
    assert not credited(Demand(4, 8, 0.0, timeout_s=600.0, estimate_s=60.0), policy)  # a timeout: age


@pytest.mark.parametrize(("history", "drains_for"), [(False, "whole"), (True, "quad")])
def test_the_controller_drains_for_the_older_job_when_the_younger_runs_long(
        tmp_path: Path, history: bool, drains_for: str) -> None:
    """Every GPU busy; a 4-GPU job and right after it an 8-GPU job. The size credit makes
    the 8-GPU job drain first; when the history says that job (its project and name) ran
    five hours, the older 4-GPU job drains first instead. Which job drains, not when:
    drains start at once (`drain_after_s` 0)."""
    now = time.time()
    world = busy_world(tmp_path, ControllerSettings(projects=(PROJECT,)), now, PlanPolicy(drain_after_s=0.0))
    try:
        jobs = {"quad": world.submit(4, 600.0, name="eval"), "whole": world.submit(8, 600.0, name="train")}
        if history:
            project = project_of(world.state.web_url(world.state.jobs[jobs["whole"]]))
            jobs_store.save_jobs(world.store, [_run(200 + k, project, "train", 5 * HOUR, now - k * HOUR)
                                               for k in range(1, 4)])
        world.advance(60, step=5.0)
        drains = [e for e in world.store.events(world.controller.host) if e.kind == "drain"]
        assert drains, "no block drained"
        assert f"for pending job {jobs[drains_for]}:" in drains[0].detail, drains
    finally:
        world.close()
