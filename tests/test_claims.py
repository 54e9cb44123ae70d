"""Claims between hosts sharing a store, and the events telling a real drain from a block
opened at once on idle GPUs (runnerctl/controller/claims.py)."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path

import pytest

from runnerctl.controller.claims import Claims, drained_for
from runnerctl.controller.plan import Demand, Observed, Plan, PlanPolicy, SlotState
from runnerctl.controller.store import Event, Store
from runnerctl.gpus.sim import count_snapshot
from runnerctl.layout import plan_slots

TTL_S = 120.0


class Host:
    """One host's planning over a store shared with others, as the loop does it."""

    def __init__(self, name: str, store: Store) -> None:
        self.name, self.store = name, store
        self.slots = plan_slots(count_snapshot(name, 8))
        self.by_key = {s.key: s for s in self.slots}
        self.claims = Claims(store, name, ttl_s=TTL_S, drains={})
        self.reserved: dict[str, int] = {}
        self.events: list[tuple[str, str, str]] = []

    def tick(self, now: float, demand: tuple[Demand, ...], busy: AbstractSet[int] = frozenset(),
             blocks: Mapping[str, int] | None = None) -> Plan:
        """`busy`: GPUs whose single runs a job; `blocks`: block key -> the job it runs."""
        running = {s.name: (100 + s.gpus[0],) for s in self.slots if s.size == 1 and s.gpus[0] in busy}
        running |= {self.by_key[key].name: (job,) for key, job in (blocks or {}).items()}
        states = tuple(SlotState(s, s.size > 1 and s.name not in self.reserved, running.get(s.name, ()))
                       for s in self.slots)
        claimed = {job for job, host in self.store.claims(now).items() if host != self.name}
        elsewhere = frozenset(d.job_id for d in demand if d.job_id in claimed)
        observed = Observed(states, {}, demand, dict(self.reserved), elsewhere=elsewhere)
        result, _ = self.claims.plan(observed, PlanPolicy(), now)
        self.events += self.claims.tell(result)
        self.reserved = dict(result.reserved)
        return result

    def drains(self) -> list[int | None]:
        return [drained_for(detail) for kind, _, detail in self.events if kind == "drain"]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(state_dir=tmp_path)


ALL = set(range(8))


def test_an_idle_block_is_a_reserve_and_becomes_a_drain_only_when_it_must_wait(store: Store) -> None:
    host = Host("gpu-a", store)
    big = (Demand(7, 8, 10.0),)
    host.tick(1.0, big)
    block = host.by_key["gpu0-7"].name
    assert host.events == [("reserve", block, "for pending job 7: idle, opened at once")]
    host.tick(2.0, big)
    assert len(host.events) == 1  # nothing new to tell
    host.tick(3.0, big, busy={3})  # a single took a job on it before its pause went through
    assert host.events[1:] == [("drain", block, f"for pending job 7: waiting on {host.by_key['gpu3'].name}")]
    host.tick(4.0, big, busy={3})
    host.tick(5.0, big)  # the block opens: no third event
    assert len(host.events) == 2 and host.drains() == [7]


def test_a_block_that_gitlab_gave_another_job_drains_for_the_one_it_opened_for(store: Store) -> None:
    host = Host("gpu-a", store)
    wanted = Demand(7, 8, 10.0)
    host.tick(1.0, (Demand(6, 8, 5.0), wanted))
    host.tick(2.0, (wanted,), blocks={"gpu0-7": 6})  # GitLab handed the block the other 8-GPU job
    block = host.by_key["gpu0-7"].name
    assert host.events[-1] == ("drain", block, "for pending job 7: waiting on its own runner's job")
    assert host.claims.drained_for == {7}


def test_a_host_keeps_the_claim_of_a_job_it_drained_for_while_a_more_urgent_job_drains(
        store: Store) -> None:
    a, b = Host("gpu-a", store), Host("gpu-b", store)
    small = Demand(5, 2, 10.0)
    a.tick(1.0, (small,), busy=ALL)
    assert a.drains() == [5] and store.claims(1.0) == {5: "gpu-a"}
    urgent = Demand(6, 4, 20.0, priority="high")
    a.tick(2.0, (small, urgent), busy=ALL)  # one drain at a time: the high-priority job's now
    assert set(a.reserved.values()) == {6}
    assert store.claims(2.0) == {5: "gpu-a", 6: "gpu-a"}  # 5 kept: gpu-a drained for it
    result = b.tick(2.5, (small, urgent), busy=ALL)
    assert result.reserved == {} and b.drains() == []  # no second host drains for either
    b.tick(3.0, (small, urgent), busy=ALL - {0, 1})  # gpu-b has an idle pair: any host may open it
    assert b.events == [("reserve", b.by_key["gpu0-1"].name, "for pending job 5: idle, opened at once")]
    assert store.claims(3.0)[5] == "gpu-a"
    a.tick(4.0, (urgent,), busy=ALL)  # 5 started on gpu-b: gone from the queue
    assert a.claims.drained_for == {6}


def test_a_claim_outlives_its_job_for_the_ttl_so_a_stale_queue_elsewhere_drains_nothing(
        store: Store) -> None:
    a, b = Host("gpu-a", store), Host("gpu-b", store)
    big = Demand(9, 8, 10.0)
    a.tick(1.0, (big,))
    assert store.claims(1.0) == {9: "gpu-a"}
    a.tick(2.0, ())  # the job started on gpu-a
    result = b.tick(3.0, (big,), busy={0})  # gpu-b's last poll still lists it as pending
    assert result.reserved == {} and b.drains() == []
    a.tick(TTL_S, ())
    assert store.claims(TTL_S) == {9: "gpu-a"}
    a.tick(1.0 + TTL_S + 0.5, ())  # lapsed: released
    assert store.claims(1.0 + TTL_S) == {} and store.claims(0.0) == {}


def test_a_lapsed_claim_passes_and_its_old_holder_lets_it_go(store: Store) -> None:
    a, b = Host("gpu-a", store), Host("gpu-b", store)
    big = Demand(9, 8, 10.0)
    a.tick(1.0, (big,), busy={0})
    assert a.drains() == [9]
    b.tick(TTL_S + 2.0, (big,), busy={0})  # gpu-a stopped ticking: the claim lapsed
    assert b.drains() == [9] and store.claims(TTL_S + 2.5) == {9: "gpu-b"}
    result = a.tick(TTL_S + 3.0, (big,), busy={0})
    assert result.reserved == {} and a.claims.drained_for == set()


@pytest.mark.parametrize("detail", ["for pending job 9: waiting on x", "for pending job 9"])  # new, old
def test_after_a_restart_a_drain_under_way_is_not_told_again_and_keeps_its_claim(
        store: Store, detail: str) -> None:
    a = Host("gpu-a", store)
    big = Demand(9, 8, 10.0)
    a.tick(1.0, (big,), busy={0})
    (kind, block, _), = a.events
    store.record(Event(1.0, "gpu-a", kind, block, detail))
    a.claims, a.events = Claims(store, "gpu-a", ttl_s=TTL_S, drains=a.reserved), []  # restarted
    assert a.claims.drained_for == {9}
    a.tick(2.0, (big,), busy={0})
    assert a.events == [] and store.claims(2.0) == {9: "gpu-a"}


def test_drained_for_reads_old_and_new_details() -> None:
    assert drained_for("for pending job 42") == 42
    assert drained_for("for pending job 42: waiting on x") == 42
    assert drained_for("by olga: kernel update") is None
