"""The fleet page's store reads at a big lab's size, against the queries they replaced.

    python benchmarks/fleet_store.py [--events 1000000] [--hosts 30] [--rounds 5]

A SQLite store holds `--events` events over `--hosts` hosts (events at the same rate on
every host but one, which has written 20 events long ago: a quiet host), as a year of a
lab's activity log would. Timed, median of `--rounds`, wall clock:

- `Store.hosts()` (the fleet's hosts, retired ones left out) and the latest event of each
  host (`Store.events(host, 1)`, what `/api/fleet` reads per host), then the quiet host's
  50 latest events (`/api/host` on it);
- the baseline, in the same run on a copy of the same store without the index
  `events_host_id` (migration 6): the queries runnerctl ran before it (`SELECT DISTINCT
  host FROM events`, the retired check over `max(id) GROUP BY host`, and the same
  per-host reads, which then scan the table).

Writes its figures into benchmarks/RESULTS.md between the fleet-store markers.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OLD_HOSTS = ("SELECT DISTINCT host FROM events UNION SELECT DISTINCT host FROM toggles",
             "SELECT host FROM events WHERE kind = ? AND id IN (SELECT max(id) FROM events GROUP BY host)")


def fill(state_dir: Path, events: int, hosts: int) -> None:
    from runnerctl.controller.store import Store

    store = Store.open(state_dir=state_dir)
    names = [f"gpu-{i:02d}" for i in range(hosts - 1)]
    with store._tx() as cur:
        cur.execute("INSERT INTO events (at, host, kind, subject, detail) VALUES (?, ?, ?, ?, ?)",
                    (1.6e9, "gpu-quiet", "pause", "gpu:1", "long ago"))
        for i in range(19):
            cur.execute("INSERT INTO events (at, host, kind, subject, detail) VALUES (?, ?, ?, ?, ?)",
                        (1.6e9 + i, "gpu-quiet", "resume", "gpu:1", "long ago"))
    batch = 50_000
    for start in range(0, events, batch):
        rows = [(1.7e9 + i * 0.6, names[i % len(names)], "drain", "slot:gpu0-3", "for job 1234")
                for i in range(start, min(events, start + batch))]
        with store._tx() as cur:
            cur._cursor.executemany(  # the store's cursor takes one row; a bulk load takes many
                "INSERT INTO events (at, host, kind, subject, detail) VALUES (?, ?, ?, ?, ?)", rows)
    store.close()


def median_s(call: Callable[[], object], rounds: int) -> float:
    call()  # warm the page cache
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--hosts", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    from results_md import parse_args

    args = parse_args(parser)  # RESULTS.md: the default run's figures only

    import sqlite3

    from runnerctl.controller.store import RETIRED, Store

    with tempfile.TemporaryDirectory(prefix="runnerctl-bench-") as tmp:
        now_dir, old_dir = Path(tmp) / "now", Path(tmp) / "before"
        now_dir.mkdir()
        started = time.perf_counter()
        fill(now_dir, args.events, args.hosts)
        filled_s = time.perf_counter() - started
        shutil.copytree(now_dir, old_dir)
        with sqlite3.connect(old_dir / "controller.sqlite") as conn:
            conn.execute("DROP INDEX events_host_id")
        store = Store.open(state_dir=now_dir)
        old = sqlite3.connect(old_dir / "controller.sqlite")

        def ours() -> None:
            for host in store.hosts():
                store.events(host, 1)
            store.events("gpu-quiet", 50)

        def before() -> None:
            retired = {r[0] for r in old.execute(OLD_HOSTS[1], (RETIRED,))}
            hosts = {r[0] for r in old.execute(OLD_HOSTS[0])} - retired
            for host in sorted(hosts):
                old.execute("SELECT at, host, kind, subject, detail FROM events WHERE host = ? "
                            "ORDER BY id DESC LIMIT 1", (host,)).fetchall()
            old.execute("SELECT at, host, kind, subject, detail FROM events WHERE host = ? "
                        "ORDER BY id DESC LIMIT 50", ("gpu-quiet",)).fetchall()

        assert sorted(store.hosts()) == sorted({r[0] for r in old.execute(OLD_HOSTS[0])})
        now_s, before_s = median_s(ours, args.rounds), median_s(before, args.rounds)
        store.close()
        old.close()
    print(f"store: {args.events} events over {args.hosts} hosts (SQLite; filled in {filled_s:.1f} s)")
    print(f"fleet reads now      {now_s * 1000:.2f} ms")
    print(f"before (baseline)    {before_s * 1000:.2f} ms")
    print(f"ratio                {now_s / before_s:.4f}x the baseline ({before_s / now_s:.0f} times faster)")
    write_results(args, now_s, before_s)
    return 0


def write_results(args: argparse.Namespace, now_s: float, before_s: float) -> None:
    lines = ["## Fleet page: store reads at a big lab's size", "",
             f"`python benchmarks/fleet_store.py`: a SQLite store of "
             f"{args.events:,} events over {args.hosts} hosts, one of them quiet (20 events long ago); "
             f"the fleet's hosts, each host's latest event and the quiet host's 50 latest (what "
             f"`/api/fleet` and `/api/host` read, polled every 2 s per open page), median of "
             f"{args.rounds} rounds. Baseline, in the same run on a copy of the store without the "
             "index `events_host_id`: the queries before it (DISTINCT and max(id) GROUP BY over every "
             "event; per-host reads scanning the table).", "",
             "| events | hosts | now (ms) | before (ms) | ratio |", "|---|---|---|---|---|",
             f"| {args.events:,} | {args.hosts} | {now_s * 1000:.2f} | {before_s * 1000:.2f} | "
             f"{now_s / before_s:.4f}x |"]
    from results_md import write_section

    write_section("fleet-store", lines)


if __name__ == "__main__":
    sys.exit(main())
