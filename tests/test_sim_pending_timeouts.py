"""What `dynamic`'s planner knows of a pending job's timeout in the simulator
(`SimConfig.pending_timeouts`, `runnerctl.sim.inputs.job_timeouts`): GitLab's jobs API
has no timeout, so a real controller knows none ("none") or only the runners'
`maximum_timeout` ("cap"); the trace's own ("trace", the default) is an upper bound.
With "none" nothing is backfilled and the size credits apply; with "cap" the planner
sees the cap for every pending job (age order, and no backfill either: no running job
ends later than the cap) and GitLab kills every job at min(its timeout, cap)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from runnerctl.cli import main
from runnerctl.controller.plan import Observed, Plan, PlanPolicy
from runnerctl.sim import replan
from runnerctl.sim.gitlab_state import SimRunner as GitLabRunner
from runnerctl.sim.hosts import SimRunner
from runnerctl.sim.labtrace import lab_trace
from runnerctl.sim.simulator import SimConfig, Simulator, TraceJob
from runnerctl.sim.timeouts import gitlab_timeout, job_timeouts, parse_runner_timeouts

HOUR = 3600.0


class Recorded:
    """Every plan the simulator computes: the pending jobs' timeouts it was handed and
    the backfill decisions it made."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.timeouts: set[float | None] = set()
        self.backfills = 0
        real = replan.plan

        def plan(observed: Observed, policy: PlanPolicy) -> Plan:
            self.timeouts.update(d.timeout_s for d in observed.demand)
            result = real(observed, policy)
            self.backfills += sum(d.open and d.reason.startswith("backfill") for d in result.decisions)
            return result

        monkeypatch.setattr(replan, "plan", plan)


@pytest.mark.parametrize(("mode", "cap", "singles"), [
    ("trace", None, None), ("none", None, None), ("cap", 2 * HOUR, None), ("cap", 8 * HOUR, 2 * HOUR)])
def test_the_planner_sees_only_what_the_mode_allows_and_backfills_only_known_timeouts(
        monkeypatch: pytest.MonkeyPatch, mode: str, cap: float | None, singles: float | None) -> None:
    jobs, foreign = lab_trace(200, seed=1)
    recorded = Recorded(monkeypatch)
    config = SimConfig(pending_timeouts=mode, runner_max_timeout_s=cap,
                       runner_max_timeout_by_gpus=() if singles is None else ((1, singles),))
    result = Simulator(jobs, config, foreign).run()
    assert result["double_allocations"] == 0 and result["jobs_never_started"] == 0
    if mode == "trace":
        assert recorded.timeouts <= {j.timeout for j in jobs} and len(recorded.timeouts) > 1
        assert recorded.backfills > 0
    elif mode == "none":
        assert recorded.timeouts == {None} and recorded.backfills == 0
    elif singles is None:  # no running job ends later than the cap, so no drain ends late enough to backfill
        assert recorded.timeouts == {cap} and recorded.backfills == 0
    else:  # 1-GPU jobs bounded by their runners' shorter cap backfill drains behind longer jobs
        assert recorded.timeouts == {cap, singles} and recorded.backfills > 0


def _credit_trace() -> list[TraceJob]:
    """An 8-GPU job holds the host for an hour; eight long 1-GPU jobs wait, then a
    younger 4-GPU job."""
    jobs = [TraceJob(1, 0.0, 8, HOUR, timeout=2 * HOUR)]
    jobs += [TraceJob(10 + i, 60.0 + i, 1, 3000.0, timeout=6000.0) for i in range(8)]
    return [*jobs, TraceJob(100, 120.0, 4, 600.0, timeout=1200.0)]


def test_unknown_timeouts_give_big_jobs_the_size_credit_known_ones_age_order() -> None:
    """When the 8-GPU job ends, a planner that knows the timeouts serves the eight older
    1-GPU jobs first (age order); one that knows none gives the younger 4-GPU job its
    credit (`PlanPolicy.idle_credit_s`) and it takes a quad at once."""
    starts = {}
    for mode, cap in (("trace", None), ("cap", 2 * HOUR), ("none", None)):
        sim = Simulator(_credit_trace(), SimConfig(pending_timeouts=mode, runner_max_timeout_s=cap))
        sim.run()
        starts[mode] = sim.started
    freed = starts["none"][1] + HOUR
    assert starts["none"][100] == freed
    assert sum(starts["none"][10 + i] > freed for i in range(8)) == 4  # four singles wait for the quad
    for mode in ("trace", "cap"):
        assert all(starts[mode][10 + i] == freed for i in range(8))
        assert starts[mode][100] > freed + 2000  # behind the 1-GPU jobs


class Ends(Simulator):
    """Notes each started job's runner's `ends_by` (what runnerctl's lease records)."""

    ends_by: dict[int, float | None]

    def _start(self, now: float, host_no: int, gpus: tuple[int, ...], job_id: int,
               runner: SimRunner | None) -> None:
        super()._start(now, host_no, gpus, job_id, runner)
        if runner is not None and runner.job == job_id:
            self.ends_by = {**getattr(self, "ends_by", {}), job_id: runner.ends_by}


