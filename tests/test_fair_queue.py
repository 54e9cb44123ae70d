"""Fair share's queue share (issue 16, a new user's flood): pending and running work count
at once, not only past usage, through one function (`fairshare.fair_seconds`) that the
controller and the simulator both call."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runnerctl.controller import jobs_store
from runnerctl.controller.demand import PendingJob
from runnerctl.controller.fair_usage import FairShare
from runnerctl.controller.fairshare import (
    FairPolicy,
    Penalties,
    Queued,
    Span,
    Usage,
    fair_seconds,
    queue_share_s,
)
from runnerctl.controller.jobs_store import JobRecord
from runnerctl.controller.plan import Demand, Observed, SlotState, plan
from runnerctl.controller.store import Store
from runnerctl.gpus.sim import count_snapshot
from runnerctl.layout import plan_slots
from runnerctl.settings import ControllerSettings
from runnerctl.sim.simulator import SimConfig, Simulator, TraceJob

HOUR = 3600.0
STEP = 300.0


def _no_usage(policy: FairPolicy) -> Penalties:
    return Penalties(Usage(policy.half_life_s), policy)


def test_a_flood_users_kth_job_counts_k_steps_younger() -> None:
    flood = [Queued(i, "fay", "f", 1, 0.0) for i in range(1, 201)]
    share = queue_share_s(flood, (), STEP)
    assert [share[i] for i in (1, 2, 3, 101)] == [0.0, STEP, 2 * STEP, 100 * STEP]
    running = [Queued(900, "fay", "f", 4, -HOUR)]  # 4 GPUs running count before every pending one
    assert queue_share_s(flood[:2], running, STEP) == {1: 4 * STEP, 2: 5 * STEP}
    # user and project count half each: another user's jobs in fay's project count half
    mixed = [Queued(1, "ann", "f", 2, 0.0), Queued(2, "fay", "f", 1, 1.0)]
    assert queue_share_s(mixed, (), STEP)[2] == STEP * (0 + 2) / 2


def test_two_users_jobs_interleave() -> None:
    """ann submits five 1-GPU jobs, bob five a minute later: ordered by age plus queue
    share they alternate, ann's first (round robin), not all of ann's first."""
    policy = FairPolicy(weight_s=12 * HOUR, queue_step_s=STEP)
    jobs = [Queued(i, "ann", "a", 1, 0.0) for i in range(1, 6)]
    jobs += [Queued(10 + i, "bob", "b", 1, 60.0) for i in range(1, 6)]
    fair = fair_seconds(_no_usage(policy), jobs, ())
    order = [j.user for j in sorted(jobs, key=lambda j: (j.created_at + fair[j.job_id], j.job_id))]
    assert order == ["ann", "bob"] * 5


def test_fair_s_is_bounded_by_the_weight_and_grows_with_usage_and_queue() -> None:
    policy = FairPolicy(weight_s=2 * HOUR, queue_step_s=STEP)
    flood = [Queued(i, "fay", "f", 8, 0.0) for i in range(1, 51)]
    fair = fair_seconds(_no_usage(policy), flood, ())
    values = [fair[j.job_id] for j in flood]
    assert values[0] == 0.0 and all(0 <= v < policy.weight_s for v in values)  # no job starves
    assert values == sorted(values) and len(set(values)) == len(values)  # later ones later, none equal
    assert values[1] == pytest.approx(8 * STEP, rel=0.2)  # about k x step while small against the weight
    assert values[1] == pytest.approx(policy.weight_s * (1 - math.exp(-8 * STEP / policy.weight_s)))
    huge = [Queued(i, "fay", "f", 8, 0.0) for i in range(1, 10_001)]
    assert max(fair_seconds(_no_usage(policy), huge, ()).values()) <= policy.weight_s
    # a heavy past user with the same queue counts younger still, but under the weight
    usage = Usage.of([Span("fay", "f", 8, -100 * HOUR, 0.0)], 0.0, policy.half_life_s)
    heavy = fair_seconds(Penalties(usage, policy, users={"fay", "bob"}, projects={"f", "b"}), flood, ())
    assert all(fair[j] < heavy[j] < policy.weight_s for j in (1, 2, 50))
    assert fair_seconds(_no_usage(FairPolicy(queue_step_s=STEP)), flood, ()) == {}  # off by default


_JOB = st.tuples(st.sampled_from(["ann", "bob", "cat"]), st.sampled_from(["a", "b"]),
                 st.sampled_from([1, 2, 4, 8]), st.floats(0, 10 * HOUR))


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(pending=st.lists(_JOB, max_size=60), running=st.lists(_JOB, max_size=20),
       used=st.lists(_JOB, max_size=5), weight_h=st.floats(0.1, 48), step_min=st.floats(0, 120))
def test_no_job_counts_more_than_the_weight_younger_and_a_users_jobs_keep_their_order(
        pending: list[tuple[str, str, int, float]], running: list[tuple[str, str, int, float]],
        used: list[tuple[str, str, int, float]], weight_h: float, step_min: float) -> None:
    """Whatever waits and runs: every pending job's fair_s is in [0, weight] (so a job
    that waited the weight longer than any other goes first: none starves), and a user's
    jobs of one project keep their age order."""
    policy = FairPolicy(weight_s=weight_h * HOUR, queue_step_s=step_min * 60)
    now = 10 * HOUR
    usage = Usage.of([Span(u, p, g, t - HOUR, t) for u, p, g, t in used], now, policy.half_life_s)
    jobs = [Queued(i, u, p, g, t) for i, (u, p, g, t) in enumerate(pending)]
    fair = fair_seconds(Penalties(usage, policy, users={j.user for j in jobs},
                                  projects={j.project for j in jobs}),
                        jobs, [Queued(1000 + i, u, p, g, t) for i, (u, p, g, t) in enumerate(running)])
    assert set(fair) == {j.job_id for j in jobs}
    assert all(0.0 <= s <= policy.weight_s for s in fair.values())
    for a in jobs:
        for b in jobs:
            same = (a.user, a.project) == (b.user, b.project)
            if same and (a.created_at, a.job_id) < (b.created_at, b.job_id):
                assert a.created_at + fair[a.job_id] <= b.created_at + fair[b.job_id] + 1e-6


def test_the_planner_drains_for_the_other_users_younger_job() -> None:
    """Every GPU busy with 1-GPU jobs; fay (no past use, one job running, two 4-GPU jobs
    waiting since 0 s) and bob (a 4-GPU job since 60 s). By age fay's first job drains the
    block; with the queue share bob's does, though fay has no usage yet."""
    slots = plan_slots(count_snapshot("gpu-a", 8))
    states = tuple(SlotState(s, s.size > 1, (100 + s.gpus[0],) if s.size == 1 else ()) for s in slots)
    jobs = [Queued(1, "fay", "f", 4, 0.0), Queued(2, "fay", "f", 4, 0.0), Queued(3, "bob", "b", 4, 60.0)]
    running = [Queued(100, "fay", "f", 1, -600.0)]
    demand = [Demand(j.job_id, j.gpus, j.created_at, timeout_s=HOUR) for j in jobs]
    assert set(plan(Observed(states, demand=tuple(demand))).reserved.values()) == {1}
    fair = fair_seconds(_no_usage(FairPolicy(weight_s=12 * HOUR, queue_step_s=STEP)), jobs, running)
    fairly = tuple(dataclasses.replace(d, fair_s=fair[d.job_id]) for d in demand)
    assert set(plan(Observed(states, demand=fairly)).reserved.values()) == {3}


