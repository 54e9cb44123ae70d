"""The simulator skips a host's plan only where planning would change nothing.

`Simulator._sees` and `_boundary` decide from the change log which hosts to plan again;
a simulator that plans every host at every tick (`EveryHost`) is the reference: the
same jobs must start at the same times on the same GPUs, with the same runner actions,
while the real one computes fewer plans.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from runnerctl.controller.fairshare import FairPolicy
from runnerctl.controller.plan import PlanPolicy
from runnerctl.sim.labtrace import lab_trace
from runnerctl.sim.simulator import SimConfig, Simulator, TraceJob
from runnerctl.sim.trace import synthetic


class EveryHost(Simulator):
    """Plans every host at every controller tick (no change log, no skipping)."""

    def _tick(self, now: float) -> None:
        self._dirty.update(range(len(self.hosts)))
        super()._tick(now)


def _with_priorities(jobs: list[TraceJob], seed: int) -> list[TraceJob]:
    rng = random.Random(seed)
    return [dataclasses.replace(j, priority=rng.choice(["high", "normal", "normal", "low"])) for j in jobs]


@pytest.mark.parametrize(("jobs", "hosts", "foreign", "max_draining", "seed"), [
    (300, 1, 2, 1, 1), (400, 4, 2, 1, 2), (400, 4, 3, 2, 3), (500, 6, 1, 1, 4)])
def test_same_schedule_as_planning_every_host(jobs: int, hosts: int, foreign: int, max_draining: int,
                                              seed: int) -> None:
    trace, uses = synthetic(jobs, hosts=hosts, seed=seed, foreign_per_host=foreign)
    trace = _with_priorities(trace, seed)
    config = SimConfig(hosts=hosts, plan_policy=PlanPolicy(max_draining=max_draining))
    lazy, eager = Simulator(trace, config, uses), EveryHost(trace, config, uses)
    lazy_result, eager_result = lazy.run(), eager.run()
    assert lazy.started == eager.started
    assert lazy.placement == eager.placement
    assert lazy.actions == eager.actions and lazy.dropped == eager.dropped
    assert lazy_result == eager_result
    assert lazy.plans < eager.plans


@pytest.mark.parametrize(("hosts", "seed", "untimed", "fair", "pending", "cap_h", "singles_h"), [
    (1, 1, 0.0, False, "trace", None, None), (2, 2, 0.0, False, "trace", None, None),
    (4, 3, 0.0, False, "trace", None, None), (2, 4, 0.5, False, "trace", None, None),
    (3, 5, 0.3, True, "trace", None, None),
    (2, 6, 0.3, False, "none", None, None), (3, 7, 0.0, True, "none", 4.0, None),
    (2, 8, 0.3, False, "cap", 2.0, None), (3, 9, 0.0, True, "cap", 4.0, None),
    (1, 10, 0.0, False, "cap", 0.5, None), (2, 11, 0.2, False, "trace", 3.0, None),
    (2, 12, 0.0, False, "cap", 8.0, 2.0), (3, 13, 0.3, True, "cap", None, 1.5)])
def test_same_schedule_with_backfill_on_lab_traces(hosts: int, seed: int, untimed: float, fair: bool,
                                                   pending: str, cap_h: float | None,
                                                   singles_h: float | None) -> None:
    """Lab-like traces have timeouts, so backfill (which reads the time) acts; with some
    timeouts unknown, drains whose end is unknown (no backfill there) mix with known ones;
    fair share (instance runners) changes which job is first in the planner's order.
    What the planner knows of pending jobs' timeouts (`SimConfig.pending_timeouts`):
    nothing ("none": size credits, no backfill, running jobs' ends known), or the runners'
    cap for every job ("cap": age order; GitLab kills jobs at the cap, so no drain ends
    late enough to backfill, unless the 1-GPU runners' cap is shorter: `singles_h`; without
    a cap for the others, their jobs' timeouts are unknown); a cap under "trace" shortens
    the timeouts the planner sees."""
    trace, uses = lab_trace(150 * hosts, hosts=hosts, seed=seed)
    rng = random.Random(seed)
    trace = [dataclasses.replace(j, timeout=None) if rng.random() < untimed else j for j in trace]
    config = SimConfig(hosts=hosts, fair=FairPolicy(weight_s=12 * 3600.0) if fair else FairPolicy(),
                       runner_type="instance" if fair else "group", pending_timeouts=pending,
                       runner_max_timeout_s=None if cap_h is None else cap_h * 3600,
                       runner_max_timeout_by_gpus=() if singles_h is None else ((1, singles_h * 3600),))
    lazy, eager = Simulator(trace, config, uses), EveryHost(trace, config, uses)
    lazy_result, eager_result = lazy.run(), eager.run()
    assert lazy.started == eager.started and lazy.placement == eager.placement
    assert lazy.actions == eager.actions and lazy_result == eager_result
    assert lazy.plans < eager.plans


@pytest.mark.parametrize(("hosts", "seed", "durations", "pending"), [
    (2, 14, "lognormal", "cap"), (3, 15, "philly", "cap"), (2, 16, "philly", "trace")])
def test_same_schedule_with_caps_by_size_and_philly_run_times(hosts: int, seed: int, durations: str,
                                                              pending: str) -> None:
    """The runners' caps at the backfill bounds (2 h on 1-GPU, 3 h on 2- and 4-GPU runners,
    `simulate_lab.py`'s `caps by size`), so pairs and quads backfill on known caps, and the
    Philly trace's run times (`lab_trace(durations="philly")`)."""
    trace, uses = lab_trace(150 * hosts, hosts=hosts, seed=seed, durations=durations)
    config = SimConfig(hosts=hosts, pending_timeouts=pending, runner_max_timeout_s=8 * 3600.0,
                       runner_max_timeout_by_gpus=((1, 7200.0), (2, 10800.0), (4, 10800.0)))
    lazy, eager = Simulator(trace, config, uses), EveryHost(trace, config, uses)
    lazy_result, eager_result = lazy.run(), eager.run()
    assert lazy.started == eager.started and lazy.placement == eager.placement
    assert lazy.actions == eager.actions and lazy_result == eager_result
    assert lazy.plans < eager.plans


@pytest.mark.parametrize(("runner_type", "seed"), [("instance", 1), ("group", 5)])
def test_same_schedule_with_fair_share_and_a_flood(runner_type: str, seed: int) -> None:
    """Fair share on with a new user's flood (issue 16): its queue share changes jobs'
    `fair_s` whenever a job of a user with pending jobs ends, and every host is planned
    again then; the schedule is still the one of planning every host at every tick."""
    trace, uses = lab_trace(200, hosts=2, seed=seed)
    at = max(j.submit for j in trace) / 4
    trace += [TraceJob(10_000 + i, at, 1, 600.0 + 60 * i, project="flood", timeout=4 * 3600.0)
              for i in range(80)]
    trace += [TraceJob(20_000 + i, at + 60.0 * i, 1 + i % 2, 900.0, project=f"other{i % 3}",
                       timeout=4 * 3600.0) for i in range(6)]
    config = SimConfig(hosts=2, runner_type=runner_type, fair=FairPolicy(weight_s=12 * 3600.0))
    lazy, eager = Simulator(trace, config, uses), EveryHost(trace, config, uses)
    lazy_result, eager_result = lazy.run(), eager.run()
    assert lazy.started == eager.started and lazy.placement == eager.placement
    assert lazy.actions == eager.actions and lazy_result == eager_result
    assert lazy.plans < eager.plans
    unqueued = Simulator(trace, dataclasses.replace(config, fair=FairPolicy(weight_s=12 * 3600.0,
                                                                            queue_step_s=0.0)), uses)
    unqueued.run()
    assert unqueued.started != lazy.started  # the queue share changed the schedule


def test_the_simulator_counts_run_times_as_the_controller_does() -> None:
    """Without timeouts known, the lab trace's long jobs lose their size credits once
    their history says so: the same schedule with every host planned at every tick
    (test_simulator_replan's reference), and another than without history."""
    trace, uses = lab_trace(300, hosts=2, load=0.9, seed=3, foreign_per_host=2)
    config = SimConfig(hosts=2, pending_timeouts="none")
    lazy, eager = Simulator(trace, config, uses), EveryHost(trace, config, uses)
    assert lazy.run() == eager.run()
    assert lazy.started == eager.started and lazy.placement == eager.placement
    flipped = {key for key in {(j.project, j.name) for j in trace if j.gpus > 1}
               if (lazy.run_times.estimate(key) or 0.0) > PlanPolicy().credit_estimate_max_s}
    assert flipped, "no history crossed the bound"
    blind = Simulator(trace, SimConfig(hosts=2, pending_timeouts="none", history=False), uses)
    blind.run()
    assert blind.started != lazy.started


@pytest.mark.parametrize(("hosts", "seed", "max_draining", "drain_after_s", "fair"), [
    (2, 39, 1, 1200.0, False), (3, 23, 1, 600.0, False), (8, 24, 1, 1800.0, False),
    (6, 33, 2, 1800.0, False), (4, 3, 1, 1200.0, True)])
def test_same_schedule_with_drains_that_wait(hosts: int, seed: int, max_draining: int,
                                             drain_after_s: float, fair: bool) -> None:
    """Drains start only after a job waited `drain_after_s` (no timeouts known): a job
    coming of age is an event, the job that held a host's drains back leaving makes it
    plan only if the next one may drain (`replan._held_again`), and a job left alone for
    a host is protected there (`replan._lone`), as the planner does at every tick. The
    synthetic seeds and the lab trace with fair share on instance runners are those where
    each of these rules was found missing (against the reference); the delay changes the
    schedule."""
    policy = PlanPolicy(max_draining=max_draining, drain_after_s=drain_after_s)
    if fair:
        trace, uses = lab_trace(100 * hosts, hosts=hosts, seed=seed)
        config = SimConfig(hosts=hosts, pending_timeouts="none", runner_type="instance",
                           fair=FairPolicy(weight_s=12 * 3600.0, queue_step_s=300.0), plan_policy=policy)
    else:
        trace, uses = synthetic(300, hosts=hosts, seed=seed, foreign_per_host=2)
        trace = _with_priorities(trace, seed)
        config = SimConfig(hosts=hosts, plan_policy=policy)
    lazy, eager = Simulator(trace, config, uses), EveryHost(trace, config, uses)
    lazy_result, eager_result = lazy.run(), eager.run()
    assert lazy.started == eager.started and lazy.placement == eager.placement
    assert lazy.actions == eager.actions and lazy_result == eager_result
    assert lazy.plans < eager.plans
    at_once_policy = dataclasses.replace(policy, drain_after_s=0.0)
    at_once = Simulator(trace, dataclasses.replace(config, plan_policy=at_once_policy), uses)
    at_once.run()
    assert at_once.started != lazy.started