def test_with_a_cap_every_job_ends_by_it_as_gitlab_kills_it_then() -> None:
    cap = HOUR
    jobs, foreign = lab_trace(200, seed=2)
    jobs[0] = TraceJob(jobs[0].job_id, jobs[0].submit, 1, 5 * HOUR)  # no timeout of its own: the cap's
    assert sum(j.duration > cap for j in jobs) > 5, "some jobs should outlast the cap"
    sim = Ends(jobs, SimConfig(pending_timeouts="cap", runner_max_timeout_s=cap), foreign)
    sim.run()
    assert len(sim.finished) == len(jobs)
    for job in jobs:
        limit = cap if job.timeout is None else min(job.timeout, cap)
        ran = sim.finished[job.job_id] - sim.started[job.job_id]
        assert ran == pytest.approx(min(job.duration, limit))
        assert sim.ends_by[job.job_id] == pytest.approx(sim.started[job.job_id] + limit)


def test_without_a_cap_running_jobs_keep_their_timeouts() -> None:
    """"none" hides pending jobs' timeouts, not running ones' (CI_JOB_TIMEOUT)."""
    jobs, foreign = lab_trace(100, seed=3)
    sim = Ends(jobs, SimConfig(pending_timeouts="none"), foreign)
    sim.run()
    assert all(sim.ends_by[j.job_id] == pytest.approx(sim.started[j.job_id] + (j.timeout or 0.0))
               for j in jobs)


def test_runners_of_each_size_may_have_their_own_cap() -> None:
    """A `gpus:N` job runs on an N-GPU runner: its runners' cap bounds it. The planner
    knows the bounds only when the runners of every slot size have one, as the
    controller (`Controller._timed`): bounds on some sizes would take the size credit
    from those jobs alone."""
    jobs = [TraceJob(1, 0.0, 1, 10.0, timeout=HOUR), TraceJob(2, 0.0, 2, 10.0, timeout=5 * HOUR),
            TraceJob(3, 0.0, 4, 10.0), TraceJob(4, 0.0, 1, 10.0)]
    config = SimConfig(pending_timeouts="cap", runner_max_timeout_by_gpus=((1, 1800.0), (2, 4 * HOUR)))
    runs, known = job_timeouts(jobs, config)
    assert runs == {1: 1800.0, 2: 4 * HOUR, 3: None, 4: 1800.0}
    assert known == dict.fromkeys(runs)  # the 4- and 8-GPU runners have none
    config = dataclasses.replace(config, runner_max_timeout_s=2 * HOUR)
    assert job_timeouts(jobs, config)[0] == {1: 1800.0, 2: 4 * HOUR, 3: 2 * HOUR, 4: 1800.0}
    assert job_timeouts(jobs, config)[1] == {1: 1800.0, 2: 4 * HOUR, 3: 2 * HOUR, 4: 1800.0}
    assert job_timeouts(jobs, dataclasses.replace(config, pending_timeouts="trace"))[1][3] == 2 * HOUR
    assert set(job_timeouts(jobs, dataclasses.replace(config, pending_timeouts="none"))[1].values()) == {None}


def test_runner_timeouts_on_the_command_line() -> None:
    assert parse_runner_timeouts("86400") == (86400.0, ())
    assert parse_runner_timeouts("86400, 1=7200,2=3600") == (86400.0, ((1, 7200.0), (2, 3600.0)))
    assert parse_runner_timeouts("1=7200") == (None, ((1, 7200.0),))
    for bad in ("x", "a=7200", "0=7200", "1=", ""):
        with pytest.raises(ValueError, match="runner maximum timeout"):
            parse_runner_timeouts(bad)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"pending_timeouts": "oracle"}, "unknown pending_timeouts 'oracle'"),
    ({"pending_timeouts": "cap"}, "needs the runners' maximum timeout"),
    ({"runner_max_timeout_s": 60.0}, "at least 600"),
    ({"runner_max_timeout_by_gpus": ((1, 599.0),)}, "at least 600"),
    ({"runner_max_timeout_s": float("inf")}, "at least 600"),
])
def test_bad_configurations_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SimConfig(**kwargs)  # type: ignore[arg-type]


def test_cli_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text("job_id,submit_time,gpus,duration,timeout\n1,0,1,7200,10000\n2,0,2,60,\n")
    assert main(["simulate", "--trace", str(trace), "--json", "--pending-timeouts", "cap",
                 "--runner-max-timeout-s", "3600"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["jobs_completed"] == 2 and result["makespan_s"] < 3700  # killed at the cap
    assert main(["simulate", "--trace", str(trace), "--json", "--pending-timeouts", "cap",
                 "--runner-max-timeout-s", "2=600"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["makespan_s"] > 7000  # the 1-GPU job's runners have no cap: it runs to the end
    for args in (["--pending-timeouts", "cap"], ["--runner-max-timeout-s", "1=60"],
                 ["--runner-max-timeout-s", "1h"]):
        assert main(["simulate", "--trace", str(trace), *args]) == 3
        err = capsys.readouterr().err
        assert "maximum timeout" in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2


def test_gitlab_timeout_is_the_smaller_of_job_and_runner_and_the_fake_gitlab_uses_it() -> None:
    assert gitlab_timeout(None, None) is None
    assert gitlab_timeout(3600, None) == 3600
    assert gitlab_timeout(None, 600) == 600
    assert gitlab_timeout(3600, 600) == 600
    assert gitlab_timeout(600, 3600) == 600
    runner = GitLabRunner(id=1, description="gpu0", runner_type="group_type", tags=frozenset(),
                          paused=False, token="t", created_at=0.0)
    assert runner.job_timeout(3600) == 3600  # none set: the project's
    runner.maximum_timeout = 900
    assert runner.job_timeout(3600) == 900
    assert runner.job_timeout(600) == 600