def test_a_new_users_flood_lets_the_others_two_gpu_job_start_soon() -> None:
    """On 8 GPUs a new user floods 40 1-GPU jobs of 30 minutes; another asks for 2 GPUs a
    minute later. Usage (read here every two hours) counts the flood only once it has run;
    until then the 2-GPU job waits behind every older 1-GPU job, rounds of the flood. The
    queue share counts the flood at once: the 2-GPU job starts after the first round."""
    trace = [TraceJob(i, 0.0, 1, 1800.0, project="flood", timeout=HOUR) for i in range(1, 41)]
    trace.append(TraceJob(100, 60.0, 2, 600.0, project="other", timeout=HOUR))
    starts = {}
    for step in (0.0, STEP):
        config = SimConfig(runner_type="instance", fair_update_s=2 * HOUR,
                           fair=FairPolicy(weight_s=12 * HOUR, queue_step_s=step))
        sim = Simulator(trace, config)
        sim.run()
        starts[step] = sim.started[100] - 60.0
    assert starts[STEP] <= 1800.0 and starts[0.0] >= 2 * 1800.0


def _record(job_id: int, user: str, project: str, gpus: int, start: float, end: float | None,
            now: float) -> JobRecord:
    return JobRecord(host="gpu-a", job_id=job_id, slot="s", gpus=tuple(range(gpus)), project=project,
                     pipeline="1", name="train", user=user, url="", queued_at=None, started_at=start,
                     seen_at=now if end is None else end, ended_at=end,
                     outcome="running" if end is None else "ended")


