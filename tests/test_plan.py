"""The pure planner: S1 always, L1 reservation and drain, L2 release, gate respected."""

from __future__ import annotations

import dataclasses
import itertools
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from runnerctl.controller.plan import (
    Decision,
    Demand,
    Observed,
    SlotState,
    differences,
    plan,
    relevant_demand,
)
from runnerctl.gpus.sim import count_snapshot
from runnerctl.layout import plan_slots
from runnerctl.model import Slot, slot_key

SLOTS = plan_slots(count_snapshot("gpu-a", 8))
BY_KEY = {s.key: s for s in SLOTS}


def _observed(running: dict[str, tuple[int, ...]] | None = None, *, paused: set[str] | None = None,
              closed: dict[int, str] | None = None, demand: tuple[Demand, ...] = (),
              reserved: dict[str, int] | None = None) -> Observed:
    running = running or {}
    paused = {s.key for s in SLOTS if s.size > 1} if paused is None else paused
    states = tuple(SlotState(s, s.key in paused, running.get(s.key, ())) for s in SLOTS)
    return Observed(states, closed or {}, demand,
                    {BY_KEY[k].name: j for k, j in (reserved or {}).items()})


def _open(observed: Observed) -> set[str]:
    return {s.key for s in plan(observed).open_slots()}


def test_idle_host_opens_every_single_and_no_block() -> None:
    assert _open(_observed()) == {f"gpu{i}" for i in range(8)}


def test_four_gpu_demand_takes_the_idle_quad_at_once() -> None:
    observed = _observed({"gpu1": (11,)}, demand=(Demand(99, 4, 10.0),))
    result = plan(observed)
    assert {s.key for s in result.open_slots()} == {"gpu4-7", "gpu0", "gpu1", "gpu2", "gpu3"}
    assert result.reserved == {BY_KEY["gpu4-7"].name: 99}
    pauses, resumes = differences(result.decisions, {s.slot.name: s.paused for s in observed.slots})
    assert {d.slot.key for d in pauses} == {"gpu4", "gpu5", "gpu6", "gpu7"}
    assert [d.slot.key for d in resumes] == ["gpu4-7"]


def test_busy_host_drains_the_block_that_frees_soonest() -> None:
    running = {"gpu0": (1,), "gpu1": (2,), "gpu2": (3,), "gpu4": (4,), "gpu6": (5,), "gpu7": (6,),
               "gpu5": (7,)}
    observed = _observed(running, paused=set(), demand=(Demand(99, 4, 10.0),))
    result = plan(observed)
    decisions = {d.slot.key: d for d in result.decisions}
    assert result.reserved == {BY_KEY["gpu0-3"].name: 99}  # 3 busy GPUs beat 4
    assert not decisions["gpu0-3"].open and "draining for job 99" in decisions["gpu0-3"].reason
    assert not any(decisions[f"gpu{i}"].open for i in range(4))  # no new 1-GPU job there
    assert decisions["gpu3"].reason.startswith("drained for")
    # the three jobs end: the block opens
    done = _observed({k: v for k, v in running.items() if k not in ("gpu0", "gpu1", "gpu2")},
                     paused={f"gpu{i}" for i in range(4)} | {"gpu0-3"},
                     demand=(Demand(99, 4, 10.0),), reserved={"gpu0-3": 99})
    assert "gpu0-3" in _open(done)


def test_reservation_is_kept_while_its_job_waits() -> None:
    running = {"gpu0": (1,), "gpu4": (2,)}
    observed = _observed(running, paused={"gpu4", "gpu5", "gpu6", "gpu7"},
                         demand=(Demand(99, 4, 10.0),), reserved={"gpu4-7": 99})
    assert plan(observed).reserved == {BY_KEY["gpu4-7"].name: 99}


def test_demand_gone_reopens_singles_in_one_tick() -> None:
    observed = _observed(paused={f"gpu{i}" for i in range(4)} | {"gpu0-1", "gpu2-3", "gpu4-5",
                                                                   "gpu6-7", "gpu4-7", "gpu0-7"},
                         reserved={"gpu0-3": 99})
    result = plan(observed)
    pauses, resumes = differences(result.decisions, {s.slot.name: s.paused for s in observed.slots})
    assert [d.slot.key for d in pauses] == ["gpu0-3"]
    assert {d.slot.key for d in resumes} == {"gpu0", "gpu1", "gpu2", "gpu3"}


