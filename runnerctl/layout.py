"""Which runner slots a host gets: one per GPU plus aligned blocks up to the whole host.

Blocks nest: every pair lies inside one quad, every quad inside one octet, so a block
drains exactly the singles and smaller blocks under it. GPUs are grouped by NVML
topology where it is known (closest pairs first, then closest pairs of pairs), and by
index where it is not.

Tags decide which runner GitLab may give a job to: GitLab hands a job to a runner whose
tags include *all* of the job's tags. A block runner therefore carries only `gpus:N`
and never `gpu` or a smaller `gpus:K`, so it cannot take a job that asked for fewer
GPUs; single-GPU runners carry `gpu` and `gpus:1` so that both the classic `tags:
[gpu]` and `gpus:1` reach them. Every runner carries all `priority:*` tags, so a job's
priority tag only informs the controller and never makes a job unschedulable.

A GPU in MIG mode (NVML `mig_enabled`) gets no slot and is not counted in any block:
runnerctl leaves MIG GPUs alone (docs/controller.md, "MIG GPUs"). Its processes run on
GPU instances, CUDA takes MIG device UUIDs, not the GPU's, and NVML reports no
utilization for it, so neither the lease (a set of whole GPUs) nor the gate fits it.

The host's stand-by runner (`standby_tags`) carries every tag any of its slots
carries, so that a job one of its slots can serve is never "stuck" in GitLab's eyes
while its runners are paused (docs/controller.md, "Stand-by runner").
"""

from __future__ import annotations

from runnerctl.model import GpuSnapshot, Slot, TopologyLevel
from runnerctl.tags import runner_tags

_UNKNOWN_DISTANCE = TopologyLevel.SYSTEM + 1


def slot_tags(slot: Slot) -> list[str]:
    return runner_tags(gpus=slot.size, host=slot.host)


def standby_name(host: str) -> str:
    """The stand-by runner's description in GitLab (never a config.toml entry)."""
    return f"runnerctl/{host}/standby"


def standby_tags(slots: list[Slot]) -> list[str]:
    """Every tag of every slot of the host, in slot order: the jobs the host can serve."""
    return list(dict.fromkeys(tag for slot in slots for tag in slot_tags(slot)))


def mig_gpus(snapshot: GpuSnapshot) -> list[int]:
    """GPUs in MIG mode: runnerctl plans no slot on them."""
    return [gpu.index for gpu in snapshot.gpus if gpu.mig_enabled]


MIG_HINT = ("runnerctl leaves MIG GPUs alone (no runner, never opened); nothing to set: to give "
            "one to runnerctl, turn MIG off (nvidia-smi -i N -mig 0, then reset the GPU) and run "
            "runnerctl init again")


def plan_slots(snapshot: GpuSnapshot) -> list[Slot]:
    """Singles, then blocks of 2, 4, ... GPUs, then the whole host; smallest first.
    Lost GPUs and MIG GPUs (`mig_gpus`) are left out."""
    indexes = sorted(gpu.index for gpu in snapshot.gpus if not gpu.lost and not gpu.mig_enabled)
    if not indexes:
        return []
    slots = [Slot(snapshot.host, (i,)) for i in indexes]
    groups: list[tuple[int, ...]] = [(i,) for i in indexes]
    while len(groups) > 1:
        paired, leftover = _pair_closest(groups, snapshot)
        slots.extend(Slot(snapshot.host, group) for group in paired)
        groups = paired + leftover
        groups.sort()
        if not paired:
            break
    whole = tuple(indexes)
    if len(whole) > 1 and all(slot.gpus != whole for slot in slots):
        slots.append(Slot(snapshot.host, whole))
    return sorted(slots, key=lambda s: (s.size, s.gpus))


def _pair_closest(
    groups: list[tuple[int, ...]], snapshot: GpuSnapshot
) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """Merge groups of equal size two by two, closest pairs first (ties by index).

    Groups of a different size than the smallest (left over from an odd count) wait
    for the final whole-host block.
    """
    size = min(len(g) for g in groups)
    same = [g for g in groups if len(g) == size]
    leftover = [g for g in groups if len(g) != size]
    candidates = sorted(
        (_distance(a, b, snapshot), a, b)
        for pos, a in enumerate(same)
        for b in same[pos + 1 :]
    )
    used: set[tuple[int, ...]] = set()
    merged: list[tuple[int, ...]] = []
    for _, a, b in candidates:
        if a not in used and b not in used:
            used.update((a, b))
            merged.append(tuple(sorted(a + b)))
    leftover.extend(g for g in same if g not in used)
    return merged, leftover


def _distance(a: tuple[int, ...], b: tuple[int, ...], snapshot: GpuSnapshot) -> int:
    """The worst link between two groups; unknown links count as farthest."""
    worst = 0
    for x in a:
        for y in b:
            level = snapshot.level(x, y)
            worst = max(worst, _UNKNOWN_DISTANCE if level is None else int(level))
    return worst
