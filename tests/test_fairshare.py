"""Fair share (issue 16): decayed usage, shares, the bounded penalty, and its effect on
the planner and in the simulator (with GitLab's job order for group and instance runners)."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from runnerctl.cli import main
from runnerctl.controller.fairshare import DAY_S, FairPolicy, Penalties, Span, Usage, decayed_gpu_s, factor
from runnerctl.controller.plan import Demand, Observed, SlotState, plan
from runnerctl.gpus.sim import count_snapshot
from runnerctl.layout import plan_slots
from runnerctl.settings import load_settings
from runnerctl.sim.simulator import SimConfig, Simulator, TraceJob
from runnerctl.sim.trace import synthetic

HOUR = 3600.0


def test_usage_halves_every_half_life() -> None:
    now = 10 * DAY_S
    fresh = decayed_gpu_s(2, now - HOUR, now, now, 7 * DAY_S)
    week_old = decayed_gpu_s(2, now - 7 * DAY_S - HOUR, now - 7 * DAY_S, now, 7 * DAY_S)
    assert fresh == pytest.approx(2 * HOUR, rel=1e-2)  # an hour decays a little
    assert week_old == pytest.approx(fresh / 2, rel=1e-6)
    assert decayed_gpu_s(1, now + 5, now + 10, now, DAY_S) == 0.0  # not yet used


def test_incremental_usage_equals_reading_it_at_once() -> None:
    spans = [Span("ann", "a", 4, 0.0, 5 * HOUR), Span("bob", "b", 1, HOUR, None)]
    whole = Usage.of(spans, 10 * HOUR, DAY_S)
    step = Usage(DAY_S)
    for at in (2 * HOUR, 6 * HOUR, 10 * HOUR):
        last = step.at
        step.decay_to(at)
        for span in spans:
            step.add(span, since=last)
    assert step.users == pytest.approx(whole.users)
    assert step.projects == pytest.approx(whole.projects)


def test_factor_is_slurms_classic_two_to_the_minus_usage_over_share() -> None:
    used = {"ann": 30.0, "bob": 10.0}
    assert factor(used, "ann", {}, ()) == pytest.approx(2 ** -(0.75 / 0.5))
    assert factor(used, "bob", {}, ()) == pytest.approx(2 ** -(0.25 / 0.5))
    assert factor(used, "cat", {}, ()) == 1.0  # no use: no penalty, though she counts in the shares
    assert factor(used, "ann", {}, ("cat",)) == pytest.approx(2 ** -(0.75 / (1 / 3)))
    # ann holds 3 shares of 4: her 75 % of the use is exactly her share
    assert factor(used, "ann", {"ann": 3.0}, ()) == pytest.approx(0.5)


def test_penalty_is_bounded_and_zero_when_off() -> None:
    usage = Usage.of([Span("ann", "a", 8, 0.0, 100 * HOUR)], 100 * HOUR, DAY_S)
    policy = FairPolicy(weight_s=2 * HOUR)
    heavy = Penalties(usage, policy, users={"ann", "bob"}).penalty_s("ann", "a")
    assert 0 < heavy < 2 * HOUR
    assert Penalties(usage, policy).penalty_s("bob", "b") == 0.0
    assert Penalties(usage, FairPolicy()).penalty_s("ann", "a") == 0.0
    with pytest.raises(ValueError, match="half-life"):
        Usage(0.0)


def test_a_heavy_users_older_job_drains_after_a_light_users_younger_one() -> None:
    """Every GPU busy with 1-GPU jobs, two 4-GPU jobs waiting: without fair share the
    older one drains a block; with the heavy user's penalty the light user's one does."""
    slots = plan_slots(count_snapshot("gpu-a", 8))
    states = tuple(SlotState(s, s.size > 1, (100 + s.gpus[0],) if s.size == 1 else ()) for s in slots)
    heavy, light = Demand(1, 4, 0.0), Demand(2, 4, 600.0)
    before = plan(Observed(states, demand=(heavy, light)))
    assert set(before.reserved.values()) == {1}
    after = plan(Observed(states, demand=(dataclasses.replace(heavy, fair_s=1800.0), light)))
    assert set(after.reserved.values()) == {2}
    # bounded: a job that waited longer than the penalty wins again
    old_heavy = Demand(1, 4, -1200.0, fair_s=1800.0)
    assert set(plan(Observed(states, demand=(old_heavy, light))).reserved.values()) == {1}
    # priority first: a high-priority heavy job drains before any normal one
    urgent = Demand(1, 4, 0.0, "high", fair_s=1800.0)
    assert set(plan(Observed(states, demand=(urgent, light))).reserved.values()) == {1}


def test_instance_runners_take_the_project_with_fewest_running_jobs_first() -> None:
    jobs = [TraceJob(1, 0.0, 1, 1000.0, project="a"), TraceJob(2, 0.0, 1, 100.0, project="a"),
            TraceJob(3, 0.0, 1, 100.0, project="a"), TraceJob(4, 1.0, 1, 100.0, project="b")]
    starts = {}
    for runner_type in ("group", "instance"):
        sim = Simulator(jobs, SimConfig(gpus_per_host=2, policy="static-singles", runner_type=runner_type))
        sim.run()
        starts[runner_type] = sim.started
    assert starts["group"][3] < starts["group"][4]  # GitLab hands group runners the oldest job
    assert starts["instance"][4] < starts["instance"][3]  # project b runs nothing: it goes first
    with pytest.raises(ValueError, match="runner type"):
        Simulator(jobs, SimConfig(runner_type="project"))


def test_fair_share_lets_a_light_users_smaller_job_start_first() -> None:
    """A heavy user filled the host (GPUs 0-3 free at 1000 s); then they ask for 4 GPUs and
    a light user for 2, at once. Without fair share the 4-GPU job takes GPUs 0-3 (a big
    job counts `idle_credit_s` older per extra GPU); with a fair-share weight above that
    credit the light user's job starts first. The weight must exceed the size credits to
    reorder sizes (docs/fairshare.md)."""
    jobs = [TraceJob(i, 0.0, 1, 1000.0 if i <= 4 else HOUR, project="h") for i in range(1, 9)]
    jobs += [TraceJob(9, 400.0, 4, 100.0, project="h"), TraceJob(10, 400.0, 2, 100.0, project="l")]
    off = Simulator(jobs, SimConfig())
    off.run()
    on = Simulator(jobs, SimConfig(fair=FairPolicy(weight_s=12 * HOUR)))
    on.run()
    assert off.started[9] < off.started[10]
    assert on.started[10] < on.started[9]


def _flood(runner_type: str) -> dict[str, object]:
    jobs = [TraceJob(i, 0.0, 1, 600.0, project="flood") for i in range(1, 41)]
    jobs += [TraceJob(100 + 10 * u + k, 10.0 + k, 1, 600.0, project=f"other{u}")
             for u in range(3) for k in range(2)]
    fair = FairPolicy(weight_s=4 * HOUR)
    return Simulator(jobs, SimConfig(runner_type=runner_type, fair=fair)).run()


def test_flood_instance_runners_keep_the_others_waits_short_group_runners_do_not() -> None:
    """One user submits 40 1-GPU jobs at once, three others 2 each, on 8 GPUs: with
    instance runners GitLab serves the others first; with group runners it hands out the
    oldest job, so the others wait behind the flood (runnerctl cannot reorder 1-GPU jobs)."""
    instance, group = _flood("instance"), _flood("group")
    users_i, users_g = instance["users"], group["users"]
    assert isinstance(users_i, dict) and isinstance(users_g, dict)
    others = [f"other{u}" for u in range(3)]
    assert max(users_i[o]["wait_p95_s"] for o in others) <= 600.0
    assert min(users_g[o]["wait_p95_s"] for o in others) >= 4 * 600.0
    assert float(instance["jain_slowdown"]) >= 0.8  # type: ignore[arg-type]
    assert instance["jobs_completed"] == group["jobs_completed"] == 46  # the flood runs too


@pytest.mark.parametrize("seed", [1, 2])
def test_fair_share_schedule_same_as_planning_every_host(seed: int) -> None:
    """With fair share on, skipping hosts (`replan.sees`) still gives the schedule of
    planning every host at every tick."""
    from tests.test_simulator_replan import EveryHost

    trace, uses = synthetic(300, hosts=3, seed=seed, foreign_per_host=1)
    rng = random.Random(seed)
    trace = [dataclasses.replace(j, user=rng.choice(["ann", "bob", "cat"]),
                                 project=rng.choice(["a", "b"])) for j in trace]
    config = SimConfig(hosts=3, fair=FairPolicy(weight_s=2 * HOUR, half_life_s=DAY_S), fair_update_s=600.0)
    lazy, eager = Simulator(trace, config, uses), EveryHost(trace, config, uses)
    assert lazy.run() == eager.run()
    assert lazy.started == eager.started and lazy.placement == eager.placement
    assert lazy.actions == eager.actions
    unfair = Simulator(trace, dataclasses.replace(config, fair=FairPolicy()), uses)
    unfair.run()
    assert unfair.started != lazy.started  # fair share changed the schedule: the check means something


def test_simulate_command_takes_runner_type_and_fair_share(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "jobs.csv"
    rows = [f"{i},0,1,600,flood,normal,fay" for i in range(1, 21)] + ["30,10,1,600,other,normal,ola"]
    trace.write_text("job_id,submit_time,gpus,duration,project,priority,user\n" + "\n".join(rows) + "\n")
    waits = {}
    for runner_type in ("group", "instance"):
        assert main(["simulate", "--trace", str(trace), "--runner-type", runner_type,
                     "--fair-weight-h", "4", "--json"]) == 0
        waits[runner_type] = json.loads(capsys.readouterr().out)["users"]["ola"]["wait_p50_s"]
    assert waits["instance"] < 1000 <= waits["group"]  # the first free GPU vs behind the flood
    assert main(["simulate", "--trace", str(trace), "--runner-type", "project"]) == 2
    assert "project" in capsys.readouterr().err


def test_fair_share_settings_load_with_integer_shares(tmp_path: Path) -> None:
    path = tmp_path / "runnerctl.toml"
    path.write_text("[controller]\nfair_weight_h = 4\nuser_shares = { ann = 2, bob = 0.5 }\n")
    settings = load_settings(path).controller
    assert settings.user_shares == {"ann": 2.0, "bob": 0.5} and settings.fair_weight_h == 4.0
