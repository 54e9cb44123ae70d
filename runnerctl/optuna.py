"""Optuna for runnerctl workers: `study_from_env()` and `run_worker(objective)`.

A sweep is W GitLab jobs (`parallel: W`) sharing one study in one database. Each job
calls `run_worker(objective)`, which loads the study named by `OPTUNA_STUDY_NAME` from
`OPTUNA_STORAGE` with settings that survive real life:

- `pool_pre_ping` (a connection PostgreSQL dropped while a trial trained for an hour is
  replaced, not failed) and a small fixed pool: a worker uses at most two connections
  at once (its trial, its heartbeat thread), so PostgreSQL's default
  `max_connections = 100` holds 16 workers with room to spare and about 45 at most;
  runnerctl's own server allows 200;
- heartbeats: a worker killed mid-trial leaves its trial RUNNING only until another
  worker sees the heartbeat is stale and marks it FAIL; the retry callback then queues a
  copy with the same parameters, which the next free worker runs;
- an exact trial budget (`OPTUNA_N_TRIALS`, total over all workers): a trial runs only
  while COMPLETE + other RUNNING trials are fewer than the budget; one that would
  overshoot is pruned unrun, and its worker waits for the trials still in flight (one
  may die and need a retry) instead of leaving early.

Heartbeats need RDBStorage and `study.optimize()` (Optuna docs); journal files get the
budget but not the failover, so their workers do not wait for in-flight trials.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import optuna
import sqlalchemy.exc
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages._cached_storage import _CachedStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, Trial, TrialState

from runnerctl.errors import ConfigError
from runnerctl.optuna_journal import RECONNECT_S, PostgresJournalBackend, SweepJournalStorage, is_journal_url
from runnerctl.postgres import check_user_part

ENV_STORAGE = "OPTUNA_STORAGE"
ENV_STUDY = "OPTUNA_STUDY_NAME"
ENV_TRIALS = "OPTUNA_N_TRIALS"
ENV_PROJECT_ID, ENV_PROJECT_PATH = "CI_PROJECT_ID", "CI_PROJECT_PATH"
"""The GitLab project of the job (GitLab's predefined CI/CD variables)."""
PROJECT_ATTR = "runnerctl_project"
"""The study's user attribute naming the project whose sweep made it: {"id", "path"}."""
HEARTBEAT_INTERVAL_S = 10
"""How often a running trial says it is alive: one UPDATE per running trial, so 200
workers cost 20 writes a second."""
GRACE_PERIOD_S = 40
"""A trial silent this long is stale: four missed heartbeats, so a long GC pause or a
PostgreSQL restart does not fail a live trial (its worker would then crash on `tell`)."""
MAX_RETRY = 3
"""A trial whose worker died is retried this often before it counts as failed."""
MIN_FAILED_IN_A_ROW = 10
"""A worker stops after this many trials in a row (or the budget, if larger) whose value
Optuna fails (NaN, None, not a number): an objective that always diverges would else
run until the job's timeout."""
POOL_SIZE = 2
"""Connections per worker: the trial's and the heartbeat thread's. No overflow: a
third would only wait, and a fixed size keeps 16 workers at 32 connections."""
ENV_REFRESH = "RUNNERCTL_OPTUNA_REFRESH_S"
REFRESH_S = 1.0
"""A worker reads other workers' new and unfinished trials at most this often (see
`SweepStorage`); 0 reads them at every request, as plain Optuna does."""
JOURNAL_PREFIX = "journal:"
"""`journal:PATH` selects Optuna's journal file storage (one host; no heartbeats)."""

Objective = Callable[[Trial], float | tuple[float, ...]]
_T = TypeVar("_T")
_log = logging.getLogger(__name__)


def make_storage(url: str, *, heartbeat_interval: int | None = None,
                 grace_period: int | None = None,
                 env: Mapping[str, str] | None = None) -> BaseStorage:
    """RDBStorage for database URLs, JournalStorage for `journal:PATH`.

    `RUNNERCTL_OPTUNA_HEARTBEAT_S` and `RUNNERCTL_OPTUNA_GRACE_S` in the environment
    override the defaults (tests use seconds, not tens of seconds).
    """
    env = os.environ if env is None else env
    if url.startswith(JOURNAL_PREFIX):
        path = url.removeprefix(JOURNAL_PREFIX)
        if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise ConfigError(f"the journal file's directory {os.path.dirname(os.path.abspath(path))} "
                              "does not exist", hint=f"create it, or give another {JOURNAL_PREFIX}PATH")
        return JournalStorage(JournalFileBackend(path))
    interval = heartbeat_interval or _positive(env, "RUNNERCTL_OPTUNA_HEARTBEAT_S", HEARTBEAT_INTERVAL_S)
    grace = grace_period or _positive(env, "RUNNERCTL_OPTUNA_GRACE_S", GRACE_PERIOD_S)
    if is_journal_url(url):
        with warnings.catch_warnings():  # heartbeats are "experimental" in Optuna, and needed here
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            callback = _retry_callback()[1]
        return SweepJournalStorage(PostgresJournalBackend(url), heartbeat_interval=interval,
                                   grace_period=grace, stale_trial_callback=callback)
    if url.startswith("postgres"):
        check_user_part(url.partition("://")[2])
    engine: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("sqlite"):
        engine["connect_args"] = {"timeout": 60}  # wait for the file lock, do not fail
    else:
        engine.update(pool_size=POOL_SIZE, max_overflow=0)
    if url.startswith("postgres"):
        engine["connect_args"] = {"client_encoding": "UTF8"}  # a SQL_ASCII database's text is no bytes
    with warnings.catch_warnings():  # heartbeats are "experimental" in Optuna, and needed here
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        keyword, callback = _retry_callback()
        try:
            return RDBStorage(url, engine_kwargs=engine, heartbeat_interval=interval,
                              grace_period=grace, **{keyword: callback})
        except sqlalchemy.exc.SQLAlchemyError as exc:  # no server, a bad URL: one line, no password
            first = str(getattr(exc, "orig", None) or exc).strip().splitlines()
            why = first[0] if first else type(exc).__name__
            raise ConfigError(f"cannot open the study's database: {why}",
                              hint="check the storage URL and that the server runs "
                                   "(`runnerctl postgres status`)") from None


class SweepStorage(_CachedStorage):
    """Optuna's cache in front of RDBStorage, reading the database less often.

    Plain Optuna re-reads every unfinished trial of the study (and every new one) with
    all their parameters and attributes about three times per trial: to pop a WAITING
    trial, for the sampler, for the relative search space. With W workers that is
    W trials loaded through the ORM, three times, by each of W workers per trial round,
    and on a busy host this CPU, not the database, is what stops 16 workers scaling.
    Here a worker refreshes its view at most once per `refresh_s` (the sampler sees other
    workers' trials up to that much later, nothing it has not already seen goes away) and
    looks for dead workers' trials at most once per heartbeat interval (a trial is stale
    only after a grace period of several intervals anyway). Writes go straight through:
    a trial's state is always set in the database, atomically, as before.
    """

    def __init__(self, backend: RDBStorage, *, refresh_s: float = REFRESH_S,
                 reconnect_s: float = RECONNECT_S) -> None:
        super().__init__(backend)
        self.refresh_s = refresh_s
        self.reconnect_s = reconnect_s
        self._read_at: dict[int, float] = {}
        self._stale_checked_at: dict[int, float] = {}
        self._away = False  # the server is away: said once until a call works again

    # -- through a server restart ----------------------------------------------------------
    # Optuna's heartbeat thread dies at the first beat that fails, and a `tell` that fails
    # ends the worker with its trial RUNNING: a restart of the study's PostgreSQL for a second
    # or two then cost a live trial (failed by another worker once its beats stopped, and run
    # again) or every worker (found by a review as a researcher sweeping). A missed beat is
    # said and skipped (the next one, an interval later, tries again); every other call is
    # sent again while the server is away, for up to `reconnect_s`, as on the journal path.
    def _through_outage(self, what: str, call: Callable[[], _T]) -> _T:
        deadline = time.monotonic() + self.reconnect_s
        delay = 0.25
        while True:
            try:
                result = call()
            except Exception as exc:
                if not _server_away(exc) or time.monotonic() + delay > deadline:
                    raise
                self._say_away(exc, what)
                time.sleep(delay)
                delay = min(2 * delay, 5.0)
                continue
            if self._away:
                self._away = False
                _log.warning("the study's database answers again")
            return result

    def _say_away(self, exc: BaseException, what: str) -> None:
        if not self._away:
            self._away = True
            _log.warning("the study's database is away (%s) while trying to %s; trying again for up to "
                         "%.0f s", _first_line(exc), what, self.reconnect_s)

    def record_heartbeat(self, trial_id: int) -> None:
        try:
            super().record_heartbeat(trial_id)
        except Exception as exc:
            if not _server_away(exc):
                raise
            self._say_away(exc, f"record trial {trial_id}'s heartbeat")  # the next beat tries again

    def set_trial_state_values(self, trial_id: int, state: TrialState,
                               values: Sequence[float] | None = None) -> bool:
        tries = 0

        def finish() -> bool:
            nonlocal tries
            tries += 1
            try:
                return super(SweepStorage, self).set_trial_state_values(trial_id, state, values)
            except optuna.exceptions.UpdateFinishedTrialError:
                if tries > 1 and self._backend.get_trial(trial_id).state == state:
                    return True  # a try whose commit's answer was lost did it
                raise

        return self._through_outage(f"set trial {trial_id} {state.name}", finish)

    def create_new_trial(self, *args: Any, **kwargs: Any) -> int:
        return self._through_outage("create a trial", lambda: super(SweepStorage, self).create_new_trial(
            *args, **kwargs))

    def set_trial_param(self, *args: Any, **kwargs: Any) -> None:
        self._through_outage("set a trial's parameter", lambda: super(SweepStorage, self).set_trial_param(
            *args, **kwargs))

    def set_trial_intermediate_value(self, *args: Any, **kwargs: Any) -> None:
        self._through_outage("report an intermediate value", lambda: super(
            SweepStorage, self).set_trial_intermediate_value(*args, **kwargs))

    def set_trial_user_attr(self, *args: Any, **kwargs: Any) -> None:
        self._through_outage("set a trial's attribute", lambda: super(SweepStorage, self).set_trial_user_attr(
            *args, **kwargs))

    def set_trial_system_attr(self, *args: Any, **kwargs: Any) -> None:
        self._through_outage("set a trial's attribute", lambda: super(
            SweepStorage, self).set_trial_system_attr(*args, **kwargs))

    def get_trial(self, trial_id: int) -> FrozenTrial:
        return self._through_outage("read a trial", lambda: super(SweepStorage, self).get_trial(trial_id))

    def get_all_trials(self, *args: Any, **kwargs: Any) -> list[FrozenTrial]:
        return self._through_outage("read the study's trials", lambda: super(
            SweepStorage, self).get_all_trials(*args, **kwargs))

    def _read_trials_from_remote_storage(self, study_id: int) -> None:
        now = time.monotonic()
        if study_id in self._studies and now - self._read_at.get(study_id, -1e9) < self.refresh_s:
            return
        super()._read_trials_from_remote_storage(study_id)
        self._read_at[study_id] = now

    def expire(self) -> None:
        """Make the next read go to the database (a worker's last look at the study)."""
        self._read_at.clear()

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        now, interval = time.monotonic(), self._backend.heartbeat_interval or 0
        if now - self._stale_checked_at.get(study_id, -1e9) < interval:
            return []
        self._stale_checked_at[study_id] = now
        return self._through_outage("look for dead workers' trials",
                                    lambda: super(SweepStorage, self)._get_stale_trial_ids(study_id))


def _server_away(exc: BaseException) -> bool:
    """An error of a database server that went away (stopped, restarting, its connection
    ended): SQLAlchemy's OperationalError, also as the cause of Optuna's StorageInternalError
    ("An exception is raised during the commit...", optuna/storages/_rdb/storage.py)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, sqlalchemy.exc.OperationalError) or (
                isinstance(seen, sqlalchemy.exc.DBAPIError) and seen.connection_invalidated):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _first_line(exc: BaseException) -> str:
    found = str(getattr(exc, "orig", None) or exc.__cause__ or exc).strip().splitlines()
    return found[0] if found else type(exc).__name__


def _retry_callback() -> tuple[str, Any]:
    """RDBStorage's argument name and the callback: Optuna 4.9 renamed both."""
    try:
        from optuna.storages import RetryHeartbeatStaleTrialCallback  # type: ignore[attr-defined, unused-ignore]
    except ImportError:  # Optuna < 4.9
        from optuna.storages import RetryFailedTrialCallback

        return "failed_trial_callback", RetryFailedTrialCallback(max_retry=MAX_RETRY)
    return "heartbeat_stale_trial_callback", RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)


