"""Issue 16: backfill into a draining block (`controller.backfill`). A single on an idle
GPU of a block drained for an 8-GPU job stays open while the 1-GPU jobs GitLab would
hand it end, by their timeouts, before the drain is expected to end (a smaller block
likewise for jobs of its size); every invariant
holds with estimates wrong by 10x either way, and a backfilled job never has a timeout
above `backfill_max_s` (the most it can delay the drained job; `backfill_blocks_max_s`
for smaller blocks)."""

from __future__ import annotations

import dataclasses
import itertools
import os
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from runnerctl.controller.plan import Demand, Observed, PlanPolicy, SlotState, plan
from runnerctl.gpus.sim import count_snapshot
from runnerctl.layout import plan_slots
from runnerctl.model import Slot
from runnerctl.sim.hosts import SimRunner
from runnerctl.sim.labtrace import lab_trace
from runnerctl.sim.simulator import SimConfig, Simulator, TraceJob

SLOTS = plan_slots(count_snapshot("gpu-a", 8))
SINGLES = [s for s in SLOTS if s.size == 1]
NOW = 10_000.0


def _states(ends: dict[int, float | None]) -> tuple[SlotState, ...]:
    """Singles on GPUs `ends` run a job each, started at 0 and ending by the value."""
    def state(slot: Slot) -> SlotState:
        if slot.size == 1 and slot.gpus[0] in ends:
            return SlotState(slot, False, (100 + slot.gpus[0],), 0.0, ends[slot.gpus[0]])
        return SlotState(slot, slot.size > 1)
    return tuple(state(s) for s in SLOTS)


def _observed(ends: dict[int, float | None], ones: list[float | None], *,
              now: float | None = NOW) -> Observed:
    """Jobs running on GPUs `ends`, an 8-GPU job waits, and 1-GPU jobs with these
    timeouts wait after it."""
    demand = (Demand(1, 8, 0.0), *(Demand(2 + i, 1, 1.0 + i, timeout_s=t) for i, t in enumerate(ones)))
    return Observed(_states(ends), demand=demand, now=now)


def _opened(observed: Observed, policy: PlanPolicy | None = None) -> set[int]:
    return {s.gpus[0] for s in plan(observed, policy or PlanPolicy()).open_slots() if s.size == 1}


def test_short_jobs_backfill_the_idle_gpus_of_a_drain_and_long_ones_do_not() -> None:
    busy = dict.fromkeys(range(6), NOW + 3600)  # the drain ends within the hour at the latest
    assert _opened(_observed(busy, [600, 600]), PlanPolicy(backfill_max_s=0)) == set()  # no backfill
    result = plan(_observed(busy, [600, 600]))
    assert {s.gpus[0] for s in result.open_slots()} == {6, 7}
    assert all(d.reason.startswith("backfill") for d in result.decisions if d.open)
    assert result.reserved == {SLOTS[-1].name: 1} and result.recheck_at == NOW + 3600 - 600
    assert _opened(_observed(busy, [600])) == {6}  # one job: one single (no later job may land)
    assert _opened(_observed(busy, [600, 5000, 600])) == {6}  # the second oldest ends too late
    assert _opened(_observed(busy, [4000, 600])) == set()  # the oldest would outlast the drain
    assert _opened(_observed(busy, [600, None])) == {6}  # unknown timeout: never backfilled
    assert _opened(_observed({**busy, 3: None}, [600, 600])) == set()  # a drain with no known end
    assert _opened(_observed(busy, [600, 600], now=None)) == set()  # no clock: no backfill
    late = dict.fromkeys(range(6), NOW + 86400)
    assert _opened(_observed(late, [7000, 7000])) == {6, 7}
    assert _opened(_observed(late, [8000, 8000])) == set()  # over backfill_max_s (2 h)


def test_smaller_blocks_backfill_a_drain_too() -> None:
    """A block smaller than the drained one, on its idle GPUs, opens while the pending
    jobs of its size GitLab would hand it end in time, by the same rules as singles."""
    busy = dict.fromkeys(range(4), NOW + 3600)  # gpu0-3 busy, the drain ends within the hour

    def opened(*jobs: Demand) -> set[str]:
        demand = (Demand(1, 8, 0.0), *jobs)
        result = plan(Observed(_states(busy), demand=demand, now=NOW))
        assert result.reserved == {SLOTS[-1].name: 1}
        return {s.key for s in result.open_slots() if not set(s.gpus) & set(busy)}

    assert opened(Demand(2, 4, 1.0, timeout_s=1800.0)) == {"gpu4-7"}
    assert opened(Demand(2, 4, 1.0, timeout_s=4000.0)) == set()  # would outlast the drain
    assert opened(Demand(2, 4, 1.0)) == set()  # unknown timeout
    pairs = (Demand(2, 2, 1.0, timeout_s=600.0), Demand(3, 2, 2.0, timeout_s=600.0))
    assert opened(*pairs) == {"gpu4-5", "gpu6-7"}
    assert opened(Demand(2, 2, 1.0, timeout_s=600.0)) == {"gpu4-5"}  # one job: one pair
    # a pair for a 2-GPU job, singles for 1-GPU jobs on the rest, never overlapping (S1)
    assert opened(Demand(2, 2, 1.0, timeout_s=600.0), Demand(3, 1, 2.0, timeout_s=600.0),
                  Demand(4, 1, 3.0, timeout_s=600.0)) == {"gpu4-5", "gpu6", "gpu7"}


