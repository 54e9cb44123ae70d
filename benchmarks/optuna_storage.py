"""Trials per second and CPU per trial of an Optuna sweep by storage and worker count, in one run.

    python benchmarks/optuna_storage.py [--workers 4,16,64] [--trials 320] [--repeat 2]
                                        [--configs journal-pg,rdb-pg,plain-pg,grpc-pg,journal-file]
                                        [--scratch DIR]

Every worker is a separate process, as in a sweep (one per GitLab job), and its
objective sleeps 0.2 s, standing in for GPU work, so W workers could at best complete
W / 0.2 trials a second; the figures measure what the storage path costs on top. What
is measured, and what is left out on purpose:

- left out: process start-up. The worker processes start once, import Optuna, run a
  dozen trials of an in-memory study (loading what Optuna imports only at first use,
  such as numpy.random), and then wait at a start barrier (a file each run touches)
  before every run. Starting and importing 64 Python processes on a 2-core host takes
  a minute and says nothing about the storage; in a real sweep each worker starts once
  per job, not once per trial. Each run still loads its own study and opens (and at the
  end closes) its connections.
- every run completes the same number of trials (`--trials`, default 320, 20 per worker
  at 16 workers), whatever its worker count: the sampler's CPU per trial grows with the
  trials it reads, and a run of 64 workers x 20 trials would measure a sampler reading
  four times as many, not the storage.
- left out: the first and last tenth of completions. A run's rate is the trials
  completed between the 10th and 90th percentile of completion times over that span;
  the ramp-up and the last stragglers depend on the run's length, not the storage.
- kept: everything a worker does per trial in a real sweep, the sampler's CPU included
  (Optuna's default TPE sampler, whose cost grows with the trials it reads), the
  heartbeat threads, and the CPU of the database server and of the gRPC proxy (the
  table shows both per trial). On a host with few cores that CPU, not the 0.2 s
  objective, is what caps the rate at 16 and more workers.
- the host is shared: every configuration runs `--repeat` times, interleaved, and keeps
  its best rate, since other work only ever slows a run down. Before each run the
  benchmark waits until no autovacuum worker runs, has the server write every dirty page
  (CHECKPOINT), and waits (up to 30 s) until the host's CPUs are at least 80 % idle over
  half a second, so a run does not start beside the previous run's leftovers (autovacuum
  and the flushing of thousands of RDB rows, whose writes would slow every commit of the
  next run; 64 workers closing their connections). The load average at the start and
  the end is printed with the table.

The configurations (`--configs`), all measured in the same run:

- `journal-pg`: what the optuna-sweep template runs on `runnerctl postgres url` (its
  default `--kind journal`), `runnerctl.optuna.run_worker` with the template's
  environment: Optuna's JournalStorage on a log table in PostgreSQL, heartbeats with
  retries, an exact total;
- `rdb-pg`: the same worker on `runnerctl postgres url --kind rdb`: RDBStorage through
  runnerctl's `SweepStorage` cache (other workers' trials read at most once a second);
- `plain-pg`: Optuna as documented, `study.optimize(objective, n_trials=total / W)` on the
  RDB URL (no heartbeats);
- `grpc-pg`: the same plain loop through Optuna's `GrpcStorageProxy`, one proxy process
  (`run_grpc_proxy_server`, Optuna's cached RDB storage) in front of the same database;
  Optuna implements no heartbeats for it;
- `journal-file`: plain Optuna on its JournalStorage file on the scratch disk (one
  host only), the cheapest storage there is, as the reference;
- `sqlite`: plain Optuna on a SQLite file next to it (not in the default set).

Needs the `test` (or `optuna`) and `bench` extras (`pip install -e '.[test,bench]'`; `bench` is
grpcio for `grpc-pg`). PostgreSQL is a server started by runnerctl (`runnerctl.postgres`) in a scratch
directory (`--scratch DIR` puts it on the disk your workers would use; default: a
temporary directory); the run measures that disk's fsync time first. The table goes
into benchmarks/RESULTS.md between the optuna-storage markers (`--no-write` leaves it).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from optuna_workers import SLEEP_S, Workers, close_storage  # noqa: E402 - after the path

LABELS = {
    "journal-pg": "runnerctl: journal on PostgreSQL",
    "rdb-pg": "runnerctl: RDB on PostgreSQL",
    "plain-pg": "plain Optuna: RDBStorage on PostgreSQL",
    "grpc-pg": "plain Optuna: GrpcStorageProxy, PostgreSQL",
    "journal-file": "plain Optuna: JournalStorage file",
    "sqlite": "plain Optuna: RDBStorage on SQLite",
}
DEFAULT_CONFIGS = "journal-pg,rdb-pg,plain-pg,grpc-pg,journal-file"


@dataclasses.dataclass(frozen=True)
class Run:
    config: str
    workers: int
    rate: float  # trials/s, steady
    cpu_ms: float  # CPU per trial, workers + server
    server_ms: float = 0.0  # of which the server's (database, proxy)


# -- one measurement ---------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Target:
    """Where one configuration's workers go: their URL, the driver's, the server pids."""

    url: str
    admin_url: str  # the driver creates and reads studies here
    pids: tuple[int, ...] = ()


def run_one(workers: Workers, config: str, target: Target, count: int, total: int,
            scratch: Path) -> Run:
    import optuna

    name = f"bench_{config.replace('-', '_')}_{count}_{time.monotonic_ns()}"
    storage = _own_storage(target.admin_url)
    optuna.create_study(study_name=name, storage=storage)
    go = scratch / f"go-{name}"
    cpu, server = workers.run(count, f"{config} {target.url} {name} {total} {-(-total // count)} {go}",
                              go, lambda: sum(_server_cpu(pid) for pid in target.pids))
    trials = optuna.load_study(study_name=name, storage=storage).get_trials(
        deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    ends = [t.datetime_complete.timestamp() for t in trials if t.datetime_complete]
    return Run(config, count, _steady_rate(ends), 1000 * (cpu + server) / len(trials),
               1000 * server / len(trials))


_STORAGES: dict[str, Any] = {}


def _own_storage(url: str) -> Any:
    """This process's one storage per URL (one connection pool, not one per run)."""
    if url not in _STORAGES:
        import optuna

        from runnerctl.optuna import make_storage

        _STORAGES[url] = (optuna.storages.RDBStorage(url) if url.startswith(("postgresql", "sqlite"))
                          else make_storage(url))
    return _STORAGES[url]


