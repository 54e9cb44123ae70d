"""When a drain starts (`PlanPolicy.drain_after_s`): a multi-GPU job whose timeout is
unknown, and that did not come alone, drains a block only once it has waited that long;
until then no new drain starts, and drains under way go on. Planner cases on one 8-GPU
host, then the controller end to end (fake GitLab, simulated runners)."""

from __future__ import annotations

from pathlib import Path

from runnerctl.controller.demand import pending_job
from runnerctl.controller.plan import Demand, Observed, PlanPolicy, SlotState, plan
from runnerctl.controller.store import Event
from runnerctl.controller.waiting import why_waiting
from runnerctl.gitlab import _job
from runnerctl.gpus.sim import count_snapshot
from runnerctl.layout import plan_slots
from runnerctl.settings import ControllerSettings
from runnerctl.sim.world import PROJECT, World, build_world

SLOTS = plan_slots(count_snapshot("gpu-a", 8))
BY_KEY = {s.key: s for s in SLOTS}
AFTER = PlanPolicy().drain_after_s
BUSY = {f"gpu{i}": (i + 1,) for i in range(8)}  # every GPU runs a 1-GPU job


def _observed(demand: tuple[Demand, ...], now: float | None,
              reserved: dict[str, int] | None = None) -> Observed:
    states = tuple(SlotState(s, s.size > 1, BUSY.get(s.key, ())) for s in SLOTS)
    return Observed(states, {}, demand, {BY_KEY[k].name: job for k, job in (reserved or {}).items()}, now=now)


def test_a_job_without_a_timeout_drains_only_after_waiting() -> None:
    """Two 4-GPU jobs wait (so neither came alone): the older drains once it has waited."""
    jobs = (Demand(99, 4, 1000.0), Demand(100, 4, 1010.0))
    young = _observed(jobs, now=1000.0 + 60)
    result = plan(young)
    assert result.reserved == {} and result.drains_from == (99, 1000.0 + AFTER)
    assert all(d.open for d in result.decisions if d.slot.size == 1)  # no single paused for it
    why = why_waiting(young, result)
    minutes = round((AFTER - 60) / 60)
    assert why[99].code == "resources"
    assert why[99].detail.endswith(f"drains a block in {minutes} minutes if none frees first")
    assert why[100].code == "resources" and "drains" not in why[100].detail
    old = plan(_observed(jobs, now=1000.0 + AFTER))
    assert list(old.reserved.values()) == [99] and old.drains_from is None


def test_a_job_that_came_alone_drains_at_once() -> None:
    """L1: a job that came while no other multi-GPU job waited (protected) starts within
    the drain time and two intervals, so it does not wait first."""
    result = plan(_observed((Demand(99, 4, 1000.0),), now=1000.0 + 60))
    assert list(result.reserved.values()) == [99] and result.protected == {99}


def test_a_job_with_a_known_timeout_drains_at_once() -> None:
    jobs = (Demand(99, 4, 1000.0, timeout_s=3600.0), Demand(100, 4, 1010.0, timeout_s=3600.0))
    result = plan(_observed(jobs, now=1000.0 + 60))
    assert list(result.reserved.values()) == [99] and result.drains_from is None


def test_without_a_time_or_a_delay_a_drain_starts_at_once() -> None:
    jobs = (Demand(99, 4, 1000.0), Demand(100, 4, 1010.0))
    assert list(plan(_observed(jobs, now=None)).reserved.values()) == [99]
    assert list(plan(_observed(jobs, now=1060.0), PlanPolicy(drain_after_s=0.0)).reserved.values()) == [99]


def test_a_drain_under_way_goes_on_and_no_later_job_drains_ahead() -> None:
    """Job 50 drains gpu0-3. Job 70 (high priority, just came) is first in drain order but
    too young: 50's drain goes on; job 60, older than 70 but after it in drain order,
    starts no drain of its own (no later job drains ahead of 70)."""
    now = 10_000.0
    demand = (Demand(50, 4, now - 3 * AFTER), Demand(60, 4, now - 2 * AFTER), Demand(70, 4, now - 10, "high"))
    result = plan(_observed(demand, now=now, reserved={"gpu0-3": 50}), PlanPolicy(max_draining=2))
    assert result.reserved == {BY_KEY["gpu0-3"].name: 50}
    assert result.drains_from == (70, now - 10 + AFTER)
    later = plan(_observed(demand, now=now - 10 + AFTER, reserved={"gpu0-3": 50}), PlanPolicy(max_draining=2))
    assert 70 in later.reserved.values()  # of age: it drains (a high priority may take 50's block)


def test_a_lapsed_idle_reservation_is_no_drain_under_way() -> None:
    """A young 2-GPU job took the idle block gpu0-1 while an older 4-GPU job was held;
    then a foreign process closes gpu0. The young job has no drain under way: it drains
    no busy block while the older one waits."""
    now = 100_000.0
    held, young = Demand(5, 4, now - 300), Demand(10, 2, now - 30)
    busy = {f"gpu{i}": (100 + i,) for i in range(2, 8)}
    states = tuple(SlotState(s, s.size > 1, busy.get(s.key, ())) for s in SLOTS)
    first = plan(Observed(states, {}, (held, young), {}, now=now))
    assert first.reserved == {BY_KEY["gpu0-1"].name: 10} and first.drains_from == (5, now - 300 + AFTER)
    later = plan(Observed(states, {0: "foreign process"}, (held, young), dict(first.reserved), now=now + 30))
    assert later.reserved == {} and later.drains_from == (5, now - 300 + AFTER)


