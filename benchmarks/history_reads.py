"""The controller's job-history reads at a big lab's size: incremental against full.

    python benchmarks/history_reads.py [--jobs 300000] [--days 70] [--hosts 30] [--rounds 5]

A SQLite store holds `--jobs` finished jobs over `--hosts` hosts, ending evenly over the
last `--days` days (the default, 300,000 in 70 days, is about 4,300 jobs a day), plus 200
running. Every serve reads it once a minute for run-time estimates (30 days of runs) and
fair share (ten half-lives of use: 70 days at the default 7-day half-life). Timed, median
of `--rounds`, wall clock, each read one minute after the last with a minute's new jobs
(the day's rate) written in between:

- now: `Estimates.of` and `FairShare.penalties` as serve calls them between their
  hourly full reads (the jobs that ended since the last read, on the `ended_at` index);
- the baseline, in the same run and on the same store: a full read of the window, what
  each minute cost before (and what the hourly full read still costs).

Writes its figures into benchmarks/RESULTS.md between the history-reads markers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NAMES = ("train", "eval", "sweep", "lint", "preprocess")


def fill(state_dir: Path, jobs: int, days: float, hosts: int, now: float) -> None:
    from runnerctl.controller.store import Store

    store = Store.open(state_dir=state_dir)
    columns = ("host, job_id, slot, gpus, project, pipeline, name, username, url, queued_at, started_at, "
               "seen_at, ended_at, outcome, util_sum, util_samples, idle_gpu_s, low_since, unused_at")
    marks = ", ".join("?" * 19)
    step = days * 86400.0 / jobs
    batch = 50_000
    for first in range(0, jobs, batch):
        rows = []
        for i in range(first, min(jobs, first + batch)):
            end = now - days * 86400.0 + i * step
            start = end - 3600.0 * (1 + i % 7)
            rows.append((f"gpu-{i % hosts:02d}", i, "gpu0-3", "0,1,2,3", f"lab/p{i % 40}", str(i // 10),
                         NAMES[i % len(NAMES)], f"user{i % 60}", "", None, start, end, end,
                         "ended", 0.0, 0, 0.0, None, None))
        with store._tx() as cur:
            cur._cursor.executemany(f"INSERT INTO job_history ({columns}) VALUES ({marks})", rows)
    with store._tx() as cur:
        cur._cursor.executemany(f"INSERT INTO job_history ({columns}) VALUES ({marks})", [
            (f"gpu-{i % hosts:02d}", jobs + i, "gpu0", "0", "lab/p1", "1", "train", f"user{i % 60}", "", None,
             now - 600.0, now, None, "running", 0.0, 0, 0.0, None, None) for i in range(200)])
    store.close()


def median_s(samples: list[float]) -> float:
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=300_000)
    parser.add_argument("--days", type=float, default=70.0)
    parser.add_argument("--hosts", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    from results_md import parse_args

    args = parse_args(parser)  # RESULTS.md: the default run's figures only

    from runnerctl.controller import jobs_store
    from runnerctl.controller.demand import PendingJob
    from runnerctl.controller.estimates import Estimates
    from runnerctl.controller.fair_usage import FairShare
    from runnerctl.controller.jobs_store import JobRecord
    from runnerctl.controller.store import Store
    from runnerctl.settings import ControllerSettings

    now = 1.8e9
    settings = ControllerSettings(fair_weight_h=2.0)  # the default 7-day half-life
    pending = [PendingJob(10_000_000 + i, 7, 4, now, "normal", None,
                          f"https://gitlab.example/lab/p{i}/-/jobs/{i}", f"user{i}", NAMES[i % len(NAMES)])
               for i in range(20)]
    per_minute = max(1, round(args.jobs / (args.days * 1440)))
    with tempfile.TemporaryDirectory(prefix="runnerctl-bench-") as tmp:
        started = time.perf_counter()
        fill(Path(tmp), args.jobs, args.days, args.hosts, now)
        filled_s = time.perf_counter() - started
        store = Store.open(state_dir=Path(tmp))
        estimates, fair = Estimates(store), FairShare(store, settings)
        estimates.of(pending, now)  # the first read of each is a full one
        fair.penalties(pending, now)
        timed: dict[str, list[float]] = {"estimates": [], "fair": [], "estimates full": [], "fair full": []}
        next_id = 10 * args.jobs
        for minute in range(1, args.rounds + 1):
            at = now + 60.0 * minute
            jobs_store.save_jobs(store, [
                JobRecord(f"gpu-{i % args.hosts:02d}", next_id + i, "gpu0", (0,), "lab/p1", "1", "train",
                          "user1", "", None, at - 1800.0, at - 1.0, at - 1.0, "ended")
                for i in range(per_minute)])
            next_id += per_minute
            calls: dict[str, Callable[[float], object]] = {
                "estimates": lambda t: estimates.of(pending, t), "fair": lambda t: fair.penalties(pending, t),
                "estimates full": lambda t: Estimates(store).of(pending, t),
                "fair full": lambda t: FairShare(store, settings).penalties(pending, t)}
            for name, call in calls.items():
                timed[name].append(_time(call, at))
        last = now + 60.0 * args.rounds
        assert estimates.of(pending, last) == Estimates(store).of(pending, last)  # the same answer
        store.close()
    figures = {name: median_s(samples) for name, samples in timed.items()}
    print(f"store: {args.jobs} jobs over {args.days:g} days and {args.hosts} hosts, {per_minute} new a "
          f"minute (SQLite; filled in {filled_s:.1f} s)")
    for what in ("estimates", "fair"):
        now_s, full_s = figures[what], figures[f"{what} full"]
        print(f"{what:10} a minute's read {now_s * 1000:8.2f} ms   full read (baseline) "
              f"{full_s * 1000:8.2f} ms   ratio {now_s / full_s:.4f}x   with the hourly full read "
              f"{(now_s + full_s / 60) / full_s:.4f}x")
    write_results(args, per_minute, figures)
    return 0


def _time(call: Callable[[float], object], at: float) -> float:
    start = time.perf_counter()
    call(at)
    return time.perf_counter() - start


def write_results(args: argparse.Namespace, per_minute: int, figures: dict[str, float]) -> None:
    lines = ["## Job history reads: estimates and fair share each minute", "",
             f"`python benchmarks/history_reads.py`: a SQLite store of "
             f"{args.jobs:,} finished jobs ending over {args.days:g} days on {args.hosts} hosts, "
             f"200 running, {per_minute} more ending each minute; what one serve reads each minute "
             "for run-time estimates (30 days) and fair share (ten half-lives: 70 days), median of "
             f"{args.rounds} minutes. Baseline, in the same run on the same store: a full read of the "
             "window, what every minute cost before. The full read still runs once an hour: the "
             "cost a minute, averaged over the hour, is a minute's read plus a sixtieth of a full one.", "",
             "| read | a minute now (ms) | full read, before (ms) | ratio "
             "| a minute, with the hourly full read (ms) | ratio |", "|---|---|---|---|---|---|"]
    for what, label in (("estimates", "run-time estimates"), ("fair", "fair-share usage")):
        now_s, full_s = figures[what], figures[f"{what} full"]
        hourly = now_s + full_s / 60
        lines.append(f"| {label} | {now_s * 1000:.2f} | {full_s * 1000:.2f} | {now_s / full_s:.4f}x "
                     f"| {hourly * 1000:.2f} | {hourly / full_s:.4f}x |")
    from results_md import write_section

    write_section("history-reads", lines)


if __name__ == "__main__":
    sys.exit(main())