def _positive(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "")
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{name} must be a whole number of seconds above 0, not {raw!r}")
    return int(raw)


def _refresh_s(env: Mapping[str, str]) -> float:
    raw = env.get(ENV_REFRESH, "")
    try:
        refresh = float(raw) if raw else REFRESH_S
    except ValueError:
        refresh = -1.0
    if not 0 <= refresh <= 60:
        raise ConfigError(f"{ENV_REFRESH} must be a number of seconds from 0 to 60, not {raw!r}",
                          hint=f"0 reads other workers' trials at every step, as plain Optuna does; "
                               f"the default is {REFRESH_S}")
    return refresh


def study_from_env(env: Mapping[str, str] | None = None, *,
                   sampler: optuna.samplers.BaseSampler | None = None) -> optuna.Study:
    """The study named by OPTUNA_STUDY_NAME in OPTUNA_STORAGE, with runnerctl's storage settings.

    The study must exist: the sweep's `optuna-create-study` job (or `runnerctl postgres
    create-study`) creates it once, because workers creating tables at the same time race.
    """
    env = os.environ if env is None else env
    missing = [name for name in (ENV_STORAGE, ENV_STUDY) if not env.get(name)]
    if missing:
        raise ConfigError(f"{' and '.join(missing)} not set",
                          hint="run inside runnerctl's optuna-sweep template, or set them by hand")
    storage = make_storage(env[ENV_STORAGE], env=env)
    if isinstance(storage, RDBStorage):
        storage = SweepStorage(storage, refresh_s=_refresh_s(env))
    elif isinstance(storage, SweepJournalStorage):
        storage.refresh_s = _refresh_s(env)
    study = load_study(env[ENV_STUDY], storage, sampler=sampler)
    check_project(study, env)
    return study