def settle(idle: float = 0.8, limit_s: float = 30.0) -> float:
    """Wait until the host's CPUs are `idle` idle over half a second, at most `limit_s`;
    returns the seconds waited."""
    def ticks() -> tuple[int, int]:
        fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return fields[3] + fields[4], sum(fields)  # idle + iowait, all

    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        idle0, all0 = ticks()
        time.sleep(0.5)
        idle1, all1 = ticks()
        if all1 > all0 and (idle1 - idle0) / (all1 - all0) >= idle:
            break
    return time.monotonic() - started


def quiesce(admin_url: str, limit_s: float = 60.0) -> float:
    """Wait until no autovacuum worker runs (at most `limit_s`), then write every dirty
    page (CHECKPOINT): the previous runs' writes, thousands of RDB rows, are not flushed
    in the background of the next run, whose every commit waits on the same disk.
    Returns the seconds it took."""
    import psycopg

    from runnerctl.postgres import libpq_url

    started = time.monotonic()
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
        while time.monotonic() - started < limit_s:
            row = conn.execute("SELECT count(*) FROM pg_stat_activity "
                               "WHERE backend_type = 'autovacuum worker'").fetchone()
            if row is None or row[0] == 0:
                break
            time.sleep(0.5)
        conn.execute("CHECKPOINT")
    return time.monotonic() - started


def _steady_rate(ends: list[float]) -> float:
    """Completions between the 10th and 90th percentile of their times, per second."""
    ends = sorted(ends)
    lo, hi = int(0.1 * (len(ends) - 1)), int(0.9 * (len(ends) - 1))
    return (hi - lo) / (ends[hi] - ends[lo])


