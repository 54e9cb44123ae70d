"""`simulate`'s metrics count a job for the time it ran: its duration, but at most its
timeout (the trace's, capped by the runners' maximum timeout), as the simulator ends it
(`Simulator.run_time`): in the lower bound, GPU-hours and slowdowns alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runnerctl.cli import main


def test_a_job_counts_for_the_time_it_ran_not_its_duration(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """One GPU: bob runs 600 s; alice's 3600 s job is killed at its 600 s timeout after
    waiting 600 s; carol's 5000 s job at the runners' 900 s after waiting 1200 s."""
    trace = tmp_path / "jobs.csv"
    trace.write_text("job_id,submit_time,gpus,duration,user,timeout\n"
                     "1,0,1,600,bob,\n2,0,1,3600,alice,600\n3,0,1,5000,carol,\n")
    assert main(["simulate", "--trace", str(trace), "--gpus-per-host", "1", "--policy", "greedy",
                 "--runner-max-timeout-s", "900", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["makespan_s"] == result["lower_bound_s"] == 600 + 600 + 900
    users = result["users"]
    assert {u: users[u]["gpu_hours"] for u in users} == {"alice": round(600 / 3600, 3),
                                                         "bob": round(600 / 3600, 3),
                                                         "carol": round(900 / 3600, 3)}
    assert {u: users[u]["mean_slowdown"] for u in users} == {"alice": (600 + 600) / 600, "bob": 1.0,
                                                             "carol": round((1200 + 900) / 900, 3)}


def test_a_lone_job_killed_at_its_timeout_meets_the_lower_bound(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text("job_id,submit_time,gpus,duration,user,timeout\n1,0,2,3600,alice,600\n")
    assert main(["simulate", "--trace", str(trace), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["makespan_s"] == result["lower_bound_s"] == 600.0
    assert result["users"]["alice"]["gpu_hours"] == round(2 * 600 / 3600, 3)