def check_project(study: optuna.Study, env: Mapping[str, str]) -> None:
    """A study belongs to the GitLab project whose sweep made it (`create_study` records
    `PROJECT_ATTR`): every project's runners get one storage URL (`runnerctl init
    --optuna-storage`), so two projects choosing one study_name shared a study, the second
    running nothing and reporting the first one's best (found by a review as a researcher
    sweeping). Outside CI (no CI_PROJECT_ID), or on a study made elsewhere, nothing is checked."""
    mine = env.get(ENV_PROJECT_ID, "")
    owner = study.user_attrs.get(PROJECT_ATTR)
    if not mine or not isinstance(owner, dict) or str(owner.get("id")) == mine:
        return
    raise ConfigError(f"study {study.study_name!r} belongs to project {owner.get('path') or owner.get('id')} "
                      f"(its sweep made it), not to {env.get(ENV_PROJECT_PATH) or mine}: two projects in one "
                      "study mix their trials",
                      hint="give the sweep another study_name, or each project a database of its own "
                           "(`runnerctl postgres create-study NAME`)")


def load_study(name: str, storage: BaseStorage, *,
               sampler: optuna.samplers.BaseSampler | None = None) -> optuna.Study:
    """Study NAME; ConfigError naming the studies there when it is not (Optuna: KeyError)."""
    try:
        return optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    except KeyError:
        names = sorted(s.study_name for s in storage.get_all_studies())
        there = f"studies there: {', '.join(names[:10])}{', ...' if len(names) > 10 else ''}" \
            if names else "the storage holds no study"
        hint = "check OPTUNA_STUDY_NAME (the sweep's optuna-create-study job makes it)"
        raise ConfigError(f"no study {name!r} in the storage ({there})", hint=hint) from None


