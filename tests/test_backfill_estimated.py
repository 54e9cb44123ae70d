"""Issue 16: backfill by run-time estimate (`PlanPolicy.backfill_estimated`). A pending
job whose timeout is unknown backfills a draining block by its history's estimate, and
the runner opened for it gets a maximum job timeout that ends at the drain's expected end
(`controller.caps`), so an estimate wrong by any factor costs the backfilled job (GitLab
kills it there), never the drained job."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from runnerctl.controller import act
from runnerctl.controller.caps import CAP_SLACK_S, to_send, wanted
from runnerctl.controller.observe import RunnerCache
from runnerctl.controller.plan import Decision, Demand, Observed, PlanPolicy, SlotState, plan
from runnerctl.errors import ConfigError, TemporaryError
from runnerctl.gpus.sim import count_snapshot
from runnerctl.layout import plan_slots
from runnerctl.model import Slot
from runnerctl.settings import ControllerSettings, parse_planner
from runnerctl.sim.hosts import SimRunner
from runnerctl.sim.labtrace import lab_trace
from runnerctl.sim.simulator import SimConfig, Simulator
from runnerctl.sim.world import PROJECT, build_world

SLOTS = plan_slots(count_snapshot("gpu-a", 8))
NOW = 10_000.0
ON = PlanPolicy(backfill_estimated=True)


def _observed(ends: dict[int, float], ones: list[tuple[float | None, float | None]], *,
              quad: tuple[float | None, float | None] | None = None) -> Observed:
    """Singles on GPUs `ends` run a job each (ending by the value), an 8-GPU job waits, and
    1-GPU jobs wait after it, each with (timeout, estimate); `quad`: a 4-GPU job too."""
    def state(slot: Slot) -> SlotState:
        if slot.size == 1 and slot.gpus[0] in ends:
            return SlotState(slot, False, (100 + slot.gpus[0],), 0.0, ends[slot.gpus[0]])
        return SlotState(slot, slot.size > 1)
    demand = [Demand(1, 8, 0.0), *(Demand(2 + i, 1, 1.0 + i, timeout_s=t, estimate_s=e)
                                   for i, (t, e) in enumerate(ones))]
    if quad is not None:
        demand.append(Demand(50, 4, 0.5, timeout_s=quad[0], estimate_s=quad[1]))
    return Observed(tuple(state(s) for s in SLOTS), demand=tuple(demand), now=NOW)


def _keys(deadlines: Mapping[str, float]) -> dict[str, float]:
    """Slot name -> deadline as slot key -> deadline."""
    return {name.rsplit("/", 1)[-1]: end for name, end in deadlines.items()}


def _singles(observed: Observed, policy: PlanPolicy) -> set[int]:
    return {s.gpus[0] for s in plan(observed, policy).open_slots() if s.size == 1}


def test_jobs_backfill_by_estimate_only_when_asked_and_get_the_drains_end_as_deadline() -> None:
    busy = dict.fromkeys(range(6), NOW + 3600)  # gpu0-5 busy for an hour at most: gpu6-7 idle
    guessed = _observed(busy, [(None, 300.0), (None, 300.0)])
    assert _singles(guessed, PlanPolicy()) == set()  # off (the default): estimates never backfill
    result = plan(guessed, ON)
    assert {s.gpus[0] for s in result.open_slots()} == {6, 7}
    assert _keys(result.deadlines) == {"gpu6": NOW + 3600, "gpu7": NOW + 3600}
    assert all("by estimate" in d.reason for d in result.decisions if d.open)
    assert result.recheck_at == NOW + 3600 - 600  # GitLab's smallest maximum timeout: 10 minutes
    known = plan(_observed(busy, [(300.0, None), (300.0, None)]), ON)  # timeouts known: no deadline
    assert {s.gpus[0] for s in known.open_slots()} == {6, 7} and known.deadlines == {}
    mixed = plan(_observed(busy, [(300.0, None), (None, 300.0)]), ON)
    assert set(_keys(mixed.deadlines)) == {"gpu6", "gpu7"}  # either may get the guessed job
    assert _singles(_observed(busy, [(None, 4000.0)]), ON) == set()  # outlasts the drain
    assert _singles(_observed(busy, [(None, None)]), ON) == set()  # no history: nothing known
    assert _singles(_observed(busy, [(None, 8000.0)]), dataclasses.replace(ON, backfill_max_s=7200)) == set()
    soon = dict.fromkeys(range(6), NOW + 500)  # under 10 minutes left: no maximum timeout that short
    assert _singles(_observed(soon, [(None, 60.0)]), ON) == set()
    assert _singles(_observed(soon, [(60.0, None)]), ON) == {6}  # a known timeout needs none


def test_a_smaller_block_backfills_by_estimate_with_a_deadline_too() -> None:
    busy = dict.fromkeys(range(4), NOW + 7200)  # gpu0-3 busy: the quad gpu4-7 idle
    result = plan(_observed(busy, [], quad=(None, 1800.0)), ON)
    assert [s.key for s in result.open_slots()] == ["gpu4-7"]
    assert _keys(result.deadlines) == {"gpu4-7": NOW + 7200}
    assert plan(_observed(busy, [], quad=(None, 1800.0)), PlanPolicy()).open_slots() == []


def test_the_maximum_timeout_a_runner_should_have() -> None:
    assert wanted(None, None, NOW) is None and wanted(None, 3600, NOW) == 3600  # its own
    assert wanted(NOW + 2000, None, NOW) == 2000
    assert wanted(NOW + 2000, 900, NOW) == 900  # never over its own
    assert wanted(NOW + 100, None, NOW) == 600  # GitLab takes none under 10 minutes
    deadlines = {"a": NOW + 3000}
    assert to_send(["a", "b"], deadlines, {}, {}, NOW) == {"a": 3000, "b": None}  # unknown: both sent
    assert to_send(["a", "b"], deadlines, {}, {"a": None, "b": None}, NOW) == {"a": 3000}
    assert to_send(["a"], deadlines, {}, {"a": 3000 + int(CAP_SLACK_S)}, NOW) == {}  # within the slack
    assert to_send(["a"], deadlines, {}, {"a": 3001 + int(CAP_SLACK_S)}, NOW) == {"a": 3000}
    assert to_send(["a"], deadlines, {}, {"a": 3000}, NOW + 600) == {"a": 2400}  # time went on
    assert to_send(["b"], deadlines, {"b": 7200}, {"b": 1500}, NOW) == {"b": 7200}  # its own back
    assert to_send([], deadlines, {}, {"a": 1500}, NOW) == {}  # paused runners keep theirs


class _Port:
    """What `act.apply` sends, in order; `fail` names a call that fails."""

    def __init__(self, fail: str = "") -> None:
        self.calls: list[tuple[str, int, object]] = []
        self.fail = fail

    def set_paused(self, runner_id: int, paused: bool) -> None:
        self.calls.append(("paused", runner_id, paused))

    def set_maximum_timeout(self, runner_id: int, seconds: int | None) -> None:
        if self.fail == "cap":
            raise TemporaryError("GitLab answered 502", delay=1.0)
        self.calls.append(("cap", runner_id, seconds))


def _apply(port: _Port, cache: RunnerCache) -> list[act.Action]:
    single, pair = SLOTS[0], next(s for s in SLOTS if s.size == 2)
    decisions = [Decision(single, True, "backfill (by estimate)"), Decision(pair, False, "drain")]
    return act.apply(decisions, gitlab=port, cache=cache, health=act.GitLabHealth(), now=NOW,  # type: ignore[arg-type]
                     caps={single.name: 1800})


def test_a_runner_opens_only_after_its_maximum_timeout_was_set() -> None:
    single, pair = SLOTS[0], next(s for s in SLOTS if s.size == 2)
    cache = RunnerCache({single.name: 1, pair.name: 2})
    cache.paused.update({single.name: True, pair.name: False})
    port = _Port()
    done = _apply(port, cache)
    assert port.calls == [("paused", 2, True), ("cap", 1, 1800), ("paused", 1, False)]
    assert [a.cap for a in done] == [False, True, False] and all(a.ok for a in done)
    assert cache.known_caps() == {single.name: 1800}  # the pair's was never read: unknown
    failing = RunnerCache({single.name: 1, pair.name: 2})
    failing.paused.update({single.name: True, pair.name: False})
    port = _Port(fail="cap")
    done = _apply(port, failing)
    assert port.calls == [("paused", 2, True)]  # no resume without its maximum timeout
    assert not done[-1].ok and done[-1].cap and single.name not in failing.known_caps()


def test_the_http_gitlab_sets_and_clears_a_runners_maximum_timeout(tmp_path: Path) -> None:
    """python-gitlab sends None as JSON null; GitLab clears the runner's maximum timeout."""
    world = build_world(tmp_path / "store")
    try:
        runner_id = next(iter(world.fleet.runner_ids.values()))
        world.gitlab.set_maximum_timeout(runner_id, 1800)
        assert world.state.runners[runner_id].maximum_timeout == 1800
        assert world.gitlab.get_runner(runner_id).maximum_timeout == 1800
        world.gitlab.set_maximum_timeout(runner_id, None)
        assert world.state.runners[runner_id].maximum_timeout is None
    finally:
        world.close()


