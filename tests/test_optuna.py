"""runnerctl.optuna: storage settings, the study from the environment, the exact budget,
and the failover of a dead worker's trial, on the real PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy
import optuna
import pytest
from optuna.storages import JournalStorage, RDBStorage
from optuna.trial import TrialState

from runnerctl.errors import ConfigError
from runnerctl.optuna import (
    ENV_STORAGE,
    ENV_STUDY,
    GRACE_PERIOD_S,
    HEARTBEAT_INTERVAL_S,
    POOL_SIZE,
    REFRESH_S,
    SweepStorage,
    TrialCounter,
    make_storage,
    run_worker,
    study_from_env,
)
from runnerctl.optuna_tools import create_study, report
from runnerctl.postgres import PostgresServer

pytestmark = [pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning"),
              pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")]  # study.ask()
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _quick(trial: optuna.Trial) -> float:
    return trial.suggest_float("x", -1, 1) ** 2


def test_postgres_storage_settings(pg_server: PostgresServer) -> None:
    storage = make_storage(pg_server.create_database("settings"), env={})
    assert isinstance(storage, RDBStorage)
    assert storage.engine_kwargs == {"pool_pre_ping": True, "pool_size": POOL_SIZE, "max_overflow": 0,
                                     "connect_args": {"client_encoding": "UTF8"}}  # SQL_ASCII: text, no bytes
    assert storage.engine.pool.size() == POOL_SIZE  # type: ignore[attr-defined]
    assert 16 * POOL_SIZE <= 100 // 2  # 16 workers take at most half of max_connections = 100
    assert (storage.heartbeat_interval, storage.grace_period) == (HEARTBEAT_INTERVAL_S, GRACE_PERIOD_S)
    assert storage.failed_trial_callback is not None  # retries dead workers' trials (any Optuna 4.5+)
    quick = make_storage(pg_server.create_database("settings"),
                         env={"RUNNERCTL_OPTUNA_HEARTBEAT_S": "1", "RUNNERCTL_OPTUNA_GRACE_S": "3"})
    assert isinstance(quick, RDBStorage) and (quick.heartbeat_interval, quick.grace_period) == (1, 3)
    with pytest.raises(ConfigError, match="RUNNERCTL_OPTUNA_GRACE_S"):
        make_storage("sqlite://", env={"RUNNERCTL_OPTUNA_GRACE_S": "0"})


def test_sqlite_and_journal_storages(tmp_path: Path) -> None:
    sqlite = make_storage(f"sqlite:///{tmp_path}/s.db", env={})
    assert isinstance(sqlite, RDBStorage)
    assert sqlite.engine_kwargs == {"pool_pre_ping": True, "connect_args": {"timeout": 60}}
    assert isinstance(make_storage(f"journal:{tmp_path}/j.log"), JournalStorage)


def test_study_from_env_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="OPTUNA_STORAGE and OPTUNA_STUDY_NAME not set"):
        study_from_env({})
    url = f"sqlite:///{tmp_path}/s.db"
    optuna.create_study(study_name="env_study", storage=url, direction="maximize")
    study = study_from_env({"OPTUNA_STORAGE": url, "OPTUNA_STUDY_NAME": "env_study"})
    assert study.study_name == "env_study" and study.direction == optuna.study.StudyDirection.MAXIMIZE


def test_sweep_storage_reads_other_workers_trials_once_per_refresh(pg_server: PostgresServer) -> None:
    """Other workers' trials reach a worker's view at its next refresh, not at every read;
    its own trials and every write go to the database at once."""
    url = pg_server.create_database("refresh")
    optuna.create_study(study_name="refresh", storage=url)
    env = {"OPTUNA_STORAGE": url, "OPTUNA_STUDY_NAME": "refresh"}
    study = study_from_env({**env, "RUNNERCTL_OPTUNA_REFRESH_S": "60"})
    storage = study._storage
    assert isinstance(storage, SweepStorage) and storage.refresh_s == 60
    assert study.trials == []  # the first read: the study as it is
    other = optuna.load_study(study_name="refresh", storage=url)  # plain Optuna, another worker
    other.optimize(_quick, n_trials=2)
    own = study.ask()
    study.tell(own, 0.5)
    assert [t.number for t in study.trials] == [own.number]  # the others come at the next refresh
    assert [t.state for t in other.trials] == [TrialState.COMPLETE] * 3  # its own write is there
    storage.refresh_s = 0
    assert [t.number for t in study.trials] == [0, 1, 2]
    assert study_from_env(env)._storage.refresh_s == REFRESH_S  # type: ignore[attr-defined]
    for bad in ("-1", "soon", "61"):
        with pytest.raises(ConfigError, match="RUNNERCTL_OPTUNA_REFRESH_S must be a number"):
            study_from_env({**env, "RUNNERCTL_OPTUNA_REFRESH_S": bad})


def test_budget_is_exact_and_a_finished_study_adds_no_trials(pg_server: PostgresServer,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    url = pg_server.create_database("budget")
    optuna.create_study(study_name="budget", storage=url)
    monkeypatch.setenv("OPTUNA_STORAGE", url)
    monkeypatch.setenv("OPTUNA_STUDY_NAME", "budget")
    monkeypatch.setenv("OPTUNA_N_TRIALS", "7")
    assert run_worker(_quick) == 7
    assert run_worker(_quick) == 0  # a late or retried worker job: nothing to do
    study = optuna.load_study(study_name="budget", storage=url)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 7
    monkeypatch.setenv("OPTUNA_N_TRIALS", "seven")
    _one_line_exit(capsys, lambda: run_worker(_quick), "OPTUNA_N_TRIALS must be a positive number")


def _one_line_exit(capsys: pytest.CaptureFixture[str], call: Callable[[], object], needle: str) -> None:
    """A worker's set-up error ends it with one line and exit code 3 (its user script's
    traceback showed before: found by a review as a researcher sweeping)."""
    with pytest.raises(SystemExit) as ended:
        call()
    assert ended.value.code == 3
    err = capsys.readouterr().err
    assert err.startswith("runnerctl.optuna: error: ") and needle in err and "Traceback" not in err, err


def test_waiting_workers_fail_and_retry_a_dead_workers_trial(pg_server: PostgresServer) -> None:
    """The budget is spoken for by a trial whose worker died: the live worker, idle and
    waiting, still notices the stale heartbeat, and runs the retried copy itself."""
    url = pg_server.create_database("dead_worker")
    optuna.create_study(study_name="dead", storage=url)
    storage = make_storage(url, heartbeat_interval=1, grace_period=1)
    assert isinstance(storage, RDBStorage)
    study = optuna.load_study(study_name="dead", storage=SweepStorage(storage))  # as study_from_env
    assert run_worker(_quick, study=study, n_trials=3) == 3
    dead = study.ask()  # a fourth trial, RUNNING, its worker about to vanish
    dead.suggest_float("x", -1, 1)
    storage.record_heartbeat(dead._trial_id)  # one beat, then silence
    started = time.monotonic()
    assert run_worker(_quick, study=study, n_trials=4, poll_s=0.2) == 1
    assert time.monotonic() - started >= 1  # only after the grace period
    trials = study.get_trials(deepcopy=False)
    assert Counter(t.state for t in trials) == {TrialState.COMPLETE: 4, TrialState.FAIL: 1}
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == dead.number]
    assert retry.state == TrialState.COMPLETE and retry.params == dead.params


def test_without_heartbeats_nobody_waits_forever(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """...and the worker says why it stopped short: it printed "ran 0" and nothing else, at
    every later run, while the dead trial held its place (found by a review as a researcher
    sweeping)."""
    url = f"journal:{tmp_path}/j.log"
    study = optuna.create_study(study_name="j", storage=make_storage(url))
    study.ask()  # RUNNING forever: journal files have no heartbeats
    assert not TrialCounter(study).failover
    done = threading.Event()

    def work() -> None:
        run_worker(_quick, study=study, n_trials=3)
        done.set()

    threading.Thread(target=work, daemon=True).start()
    assert done.wait(timeout=120)
    assert TrialCounter(study).counts() == (2, 1)
    said = [r.getMessage() for r in caplog.records if "this storage has no heartbeats" in r.getMessage()]
    assert said and "stopping with 2 of 3 trials complete and 1 RUNNING" in said[-1], said


def test_trial_counter_counts_in_the_database(pg_server: PostgresServer) -> None:
    url = pg_server.create_database("counter")
    study = optuna.create_study(study_name="counter", storage=make_storage(url, heartbeat_interval=5))
    study.optimize(_quick, n_trials=3)
    running = study.ask()
    counter = TrialCounter(study)
    assert counter.failover
    assert counter.counts() == (3, 1)
    assert counter.counts(exclude_number=running.number) == (3, 0)


def test_a_study_that_is_not_there_is_one_line_naming_the_studies_there(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    create_study(url, "lr_search")
    with pytest.raises(ConfigError, match=r"no study 'lr_serach' in the storage \(studies there: lr_search"):
        study_from_env({ENV_STORAGE: url, ENV_STUDY: "lr_serach"})


def test_an_unreachable_rdb_database_is_one_line() -> None:
    with pytest.raises(ConfigError, match="cannot open the study's database: .*") as caught:
        make_storage("postgresql+psycopg://u:s3cret@127.0.0.1:1/db", env={})
    assert "s3cret" not in str(caught.value) and "\n" not in str(caught.value)


def test_an_existing_study_of_the_other_direction_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    create_study(url, "lr_search", direction="minimize")
    assert create_study(url, "lr_search", direction="minimize").study_name == "lr_search"  # kept
    with pytest.raises(ConfigError, match="already exists and optimizes minimize, not maximize"):
        create_study(url, "lr_search", direction="maximize")


@pytest.mark.parametrize("nan", [float("nan"), numpy.float32("nan"), None, (1.0, float("nan"))])
def test_a_worker_whose_objective_always_returns_nan_stops(tmp_path: Path, nan: object,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    study = create_study(url, "diverging")
    _one_line_exit(capsys, lambda: run_worker(lambda trial: nan, study=study, n_trials=5),  # type: ignore[arg-type,return-value]
                   "returned no number (NaN, None) in the last 10 trials here")
    assert len(study.trials) == 10


def test_report_of_a_multi_objective_study_and_infinite_values_is_strict_json(tmp_path: Path) -> None:
    storage = make_storage(f"sqlite:///{tmp_path}/s.db", env={})
    multi = optuna.create_study(study_name="multi", storage=storage, directions=["minimize", "maximize"])
    multi.optimize(lambda t: (t.suggest_float("x", 0, 1), float("inf")), n_trials=3)
    best = json.loads(report(multi, tmp_path / "multi").read_text())
    assert best["best_trials"] and best["best_trials"][0]["values"][1] == "inf"
    json.loads((tmp_path / "multi" / "trials.json").read_text())
    assert (tmp_path / "multi" / "pareto_front.html").exists()
    four = optuna.create_study(study_name="four", storage=storage, directions=["minimize"] * 4)
    four.optimize(lambda t: (t.suggest_float("x", 0, 1), 1.0, 2.0, 3.0), n_trials=2)
    assert len(json.loads(report(four, tmp_path / "four").read_text())["best_trials"]) >= 1  # no plot: 4


def test_a_trial_failed_elsewhere_while_it_ran_here_is_a_warning_not_a_crash(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Another worker took a live trial for dead (its heartbeats late) and failed it: the
    worker's tell then fails (Optuna 5: "Cannot tell a FAIL trial", then an AssertionError);
    the worker warns and goes on, and the budget is still met."""
    url = f"sqlite:///{tmp_path}/s.db"
    create_study(url, "late")
    study = study_from_env({ENV_STORAGE: url, ENV_STUDY: "late"})
    other = make_storage(url, env={})
    failed: list[int] = []

    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_float("x", 0, 1)
        if len(failed) < 2:  # the first two trials: another worker fails them as they run
            failed.append(trial.number)
            other.set_trial_state_values(trial._trial_id, TrialState.FAIL)
            if len(failed) == 2:
                trial.report(x, step=1)  # a report on the finished trial (UpdateFinishedTrialError)
        return x

    run_worker(objective, study=study, n_trials=3)
    states = Counter(t.state for t in optuna.load_study(study_name="late", storage=url).trials)
    assert states[TrialState.COMPLETE] == 3 and states[TrialState.FAIL] == 2
    for number in failed:
        assert f"trial {number} was failed by another worker while it ran here" in caplog.text
    with pytest.raises(KeyError, match="its own"):  # the objective's own error still stops the worker
        run_worker(lambda trial: {}["its own"], study=study, n_trials=4)