def run_worker(objective: Objective, *, study: optuna.Study | None = None,
               n_trials: int | None = None, poll_s: float = 1.0) -> int:
    """Run trials until the study holds `n_trials` COMPLETE ones; returns how many ran here.

    `n_trials` defaults to OPTUNA_N_TRIALS, the total over all workers. A set-up error (a
    variable missing, no such study, the storage unreachable) ends the process with one
    line and exit code 3, not a traceback; the objective's own errors propagate.
    """
    try:
        study = study or study_from_env()
        budget = n_trials if n_trials is not None else _budget_from_env()
        try:
            return _run_until_budget(objective, study, budget, poll_s)
        finally:
            if isinstance(study._storage, SweepStorage | SweepJournalStorage):
                study._storage.expire()  # the caller's next look at the study is a fresh one
    except ConfigError as exc:  # the worker's set-up or storage, not the objective: one line, no traceback
        print(f"runnerctl.optuna: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(int(exc.exit_code)) from None


def _run_until_budget(objective: Objective, study: optuna.Study, budget: int, poll_s: float) -> int:
    counter = TrialCounter(study)
    gate = _Admission(objective, counter, budget)
    while True:
        complete, running = counter.counts()
        if complete >= budget:
            return gate.ran
        if complete + running >= budget:
            if not counter.failover:  # nothing would ever fail a dead worker's trial: do not wait
                _log.warning("stopping with %d of %d trials complete and %d RUNNING: this storage has no "
                             "heartbeats, so a trial whose worker died stays RUNNING and holds its place "
                             "in %s; a sweep that must finish wants the journal on PostgreSQL "
                             "(`runnerctl postgres url`)", complete, budget, running, ENV_TRIALS)
                return gate.ran
            time.sleep(poll_s)  # in flight elsewhere; one may die and come back for a retry
            counter.fail_stale_trials()
            continue
        if gate.gave_up:
            raise ConfigError(f"the objective returned no number (NaN, None) in the last "
                              f"{gate.failed_in_a_row} trials here (Optuna fails them, and they count "
                              "toward no budget): stopping",
                              hint="a diverging run: return a finite value, or raise optuna.TrialPruned")
        try:
            study.optimize(gate, gc_after_trial=False, show_progress_bar=False)  # until gate stops
        except Exception as exc:
            if not gate.finished_elsewhere(study):
                raise  # the objective's own error, or the storage's: the worker stops
            # another worker took our trial for dead (heartbeats late): its retry copy runs. Optuna
            # says so in several ways (UpdateFinishedTrialError; 5.x: "Cannot tell a FAIL trial")
            _log.warning("trial %d was failed by another worker while it ran here (its heartbeats came "
                         "late), so its retry runs instead: %s", gate.current[1] if gate.current else -1, exc)


def _budget_from_env() -> int:
    raw = os.environ.get(ENV_TRIALS, "")
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{ENV_TRIALS} must be a positive number of trials, not {raw!r}")
    return int(raw)


class TrialCounter:
    """COMPLETE and RUNNING trials of one study, counted in the database where it is one.

    One `COUNT` instead of loading every trial (Optuna's get_trials reads each trial
    with its parameters and values, which at 16 workers costs more CPU than the trial).
    """

    def __init__(self, study: optuna.Study) -> None:
        self.study = study
        storage = getattr(study, "_storage", None)
        backend = getattr(storage, "_backend", storage)  # under Optuna's _CachedStorage
        self._rdb = backend if isinstance(backend, RDBStorage) else None
        self.failover = ((self._rdb is not None and self._rdb.heartbeat_interval is not None)
                         or isinstance(storage, SweepJournalStorage))

    def counts(self, *, exclude_number: int = -1) -> tuple[int, int]:
        """(COMPLETE, RUNNING) trials, leaving out trial number `exclude_number`."""
        storage = self.study._storage
        if isinstance(storage, SweepJournalStorage):
            return storage.count_states(self.study._study_id, exclude_number=exclude_number)
        if self._rdb is None:
            trials = self.study.get_trials(deepcopy=False,
                                           states=(TrialState.COMPLETE, TrialState.RUNNING))
            states = [t.state for t in trials if t.number != exclude_number]
            return states.count(TrialState.COMPLETE), states.count(TrialState.RUNNING)
        import sqlalchemy

        query = sqlalchemy.text(
            "SELECT t.state, COUNT(*) FROM trials t JOIN studies s ON s.study_id = t.study_id "
            "WHERE s.study_name = :study AND t.number != :number "
            "AND t.state IN ('COMPLETE', 'RUNNING') GROUP BY t.state")
        engine = self._rdb.engine

        def count() -> dict[str, int]:
            with engine.connect() as conn:
                rows = conn.execute(query, {"study": self.study.study_name, "number": exclude_number})
                return {str(row[0]): int(row[1]) for row in rows}

        counts = storage._through_outage("count the study's trials", count) \
            if isinstance(storage, SweepStorage) else count()
        return counts.get("COMPLETE", 0), counts.get("RUNNING", 0)

    def fail_stale_trials(self) -> None:
        """What optimize() does before each trial: fail dead workers' trials, queue retries."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)


class _Admission:
    """The objective, run only for trials admitted within the budget.

    A trial is RUNNING from its creation, before this check. It is admitted when the
    COMPLETE trials plus the other RUNNING ones are fewer than the budget; when it takes
    the last place, or when the others took the rest while it ran, the worker stops asking
    after it (few surplus trials at the end: the worker loop waits instead). No lock is
    needed: of any two trials, the one checked later sees the other (RUNNING or
    COMPLETE), so the last admitted trial always sees every other one that completes.
    A RUNNING trial of a killed worker is counted until the heartbeat failover marks it
    FAIL; its retried copy is then admitted like any other trial.
    """

    def __init__(self, objective: Objective, counter: TrialCounter, budget: int) -> None:
        self.objective, self.counter, self.budget = objective, counter, budget
        self.ran = 0
        self.current: tuple[int, int] | None = None
        """(storage id, number) of the trial whose objective ran last, whether it returned a
        value Optuna takes, or found the trial finished (`finished_elsewhere`)."""
        self.returned = self.found_finished = False
        self.failed_in_a_row = 0
        """Trials here whose value Optuna fails (NaN, None): they count toward no budget,
        so an objective that always diverges would run until the job's timeout."""

    @property
    def gave_up(self) -> bool:
        """So many trials in a row failed by their value that the worker stops."""
        return self.failed_in_a_row >= max(MIN_FAILED_IN_A_ROW, self.budget)

    def __call__(self, trial: Trial) -> float | tuple[float, ...]:
        taken = sum(self.counter.counts(exclude_number=trial.number))
        if taken >= self.budget:
            trial.study.stop()
            raise optuna.TrialPruned("trial budget reached; not run")
        if taken + 1 >= self.budget:
            trial.study.stop()  # the last one with room: create no surplus trial after it
        self.current, self.returned, self.found_finished = (trial._trial_id, trial.number), False, False
        try:
            value = self.objective(trial)
        except optuna.exceptions.UpdateFinishedTrialError:  # a suggest or report in it
            self.found_finished = True
            raise
        self.ran += 1
        fails = _fails(value)
        self.returned = not fails  # a value Optuna fails itself is no sign of another worker
        self.failed_in_a_row = self.failed_in_a_row + 1 if fails else 0
        if self.gave_up:
            trial.study.stop()
            return value
        if sum(self.counter.counts(exclude_number=trial.number)) + 1 >= self.budget:
            trial.study.stop()  # the others took the rest meanwhile: no trial to prune unrun
        return value

    def finished_elsewhere(self, study: optuna.Study) -> bool:
        """Did another worker fail the last trial while it ran here? Then its objective
        returned (and telling the value failed), or a suggest or report in it found the
        trial finished; an error of the objective's own also leaves the trial FAIL."""
        stale = self.returned or self.found_finished
        if self.current is None or not stale:
            return False
        try:
            return study._storage.get_trial(self.current[0]).state == TrialState.FAIL
        except Exception:  # noqa: BLE001 - the storage fails too: not this case, the caller re-raises
            return False


def _fails(value: Any) -> bool:
    """Would Optuna fail a trial with this value (NaN, None, anything not a number)?"""
    for one in value if isinstance(value, tuple | list) else (value,):
        try:
            if math.isnan(float(one)):
                return True
        except (TypeError, ValueError):
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    """`python -m runnerctl.optuna report|create-study|dashboard`: the sweep's own jobs."""
    from runnerctl.optuna_tools import main as tools_main

    return tools_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