def test_urgency_priority_then_age() -> None:
    demand = (Demand(1, 8, 5.0, "low"), Demand(2, 8, 9.0, "high"))
    assert plan(_observed(demand=demand)).reserved == {BY_KEY["gpu0-7"].name: 2}


def test_closed_gpu_keeps_its_slots_shut_and_blocks_avoid_it() -> None:
    observed = _observed(closed={5: "foreign process 4242 (alice)"}, demand=(Demand(9, 4, 1.0),))
    result = plan(observed)
    decisions = {d.slot.key: d for d in result.decisions}
    assert not decisions["gpu5"].open and "alice" in decisions["gpu5"].reason
    assert result.reserved == {BY_KEY["gpu0-3"].name: 9}
    assert plan(_observed(closed={1: "x", 5: "y"}, demand=(Demand(9, 4, 1.0),))).reserved == {}


def test_block_with_a_running_job_keeps_its_gpus_from_singles() -> None:
    observed = _observed({"gpu0-3": (7,)}, paused={"gpu0", "gpu1", "gpu2", "gpu3"} | {
        s.key for s in SLOTS if s.size > 1 and s.key != "gpu0-3"})
    opened = _open(observed)
    assert "gpu0-3" not in opened  # its demand is gone: it takes no new job
    assert not opened & {"gpu0", "gpu1", "gpu2", "gpu3"}  # but its job still runs there


slot_keys = st.sampled_from([s.key for s in SLOTS])


@settings(max_examples=int(os.environ.get("PLAN_EXAMPLES", "500")), deadline=None)
@given(running=st.dictionaries(slot_keys, st.just((1,)), max_size=6),
       paused=st.sets(slot_keys),
       closed=st.dictionaries(st.integers(0, 7), st.just("foreign"), max_size=3),
       demand=st.lists(st.builds(Demand, st.integers(1, 50), st.sampled_from([1, 2, 4, 8]),
                                 st.floats(0, 100), st.sampled_from(["high", "normal", "low"]),
                                 fair_s=st.sampled_from([0.0, 50.0])),
                       max_size=5),
       reserved=st.dictionaries(slot_keys, st.integers(1, 50), max_size=2))
def test_s1_and_gate_hold_for_any_observation(running: dict[str, tuple[int, ...]], paused: set[str],
                                              closed: dict[int, str], demand: list[Demand],
                                              reserved: dict[str, int]) -> None:
    observed = _observed(running, paused=paused, closed=closed, demand=tuple(demand),
                         reserved=reserved)
    result = plan(observed)
    opened: list[Slot] = result.open_slots()
    for a, b in itertools.combinations(opened, 2):
        assert set(a.gpus).isdisjoint(b.gpus), (a.key, b.key)  # S1
    for slot in opened:
        assert not set(slot.gpus) & set(closed)  # no job next to a foreign process
        others = {k for k in running if k != slot.key and set(BY_KEY[k].gpus) & set(slot.gpus)}
        assert not others  # never opened onto a GPU another slot's job uses
    reserved_slots = [BY_KEY[slot_key(s)] for s in result.reserved]
    for a, b in itertools.combinations(reserved_slots, 2):
        assert set(a.gpus).isdisjoint(b.gpus)
    # L1: while a multi-GPU job fits somewhere, some block is reserved (so demand is never
    # stuck), and a job that waits alone gets one and is protected from later jobs
    fitting = [d for d in demand if d.gpus > 1 and any(
        s.size == d.gpus and not set(s.gpus) & set(closed) for s in SLOTS)]
    if fitting:
        assert result.reserved
    multi = [d for d in demand if d.gpus > 1]
    if len(multi) == 1 and fitting and multi[0].job_id not in reserved.values():
        assert multi[0].job_id in result.reserved.values() and multi[0].job_id in result.protected