def _server_cpu(pid: int) -> float:
    """A process and every child it has had (exited ones counted by the kernel)."""
    import psutil

    root = psutil.Process(pid)
    total = sum(root.cpu_times())  # user, system, children_user, children_system
    for child in root.children():
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:
            continue
    return float(total)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def postgres(scratch: Path) -> Iterator[tuple[str, int, str]]:
    """runnerctl's own PostgreSQL server in scratch/pg; yields a study database URL, the
    pid and the superuser's URL."""
    from runnerctl.postgres import PostgresConfig, PostgresServer

    base = scratch / "pg"
    base.mkdir(mode=0o755)
    server = PostgresServer(PostgresConfig(base_dir=base, port=_free_port()))
    server.init()
    server.start()
    try:
        url = server.create_database("bench")
        yield url, int((base / "data" / "postmaster.pid").read_text().split()[0]), server.admin_url()
    finally:
        for storage in _STORAGES.values():
            close_storage(storage)
        _STORAGES.clear()
        server.stop()


@contextmanager
def grpc_proxy(url: str) -> Iterator[tuple[str, int]]:
    """Optuna's gRPC proxy in front of `url`, in its own process; yields grpc:HOST:PORT and its pid."""
    port = _free_port()
    code = ("import optuna, sys; optuna.logging.set_verbosity(optuna.logging.ERROR); "
            "optuna.storages.run_grpc_proxy_server(optuna.storages.get_storage(sys.argv[1]), "
            "host='127.0.0.1', port=int(sys.argv[2]))")
    proc = subprocess.Popen([sys.executable, "-c", code, url, str(port)])
    try:
        import optuna

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            client = optuna.storages.GrpcStorageProxy(host="127.0.0.1", port=port)
        client.wait_server_ready(timeout=120)
        client.close()
        yield f"grpc:127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def fsync_ms(directory: Path, count: int = 50) -> float:
    """Median time of a 512-byte write plus fsync in `directory`, in milliseconds."""
    probe = directory / "fsync-probe"
    times = []
    with open(probe, "wb") as file:
        for _ in range(count):
            start = time.perf_counter()
            file.write(b"x" * 512)
            file.flush()
            os.fsync(file.fileno())
            times.append(time.perf_counter() - start)
    probe.unlink()
    return 1000 * statistics.median(times)


# -- the table -----------------------------------------------------------------------------
def best(runs: list[Run]) -> list[Run]:
    """Per configuration, the run with the highest rate."""
    chosen: dict[tuple[str, int], Run] = {}
    for run in runs:
        key = (run.config, run.workers)
        if key not in chosen or run.rate > chosen[key].rate:
            chosen[key] = run
    return list(chosen.values())


def table(runs: list[Run], configs: list[str], counts: list[int], args: argparse.Namespace,
          load: str, fsync: float) -> list[str]:
    lines = ["## Optuna storage: trials per second and CPU per trial", "",
             f"`python benchmarks/optuna_storage.py` on this machine: {os.cpu_count()} cores, "
             f"shared (load average {load}); scratch disk fsync {fsync:.2f} ms (median of 50); "
             f"objective sleeps {SLEEP_S} s, so W workers reach at most W / {SLEEP_S} trials/s "
             f"(the % of ideal); {args.trials} trials per run; best of {args.repeat} "
             "interleaved runs, each started after a CHECKPOINT once the CPUs were 80 % idle; "
             "steady rate "
             "(10th to 90th percentile of completions); CPU is "
             "workers + server per trial, (server) the database server's and proxy's part.", "",
             "| storage | " + " | ".join(f"{w} workers trials/s (% ideal) | CPU ms (server)"
                                       for w in counts) + " |",
             "|---|" + "---|---|" * len(counts)]
    for config in configs:
        cells = []
        for workers in counts:
            run = next((r for r in runs if (r.config, r.workers) == (config, workers)), None)
            cells.append("not measured | -" if run is None else
                         f"{run.rate:.1f} ({run.rate * SLEEP_S / workers:.0%}) | "
                         f"{run.cpu_ms:.1f} ({run.server_ms:.1f})")
        lines.append(f"| {LABELS[config]} | " + " | ".join(cells) + " |")
    return [*lines, "", *checks(runs)]


