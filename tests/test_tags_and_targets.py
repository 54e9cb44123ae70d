"""The strings runnerctl writes and reads back, each spelled in one module: runner and
job tags (runnerctl/tags.py), toggle targets (`toggles.Target`) and slot keys
(`model.slot_key`)."""

from __future__ import annotations

import pytest

from runnerctl.controller.toggles import Target
from runnerctl.model import Slot, slot_key
from runnerctl.tags import PRIORITIES, PRIORITY_RANK, gpus_of, host_of, job_tags, priority_of, runner_tags


def test_a_runner_takes_exactly_the_jobs_its_tags_cover() -> None:
    single, block = runner_tags(gpus=1, host="gpu-a"), runner_tags(gpus=4, host="gpu-a")
    assert gpus_of(single) == 1 and gpus_of(block) == 4 and host_of(block) == "gpu-a"
    for gpus in (1, 4):
        job = job_tags(gpus=gpus, priority="high", host="gpu-a")
        takers = [tags for tags in (single, block) if set(job) <= set(tags)]
        assert takers == [single if gpus == 1 else block]
        assert (gpus_of(job), priority_of(job), host_of(job)) == (gpus, "high", "gpu-a")


def test_unknown_or_missing_tags_read_as_nothing() -> None:
    assert gpus_of(["docker", "gpus:x"]) == 0 and priority_of(["priority:urgent"]) is None
    assert host_of(["gpu"]) is None
    assert [PRIORITY_RANK[p] for p in PRIORITIES] == [0, 1, 2]


@pytest.mark.parametrize("text", ["host", "gpu:0", "gpu:12", "slot:gpu0-3", "slot:gpu4"])
def test_a_target_reads_back_as_written(text: str) -> None:
    target = Target.parse(text)
    assert target is not None and str(target) == text


@pytest.mark.parametrize("text", ["gpu:006", "gpu:-1", "slot:", "hosts", "gpu:1\n", "slot:gpu0-3/x"])
def test_a_malformed_target_is_none(text: str) -> None:
    assert Target.parse(text) is None


def test_a_slot_key_from_its_full_name() -> None:
    slot = Slot("gpu-a", (0, 1, 2, 3))
    assert slot_key(slot.name) == slot.key == "gpu0-3" and slot_key("gpu0-3") == "gpu0-3"
    assert Target.parse("gpu:2") == Target("gpu", "2") and Target("gpu", "2").gpu == 2