def test_smaller_blocks_take_jobs_up_to_their_own_bound() -> None:
    """Blocks backfill jobs with timeouts up to `backfill_blocks_max_s` (3 h), singles
    only up to `backfill_max_s` (2 h): behind a drain that ends in 5 h, a 4-GPU job with a
    2.7 h timeout takes the idle quad, a 1-GPU job with the same timeout takes no single,
    and neither does a quad for a 4-GPU job over 3 h."""
    busy = dict.fromkeys(range(4), NOW + 5 * 3600)

    def opened(*jobs: Demand, policy: PlanPolicy | None = None) -> set[str]:
        observed = Observed(_states(busy), demand=(Demand(1, 8, 0.0), *jobs), now=NOW)
        result = plan(observed, policy or PlanPolicy())
        assert result.reserved == {SLOTS[-1].name: 1}
        return {s.key for s in result.open_slots() if not set(s.gpus) & set(busy)}

    assert opened(Demand(2, 4, 1.0, timeout_s=9600.0)) == {"gpu4-7"}
    assert opened(Demand(2, 1, 1.0, timeout_s=9600.0)) == set()  # over the singles' 2 h
    assert opened(Demand(2, 4, 1.0, timeout_s=11_000.0)) == set()  # over the blocks' 3 h
    assert opened(Demand(2, 4, 1.0, timeout_s=9600.0), policy=PlanPolicy(backfill_max_s=0)) == set()


def test_backfill_checks_the_jobs_gitlab_hands_out_not_the_fair_share_order() -> None:
    """Issue 16 review, C: GitLab hands an open runner the oldest pending job of its size,
    whatever fair share says; a pair must not open because a younger short job ranks
    first by fair share while the oldest one, which GitLab hands out, runs far longer
    than the drain (before the fix gpu4-5 opened)."""
    busy = dict.fromkeys(range(4), NOW + 3600)
    long = Demand(2, 2, 0.0, timeout_s=20_000.0, fair_s=5000.0)  # oldest: GitLab hands it first
    short = Demand(3, 2, 100.0, timeout_s=600.0)
    result = plan(Observed(_states(busy), demand=(Demand(1, 8, -10.0), long, short), now=NOW))
    assert result.reserved == {SLOTS[-1].name: 1}
    assert not [s for s in result.open_slots() if not set(s.gpus) & set(busy)]
    # a 1-GPU job that ranks first by fair share does not hide an older long one either
    ones = (Demand(4, 1, 0.0, timeout_s=20_000.0, fair_s=5000.0), Demand(5, 1, 100.0, timeout_s=600.0))
    result = plan(Observed(_states(busy), demand=(Demand(1, 8, -10.0), *ones), now=NOW))
    assert not [s for s in result.open_slots() if not set(s.gpus) & set(busy)]


ends = st.one_of(st.none(), st.floats(NOW - 5000, NOW + 50_000))


@settings(max_examples=int(os.environ.get("PLAN_EXAMPLES", "300")), deadline=None)
@given(running=st.dictionaries(st.sampled_from(range(8)), ends, max_size=7),
       closed=st.sets(st.integers(0, 7), max_size=2),
       true_s=st.lists(st.floats(60, 20_000), max_size=10),
       error=st.lists(st.sampled_from([0.1, 0.5, 1.0, 2.0, 10.0]), min_size=10, max_size=10),
       multi=st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=3),
       multi_s=st.lists(st.one_of(st.none(), st.floats(60, 20_000)), min_size=3, max_size=3),
       reserved=st.booleans())