def test_a_young_job_that_may_take_no_block_holds_nothing_back() -> None:
    """The protected job 1 drains gpu0-3; job 9 (8 GPUs, a minute old) comes first in
    drain order but may not take the whole host (it would cut in on job 1): it fails to
    drain rather than wait, and the hour-old pair job 5 drains at once."""
    now = 100_000.0
    demand = (Demand(1, 4, now - 4000), Demand(9, 8, now - 60), Demand(5, 2, now - 3600))
    states = tuple(SlotState(s, s.size > 1, BUSY.get(s.key, ())) for s in SLOTS)
    observed = Observed(states, {}, demand, {BY_KEY["gpu0-3"].name: 1}, protected=frozenset({1}), now=now)
    result = plan(observed, PlanPolicy(max_draining=2))
    assert sorted(result.reserved.values()) == [1, 5] and result.drains_from is None
    assert "drains a block in" not in why_waiting(observed, result)[9].detail


def test_the_wait_counts_from_when_the_job_was_queued() -> None:
    """A job of a later stage is created with its pipeline an hour ago but queued a minute
    ago (`Demand.queued_at`, from GitLab's queued_duration): it waits from then."""
    now = 100_000.0
    jobs = (Demand(99, 4, now - 3600, queued_at=now - 60), Demand(100, 4, now - 3600, queued_at=now - 50))
    result = plan(_observed(jobs, now=now))
    assert result.reserved == {} and result.drains_from == (99, now - 60 + AFTER)
    assert list(plan(_observed(jobs, now=now - 60 + AFTER)).reserved.values()) == [99]


def test_the_controller_drains_once_the_job_has_waited(tmp_path: Path) -> None:
    """Every GPU busy with long 1-GPU jobs; two 4-GPU jobs (no timeout known: runners
    without a maximum timeout) come together: the first waits `drain_after_s` before a
    block drains for it, and the page's reason says when."""
    world = build_world(tmp_path, settings=ControllerSettings(projects=(PROJECT,)))
    try:
        for _ in range(8):
            world.submit(1, 86400.0)
        world.advance(60.0, step=5.0)
        assert sum(len(jobs) for jobs in world.fleet.running().values()) == 8
        job = world.submit(4, 600.0)
        world.submit(4, 600.0)
        world.advance(AFTER / 2, step=30.0)
        assert not _drains(world)
        why = world.controller.view.waiting[job]
        assert why.code == "resources" and "drains a block in" in why.detail, why
        world.advance(AFTER / 2 + 60.0, step=30.0)
        drains = _drains(world)
        assert drains and f"for pending job {job}:" in drains[0].detail, drains
    finally:
        world.close()


def test_the_controller_waits_as_long_as_its_settings_say(tmp_path: Path) -> None:
    """`[controller.planner] drain_after_s` in runnerctl.toml is the controller's: at 300 s
    the block drains after 5 minutes, not 20."""
    planner = PlanPolicy(drain_after_s=300.0)
    world = build_world(tmp_path, settings=ControllerSettings(projects=(PROJECT,), planner=planner))
    try:
        for _ in range(8):
            world.submit(1, 86400.0)
        world.advance(60.0, step=5.0)
        job = world.submit(4, 600.0)
        world.submit(4, 600.0)
        world.advance(180.0, step=30.0)
        assert not _drains(world)
        detail = world.controller.view.waiting[job].detail
        assert "drains a block in 2 minutes" in detail or "drains a block in 1 minute" in detail, detail
        world.advance(60.0, step=30.0)
        assert not _drains(world)
        world.advance(120.0, step=30.0)
        assert _drains(world)
    finally:
        world.close()


def _drains(world: World) -> list[Event]:
    return [e for e in world.store.events(world.controller.host) if e.kind == "drain"]


def test_a_later_stage_job_waits_from_when_gitlab_queued_it(tmp_path: Path) -> None:
    """Two 4-GPU jobs of a pipeline created an hour ago, queued only now (their stage
    came): the controller reads GitLab's queued_duration and waits `drain_after_s` from
    now, not from the pipeline's creation."""
    world = build_world(tmp_path, settings=ControllerSettings(projects=(PROJECT,)))
    try:
        for _ in range(8):
            world.submit(1, 86400.0)
        world.advance(60.0, step=5.0)
        created = world.clock.now - 3600.0
        job = world.submit(4, 600.0, created_at=created)
        world.submit(4, 600.0, created_at=created)
        world.advance(AFTER / 2, step=30.0)
        assert not _drains(world)
        assert "drains a block in" in world.controller.view.waiting[job].detail
        world.advance(AFTER / 2 + 60.0, step=30.0)
        assert _drains(world)
    finally:
        world.close()


def test_queued_duration_is_read_only_when_it_is_a_duration() -> None:
    """GitLab's `queued_duration` (seconds, a float) becomes the job's `queued_at` on the
    controller's clock; anything else leaves it unknown (the wait then counts from
    `created_at`)."""
    base = {"id": 7, "status": "pending", "tag_list": ["gpus:4"], "created_at": "2026-11-24T10:00:00Z"}
    for value, queued_at in ((63.5, 1000.0 - 63.5), (0, 1000.0), (-5, None), ("63", None), (True, None),
                             (float("nan"), None), (None, None)):
        info = _job({**base, "queued_duration": value}, project_id=3)
        found = pending_job(info, project_id=3, priorities={}, seen_at=900.0, now=1000.0)
        assert found is not None and found.queued_at == queued_at, value