def checks(runs: list[Run]) -> list[str]:
    """Issue 19's acceptance points for runnerctl's default storage (journal-pg)."""
    def find(workers: int) -> Run | None:
        return next((r for r in runs if (r.config, r.workers) == ("journal-pg", workers)), None)

    out = ["Acceptance (issue 19), runnerctl's journal on PostgreSQL, from this run:", ""]
    at16, at64 = find(16), find(64)
    if at16 is None:
        return [*out, "- 16 workers not measured"]
    ideal = 16 / SLEEP_S
    out.append(f"- 16 workers: {at16.rate:.1f} trials/s = {at16.rate / ideal:.1%} of the ideal "
               f"{ideal:.0f} ({'meets' if at16.rate >= 0.9 * ideal else 'BELOW'} 90 %); "
               f"{at16.cpu_ms:.1f} ms CPU per trial ({'meets' if at16.cpu_ms <= 15 else 'ABOVE'} 15 ms)")
    if at64 is not None:
        out.append(f"- 64 workers: {at64.rate:.1f} trials/s, {at64.rate / at16.rate:.2f}x its 16-worker "
                   f"rate ({'meets' if at64.rate >= at16.rate else 'BELOW'} 1.0x)")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--workers", default="4,16,64")
    parser.add_argument("--trials", type=int, default=320, help="trials per run, at every worker count")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help=f"from {', '.join(LABELS)}")
    parser.add_argument("--scratch", type=Path, default=None,
                        help="directory on the disk to measure (default: a temporary directory)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md")
    from results_md import parse_args

    args = parse_args(parser)  # RESULTS.md: the default run's figures only
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    counts = [int(w) for w in args.workers.split(",")]
    configs = args.configs.split(",")
    unknown = [c for c in configs if c not in LABELS]
    if unknown:
        parser.error(f"unknown configuration {unknown[0]!r}; choose from {', '.join(LABELS)}")
    if "grpc-pg" in configs and importlib.util.find_spec("grpc") is None:
        parser.error("grpc-pg needs grpcio: pip install -e '.[test,bench]' (or leave grpc-pg "
                     "out of --configs)")
    scratch = Path(tempfile.mkdtemp(prefix="optuna-bench-", dir=args.scratch))
    os.chmod(scratch, 0o755)  # the server runs as the postgres user when we are root
    runs: list[Run] = []
    load = f"{os.getloadavg()[0]:.1f}"
    fsync = fsync_ms(scratch)
    print(f"scratch {scratch}: fsync {fsync:.2f} ms (median of 50)", flush=True)
    workers = Workers(max(counts))
    try:
        proxy = grpc_proxy if "grpc-pg" in configs else lambda _url: nullcontext(("", 0))
        with postgres(scratch) as (pg_url, pg_pid, pg_admin), proxy(pg_url) as (grpc_url, grpc_pid):
            journal_pg = pg_url.replace("postgresql+psycopg://", "journal+postgresql://", 1)
            targets = {"journal-pg": Target(journal_pg, journal_pg, (pg_pid,)),
                       "rdb-pg": Target(pg_url, pg_url, (pg_pid,)),
                       "plain-pg": Target(pg_url, pg_url, (pg_pid,)),
                       "grpc-pg": Target(grpc_url, pg_url, (pg_pid, grpc_pid)),
                       "journal-file": Target(f"journal:{scratch}/bench.log", f"journal:{scratch}/bench.log"),
                       "sqlite": Target(f"sqlite:///{scratch}/bench.db", f"sqlite:///{scratch}/bench.db")}
            for round_ in range(1, args.repeat + 1):
                for config in configs:
                    for count in counts:
                        waited = quiesce(pg_admin) + settle()
                        run = run_one(workers, config, targets[config], count, args.trials, scratch)
                        runs.append(run)
                        print(f"round {round_}: {config:12} {count:3} workers {run.rate:6.2f} trials/s "
                              f"{run.cpu_ms:6.1f} CPU ms/trial (server {run.server_ms:4.1f}) "
                              f"load {os.getloadavg()[0]:.1f}, settled {waited:.1f} s", flush=True)
    finally:
        workers.close()
        shutil.rmtree(scratch, ignore_errors=True)
    load += f" at the start, {os.getloadavg()[0]:.1f} at the end"
    lines = table(best(runs), configs, counts, args, load, fsync)
    print("\n".join(lines))
    if not args.no_write:
        from results_md import write_section

        write_section("optuna-storage", lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
