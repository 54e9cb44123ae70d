"""End to end: render the optuna-sweep pipeline and run its jobs as gitlab-runner would.

Every job goes through runnerctl's custom executor with the shell driver on a
simulated 8-GPU host (config, prepare with its GPU lease, the run stages, cleanup:
tests/harness_custom_executor.py drives the stages as gitlab-runner does), with the CI
variables GitLab sets (CI_NODE_INDEX/CI_NODE_TOTAL for `parallel:`), against a real
PostgreSQL run by `runnerctl postgres`. The 4 workers run at once, one GPU each.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import optuna
import psycopg
import pytest
from optuna.trial import TrialState

from runnerctl.pipelines import render
from runnerctl.postgres import PostgresServer, libpq_url
from tests import ci_jobs
from tests.harness_custom_executor import FakeJob, StageResult, harness_for, make_host

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


class Pipeline:
    """A rendered pipeline, its project checkout and the simulated host it runs on."""

    def __init__(self, tmp_path: Path, *, study: str, url: str, trials: int, workers: int,
                 extra_env: dict[str, str], script: str = "search.py") -> None:
        self.project = tmp_path / "project"
        self.project.mkdir()
        example = ROOT / "examples" / "optuna-sweep" / "search.py"
        (self.project / "search.py").write_text(example.read_text())
        (tmp_path / "host").mkdir()
        self.host = make_host(tmp_path / "host")
        self.jobs = ci_jobs.load(render("optuna-sweep", {  # the URL as a masked CI/CD variable
            "study_name": study, "storage": "$OPTUNA_URL", "n_trials": str(trials), "workers": str(workers),
            "command": f'echo $$ > "worker-$CI_NODE_INDEX.pid"\npython {script}'}))
        self.env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                    "PYTHONPATH": str(ROOT), "CI": "true", "GITLAB_CI": "true",
                    "CI_PROJECT_DIR": str(self.project), "OPTUNA_URL": url, **extra_env}
        self._job_ids = itertools.count(1001)  # next() is atomic: jobs start from threads

    def run(self, name: str, *, gpu: int = 0, index: int = 1, total: int = 1) -> dict[str, StageResult]:
        """One job (one of a `parallel:` set) through config, prepare, run stages and cleanup."""
        job = ci_jobs.resolve(self.jobs, name)
        variables = {**self.env, "CI_JOB_NAME": f"{name} {index}/{total}" if total > 1 else name,
                     "CI_NODE_INDEX": str(index), "CI_NODE_TOTAL": str(total)}
        for key, value in job.get("variables", {}).items():  # GitLab expands them from the CI/CD variables
            variables[key] = re.sub(r"\$\{?(\w+)\}?", lambda m: variables.get(m.group(1), m.group(0)),
                                    str(value))
        body = 'cd "$CI_PROJECT_DIR"\n' + "\n".join(job["script"])
        return harness_for(self.host, (gpu,), "shell").run_job(
            FakeJob(id=next(self._job_ids), variables=variables), body, timeout=120)

    def run_workers(self) -> list[dict[str, StageResult]]:
        """All `parallel:` workers at once, worker i on GPU i-1, as a 4-GPU host would."""
        total = int(ci_jobs.resolve(self.jobs, "optuna-worker")["parallel"])
        results: list[dict[str, StageResult]] = [{} for _ in range(total)]

        def one(i: int) -> None:
            results[i] = self.run("optuna-worker", gpu=i, index=i + 1, total=total)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(total)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=180)
        return results


def _ok(results: dict[str, StageResult]) -> str:
    for stage, result in results.items():
        assert result.code == 0, f"{stage} failed ({result.code}):\n{result.output}"
    return results["build_script"].output


def test_four_workers_complete_exactly_100_trials(pg_server: PostgresServer, tmp_path: Path) -> None:
    url = pg_server.create_database("sweep_e2e")
    # 0.3 s a trial: 30 s of trials in all, so a worker whose five stages start seconds
    # after the others' on a loaded machine still finds trials left (at 0.05 s it did not)
    sweep = Pipeline(tmp_path, study="sweep_e2e", url=url, trials=100, workers=4,
                     extra_env={"SEARCH_SLEEP_S": "0.3"})
    _ok(sweep.run("optuna-create-study"))
    outputs = [_ok(result) for result in sweep.run_workers()]
    report = _ok(sweep.run("optuna-report"))

    study = optuna.load_study(study_name="sweep_e2e", storage=url)
    states = Counter(t.state for t in study.trials)
    assert states[TrialState.COMPLETE] == 100
    assert states[TrialState.RUNNING] == 0 and states[TrialState.WAITING] == 0
    numbers = [t.number for t in study.trials]
    assert len(numbers) == len(set(numbers)) == max(numbers) + 1
    ran = {line.split()[1]: (line.split()[4], int(line.split()[6]))
           for out in outputs for line in out.splitlines() if line.startswith("worker ")}
    assert sorted(ran) == ["1/4", "2/4", "3/4", "4/4"]  # CI_NODE_INDEX / CI_NODE_TOTAL
    assert sorted(gpus for gpus, _ in ran.values()) == ["0", "1", "2", "3"]  # one leased GPU each
    assert sum(n for _, n in ran.values()) == 100 and all(n > 0 for _, n in ran.values())
    best = json.loads((sweep.project / "optuna-report" / "best_trial.json").read_text())
    assert best["number"] == study.best_trial.number and best["complete_trials"] == 100
    assert f'"number": {study.best_trial.number}' in report
    assert (sweep.project / "optuna-report" / "optimization_history.html").stat().st_size > 1000
    assert (sweep.project / "optuna-report" / "param_importances.html").exists()


HANG_FIRST = '''"""search.py, except that worker 1 stops in its first trial (after sampling, so in its
"training"), writes that trial's number to worker-1.trial and stays there until killed;
the other workers start only once it is there, so it always has a trial to die in."""
import os
import time
from pathlib import Path

import search
from runnerctl.optuna import run_worker

MARK = Path("worker-1.trial")
current = []


class Hang:
    @staticmethod
    def sleep(seconds):
        Path("worker-1.tmp").write_text(str(current[-1]))
        os.replace("worker-1.tmp", MARK)
        while True:
            time.sleep(60)


def objective(trial):
    current.append(trial.number)
    return search.objective(trial)


if os.environ["CI_NODE_INDEX"] == "1":
    search.time = Hang
else:
    while not MARK.exists():
        time.sleep(0.05)
run_worker(objective)
'''


def _wait_for_trial_with_heartbeat(mark: Path, url: str) -> int:
    """Until worker 1 sits in a trial that is RUNNING in the database with a heartbeat
    recorded (what a stale-trial check needs); its number."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        text = mark.read_text().strip() if mark.exists() else ""
        if text.isdigit():
            with psycopg.connect(libpq_url(url)) as conn:
                row = conn.execute("SELECT t.state FROM trials t JOIN trial_heartbeats h USING (trial_id) "
                                   "WHERE t.number = %s", (int(text),)).fetchone()
            if row is not None and row[0] == "RUNNING":
                return int(text)
        time.sleep(0.05)
    pytest.fail("worker 1 never sat in a running trial with a heartbeat")