def test_the_controller_and_the_simulator_give_the_same_fair_s(tmp_path: Path) -> None:
    """The same past, running and pending jobs, read by the controller (job history in its
    store, pending jobs from GitLab) and by the simulator (its started jobs and queue):
    the same `fair_s` for every pending job, at a usage read and between two (a job that
    started counts as running at once, once even while an older poll still lists it)."""
    now = time.time()
    ran = [(1, "ann", "g/a", 4, now - 5 * HOUR, now - 2 * HOUR),
           (2, "bob", "g/b", 1, now - HOUR, now - 600.0), (3, "ann", "g/a", 2, now - 1800.0, None),
           (4, "cat", "g/c", 1, now - 900.0, None)]
    waiting = [(10, "ann", "g/a", 1, now - 3000.0), (11, "bob", "g/b", 2, now - 2000.0),
               (12, "ann", "g/a", 4, now - 1000.0), (13, "dan", "g/d", 1, now - 500.0),
               (14, "cat", "g/c", 1, now - 100.0)]
    settings = ControllerSettings(fair_weight_h=6.0, fair_half_life_h=24.0)
    store = Store.open(state_dir=tmp_path)
    jobs_store.save_jobs(store, [_record(*r, now=now) for r in ran])

    def pending_job(j: int, user: str, project: str, gpus: int, created: float) -> PendingJob:
        url = f"https://gitlab.example/{project}/-/jobs/{j}"
        return PendingJob(j, 7, gpus, created, "normal", None, url, user)

    pending = [pending_job(*w) for w in waiting]
    fair = FairShare(store, settings)
    controller = fair.penalties(pending, now)
    # 30 s later, between two usage reads: ann's job 10 started (its host wrote its row),
    # eve's job 15 arrived; GitLab's list may still show job 10 pending (an older poll)
    later = now + 30.0
    jobs_store.save_jobs(store, [_record(10, "ann", "g/a", 1, later, None, now=later)])
    eve = (15, "eve", "g/e", 1, later - 10.0)
    fresh = [pending_job(*w) for w in [*waiting[1:], eve]]
    controller_later = fair.penalties(fresh, later)
    controller_stale = fair.penalties([pending[0], *fresh], later)
    store.close()

    t0 = now - 10 * HOUR  # the simulator's clock starts at 0
    trace = [TraceJob(j, start - t0, gpus, HOUR, project=project, user=user)
             for j, user, project, gpus, start, _ in ran]
    trace += [TraceJob(j, created - t0, gpus, HOUR, project=project, user=user)
              for j, user, project, gpus, created in [*waiting, eve]]
    config = SimConfig(fair=FairPolicy(weight_s=6 * HOUR, half_life_s=24 * HOUR))
    sim = Simulator(trace, config)
    for j, _, _, _, start, end in ran:
        sim.fair.started(sim.jobs[j], start - t0)
        if end is not None:
            sim.fair.finished(sim.jobs[j], end - t0)
    for j, *_ in waiting:
        sim.queue.add(j, sim.jobs[j].gpus, "normal")
    assert sim.fair.refresh(sim, now - t0)
    simulated = {j: sim.fair.fair_s(sim.jobs[j]) for j, *_ in waiting}
    assert simulated == pytest.approx(controller, rel=1e-9, abs=1e-6)
    assert len(set(round(v) for v in controller.values())) == len(waiting)  # the check tells them apart

    sim.fair.started(sim.jobs[10], later - t0)
    sim.queue.remove(10)
    sim.queue.add(15, 1, "normal")
    assert sim.fair.refresh(sim, later - t0)  # job 10 now runs, eve waits: values moved
    simulated = {j: sim.fair.fair_s(sim.jobs[j]) for j in controller_later}
    assert simulated == pytest.approx(controller_later, rel=1e-9, abs=1e-6)
    assert controller_later[11] != pytest.approx(controller[11])  # eve counts among those present
    assert controller_later[12] > controller[12]  # ann's job 10 runs: counted at once, not a minute later
    del controller_stale[10]
    assert controller_stale == pytest.approx(controller_later, rel=1e-9, abs=1e-6)  # job 10 counted once


def test_simulate_command_takes_the_queue_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`runnerctl simulate --fair-queue-step-min`: with 0 (usage only, read once a minute as
    the controller reads it) the 2-GPU job waits behind the flood's second round, which
    starts at 30 s before usage is read again at 60 s; by default it counts the flood at
    once and starts as the first round ends."""
    from runnerctl.cli import main

    trace = tmp_path / "jobs.csv"
    rows = ["job_id,submit_time,gpus,duration,project,priority,user,timeout"]
    rows += [f"{i},0,1,30,flood,normal,fay,3600" for i in range(1, 41)]
    rows.append("50,5,2,600,other,normal,ola,3600")
    trace.write_text("\n".join(rows) + "\n")
    waits = {}
    for step in ("0", "5"):
        assert main(["simulate", "--trace", str(trace), "--runner-type", "instance", "--fair-weight-h", "12",
                     "--fair-queue-step-min", step, "--json"]) == 0
        waits[step] = json.loads(capsys.readouterr().out)["users"]["ola"]["wait_p50_s"]
    assert waits["5"] < 30 < 50 < waits["0"]
    assert main(["simulate", "--trace", str(trace), "--fair-queue-step-min", "-1"]) == 2
    assert "fair-queue-step-min" in capsys.readouterr().err


def test_a_running_row_counts_while_its_host_samples_it_within_three_ticks(tmp_path: Path) -> None:
    """A host samples its open rows once a tick: with a long `interval_s` a row stays
    "running" for three ticks, not only the 10-minute floor."""
    store = Store.open(state_dir=tmp_path)
    try:
        assert FairShare(store, ControllerSettings(fair_weight_h=1.0)).alive_s == 600.0
        assert FairShare(store, ControllerSettings(fair_weight_h=1.0, interval_s=900.0)).alive_s == 2700.0
    finally:
        store.close()
