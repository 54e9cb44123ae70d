"""Estimates and fair share read the job history incrementally (what ended since their
last read) and in full once an hour: the incremental reads must give what a full read
gives (runnerctl/controller/estimates.py, fair_usage.py)."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from runnerctl.controller import jobs_store
from runnerctl.controller.demand import PendingJob
from runnerctl.controller.estimates import FULL_S, LATE_S, REFRESH_S, Estimates
from runnerctl.controller.fair_usage import FairShare
from runnerctl.controller.jobs_store import JobRecord
from runnerctl.controller.store import Store
from runnerctl.settings import ControllerSettings

HOUR = 3600.0
NAMES = ("train", "eval", "lint")
USERS = ("ann", "bob", "cy")


def _row(job_id: int, *, name: str, user: str, start: float, end: float | None, seen: float,
         outcome: str = "ended", host: str = "gpu-a") -> JobRecord:
    return JobRecord(host=host, job_id=job_id, slot="gpu0", gpus=(0,) if job_id % 2 else (0, 1, 2, 3),
                     project="g/a", pipeline="1", name=name, user=user,
                     url=f"https://gitlab.example/g/a/-/jobs/{job_id}", queued_at=None, started_at=start,
                     seen_at=seen, ended_at=end, outcome=outcome if end is not None else "running")


def _pending(name: str) -> PendingJob:
    return PendingJob(10_000 + NAMES.index(name), 7, 1, 0.0, "normal", None, "https://gitlab.example/g/a/-/jobs/1",
                      "ann", name)


def _history(store: Store, start: float, minutes: int, seed: int) -> list[tuple[float, list[JobRecord]]]:
    """A lab's minutes: each writes the jobs that started, ran on or ended in it."""
    rng = random.Random(seed)
    running: dict[int, JobRecord] = {}
    steps = []
    next_id = 1
    for minute in range(minutes):
        now = start + minute * 60.0
        written = []
        for job_id, row in list(running.items()):
            if rng.random() < 0.15:  # ends now
                written.append(_row(job_id, name=row.name, user=row.user, start=row.started_at, end=now,
                                    seen=now, outcome=rng.choice(["ended", "ended", "canceled", "freed"])))
                del running[job_id]
            else:
                running[job_id] = _row(job_id, name=row.name, user=row.user, start=row.started_at, end=None,
                                       seen=now)
                written.append(running[job_id])
        for _ in range(rng.randrange(3)):
            running[next_id] = _row(next_id, name=rng.choice(NAMES), user=rng.choice(USERS), start=now,
                                    end=None, seen=now)
            written.append(running[next_id])
            next_id += 1
        steps.append((now, written))
    return steps


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_incremental_estimates_equal_a_full_read(tmp_path: Path, seed: int) -> None:
    store = Store.open(state_dir=tmp_path)
    kept = Estimates(store)
    pending = [_pending(name) for name in NAMES]
    start = 100 * HOUR
    steps = _history(store, start, minutes=int(FULL_S / 60) - 2, seed=seed)  # no full read but the first
    for now, written in steps:
        jobs_store.save_jobs(store, written)
        got = kept.of(pending, now + 1)
        assert got == Estimates(store).of(pending, now + 1), now
    assert kept._full_at == steps[0][0] + 1  # the first read was the only full one
    store.close()


