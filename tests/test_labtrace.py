"""Issue 16: lab-like traces (`runnerctl.sim.labtrace`) have what the benchmark relies on:
heavy tails, bursts, several users with their own mixes, timeouts that bound durations,
foreign use, offered load below 1, and (diurnal) a working day."""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from collections.abc import Callable

import pytest

from runnerctl.sim.inputs import TraceJob
from runnerctl.sim.labtrace import MAX_S, MIN_S, QUIET, arrival_rate, lab_trace
from runnerctl.sim.philly import MEDIAN_S, QUANTILES, philly_duration


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


def test_a_diurnal_trace_is_busy_in_working_hours_and_quiet_at_night() -> None:
    jobs, _ = lab_trace(1000, hosts=2, seed=5, diurnal=True)
    flat, _ = lab_trace(1000, hosts=2, seed=5)
    assert [(j.gpus, j.duration, j.user) for j in jobs] == [(j.gpus, j.duration, j.user) for j in flat]
    span = max(j.submit for j in jobs)
    assert abs(span - max(j.submit for j in flat)) < 4 * 3600  # the same span: the same average load
    working = [j for j in jobs if arrival_rate(int(j.submit // 3600)) == 1.0]
    hours = sum(1 for h in range(int(span // 3600)) if arrival_rate(h) == 1.0)
    assert 0.3 < hours * 3600 / span < 0.5  # the working hours are under half the span
    assert len(working) > 0.8 * len(jobs)  # but get most of the sessions
    day_load = sum(j.gpus * j.duration for j in working) / (16 * hours * 3600)
    assert day_load > 1.4  # well above capacity by day, 0.85 on average
    assert arrival_rate(0) == QUIET and arrival_rate(1) == 1.0 and arrival_rate(11) == QUIET  # 08, 09, 19 h
    assert arrival_rate(4 * 24 + 1) == 1.0 and arrival_rate(5 * 24 + 1) == QUIET  # Friday, Saturday 09 h


def test_philly_durations_follow_the_trace_scaled_to_each_users_median() -> None:
    """`runnerctl.sim.philly`: the Philly trace's run times, as percentiles."""
    rng = random.Random(11)
    draws = sorted(philly_duration(rng) for _ in range(40_000))
    for percent in (10, 50, 90, 99):  # within a percentile of the trace's own
        value = draws[len(draws) * percent // 100]
        assert QUANTILES[2 * percent - 2] <= value <= QUANTILES[2 * percent + 2], percent
    scaled = sorted(philly_duration(rng, 600.0) for _ in range(20_000))
    assert 0.9 * 600 < scaled[10_000] < 1.1 * 600  # a user's median, the trace's shape
    assert scaled[19_800] / scaled[10_000] > 100  # p99 over 100x the median: sigma about 2
    assert len(QUANTILES) == 201 and list(QUANTILES) == sorted(QUANTILES) and MEDIAN_S == QUANTILES[100]


def test_a_philly_lab_trace_keeps_users_sizes_and_timeouts_with_a_heavier_tail() -> None:
    jobs, _ = lab_trace(1000, hosts=2, seed=5, durations="philly")
    lognormal, _ = lab_trace(1000, hosts=2, seed=5)
    assert all(j.timeout is not None and MIN_S <= j.duration <= min(j.timeout, MAX_S) for j in jobs)
    same = [(j.gpus, j.user, j.timeout) for j in lognormal]
    assert [(j.gpus, j.user, j.timeout) for j in jobs] == same  # the same jobs, other run times
    assert sum(j.duration != k.duration for j, k in zip(jobs, lognormal, strict=True)) > 0.9 * len(jobs)

    def share(trace: list[TraceJob], test: Callable[[TraceJob], bool]) -> float:
        return sum(map(test, trace)) / len(trace)

    def short(j: TraceJob) -> bool:
        return j.duration == MIN_S

    def killed(j: TraceJob) -> bool:
        return j.duration == j.timeout

    assert share(jobs, short) > 1.5 * share(lognormal, short)  # the trace's failures at start-up
    assert share(jobs, killed) > share(lognormal, killed)  # and its longer tail, cut at the timeouts
    with pytest.raises(ValueError, match="durations"):
        lab_trace(100, durations="weibull")
