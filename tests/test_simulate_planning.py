"""`runnerctl simulate` as a capacity planner uses it: what a cap costs, who got nothing,
and runner caps by size (found by a review as a lab admin planning capacity).

Each case is small enough to work out by hand on one 8-GPU host (the docstrings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runnerctl.cli import main


def simulate(tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, *args: str) -> dict[str, object]:
    trace = tmp_path / "jobs.csv"
    trace.write_text(body)
    code = main(["simulate", "--trace", str(trace), "--json", *args])
    out = capsys.readouterr()
    assert code == 0, out.err
    result: dict[str, object] = json.loads(out.out)
    return result


def test_a_job_cut_at_its_runners_cap_is_counted_as_timed_out_with_the_work_lost(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Job 1 would run 10,000 s; the 1-GPU runners' cap (2 h) ends it at 7,200 s: GitLab
    fails it, 2,800 GPU-seconds of its work undone. Shorter waits alone would hide that."""
    body = "job_id,submit_time,gpus,duration,user\n1,0,1,10000,a\n2,0,1,3600,a\n3,100,8,3600,b\n"
    free = simulate(tmp_path, capsys, body)
    capped = simulate(tmp_path, capsys, body, "--runner-max-timeout-s", "1=7200")
    assert free["jobs_timed_out"] == 0 and free["timed_out_gpu_hours_cut"] == 0
    assert capped["jobs_timed_out"] == 1
    assert capped["timed_out_gpu_hours_cut"] == round(2800 / 3600, 3)
    users = capped["users"]
    assert isinstance(users, dict)
    assert users["a"]["timed_out"] == 1 and users["b"]["timed_out"] == 0


def test_users_whose_jobs_gitlab_dropped_are_shown_not_left_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """static-singles has no 8-GPU runner: GitLab drops alice's and bob's jobs after an
    hour. They got nothing; the per-user figures say so, and Jain's index is over carol
    alone (the only user whose jobs ran)."""
    body = ("job_id,submit_time,gpus,duration,user\n1,0,8,3600,alice\n2,0,8,3600,bob\n"
            "3,0,1,1800,carol\n4,0,1,1800,carol\n")
    result = simulate(tmp_path, capsys, body, "--policy", "static-singles")
    assert result["jobs_dropped_by_gpus"] == {"8": 2}
    users = result["users"]
    assert isinstance(users, dict)
    assert users["alice"] == {"jobs": 0, "gpu_hours": 0.0, "timed_out": 0, "dropped": 1}
    assert users["bob"]["dropped"] == 1 and "mean_slowdown" not in users["bob"]
    assert users["carol"]["jobs"] == 2 and users["carol"]["dropped"] == 0
    assert result["jain_slowdown"] == 1.0


CAPPED_TRACE = ("job_id,submit_time,gpus,duration,user\n1,0,2,3000,a\n2,10,{whole},600,b\n"
                "3,20,1,500,c\n4,25,1,500,c\n5,30,1,500,c\n")


@pytest.mark.parametrize(("gpus", "caps"), [(5, "1=600,2=3600,5=86400"), (6, "1=600,2=3600,4=3600,6=86400")])
def test_cap_knows_pending_timeouts_when_every_runner_size_of_the_host_has_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], gpus: int, caps: str) -> None:
    """A 5-GPU host has runners of 1, 2 and 5 GPUs (no 4: `layout.plan_slots`). With each
    capped, the 1-GPU jobs are known to end within 600 s and backfill the block drained for
    the whole-host job behind job 1; without, they wait behind it (about 3,580 s). The
    sizes were once taken as 1, 2, 4, 8, 16 up to the host, so on 5 GPUs `cap` knew nothing."""
    body = CAPPED_TRACE.format(whole=gpus)
    args = ("--gpus-per-host", str(gpus), "--runner-max-timeout-s", caps, "--pending-timeouts")
    known = simulate(tmp_path, capsys, body, *args, "cap")
    blind = simulate(tmp_path, capsys, body, *args, "none")
    waits_known, waits_blind = known["wait_max_s"], blind["wait_max_s"]
    assert isinstance(waits_known, dict) and isinstance(waits_blind, dict)
    assert waits_blind["1"] > 3000 and waits_known["1"] < 60, (waits_known, waits_blind)


def test_cap_with_some_runner_sizes_uncapped_says_the_planner_knows_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """All sizes or none, as the controller (which logs the same): said on stderr, once."""
    trace = tmp_path / "jobs.csv"
    trace.write_text(CAPPED_TRACE.format(whole=8))
    assert main(["simulate", "--trace", str(trace), "--runner-max-timeout-s", "1=600",
                 "--pending-timeouts", "cap"]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the 2, 4, 8-GPU runners have no maximum timeout" in err, err


@pytest.mark.parametrize("caps", ["3=700", "16=7200", "86400,5=900"])
def test_a_cap_for_a_runner_size_the_host_has_not_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], caps: str) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text(CAPPED_TRACE.format(whole=8))
    assert main(["simulate", "--trace", str(trace), "--runner-max-timeout-s", caps]) == 3
    err = capsys.readouterr().err
    assert err.startswith("runnerctl: error: runner maximum timeout for ") and err.count("\n") == 1, err
    assert "no runner holds that many GPUs on a 8-GPU host (runners hold 1, 2, 4, 8)" in err