def test_a_run_written_late_is_read_and_a_changed_outcome_at_the_full_read(tmp_path: Path) -> None:
    store = Store.open(state_dir=tmp_path)
    estimates = Estimates(store)
    now = 100 * HOUR
    jobs_store.save_jobs(store, [_row(1, name="train", user="ann", start=now - HOUR, end=now - 10, seen=now)])
    pending = [_pending("train")]
    assert estimates.of(pending, now) == {pending[0].job_id: HOUR - 10}
    # another host, its clock 2 minutes behind, writes a longer run that ended "before" the last one read
    late = _row(2, name="train", user="bob", start=now - 3 * HOUR, end=now - 130, seen=now, host="gpu-b")
    assert now - 130 > now - 10 - LATE_S
    jobs_store.save_jobs(store, [late])
    assert estimates.of(pending, now + REFRESH_S)[pending[0].job_id] == 3 * HOUR - 130
    # a webhook says afterwards that run 2 was cancelled: seen at the next full read
    jobs_store.save_jobs(store, [_row(2, name="train", user="bob", start=now - 3 * HOUR, end=now - 130,
                                      seen=now, host="gpu-b", outcome="canceled")])
    assert estimates.of(pending, now + 2 * REFRESH_S)[pending[0].job_id] == 3 * HOUR - 130  # not yet
    assert estimates.of(pending, now + FULL_S)[pending[0].job_id] == HOUR - 10
    store.close()


@pytest.mark.parametrize("seed", [4, 5])
def test_incremental_fair_share_usage_equals_a_full_read(tmp_path: Path, seed: int) -> None:
    store = Store.open(state_dir=tmp_path)
    settings = ControllerSettings(fair_weight_h=2.0, fair_half_life_h=1.0)
    fair = FairShare(store, settings)
    start = 100 * HOUR
    for now, written in _history(store, start, minutes=50, seed=seed):
        jobs_store.save_jobs(store, written)
        fair.penalties([_pending("train")], now)
    assert fair._full_at == start  # incremental after the first read
    assert fair.usage is not None
    full = FairShare(store, settings)
    full.penalties([_pending("train")], fair.usage.at)
    assert full.usage is not None
    for table in ("users", "projects"):
        mine, theirs = getattr(fair.usage, table), getattr(full.usage, table)
        assert set(mine) == set(theirs)
        for key in theirs:
            assert mine[key] == pytest.approx(theirs[key], rel=1e-9), (table, key)
    store.close()


def test_a_row_closed_between_the_two_reads_counts_once(tmp_path: Path) -> None:
    """The open rows and the rows ended since the last read are two reads: a job whose host
    closed its row in between came back from both and its use was added twice."""
    store = Store.open(state_dir=tmp_path)
    settings = ControllerSettings(fair_weight_h=2.0, fair_half_life_h=1.0)
    fair = FairShare(store, settings)
    start = 100 * HOUR
    running = _row(1, name="train", user="ann", start=start - HOUR, end=None, seen=start)
    jobs_store.save_jobs(store, [running])
    fair.penalties([_pending("train")], start)
    now = start + REFRESH_S
    open_then = [dataclasses.replace(running, seen_at=now - 1)]  # what the first read saw
    closed = _row(1, name="train", user="ann", start=start - HOUR, end=now - 1, seen=now - 1)
    jobs_store.save_jobs(store, [closed])
    usage = fair._read(now, open_then)
    full = FairShare(store, settings)
    full.penalties([_pending("train")], now)
    assert full.usage is not None
    assert usage.users["ann"] == pytest.approx(full.usage.users["ann"], rel=1e-9)
    store.close()


def test_a_host_whose_clock_is_ahead_hides_no_other_hosts_runs(tmp_path: Path) -> None:
    store = Store.open(state_dir=tmp_path)
    estimates = Estimates(store)
    now = 100 * HOUR
    pending = [_pending("train")]
    ahead = _row(1, name="eval", user="ann", start=now + HOUR - 60, end=now + HOUR, seen=now + HOUR,
                 host="fast")
    jobs_store.save_jobs(store, [ahead])
    assert estimates.of(pending, now) == {}
    jobs_store.save_jobs(store, [_row(2, name="train", user="bob", start=now - 630, end=now + 30,
                                      seen=now + 30)])
    assert estimates.of(pending, now + REFRESH_S) == Estimates(store).of(pending, now + REFRESH_S) \
        == {pending[0].job_id: 660.0}
    store.close()