def test_invariants_hold_with_estimates_wrong_by_10x(running: dict[int, float | None], closed: set[int],
                                                     true_s: list[float], error: list[float],
                                                     multi: list[int], multi_s: list[float | None],
                                                     reserved: bool) -> None:
    """Timeouts (estimates) 10x off a job's true duration either way, drains' expected
    ends anywhere: S1 and the gate hold, backfill changes no reservation, opens only
    singles and smaller blocks on idle open GPUs of draining blocks, for jobs of their
    size GitLab would hand out whose timeouts are at most `backfill_max_s` (singles) or
    `backfill_blocks_max_s` (smaller blocks) and end before the drain's expected end."""
    ones = [Demand(10 + i, 1, 10.0 + i, timeout_s=t * error[i], fair_s=3000.0 * (i % 3 == 0))
            for i, t in enumerate(true_s)]
    demand = (*(Demand(1 + i, n, float(i), timeout_s=multi_s[i]) for i, n in enumerate(multi)), *ones)
    observed = Observed(_states(running), dict.fromkeys(closed, "foreign"), demand, now=NOW,
                        reserved={SLOTS[-1].name: 1} if reserved and multi[0] == 8 else {})
    policy = PlanPolicy()
    result, without = plan(observed, policy), plan(observed, dataclasses.replace(policy, backfill_max_s=0))
    opened = result.open_slots()
    for a, b in itertools.combinations(opened, 2):
        assert set(a.gpus).isdisjoint(b.gpus)  # S1
    for slot in opened:
        assert not set(slot.gpus) & closed
        assert not any(g in running for g in slot.gpus if f"gpu{g}" != slot.key)
    assert (result.reserved, result.protected, result.claims) == (without.reserved, without.protected,
                                                                 without.claims)
    extra = [d.slot for d, w in zip(result.decisions, without.decisions, strict=True) if d.open != w.open]
    assert all(d.open for d, w in zip(result.decisions, without.decisions, strict=True) if d.open != w.open)
    if not extra:
        return
    blocks = [s for s in SLOTS if s.name in result.reserved]
    for slot in extra:
        assert not set(slot.gpus) & set(running) and not set(slot.gpus) & closed
        block = next(b for b in blocks if set(slot.gpus) < set(b.gpus))
        end = max(e for g, e in running.items() if g in block.gpus and e is not None)
        size = slot.size
        idle_open = sum(1 for s in opened if s.size == size and not set(s.gpus) & set(running))
        handed = sorted((d for d in demand if d.gpus == size), key=lambda d: (d.created_at, d.job_id))
        handed = handed[:idle_open]
        assert len(handed) == idle_open  # as many jobs pending as open idle slots of that size
        bound = policy.backfill_max_s if size == 1 else policy.backfill_blocks_max_s
        assert all(d.timeout_s is not None and d.timeout_s <= bound and NOW + d.timeout_s <= end
                   for d in handed)
    assert result.recheck_at is not None and result.recheck_at >= NOW


def _wrong_by(factor: float, seed: int) -> list[TraceJob]:
    jobs, _ = lab_trace(200, seed=seed)
    rng = random.Random(seed)
    return [dataclasses.replace(j, timeout=j.duration * (factor if rng.random() < 0.5 else 1.0))
            for j in jobs]


class Watched(Simulator):
    """Notes each job that starts on a slot inside a block a drain holds, with the job
    drained for (a backfilled job, or one that goes first: `plan._Reserver._drain`)."""

    backfilled: list[tuple[int, int]]

    def _start(self, now: float, host_no: int, gpus: tuple[int, ...], job_id: int,
               runner: SimRunner | None) -> None:
        host = self.hosts[host_no]
        for name, drained in host.reserved.items():
            if set(gpus) < set(host.slot_of[name].gpus):  # inside a drained block
                self.backfilled = [*getattr(self, "backfilled", []), (job_id, drained)]
        super()._start(now, host_no, gpus, job_id, runner)


def test_in_the_simulator_estimates_10x_off_keep_invariants_and_the_bound() -> None:
    """Half the jobs' timeouts 10x their durations (over-estimates), or a tenth (GitLab
    kills them then): no double allocation, no foreign collision, nothing dropped, and a
    job that starts inside a drained block has a timeout within `backfill_max_s` (a single) or
    `backfill_blocks_max_s` (a smaller block)."""
    policy = PlanPolicy()
    for factor, seed in ((10.0, 1), (0.1, 2)):
        jobs = _wrong_by(factor, seed)
        _, foreign = lab_trace(200, seed=seed)
        sim = Watched(jobs, SimConfig(plan_policy=policy), foreign)
        result = sim.run()
        assert result["double_allocations"] == 0 and result["foreign_collisions"] == 0
        assert result["jobs_dropped"] == {} and result["jobs_never_started"] == 0
        backfilled = getattr(sim, "backfilled", [])
        assert backfilled, "the trace should give backfill a chance"
        by_id = {j.job_id: j for j in jobs}
        bounds = {1: policy.backfill_max_s}  # singles; smaller blocks: backfill_blocks_max_s
        assert all((by_id[j].timeout or 0) <= bounds.get(by_id[j].gpus, policy.backfill_blocks_max_s)
                   or (by_id[j].submit, j) < (by_id[d].submit, d)  # or it goes first (issue 16 review A)
                   for j, d in backfilled)
