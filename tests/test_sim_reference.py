"""Issue 16: the `easy-oracle` reference policy, the per-user metrics and Jain's index
of `runnerctl simulate --json`, and the trace's `user` and `timeout` columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runnerctl.cli import main
from runnerctl.errors import ConfigError
from runnerctl.sim.simulator import ForeignUse, SimConfig, Simulator, TraceJob
from runnerctl.sim.trace import read_jobs, synthetic


def test_easy_backfills_only_jobs_that_do_not_delay_the_reservation() -> None:
    """Seven GPUs busy until 100 s, one until 50 s: the 8-GPU job (oldest blocked) is
    reserved for 100 s. A 1-GPU job of 40 s fits before that and jumps ahead; one of
    80 s would delay it and waits; greedy starts it when a GPU frees (90 s), which holds
    the 8-GPU job until 170 s."""
    jobs = [*(TraceJob(i, 0.0, 1, 100.0) for i in range(1, 8)), TraceJob(8, 0.0, 1, 50.0),
            TraceJob(9, 1.0, 8, 10.0), TraceJob(10, 2.0, 1, 40.0), TraceJob(11, 3.0, 1, 80.0)]
    easy = Simulator(jobs, SimConfig(policy="easy-oracle"))
    easy.run()
    assert easy.started[10] == 50.0  # backfilled: ends at 90 s, before the reservation
    assert easy.started[9] == 100.0  # the reservation holds
    assert easy.started[11] == 110.0  # would have ended past 100 s: after the 8-GPU job
    greedy = Simulator(jobs, SimConfig(policy="greedy"))
    greedy.run()
    assert greedy.started[11] == 90.0 and greedy.started[9] == 170.0


def test_easy_knows_when_foreign_use_ends() -> None:
    """GPU 3 is held by a colleague until 500 s (+30 s cool-down): the 8-GPU job's
    reservation is at 530 s, so a 1-GPU job of 400 s backfills at once."""
    jobs = [TraceJob(1, 0.0, 8, 10.0), TraceJob(2, 1.0, 1, 400.0)]
    sim = Simulator(jobs, SimConfig(policy="easy-oracle"), [ForeignUse(0.0, 500.0, 0, 3)])
    sim.run()
    assert sim.started == {1: 530.0, 2: 1.0}
    assert sim.placement[2][1] != (3,) and sim.foreign_collisions == 0


@pytest.mark.parametrize(("hosts", "foreign_per_host"), [(1, 0), (4, 2)], ids=["1x8", "4x8+foreign"])
def test_easy_oracle_is_near_the_bound_and_starves_no_size(hosts: int, foreign_per_host: int) -> None:
    jobs, foreign = synthetic(300 * hosts, hosts=hosts, seed=3, foreign_per_host=foreign_per_host)
    results = {p: Simulator(jobs, SimConfig(hosts=hosts, policy=p), foreign).run()
               for p in ("easy-oracle", "greedy", "fifo")}
    easy, greedy, fifo = results["easy-oracle"], results["greedy"], results["fifo"]
    assert easy["double_allocations"] == 0 and easy["foreign_collisions"] == 0
    assert easy["jobs_completed"] == len(jobs)
    assert float(easy["makespan_s"]) < float(fifo["makespan_s"])  # type: ignore[arg-type]
    assert easy["wait_max_s"][8] < greedy["wait_max_s"][8]  # type: ignore[index]


def test_json_reports_users_and_jain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ann's two 1-GPU jobs start at once; bob's 8-GPU job waits 100 s behind them:
    slowdowns 1, 1 and 2 (bounded: 100 s run), Jain over (1, 2) = 9 / 10."""
    trace = tmp_path / "jobs.csv"
    trace.write_text("job_id,submit_time,gpus,duration,project,priority,user,timeout\n"
                     "1,0,1,100,ml,normal,ann,3600\n2,0,1,100,ml,normal,ann,\n3,0,8,100,cv,normal,bob,7200\n")
    assert [j.timeout for j in read_jobs(trace)] == [3600.0, None, 7200.0]
    assert main(["simulate", "--trace", str(trace), "--policy", "easy-oracle", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["users"] == {
        "ann": {"jobs": 2, "gpu_hours": 0.056, "timed_out": 0, "dropped": 0, "wait_p50_s": 0.0,
                "wait_p95_s": 0.0, "mean_slowdown": 1.0},
        "bob": {"jobs": 1, "gpu_hours": 0.222, "timed_out": 0, "dropped": 0, "wait_p50_s": 100.0,
                "wait_p95_s": 100.0, "mean_slowdown": 2.0}}
    assert result["jain_slowdown"] == 0.9


def test_users_default_to_projects_and_slowdown_is_bounded() -> None:
    jobs = [TraceJob(1, 0.0, 8, 120.0, project="a"), TraceJob(2, 0.0, 8, 1.0, project="b"),
            TraceJob(3, 0.0, 8, 30.0, project="c", user="cy")]
    result = Simulator(jobs, SimConfig(policy="greedy")).run()
    users = result["users"]
    assert isinstance(users, dict) and set(users) == {"a", "b", "cy"}
    assert users["a"]["mean_slowdown"] == 1.0
    assert users["b"]["mean_slowdown"] == round(121 / 60, 3)  # 120 s wait, 1 s run, floor 60 s
    assert users["cy"]["mean_slowdown"] == round(151 / 60, 3)


@pytest.mark.parametrize("value", ["soon", "0", "-5", "inf", "nan"])
def test_bad_timeout_names_its_line(tmp_path: Path, value: str) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text(f"job_id,submit_time,gpus,duration,timeout\n1,0,1,10,60\n2,0,1,10,{value}\n")
    with pytest.raises(ConfigError, match=r"line 3: timeout .* seconds"):
        read_jobs(trace)
