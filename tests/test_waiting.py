"""Why a pending job waits, read from the planner's decision (controller/waiting.py):
one code per job, each case built from what `plan` decides on one 8-GPU host."""

from __future__ import annotations

from runnerctl.controller.plan import Demand, Observed, SlotState, plan
from runnerctl.controller.waiting import Waiting, why_waiting
from runnerctl.gpus.sim import count_snapshot
from runnerctl.layout import plan_slots

SLOTS = plan_slots(count_snapshot("gpu-a", 8))
BY_KEY = {s.key: s for s in SLOTS}
SINGLES = {f"gpu{i}" for i in range(8)}


def _why(running: dict[str, tuple[int, ...]], demand: tuple[Demand, ...], *,
         closed: dict[int, str] | None = None, held: dict[str, str] | None = None,
         elsewhere: frozenset[int] = frozenset()) -> dict[int, Waiting]:
    states = tuple(SlotState(s, s.size > 1, running.get(s.key, ())) for s in SLOTS)
    observed = Observed(states, closed or {}, demand,
                        held={BY_KEY[k].name: why for k, why in (held or {}).items()}, elsewhere=elsewhere)
    return why_waiting(observed, plan(observed))


def test_a_job_with_an_idle_block_is_starting() -> None:
    assert _why({}, (Demand(99, 4, 10.0),))[99].code == "starting"


def test_a_one_gpu_job_with_an_idle_single_is_starting() -> None:
    why = _why({}, (Demand(5, 1, 10.0),))[5]
    assert why.code == "starting"
    assert why.detail.startswith("runner gpu") and why.detail.endswith("open for it")


def test_the_job_a_block_drains_for_and_the_one_behind_it() -> None:
    busy = {f"gpu{i}": (i + 1,) for i in range(8)}
    why = _why(busy, (Demand(99, 4, 10.0), Demand(100, 4, 20.0)))
    assert why[99].code == "draining" and "drains for it" in why[99].detail
    assert why[100] == Waiting("priority", "behind job 99, which the planner serves first")


def test_a_high_priority_job_goes_first() -> None:
    busy = {f"gpu{i}": (i + 1,) for i in range(8)}
    why = _why(busy, (Demand(99, 8, 10.0), Demand(100, 8, 20.0, priority="high")))
    assert why[100].code == "draining" and why[99].code == "priority" and "100" in why[99].detail


def test_every_single_busy_is_resources() -> None:
    busy = {f"gpu{i}": (i + 1,) for i in range(8)}
    assert _why(busy, (Demand(7, 1, 10.0),))[7] == Waiting("resources", "all 8 runners of its size busy")


def test_no_runner_of_its_size_is_resources() -> None:
    assert _why({}, (Demand(7, 3, 10.0),))[7] == Waiting("resources", "no runner of 3 GPUs here")


def test_gpus_closed_by_the_gate_are_foreign_use() -> None:
    closed = {g: f"foreign process {100 + g} (alice)" for g in range(8)}
    why = _why({}, (Demand(7, 8, 10.0),), closed=closed)[7]
    assert why.code == "foreign" and "alice" in why.detail


def test_a_block_an_admin_paused_is_held() -> None:
    why = _why({}, (Demand(7, 8, 10.0),), held={"gpu0-7": "pause by olga: kernel update"})[7]
    assert why == Waiting("held", "held by an admin: pause by olga: kernel update")


def test_a_job_another_host_drains_for_is_draining_there() -> None:
    busy = {f"gpu{i}": (i + 1,) for i in range(8)}
    why = _why(busy, (Demand(7, 8, 10.0),), elsewhere=frozenset({7}))[7]
    assert why == Waiting("draining", "another host drains a block for it", elsewhere=True)


def test_every_pending_job_gets_a_reason() -> None:
    busy = {"gpu0": (1,), "gpu5": (2,)}
    demand = tuple(Demand(100 + i, size, float(i)) for i, size in enumerate((1, 2, 4, 8, 1, 2, 4, 8, 3)))
    why = _why(busy, demand, closed={6: "foreign process 9 (bob)"})
    assert set(why) == {d.job_id for d in demand}
    assert all(w.code in ("starting", "draining", "priority", "resources", "foreign", "held") and w.detail
               for w in why.values())