def test_a_study_of_another_project_is_refused_to_its_sweeps_jobs(tmp_path: Path) -> None:
    """Every project's runners get one storage URL: two projects choosing one study_name
    shared a study, the second running nothing and reporting the first one's best (found
    by a review as a researcher sweeping)."""
    url = f"sqlite:///{tmp_path}/s.db"
    vision = {"CI_PROJECT_ID": "7", "CI_PROJECT_PATH": "lab/vision"}
    speech = {"CI_PROJECT_ID": "9", "CI_PROJECT_PATH": "lab/speech"}
    study = create_study(url, "lr_search", env=vision)
    assert study.user_attrs["runnerctl_project"] == {"id": "7", "path": "lab/vision"}
    assert create_study(url, "lr_search", env=vision).study_name == "lr_search"  # its own: kept
    with pytest.raises(ConfigError, match="belongs to project lab/vision .*not to lab/speech"):
        create_study(url, "lr_search", env=speech)
    with pytest.raises(ConfigError, match="belongs to project lab/vision"):
        study_from_env({ENV_STORAGE: url, ENV_STUDY: "lr_search", **speech})  # a worker, the report
    assert study_from_env({ENV_STORAGE: url, ENV_STUDY: "lr_search", **vision}).study_name == "lr_search"
    assert study_from_env({ENV_STORAGE: url, ENV_STUDY: "lr_search"}).study_name == "lr_search"  # by hand
    create_study(url, "by_hand")  # `runnerctl postgres create-study`: no project yet
    assert create_study(url, "by_hand", env=speech).user_attrs["runnerctl_project"]["path"] == "lab/speech"


def test_a_worker_script_with_a_bad_set_up_says_one_line(tmp_path: Path) -> None:
    """The documented `run_worker(objective)` script printed a traceback for every set-up
    error: storage unset, a study not there, a journal in a missing directory."""
    script = Path(__file__).resolve().parents[1] / "examples" / "optuna-sweep" / "search.py"
    root = str(Path(__file__).resolve().parents[1])
    base = {k: v for k, v in os.environ.items() if not k.startswith("OPTUNA_")} | {"PYTHONPATH": root}
    cases = [({}, "OPTUNA_STORAGE and OPTUNA_STUDY_NAME not set"),
             ({"OPTUNA_STORAGE": f"journal:{tmp_path}/none/j.log", "OPTUNA_STUDY_NAME": "s"},
              "the journal file's directory"),
             ({"OPTUNA_STORAGE": f"sqlite:///{tmp_path}/s.db", "OPTUNA_STUDY_NAME": "nope"},
              "no study 'nope'")]
    for env, needle in cases:
        done = subprocess.run([sys.executable, str(script)], env={**base, **env, "OPTUNA_N_TRIALS": "3"},
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 3 and needle in done.stderr and "Traceback" not in done.stderr, done.stderr
