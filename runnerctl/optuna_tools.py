"""What a sweep does besides its workers: create the study, report it, show it, move it.

`python -m runnerctl.optuna create-study|report|dashboard` run in the optuna-sweep
template's jobs (or by hand) with the template's environment (OPTUNA_STORAGE,
OPTUNA_STUDY_NAME), so they understand every storage runnerctl hands out: Optuna's
own command line knows RDB URLs and journal files, not runnerctl's journal on
PostgreSQL. `copy_to_journal` moves a study kept in Optuna's RDB tables into the
journal of the same database (`runnerctl postgres migrate-study`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from runnerctl.errors import ConfigError
from runnerctl.optuna import (
    ENV_PROJECT_ID,
    ENV_PROJECT_PATH,
    ENV_STORAGE,
    ENV_STUDY,
    PROJECT_ATTR,
    check_project,
    make_storage,
    study_from_env,
)


def report(study: optuna.Study, out_dir: Path) -> Path:
    """Write best_trial.json, trials.json and two plots (HTML, no network needed) to out_dir;
    for a study of several objectives, its best trials (the Pareto front) and that plot."""
    out_dir.mkdir(parents=True, exist_ok=True)
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not complete:
        raise ConfigError(f"study {study.study_name!r} has no complete trial to report")
    if len(study.directions) > 1:  # no single best: the Pareto front
        front = study.best_trials
        summary: dict[str, Any] = {"study": study.study_name, "best_trials": [
            {"number": t.number, "values": _json_values(t.values), "params": t.params} for t in front]}
    else:
        best = study.best_trial
        summary = {"study": study.study_name, "number": best.number, "value": _json_value(best.value),
                   "params": best.params}
    (out_dir / "best_trial.json").write_text(json.dumps(
        {**summary, "complete_trials": len(complete)}, indent=2, allow_nan=False) + "\n")
    (out_dir / "trials.json").write_text(json.dumps(
        [{"number": t.number, "state": t.state.name, "values": _json_values(t.values), "params": t.params}
         if len(study.directions) > 1 else
         {"number": t.number, "state": t.state.name, "value": _json_value(t.value), "params": t.params}
         for t in study.get_trials(deepcopy=False)], indent=1, allow_nan=False) + "\n")
    from optuna import visualization

    if len(study.directions) > 1:
        if len(study.directions) <= 3:  # Optuna plots a front of 2 or 3 objectives only
            visualization.plot_pareto_front(study).write_html(
                out_dir / "pareto_front.html", include_plotlyjs=True)
        return out_dir / "best_trial.json"
    visualization.plot_optimization_history(study).write_html(
        out_dir / "optimization_history.html", include_plotlyjs=True)
    if len(complete) > 1 and best.params:
        # PED-ANOVA, Optuna 5's default, named so that 4.x (default fANOVA) needs no scikit-learn
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            evaluator = optuna.importance.PedAnovaImportanceEvaluator()
        visualization.plot_param_importances(study, evaluator=evaluator).write_html(
            out_dir / "param_importances.html", include_plotlyjs=True)
    return out_dir / "best_trial.json"


def _json_value(value: float | None) -> float | str | None:
    """A value strict JSON can hold: inf and -inf as strings (JSON has neither)."""
    return value if value is None or math.isfinite(value) else str(value)


def _json_values(values: list[float] | None) -> list[float | str | None] | None:
    return None if values is None else [_json_value(v) for v in values]


def create_study(url: str, name: str, *, direction: str = "minimize",
                 skip_if_exists: bool = True, env: Mapping[str, str] | None = None) -> optuna.Study:
    """The study NAME in `url` (any storage runnerctl knows); an existing one is kept,
    if it optimizes in the same direction (a sweep that maximizes would else run
    nothing and report another sweep's minimum) and belongs to this job's GitLab
    project (`check_project`); a study that names no project is given this one's."""
    env = {} if env is None else env
    storage = make_storage(url, env={})
    wanted = optuna.study.StudyDirection[direction.upper()]
    try:
        study = optuna.create_study(study_name=name, storage=storage, load_if_exists=skip_if_exists,
                                    direction=wanted)
    except optuna.exceptions.DuplicatedStudyError:
        raise ConfigError(f"study {name!r} already exists", hint="--skip-if-exists keeps it") from None
    if study.directions != [wanted]:
        have = ", ".join(d.name.lower() for d in study.directions)
        raise ConfigError(f"study {name!r} already exists and optimizes {have}, not {direction}",
                          hint="give the sweep another study_name") from None
    check_project(study, env)
    if env.get(ENV_PROJECT_ID) and PROJECT_ATTR not in study.user_attrs:
        study.set_user_attr(PROJECT_ATTR, {"id": env[ENV_PROJECT_ID], "path": env.get(ENV_PROJECT_PATH, "")})
    return study


def copy_to_journal(rdb_url: str, journal_url: str, name: str) -> int:
    """Copy study NAME from Optuna's RDB tables into the journal; returns its trial count.

    The RDB study is left as it was (delete it with `optuna delete-study` once the
    journal one is checked). A journal study of that name already there is refused.
    """
    try:
        source = optuna.load_study(study_name=name, storage=rdb_url)
    except KeyError:
        raise ConfigError(f"no study {name!r} in the database's RDB tables") from None
    target = make_storage(journal_url, env={})
    if any(s.study_name == name for s in target.get_all_studies()):
        raise ConfigError(f"the journal already holds a study {name!r}",
                          hint="it was moved before; workers use the journal URL")
    optuna.copy_study(from_study_name=name, from_storage=source._storage, to_storage=target)
    return len(source.get_trials(deepcopy=False))


def dashboard(env: Mapping[str, str], *, host: str, port: int) -> None:
    """optuna-dashboard on the storage named by OPTUNA_STORAGE (runs until interrupted)."""
    try:
        from optuna_dashboard import run_server
    except ImportError:
        raise ConfigError("optuna-dashboard is not installed",
                          hint="pip install 'runnerctl[optuna]'") from None
    url = env.get(ENV_STORAGE, "")
    if not url:
        raise ConfigError(f"{ENV_STORAGE} not set",
                          hint="the storage URL, e.g. from `runnerctl postgres url`")
    run_server(make_storage(url, env=env), host=host, port=port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runnerctl.optuna", description=(
        "The optuna-sweep template's jobs, on OPTUNA_STORAGE and OPTUNA_STUDY_NAME."))
    commands = parser.add_subparsers(dest="command", required=True)
    run_report = commands.add_parser("report", help="best trial, trials and plots into --out")
    run_report.add_argument("--out", type=Path, default=Path("optuna-report"))
    create = commands.add_parser("create-study", help="create the study (before the workers start)")
    create.add_argument("--direction", choices=["minimize", "maximize"], default="minimize")
    create.add_argument("--skip-if-exists", action="store_true", help="keep a study that exists")
    show = commands.add_parser("dashboard", help="optuna-dashboard on the storage (every study)")
    show.add_argument("--host", default="127.0.0.1")
    show.add_argument("--port", type=int, default=8080)
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    env = os.environ
    try:
        if args.command == "dashboard":
            dashboard(env, host=args.host, port=args.port)
            return 0
        if args.command == "create-study":
            missing = [n for n in (ENV_STORAGE, ENV_STUDY) if not env.get(n)]
            if missing:
                raise ConfigError(f"{' and '.join(missing)} not set")
            study = create_study(env[ENV_STORAGE], env[ENV_STUDY], direction=args.direction,
                                 skip_if_exists=args.skip_if_exists, env=env)
            print(f"study {study.study_name}: {len(study.get_trials(deepcopy=False))} trials")
            return 0
        best = report(study_from_env(), args.out)
    except ConfigError as exc:
        print(f"runnerctl.optuna: error: {exc}")
        return int(exc.exit_code)
    except OSError as exc:  # --out naming a file, a directory that cannot be written
        print(f"runnerctl.optuna: error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "))
        return 3
    print(best.read_text(), end="")
    return 0