def test_killed_worker_trial_fails_and_is_retried(pg_server: PostgresServer, tmp_path: Path) -> None:
    url = pg_server.create_database("sweep_kill")
    sweep = Pipeline(tmp_path, study="sweep_kill", url=url, trials=16, workers=4, script="hang_first.py",
                     extra_env={"SEARCH_SLEEP_S": "1.0", "RUNNERCTL_OPTUNA_HEARTBEAT_S": "1",
                                "RUNNERCTL_OPTUNA_GRACE_S": "8"})  # a live worker starved 3 s lost its trial
    (sweep.project / "hang_first.py").write_text(HANG_FIRST)
    _ok(sweep.run("optuna-create-study"))
    results: list[dict[str, StageResult]] = []
    runner = threading.Thread(target=lambda: results.extend(sweep.run_workers()))
    runner.start()
    killed = _wait_for_trial_with_heartbeat(sweep.project / "worker-1.trial", url)
    pid = int((sweep.project / "worker-1.pid").read_text())
    os.killpg(os.getpgid(pid), signal.SIGKILL)  # worker 1's job, mid-trial (OOM killer, node loss)
    runner.join(timeout=600)
    assert not runner.is_alive(), "the workers did not finish the study"

    assert results[0]["build_script"].code != 0  # the killed job fails ...
    for result in results[1:]:
        _ok(result)  # ... the others finish the study
    trials = optuna.load_study(study_name="sweep_kill", storage=url).trials
    states = Counter(t.state for t in trials)
    assert states[TrialState.COMPLETE] == 16 and states[TrialState.RUNNING] == 0
    (failed,) = [t for t in trials if t.state == TrialState.FAIL]
    assert failed.number == killed
    retried: list[Any] = [t for t in trials if t.system_attrs.get("failed_trial") == failed.number]
    assert len(retried) == 1 and retried[0].state == TrialState.COMPLETE
    assert retried[0].params == failed.params  # the same point, run again
