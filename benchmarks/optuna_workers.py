"""The worker processes of benchmarks/optuna_storage.py: each serves runs given on its stdin.

Started once per benchmark (`Workers`), they import Optuna once and then, for every run,
load the run's study, report `ready`, wait at the start barrier (a file), run the sweep as
a real worker would and report the CPU it used. See optuna_storage.py for what is measured.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
SLEEP_S = 0.2
RUNNERCTL = {"journal-pg", "rdb-pg"}  # run through runnerctl.optuna.run_worker


def objective(trial: Any) -> float:
    x: float = trial.suggest_float("x", -10, 10)
    time.sleep(SLEEP_S)
    return x * x


# -- the worker processes --------------------------------------------------------------
def worker_loop() -> None:
    """Serve runs: `config url study total share go` on stdin, `ready`/`done CPU` on stdout."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    _warm_up(optuna)
    print("up", flush=True)  # imported: the pool waits for every worker before the first run
    for line in sys.stdin:
        config, url, study_name, total, share, go = line.split()
        study = _load(config, url, study_name, int(total))
        print("ready", flush=True)
        while not os.path.exists(go):
            time.sleep(0.002)
        cpu = time.process_time()
        if config in RUNNERCTL:
            from runnerctl.optuna import run_worker

            run_worker(objective, study=study)  # as the template: waits poll 1 s
        else:
            study.optimize(objective, n_trials=int(share))
        cpu = time.process_time() - cpu
        close_storage(study._storage)  # this run's connections, before the next run
        print(f"done {cpu:.6f}", flush=True)


def _warm_up(optuna: Any) -> None:
    """Past the TPE sampler's random start-up trials on an in-memory study, so the modules
    Optuna imports only at first use (numpy.random: about 70 ms of CPU per process) are
    loaded here, before any measured run, and not in whichever run comes first."""
    study = optuna.create_study()
    study.optimize(lambda trial: trial.suggest_float("x", -10, 10) ** 2, n_trials=12)


def _load(config: str, url: str, study_name: str, total: int) -> Any:
    import optuna

    from runnerctl.optuna import make_storage, study_from_env

    if config in RUNNERCTL:  # the optuna-sweep template's environment
        os.environ.update({"OPTUNA_STORAGE": url, "OPTUNA_STUDY_NAME": study_name,
                           "OPTUNA_N_TRIALS": str(total)})
        return study_from_env()
    if config == "grpc-pg":
        host, port = url.removeprefix("grpc:").rsplit(":", 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            proxy = optuna.storages.GrpcStorageProxy(host=host, port=int(port))
        return optuna.load_study(study_name=study_name, storage=proxy)
    storage = make_storage(url) if url.startswith("journal:") else url
    return optuna.load_study(study_name=study_name, storage=storage)


def close_storage(storage: Any) -> None:
    backend = getattr(storage, "_backend", storage)
    if hasattr(backend, "engine"):
        backend.engine.dispose()
    elif hasattr(backend, "close"):  # runnerctl's PostgreSQL journal
        backend.close()
    elif hasattr(storage, "close"):  # gRPC proxy client
        storage.close()


class Workers:
    def __init__(self, count: int) -> None:
        self.procs = [subprocess.Popen([sys.executable, __file__], text=True,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                      for _ in range(count)]
        for proc in self.procs:  # all imported, so no run is measured beside 60 imports
            assert self._line(proc) == "up"

    def run(self, count: int, command: str, go: Path,
            server_cpu: Callable[[], float]) -> tuple[float, float]:
        """Start `count` workers on one study together; returns CPU seconds (workers, server)."""
        used = self.procs[:count]
        for proc in used:
            assert proc.stdin is not None
            proc.stdin.write(command + "\n")
            proc.stdin.flush()
        for proc in used:
            assert self._line(proc) == "ready"
        server = server_cpu()
        go.touch()
        cpu = sum(float(self._line(proc).split()[1]) for proc in used)
        return cpu, server_cpu() - server

    @staticmethod
    def _line(proc: subprocess.Popen[str]) -> str:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line:
            raise RuntimeError(f"worker {proc.pid} ended (exit code {proc.wait()})")
        return line

    def close(self) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.close()
        for proc in self.procs:
            proc.wait(timeout=60)


if __name__ == "__main__":
    worker_loop()
