"""Issue 16: lab-like traces (`runnerctl.sim.labtrace`) have what the benchmark relies on:
heavy tails, bursts, several users with their own mixes, timeouts that bound durations,
foreign use, and offered load below 1."""

from __future__ import annotations

import math
import statistics
from collections import Counter

import pytest

from runnerctl.sim.labtrace import MAX_S, MIN_S, lab_trace


def test_a_lab_trace_is_heavy_tailed_bursty_and_below_capacity() -> None:
    jobs, foreign = lab_trace(1000, hosts=2, seed=5, foreign_per_host=3)
    assert len(jobs) >= 1000 and len({j.job_id for j in jobs}) == len(jobs)
    assert all(j.timeout is not None and MIN_S <= j.duration <= min(j.timeout, MAX_S) for j in jobs)
    logs = [math.log(j.duration) for j in jobs
            if j.user == "student" and j.timeout and j.duration < j.timeout]
    assert statistics.stdev(logs) > 1.2  # lognormal sigma 1.6, tails cut at 1 minute and the timeout
    assert max(Counter(j.submit for j in jobs if j.user == "sweeper").values()) == 1  # spread by a second
    bursts = Counter(int(j.submit) // 60 for j in jobs if j.user == "sweeper")
    assert max(bursts.values()) >= 50  # 50 jobs within a minute
    assert {j.gpus for j in jobs} == {1, 2, 4, 8} and len({j.user for j in jobs}) == 5
    assert {j.gpus for j in jobs if j.user == "bigmodel"} == {8}
    span = max(j.submit for j in jobs) - min(j.submit for j in jobs)
    offered = sum(j.gpus * j.duration for j in jobs) / (16 * span)
    assert 0.7 < offered < 1.0
    assert len(foreign) == 6 and {u.host for u in foreign} == {0, 1}
    assert all(0 <= u.gpu < 8 and u.duration > 0 for u in foreign)


def test_the_same_seed_gives_the_same_trace_and_bad_arguments_are_refused() -> None:
    assert lab_trace(100, seed=3) == lab_trace(100, seed=3)
    assert lab_trace(100, seed=3) != lab_trace(100, seed=4)
    with pytest.raises(ValueError, match="load"):
        lab_trace(100, load=0)