@settings(max_examples=int(os.environ.get("PLAN_EXAMPLES", "500")), deadline=None)
@given(running=st.dictionaries(slot_keys, st.integers(1, 9).map(lambda j: (1000 + j,)), max_size=6),
       paused=st.sets(slot_keys),
       closed=st.dictionaries(st.integers(0, 7), st.just("foreign"), max_size=2),
       demand=st.lists(st.builds(Demand, st.integers(1, 60), st.sampled_from([1, 2, 4, 8, 16]),
                                 st.floats(0, 20_000), st.sampled_from(["high", "normal", "low"]),
                                 fair_s=st.sampled_from([0.0, 0.0, 1800.0, 9000.0])),
                       max_size=30, unique_by=lambda d: d.job_id),
       reserved=st.dictionaries(slot_keys, st.integers(1, 60), max_size=2),
       protected=st.frozensets(st.integers(1, 60), max_size=3),
       elsewhere=st.frozensets(st.integers(1, 60), max_size=8),
       more=st.sets(st.integers(0, 29)))
def test_relevant_demand_gives_the_same_plan(running: dict[str, tuple[int, ...]], paused: set[str],
                                             closed: dict[int, str], demand: list[Demand],
                                             reserved: dict[str, int], protected: frozenset[int],
                                             elsewhere: frozenset[int], more: set[int]) -> None:
    """The simulator hands `plan` a part of the queue that holds `relevant_demand`'s cut:
    it must not change the plan."""
    full = dataclasses.replace(_observed(running, paused=paused, closed=closed, demand=tuple(demand),
                                         reserved=reserved), protected=protected, elsewhere=elsewhere)
    cut = relevant_demand(demand, SLOTS, protected, elsewhere)
    part = (*cut, *(d for i, d in enumerate(reversed(demand)) if i in more and d not in cut))
    assert len(cut) <= len(demand)
    expected = plan(full)
    assert plan(dataclasses.replace(full, demand=cut)) == expected
    assert plan(dataclasses.replace(full, demand=part)) == expected  # in another order, too


def test_a_later_job_never_delays_a_job_that_waited_alone() -> None:
    """A 2-GPU job drains gpu0-1 alone; an 8-GPU job that comes later, with a better claim
    for idle GPUs, still may not take them when they free (the L1 bound)."""
    running = {f"gpu{i}": (i + 1,) for i in range(8)}
    first = plan(_observed(running, paused=set(), demand=(Demand(10, 2, 100.0),)))
    assert first.reserved == {BY_KEY["gpu0-1"].name: 10} and first.protected == {10}
    later = dataclasses.replace(
        _observed({}, paused={"gpu0", "gpu1"}, demand=(Demand(10, 2, 100.0), Demand(11, 8, 150.0)),
                  reserved={"gpu0-1": 10}), protected=first.protected)
    result = plan(later)
    assert result.reserved[BY_KEY["gpu0-1"].name] == 10 and "gpu0-1" in _open(later)
    unprotected = plan(dataclasses.replace(later, protected=frozenset()))
    assert unprotected.reserved == {BY_KEY["gpu0-7"].name: 11}  # the bigger job's claim wins


def test_idle_gpus_go_to_the_bigger_job_unless_a_smaller_one_waited_much_longer() -> None:
    demand = (Demand(1, 1, 0.0), Demand(2, 2, 10.0), Demand(3, 4, 20.0))
    result = plan(_observed(demand=demand))
    assert BY_KEY["gpu0-3"].name in result.reserved or BY_KEY["gpu4-7"].name in result.reserved
    assert sorted(result.reserved.values()) == [2, 3]
    # 7 GPUs more than one count 7 x 7200 s older, 3 more 3 x: the 8-GPU job wins an idle
    # host unless the 4-GPU one waited 4 x 7200 s longer
    for arrival, winner in ((4 * 7200.0 - 100, 2), (4 * 7200.0 + 100, 1)):
        demand = (Demand(1, 4, 0.0), Demand(2, 8, arrival))
        assert list(plan(_observed(demand=demand)).reserved.values()) == [winner]


