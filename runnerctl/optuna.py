"""Optuna for runnerctl workers: `study_from_env()` and `run_worker(objective)`.

A sweep is W GitLab jobs (`parallel: W`) sharing one study in one database. Each job
calls `run_worker(objective)`, which loads the study named by `OPTUNA_STUDY_NAME` from
`OPTUNA_STORAGE` with settings that survive real life:

- `pool_pre_ping` and a small connection pool (PostgreSQL allows 100 connections by
  default; 16 workers x (pool 2 + overflow 2) stays well inside);
- heartbeats (`heartbeat_interval`, `grace_period`): a worker killed mid-trial leaves
  its trial RUNNING only until another worker sees the heartbeat is stale and marks it
  FAIL; the retry callback then queues a copy, which the next free worker runs;
- an exact trial budget (`OPTUNA_N_TRIALS`, total over all workers): before running the
  objective, a trial is admitted only while COMPLETE + other RUNNING trials are fewer
  than the budget; a trial that would overshoot is pruned unrun, and its worker waits
  for the in-flight trials (which may still fail and need a retry) instead of leaving.

Heartbeats need RDBStorage and `study.optimize()` (Optuna docs), so journal files get
the budget but not the failover.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend
from optuna.trial import Trial, TrialState

ENV_STORAGE = "OPTUNA_STORAGE"
ENV_STUDY = "OPTUNA_STUDY_NAME"
ENV_TRIALS = "OPTUNA_N_TRIALS"
HEARTBEAT_INTERVAL_S = 5
"""How often a running trial says it is alive: cheap, and a dead worker is noticed soon."""
GRACE_PERIOD_S = 15
"""A trial silent this long is stale: three missed heartbeats, not one slow commit."""
MAX_RETRY = 3
"""A trial that failed by a dead worker is retried this often before it counts as failed."""
POOL_SIZE, MAX_OVERFLOW = 2, 2
"""Per worker: one connection for trials, one for heartbeats, two spare."""

Objective = Callable[[Trial], float | tuple[float, ...]]


def make_storage(url: str, *, heartbeat_interval: int | None = None,
                 grace_period: int | None = None) -> optuna.storages.BaseStorage:
    """RDBStorage for database URLs, JournalStorage for `journal:PATH`.

    `RUNNERCTL_OPTUNA_HEARTBEAT_S` and `RUNNERCTL_OPTUNA_GRACE_S` override the defaults.
    """
    heartbeat_interval = heartbeat_interval or int(
        os.environ.get("RUNNERCTL_OPTUNA_HEARTBEAT_S", HEARTBEAT_INTERVAL_S))
    grace_period = grace_period or int(os.environ.get("RUNNERCTL_OPTUNA_GRACE_S", GRACE_PERIOD_S))
    if url.startswith("journal:"):
        return JournalStorage(JournalFileBackend(url.removeprefix("journal:")))
    engine: dict[str, Any] = {"pool_pre_ping": True}
    if not url.startswith("sqlite"):
        engine.update(pool_size=POOL_SIZE, max_overflow=MAX_OVERFLOW)
    else:
        engine["connect_args"] = {"timeout": 60}
    with warnings.catch_warnings():  # heartbeats are "experimental" in Optuna, and needed here
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retry = RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)
        return RDBStorage(url, engine_kwargs=engine, heartbeat_interval=heartbeat_interval,
                          grace_period=grace_period, heartbeat_stale_trial_callback=retry)


def study_from_env(env: dict[str, str] | None = None) -> optuna.Study:
    env = dict(os.environ if env is None else env)
    missing = [name for name in (ENV_STORAGE, ENV_STUDY) if not env.get(name)]
    if missing:
        raise RuntimeError(f"{', '.join(missing)} not set: run this inside runnerctl's "
                           "optuna-sweep template, or set them by hand")
    return optuna.load_study(study_name=env[ENV_STUDY], storage=make_storage(env[ENV_STORAGE]))


def run_worker(objective: Objective, *, study: optuna.Study | None = None,
               n_trials: int | None = None, poll_s: float = 1.0) -> int:
    """Run trials until the study holds `n_trials` COMPLETE ones; returns how many ran here."""
    study = study or study_from_env()
    budget = n_trials if n_trials is not None else int(os.environ.get(ENV_TRIALS, "0"))
    if budget < 1:
        raise RuntimeError(f"{ENV_TRIALS} must be a positive number of trials")
    gate = _Admission(objective, study, budget)
    while True:
        gate.surplus = False
        study.optimize(gate, gc_after_trial=False, show_progress_bar=False)  # until gate stops it
        if _taken(study, budget_complete_only=True) >= budget:
            return gate.ran
        time.sleep(poll_s)  # the budget is spoken for by in-flight trials: wait for them


class _Admission:
    """The objective, run only for trials admitted within the budget.

    A trial is RUNNING from its creation, before this check. It is admitted when the
    COMPLETE trials plus the other RUNNING ones are fewer than the budget. No lock is
    needed: of any two trials, the one checked later sees the other (RUNNING or
    COMPLETE), so the last admitted trial always sees every other one that completes.
    A RUNNING trial of a killed worker is counted until the heartbeat failover marks it
    FAIL; its retried copy is then admitted like any other trial.
    """

    def __init__(self, objective: Objective, study: optuna.Study, budget: int) -> None:
        self.objective, self.study, self.budget = objective, study, budget
        self.surplus = False
        self.ran = 0

    def __call__(self, trial: Trial) -> float | tuple[float, ...]:
        if _taken(self.study, exclude=trial._trial_id) >= self.budget:
            self.surplus = True
            self.study.stop()
            raise optuna.TrialPruned("trial budget reached; not run")
        value = self.objective(trial)
        self.ran += 1
        return value


def _taken(study: optuna.Study, *, exclude: int | None = None,
           budget_complete_only: bool = False) -> int:
    """COMPLETE trials (plus RUNNING ones other than `exclude`) of the study."""
    states = ["COMPLETE"] if budget_complete_only else ["COMPLETE", "RUNNING"]
    storage = getattr(study._storage, "_backend", study._storage)  # under Optuna's cache
    if isinstance(storage, RDBStorage):  # one COUNT instead of loading every trial
        import sqlalchemy

        query = sqlalchemy.text(
            "SELECT COUNT(*) FROM trials WHERE study_id = :study AND trial_id != :exclude "
            "AND state IN :states").bindparams(sqlalchemy.bindparam("states", expanding=True))
        with storage.engine.connect() as conn:
            return int(conn.execute(query, {"study": study._study_id, "exclude": exclude or -1,
                                            "states": states}).scalar_one())
    return sum(1 for t in study.get_trials(deepcopy=False, states=[TrialState[s] for s in states])
               if t._trial_id != exclude)


def report(study: optuna.Study, out_dir: Path) -> Path:
    """Write best_trial.json, trials.json and two plots (HTML, no network needed) to out_dir."""
    import json

    out_dir.mkdir(parents=True, exist_ok=True)
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not complete:
        raise RuntimeError(f"study {study.study_name!r} has no complete trial to report")
    best = study.best_trial
    (out_dir / "best_trial.json").write_text(json.dumps(
        {"study": study.study_name, "number": best.number, "value": best.value,
         "params": best.params, "complete_trials": len(complete)}, indent=2) + "\n")
    (out_dir / "trials.json").write_text(json.dumps(
        [{"number": t.number, "state": t.state.name, "value": t.value, "params": t.params}
         for t in study.get_trials(deepcopy=False)], indent=1) + "\n")
    from optuna import visualization

    visualization.plot_optimization_history(study).write_html(
        out_dir / "optimization_history.html", include_plotlyjs=True)
    if len(complete) > 1 and best.params:
        visualization.plot_param_importances(study).write_html(
            out_dir / "param_importances.html", include_plotlyjs=True)
    return out_dir / "best_trial.json"


def main(argv: list[str] | None = None) -> int:
    """`python -m runnerctl.optuna report --out DIR`: the sweep's report job."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m runnerctl.optuna")
    parser.add_argument("command", choices=["report"])
    parser.add_argument("--out", type=Path, default=Path("optuna-report"))
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    best = report(study_from_env(), args.out)
    print(best.read_text(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
