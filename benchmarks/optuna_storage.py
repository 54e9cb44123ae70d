"""Trials per second of an Optuna sweep by storage and worker count, in one run.

    python benchmarks/optuna_storage.py [--workers 1,4,8,16] [--trials-per-worker 10]

Every worker is a separate process (as in a sweep, one per GitLab job) whose objective
sleeps 0.2 s, standing in for GPU work, so the figures measure the storage and not this
machine's two cores. Workers import and load the study first and start together on a
signal; a run's rate is COMPLETE trials / (last finish - start). Each storage's ratios
are against its own 1-worker rate measured in the same run. `runnerctl` workers use
runnerctl.optuna.run_worker (exact budget, heartbeats, retries); `plain` workers call
study.optimize(n_trials=share) on a plain RDB/journal storage, for comparison.
Writes its table into benchmarks/RESULTS.md between the optuna-storage markers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SLEEP_S = 0.2
BEGIN, END = "<!-- optuna-storage:begin -->", "<!-- optuna-storage:end -->"


def worker(url: str, study_name: str, total: int, share: int, go: Path, mode: str) -> None:
    import optuna

    from runnerctl.optuna import make_storage, run_worker

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = make_storage(url) if mode == "runnerctl" else _plain(url)
    study = optuna.load_study(study_name=study_name, storage=storage)

    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_float("x", -10, 10)
        time.sleep(SLEEP_S)
        return x * x

    print("ready", flush=True)
    while not go.exists():
        time.sleep(0.01)
    if mode == "runnerctl":
        run_worker(objective, study=study, n_trials=total, poll_s=0.2)
    else:
        study.optimize(objective, n_trials=share)
    print(f"done {time.time():.6f}", flush=True)


def _plain(url: str) -> object:
    import optuna

    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(url.removeprefix("journal:")))
    return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})


def run_one(url: str, workers: int, per_worker: int, mode: str, tag: str) -> float:
    import optuna

    name = f"bench_{tag}_{mode}_{workers}"
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    optuna.create_study(study_name=name, storage=url if not url.startswith("journal:") else _plain(url),
                        load_if_exists=True)  # type: ignore[arg-type]
    total = workers * per_worker
    go = Path(tempfile.mkdtemp()) / "go"
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", url, name, str(total),
                               str(per_worker), str(go), mode], stdout=subprocess.PIPE, text=True)
             for _ in range(workers)]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    start = time.time()
    go.touch()
    ends = []
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out
        ends.append(float(out.split("done ")[-1]))
    storage = url if not url.startswith("journal:") else _plain(url)
    study = optuna.load_study(study_name=name, storage=storage)  # type: ignore[arg-type]
    complete = len(study.get_trials(deepcopy=False,
                                    states=(optuna.trial.TrialState.COMPLETE,)))
    return complete / (max(ends) - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="1,4,8,16")
    parser.add_argument("--trials-per-worker", type=int, default=10)
    parser.add_argument("--modes", default="runnerctl,plain")
    parser.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        url, name, total, share, go, mode = args.worker
        worker(url, name, int(total), int(share), Path(go), mode)
        return 0
    from tests.pg import running_server

    counts = [int(w) for w in args.workers.split(",")]
    modes = args.modes.split(",")
    scratch = Path(tempfile.mkdtemp(prefix="optuna-bench-"))
    rows: list[tuple[str, str, int, float, float]] = []
    try:
        with running_server() as pg:
            urls = {"PostgreSQL": pg.create_database("bench"),
                    "SQLite": f"sqlite:///{scratch}/bench.db",
                    "JournalFile": f"journal:{scratch}/bench.log"}
            for storage, url in urls.items():
                for mode in modes:
                    base = None
                    for workers in counts:
                        rate = run_one(url, workers, args.trials_per_worker, mode, storage.lower())
                        base = base or rate
                        rows.append((storage, mode, workers, rate, rate / base))
                        print(f"{storage:12} {mode:9} {workers:3} workers  {rate:6.2f} trials/s  "
                              f"{rate / base:5.2f}x", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    _write(rows, counts, args.trials_per_worker)
    return 0


def _write(rows: list[tuple[str, str, int, float, float]], counts: list[int], per: int) -> None:
    lines = [BEGIN, "## Optuna storage: trials per second by workers", "",
             f"`python benchmarks/optuna_storage.py` on this machine ({os.cpu_count()} cores); "
             f"objective sleeps {SLEEP_S} s; {per} trials per worker; ratio against the same "
             "storage and mode at 1 worker, measured in the same run.", "",
             "| storage | workers | "
             + " | ".join(f"{m} trials/s (x)" for m in sorted({r[1] for r in rows})) + " |",
             "|---|---|" + "---|" * len({r[1] for r in rows})]
    for storage in dict.fromkeys(r[0] for r in rows):
        for workers in counts:
            cells = [f"{r[3]:.1f} ({r[4]:.1f}x)" for m in sorted({r[1] for r in rows})
                     for r in rows if r[0] == storage and r[2] == workers and r[1] == m]
            lines.append(f"| {storage} | {workers} | " + " | ".join(cells) + " |")
    lines.append(END)
    path = ROOT / "benchmarks" / "RESULTS.md"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    if BEGIN in text:
        head, rest = text.split(BEGIN, 1)
        text = head + "\n".join(lines) + rest.split(END, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + "\n".join(lines) + "\n"
    path.write_text(text)


if __name__ == "__main__":
    raise SystemExit(main())
