"""When a drain starts (`PlanPolicy.drain_after_s`): a multi-GPU job whose timeout is
unknown, and that did not come alone, drains a block only once it has waited that long;
until then no new drain starts, and drains under way go on. Planner cases on one 8-GPU
host, then the controller end to end (fake GitLab, simulated runners)."""

from __future__ import annotations

from pathlib import Path

from runnerctl.controller.plan import Demand, Observed, PlanPolicy, SlotState, plan
from runnerctl.controller.store import Event
from runnerctl.controller.waiting import why_waiting
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


def _drains(world: World) -> list[Event]:
    return [e for e in world.store.events(world.controller.host) if e.kind == "drain"]