def test_the_controller_backfills_by_estimate_and_gives_the_runner_its_own_timeout_back(
        tmp_path: Path) -> None:
    """A 1-GPU job named `probe` ran a minute before (seen pending, so its history has its
    name). A quad runs (GitLab's project
    timeout: an hour); an 8-GPU job drains the host. A second `probe` backfills an idle
    GPU of the drain by its estimate: its runner gets a maximum timeout ending at the
    quad's hour, GitLab fixes the job's timeout at that, and once the drain is over the
    runner's own (none) comes back before it opens again."""
    settings = ControllerSettings(projects=(PROJECT,), planner=ON)
    timeouts: dict[int, float | None] = {}
    world = build_world(tmp_path / "store", settings=settings, lease_dir=tmp_path / "state",
                        on_job=lambda kind, job, now: timeouts.setdefault(job.job_id, job.timeout_s))
    try:
        def until(done: Callable[[], bool], limit_s: float) -> None:
            end = world.clock.now + limit_s
            while not done() and world.clock.now < end:
                world.advance(1)

        whole = world.submit(8, 120.0, name="warm-up")  # so that the controller sees `probe` pending
        until(lambda: whole in world.fleet.started, 120)
        first = world.submit(1, 60.0, name="probe")
        until(lambda: first in world.fleet.finished, 600)
        world.advance(120)  # the history is read again (`estimates.REFRESH_S`)
        quad = world.submit(4, 1500.0, name="train")
        until(lambda: quad in world.fleet.started, 120)
        eight = world.submit(8, 60.0, name="big")
        world.advance(30)
        probe = world.submit(1, 60.0, name="probe")
        until(lambda: probe in world.fleet.started, 600)
        assert world.fleet.started[probe] < world.fleet.finished.get(quad, float("inf"))  # backfilled
        timeout = timeouts[probe]
        quad_end = world.fleet.started[quad] + 3600
        assert timeout is not None and 600 <= timeout
        assert world.fleet.started[probe] + timeout <= quad_end + CAP_SLACK_S + settings.interval_s
        until(lambda: eight in world.fleet.finished, 3000)
        assert eight in world.fleet.finished and world.fleet.double_allocations == 0
        world.advance(60)
        paused = world.controller.cache.paused
        open_ids = [r for name, r in world.fleet.runner_ids.items() if paused.get(name) is False]
        assert open_ids and all(world.state.runners[r].maximum_timeout is None for r in open_ids)
        events = world.controller.wiring.store.events(world.controller.host)  # newest first
        caps = [e.detail for e in reversed(events) if e.kind == "cap"]
        assert caps and "by estimate" in caps[0] and caps[-1] == "maximum job timeout back to none"
    finally:
        world.close()


