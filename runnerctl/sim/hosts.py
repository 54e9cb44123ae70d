"""The simulator's hosts: runners, GPU owners, foreign use, and their controller's memory.

Split from `simulator` (the event loop) so each stays small; the state here is mutated
only by `Simulator`. Hosts are named as FOREIGN.csv names them: gpu-a ... gpu-z, gpu-aa.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from runnerctl.controller.plan import SlotState
from runnerctl.gpus.sim import count_snapshot
from runnerctl.layout import plan_slots
from runnerctl.model import Slot


@functools.cache
def slot_sizes(gpus_per_host: int) -> frozenset[int]:
    """The GPU counts of a simulated host's slots (`layout.plan_slots` on its GPUs: 1, 2,
    4, 8 and the whole host on 8; 1, 2, 4 and 5 on 5): the runner sizes a job may ask for
    and `--runner-max-timeout-s` may name."""
    return frozenset(slot.size for slot in plan_slots(count_snapshot(host_name(0), gpus_per_host)))


def host_name(index: int) -> str:
    """gpu-a ... gpu-z, then gpu-aa, gpu-ab, ... (as spreadsheet columns)."""
    letters = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        letters = chr(97 + rest) + letters
    return f"gpu-{letters}"


class SimRunner:
    """One runner: its slot, open (unpaused) or not, the job it runs."""

    __slots__ = ("slot", "index", "open", "job", "started", "ends_by", "state", "cap")

    def __init__(self, slot: Slot, index: int, open_: bool) -> None:
        self.slot, self.index, self.open = slot, index, open_
        self.cap: int | None = None  # the maximum timeout runnerctl set for backfill by estimate (caps)
        self.job: int | None = None
        self.started: float | None = None
        self.ends_by: float | None = None  # start + its timeout (CI_JOB_TIMEOUT), if it has one
        self.state = SlotState(slot, not open_)

    def refresh(self) -> None:
        self.state = SlotState(self.slot, not self.open, () if self.job is None else (self.job,),
                               self.started, self.ends_by)


class SimHost:
    """One host: its runners under a policy, who holds each GPU, foreign use and cool-downs,
    and what its controller remembers (drains, claims, protected jobs)."""

    def __init__(self, index: int, *, gpus: int, policy: str) -> None:
        slots = plan_slots(count_snapshot(host_name(index), gpus))
        dynamic = policy == "dynamic"
        self.runners = [SimRunner(s, i, not dynamic or s.size == 1)
                        for i, s in enumerate(policy_slots(slots, policy))]
        self.idle = {r.index for r in self.runners if r.open}  # open runners without a job
        self.owner: list[int | None] = [None] * gpus
        self.foreign = [0] * gpus  # active foreign processes
        self.closed_until = [0.0] * gpus
        self.reserved: dict[str, int] = {}
        self.claimed: set[int] = set()
        self.drained: set[int] = set()  # claimed jobs it really drained for: kept (controller/claims.py)
        self.protected: frozenset[int] = frozenset()
        self.boundary: tuple[int, bool, float, int] | None = None  # replan.boundary
        self.stopped_by: int | None = None  # the job that held new drains back in its last plan (too young)
        self.recheck_at = float("inf")  # plan.Plan.recheck_at: plan again then
        self.deadlines: Mapping[str, float] = {}  # plan.Plan.deadlines of its last plan
        self.capped: set[str] = set()  # runners with a deadline's maximum timeout (SimRunner.cap)
        self.singles: Mapping[int, str] | None = {}  # plan.Plan.singles of its last plan (own.own_start;
        # None: unknown, replan.sees skipped a plan that could change only it)
        self.seen = 0  # Simulator._log: the changes its last plan saw (replan.sees)
        self.runner_of = {r.slot.name: r for r in self.runners}
        self.paused = {r.slot.name: not r.open for r in self.runners}  # as GitLab has them (replan.reconcile)
        self.slot_of = {r.slot.name: r.slot for r in self.runners}
        self.slot_sizes = frozenset(r.slot.size for r in self.runners)
        self.block_sizes = self.slot_sizes - {1}
        # replan.boundary: size -> the jobs drained for on a usable block (or idle slot), each
        # such set once (what `replan.sees` reads is whether some block may be taken)
        self.blocks: dict[int, set[tuple[int, ...]]] = {}
        self.idle_slots: dict[int, set[tuple[int, ...]]] = {}
        self.all_blocks: dict[int, set[tuple[int, ...]]] = {}  # each block size, nothing drained
        # (drains, GPUs closed, GPUs idle) -> the `blocks` and `idle_slots` read for them (replan.boundary)
        self.read: dict[object, tuple[dict[int, set[tuple[int, ...]]], dict[int, set[tuple[int, ...]]]]] = {}
        self.blocks_on: list[list[tuple[int, ...]]] = [[] for _ in range(gpus)]  # GPU -> the blocks on it
        for runner in self.runners:
            if runner.slot.size > 1:
                self.all_blocks.setdefault(runner.slot.size, set()).add(())
                for g in runner.slot.gpus:
                    self.blocks_on[g].append(runner.slot.gpus)

    def gated(self, gpu: int, now: float) -> bool:
        return bool(self.foreign[gpu]) or self.closed_until[gpu] > now

    def free_gpus(self, now: float) -> list[int]:
        return [g for g, owner in enumerate(self.owner) if owner is None and not self.gated(g, now)]


def policy_slots(slots: list[Slot], policy: str) -> list[Slot]:
    """The runners a policy registers: every slot (dynamic, references), the singles, or
    a fixed partition (one quad, one pair, two singles)."""
    if policy == "static-singles":
        return [s for s in slots if s.size == 1]
    if policy == "static-partition":
        keys = {"gpu0-3", "gpu4-5", "gpu6", "gpu7"}
        return [s for s in slots if s.key in keys] or [s for s in slots if s.size == 1]
    return slots