def test_jobs_with_known_timeouts_wait_in_age_order_without_size_credit() -> None:
    """Issue 16: with timeouts known, a later bigger job gets no size credit, neither for
    idle GPUs nor for which job drains (on the lab traces the credit made older 1-GPU
    and 4-GPU jobs wait 2-4x easy-oracle's p95); without them, the credit stays."""
    older, later = Demand(1, 4, 0.0, timeout_s=3600.0), Demand(2, 8, 100.0, timeout_s=3600.0)
    assert list(plan(_observed(demand=(older, later))).reserved.values()) == [1]
    unknown = (dataclasses.replace(older, timeout_s=None), dataclasses.replace(later, timeout_s=None))
    assert list(plan(_observed(demand=unknown)).reserved.values()) == [2]
    # a busy host drains for the older job (age order), not the later bigger one
    running = {f"gpu{i}": (i + 1,) for i in range(8)}
    assert set(plan(_observed(running, paused=set(), demand=(older, later))).reserved.values()) == {1}
    assert set(plan(_observed(running, paused=set(), demand=unknown)).reserved.values()) == {2}
    # 1-GPU jobs that came first keep their singles on an idle host
    ones = tuple(Demand(10 + i, 1, float(i), timeout_s=600.0) for i in range(4))
    result = plan(_observed(demand=(*ones, Demand(20, 8, 50.0, timeout_s=600.0))))
    assert not result.reserved and set(result.singles) == {10, 11, 12, 13}


def test_a_later_1gpu_job_with_a_better_claim_never_delays_a_protected_drain() -> None:
    """Age order keeps an idle single for a 1-GPU job that goes first out of a drain,
    but not for one that came after a protected job (L1), whatever fair share says."""
    heavy = Demand(10, 8, 100.0, timeout_s=3600.0, fair_s=3600.0)  # counts as 3700
    light = Demand(11, 1, 150.0, timeout_s=600.0)  # came later, counts as 150
    other = Demand(12, 2, 5000.0, timeout_s=600.0)
    observed = _observed({"gpu0": (1,)}, paused=set(), demand=(heavy, light, other))
    protected = plan(dataclasses.replace(observed, protected=frozenset({10})))
    assert protected.reserved == {BY_KEY["gpu0-7"].name: 10}
    assert 10 not in plan(observed).reserved.values()  # not protected: the 1-GPU job goes first


def test_a_job_claimed_elsewhere_takes_an_idle_block_but_is_never_drained_for() -> None:
    wanted = (Demand(5, 8, 10.0),)
    busy = {"gpu0": (1,)}
    assert plan(_observed(busy, paused=set(), demand=wanted)).reserved == {BY_KEY["gpu0-7"].name: 5}
    away = plan(dataclasses.replace(_observed(busy, paused=set(), demand=wanted), elsewhere=frozenset({5})))
    assert away.reserved == {} and away.claims == frozenset()
    assert "gpu1" in {s.key for s in away.open_slots()}  # no drain: its singles stay open
    idle = plan(dataclasses.replace(_observed(demand=wanted), elsewhere=frozenset({5})))
    assert idle.reserved == {BY_KEY["gpu0-7"].name: 5} and idle.claims == frozenset()
    assert {s.key for s in idle.open_slots()} == {"gpu0-7"}
    here = plan(_observed(demand=wanted))
    assert here.claims == {5}


def test_a_runner_in_an_unknown_state_gets_the_desired_one() -> None:
    """GitLab did not answer for a runner (None, or never listed): whatever the plan wants
    is sent, open or closed; a known state equal to the wish sends nothing."""
    single, block = Decision(BY_KEY["gpu0"], True, "idle"), Decision(BY_KEY["gpu0-3"], False, "no demand")
    both = [single, block]

    def states(one: bool | None, other: bool | None) -> dict[str, bool | None]:
        return {single.slot.name: one, block.slot.name: other}

    assert differences(both, {}) == ([block], [single])
    assert differences(both, states(None, None)) == ([block], [single])
    assert differences(both, states(False, True)) == ([], [])
    assert differences(both, states(True, False)) == ([block], [single])