class _Watched(Simulator):
    """Notes each job a runner with a deadline starts: (job, deadline)."""

    capped: list[tuple[int, float]]

    def _start(self, now: float, host_no: int, gpus: tuple[int, ...], job_id: int,
               runner: SimRunner | None) -> None:
        host = self.hosts[host_no]
        if runner is not None and runner.slot.name in host.deadlines and runner.cap is not None:
            self.capped = [*getattr(self, "capped", []), (job_id, host.deadlines[runner.slot.name])]
        super()._start(now, host_no, gpus, job_id, runner)


@pytest.mark.parametrize("seed", [1, 2])
def test_in_the_simulator_wrong_estimates_cost_the_backfilled_job_not_the_drain(seed: int) -> None:
    """Lab traces with each job's run time 10x or a tenth of the trace's at random, so its
    name's history is off by 10x or 100x either way: every job a deadline's runner starts
    ends by the deadline (plus the slack and a tick), some are killed there, and nothing
    else breaks."""
    jobs, foreign = lab_trace(400, seed=seed)
    rng = random.Random(seed)
    jobs = [dataclasses.replace(j, duration=j.duration * rng.choice((10.0, 0.1))) for j in jobs]
    config = SimConfig(hosts=2, pending_timeouts="none", plan_policy=ON)
    sim = _Watched(jobs, config, foreign)
    result = sim.run()
    assert result["double_allocations"] == 0 and result["foreign_collisions"] == 0
    assert result["jobs_never_started"] == 0
    capped = getattr(sim, "capped", [])
    assert capped, "the trace should give backfill by estimate a chance"
    for job_id, deadline in capped:
        assert sim.started[job_id] + sim.run_time(job_id) <= deadline + CAP_SLACK_S + config.reconcile_s
    killed = [j for j, _ in capped if sim.run_time(j) < sim.jobs[j].duration]
    assert result["jobs_killed_at_deadline"] == len(killed) > 0
    off = Simulator(jobs, dataclasses.replace(config, plan_policy=PlanPolicy()), foreign).run()
    assert off["jobs_killed_at_deadline"] == 0


def test_the_setting_reads_from_planner_options() -> None:
    assert parse_planner("backfill_estimated=true").backfill_estimated is True
    assert parse_planner("backfill_estimated=False").backfill_estimated is False
    with pytest.raises(ConfigError, match="backfill_estimated"):
        parse_planner("backfill_estimated=1")
