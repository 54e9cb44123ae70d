"""Slot layout: singles plus nested aligned blocks, chosen by topology, tagged safely."""

from __future__ import annotations

import itertools

import pytest

from runnerctl.gpus.sim import count_snapshot
from runnerctl.layout import mig_gpus, plan_slots, slot_tags, standby_tags
from runnerctl.model import GpuSnapshot, Slot, TopologyLevel


def _sizes(slots: list[Slot]) -> dict[int, int]:
    sizes: dict[int, int] = {}
    for slot in slots:
        sizes[slot.size] = sizes.get(slot.size, 0) + 1
    return sizes


def test_eight_gpus_give_8_singles_4_pairs_2_quads_1_octet() -> None:
    slots = plan_slots(count_snapshot("gpu-a", 8))
    assert _sizes(slots) == {1: 8, 2: 4, 4: 2, 8: 1}
    assert [s.key for s in slots if s.size == 2] == ["gpu0-1", "gpu2-3", "gpu4-5", "gpu6-7"]
    assert [s.name for s in slots][-1] == "runnerctl/gpu-a/gpu0-7"


@pytest.mark.parametrize("count", [1, 2, 3, 5, 6, 8, 12, 16])
def test_blocks_nest_and_cover(count: int) -> None:
    slots = plan_slots(count_snapshot("h", count))
    assert sorted(s.gpus[0] for s in slots if s.size == 1) == list(range(count))
    for small, big in itertools.combinations(slots, 2):
        a, b = set(small.gpus), set(big.gpus)
        assert a <= b or b <= a or a.isdisjoint(b), (small.key, big.key)
    if count > 1:
        assert max(s.size for s in slots) == count


def test_topology_pairs_closest_gpus() -> None:
    """GPUs 0 and 2 share a board, as do 1 and 3: pairs follow the board, not the index."""
    base = count_snapshot("h", 4)
    levels = {(a, b): TopologyLevel.SYSTEM for a, b in itertools.combinations(range(4), 2)}
    levels[(0, 2)] = TopologyLevel.INTERNAL
    levels[(1, 3)] = TopologyLevel.SINGLE
    snapshot = GpuSnapshot(host="h", taken_at=0, gpus=base.gpus, topology=levels)
    pairs = [s.gpus for s in plan_slots(snapshot) if s.size == 2]
    assert pairs == [(0, 2), (1, 3)]
    assert [s.key for s in plan_slots(snapshot) if s.size == 2] == ["gpu0+2", "gpu1+3"]


def test_unknown_topology_falls_back_to_index_order() -> None:
    base = count_snapshot("h", 4)
    snapshot = GpuSnapshot(host="h", taken_at=0, gpus=base.gpus, topology={})
    assert [s.gpus for s in plan_slots(snapshot) if s.size == 2] == [(0, 1), (2, 3)]


def test_lost_gpu_gets_no_slot() -> None:
    import dataclasses

    base = count_snapshot("h", 4)
    gpus = tuple(dataclasses.replace(g, lost=g.index == 3) for g in base.gpus)
    slots = plan_slots(dataclasses.replace(base, gpus=gpus))
    assert all(3 not in s.gpus for s in slots)
    assert max(s.size for s in slots) == 3


def test_mig_gpu_gets_no_slot_and_is_in_no_block() -> None:
    import dataclasses

    base = count_snapshot("h", 8)
    gpus = tuple(dataclasses.replace(g, mig_enabled=g.index == 5) for g in base.gpus)
    snapshot = dataclasses.replace(base, gpus=gpus)
    slots = plan_slots(snapshot)
    assert all(5 not in s.gpus for s in slots) and mig_gpus(snapshot) == [5]
    assert sorted(s.gpus[0] for s in slots if s.size == 1) == [0, 1, 2, 3, 4, 6, 7]
    assert plan_slots(base)[-1].size == 8  # the same GPUs without MIG: the octet is back


def _runner_can_take(runner_tags: list[str], job_tags: list[str]) -> bool:
    """GitLab's rule (docs.gitlab.com/ci/runners/configure_runners, "Use tags"): a runner
    picks a job only if the runner has every tag of the job."""
    return set(job_tags) <= set(runner_tags)


@pytest.mark.parametrize("asked", [1, 2, 4, 8])
def test_a_block_never_takes_a_smaller_job(asked: int) -> None:
    slots = plan_slots(count_snapshot("gpu-a", 8))
    job_variants = [[f"gpus:{asked}"], [f"gpus:{asked}", "priority:high"],
                    [f"gpus:{asked}", "host:gpu-a"]]
    if asked == 1:
        job_variants += [["gpu"], ["gpu", "gpus:1"]]
    for job_tags in job_variants:
        takers = {s.size for s in slots if _runner_can_take(slot_tags(s), job_tags)}
        assert takers == {asked}, (job_tags, takers)


def test_every_slot_accepts_any_priority_tag() -> None:
    for slot in plan_slots(count_snapshot("h", 8)):
        for priority in ("high", "normal", "low"):
            assert f"priority:{priority}" in slot_tags(slot)


@pytest.mark.parametrize("count", [1, 3, 6, 8, 16])
def test_standby_tags_cover_every_slot_and_nothing_else(count: int) -> None:
    slots = plan_slots(count_snapshot("h", count))
    tags = standby_tags(slots)
    assert len(tags) == len(set(tags)) <= 50  # GitLab's TAG_LIST_MAX_LENGTH
    assert set(tags) == {t for s in slots for t in slot_tags(s)}
    assert {f"gpus:{s.size}" for s in slots} <= set(tags) and "host:h" in tags
