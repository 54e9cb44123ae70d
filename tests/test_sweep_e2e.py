"""End to end: render the optuna-sweep pipeline and run its jobs as GitLab would, with
4 workers in parallel against a real PostgreSQL run by `runnerctl postgres`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from runnerctl.pipelines import render
from runnerctl.postgres import PostgresServer
from tests import ci_jobs

ROOT = Path(__file__).resolve().parents[1]


def _project(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "examples" / "optuna-sweep" / "search.py", tmp_path / "search.py")
    return tmp_path


def _env(**extra: str) -> dict[str, str]:
    bindir = str(Path(sys.executable).parent)
    return {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT), **extra}


def _pipeline(study: str, url: str, *, trials: int, workers: int) -> str:
    return render("optuna-sweep", {"study_name": study, "storage": url, "n_trials": str(trials),
                                   "workers": str(workers), "command": "python search.py"})


def test_four_workers_complete_exactly_100_trials(pg_server: PostgresServer, tmp_path: Path) -> None:
    url = pg_server.create_database("sweep_e2e")
    project = _project(tmp_path)
    outputs = ci_jobs.run_pipeline(_pipeline("sweep_e2e", url, trials=100, workers=4),
                                   cwd=project, env=_env(SEARCH_SLEEP_S="0.05"))
    study = optuna.load_study(study_name="sweep_e2e", storage=url)
    states = Counter(t.state for t in study.trials)
    assert states[TrialState.COMPLETE] == 100
    assert states[TrialState.RUNNING] == 0 and states[TrialState.WAITING] == 0
    numbers = [t.number for t in study.trials]
    assert len(numbers) == len(set(numbers))
    ran = [int(out.split(" ran ")[1].split()[0]) for key, out in outputs.items()
           if key.startswith("optuna-worker")]
    assert len(ran) == 4 and sum(ran) == 100 and all(n > 0 for n in ran)
    best = json.loads((project / "optuna-report" / "best_trial.json").read_text())
    assert best["number"] == study.best_trial.number and best["complete_trials"] == 100
    assert (project / "optuna-report" / "optimization_history.html").stat().st_size > 1000
    assert (project / "optuna-report" / "param_importances.html").exists()


def test_killed_worker_trial_fails_and_is_retried(pg_server: PostgresServer, tmp_path: Path) -> None:
    url = pg_server.create_database("sweep_kill")
    project = _project(tmp_path)
    env = _env(SEARCH_SLEEP_S="1.0", RUNNERCTL_OPTUNA_HEARTBEAT_S="1", RUNNERCTL_OPTUNA_GRACE_S="3")
    pipeline = ci_jobs.load(_pipeline("sweep_kill", url, trials=16, workers=4))
    (create,) = ci_jobs.start_job(pipeline, "optuna-create-study", cwd=project, env=env)
    assert create.wait(timeout=60) == 0
    workers = ci_jobs.start_job(pipeline, "optuna-worker", cwd=project, env=env)
    study = optuna.load_study(study_name="sweep_kill", storage=url)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if len(running) >= 4 and all(t.params for t in running):  # mid-objective
            break
        time.sleep(0.1)
    else:
        pytest.fail("four workers never ran trials at once")
    os.killpg(workers[0].pid, signal.SIGKILL)  # as gitlab-runner kills a job's process group
    for proc in workers[1:]:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
    workers[0].wait(timeout=10)
    trials = optuna.load_study(study_name="sweep_kill", storage=url).trials
    states = Counter(t.state for t in trials)
    assert states[TrialState.COMPLETE] == 16 and states[TrialState.RUNNING] == 0
    (failed,) = [t for t in trials if t.state == TrialState.FAIL]
    retries = [t for t in trials
               if RetryHeartbeatStaleTrialCallback.retried_trial_number(t) == failed.number]
    assert len(retries) == 1 and retries[0].state == TrialState.COMPLETE
    # the retry keeps what the killed trial had sampled (it may have died mid-suggest)
    assert failed.params and failed.params.items() <= retries[0].params.items()
