"""runnerctl's Optuna journal on the real PostgreSQL: workers as separate processes with
their own connections, exact totals, a SIGKILLed worker's trial failed and retried, the
report and optuna-dashboard, and moving a study out of Optuna's RDB tables."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import wsgiref.simple_server
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import optuna
import pytest
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from runnerctl.cli import main as cli_main
from runnerctl.optuna import make_storage, run_worker, study_from_env
from runnerctl.optuna_journal import (
    FILLER,
    LOG_TABLE,
    SEQUENCE,
    PostgresJournalBackend,
    SweepJournalStorage,
)
from runnerctl.optuna_tools import main as tools_main
from runnerctl.postgres import PostgresServer, libpq_url, storage_url
from tests.conftest import defaults_toml

ROOT = Path(__file__).resolve().parents[1]
SEARCH = ROOT / "examples" / "optuna-sweep" / "search.py"
pytestmark = [pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning"),
              pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")]
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _journal(pg_server: PostgresServer, name: str) -> str:
    return storage_url(pg_server.create_database(name), "journal")


def _over_socket(pg_server: PostgresServer, url: str) -> str:
    """The same database through the server's Unix socket: another way in, as from another host."""
    rest = url.split("@", 1)[1].split("/", 1)[1]
    user = url.split("://", 1)[1].split("@", 1)[0]
    return (f"journal+postgresql://{user}@/{rest}?host={quote(str(pg_server.config.data_dir))}"
            f"&port={pg_server.config.port}")


def _workers(urls: list[str], study: str, trials: int, **env: str) -> list[subprocess.Popen[str]]:
    base = {**os.environ, "PYTHONPATH": str(ROOT), "OPTUNA_STUDY_NAME": study,
            "OPTUNA_N_TRIALS": str(trials), **env}
    return [subprocess.Popen([sys.executable, str(SEARCH)], text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT,
                             env={**base, "OPTUNA_STORAGE": url, "CI_NODE_INDEX": str(i + 1),
                                  "CI_NODE_TOTAL": str(len(urls))})
            for i, url in enumerate(urls)]


def _finish(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
    return [(proc.wait(timeout=240), proc.communicate()[0]) for proc in procs]


def test_workers_on_two_hosts_complete_exactly_100_trials(pg_server: PostgresServer) -> None:
    """4 worker processes, each its own connection, two over TCP and two over the socket."""
    url = _journal(pg_server, "journal_100")
    assert tools_main(["create-study"]) != 0  # names what is missing, no traceback
    make_storage(url)  # the tables, as the sweep's create-study job makes them
    optuna.create_study(study_name="j100", storage=make_storage(url))
    socket_url = _over_socket(pg_server, url)
    # 0.3 s a trial, 30 s in all: a worker whose import of optuna ends seconds after the
    # others' on a loaded machine still finds trials left (at 0.02 s it did not)
    results = _finish(_workers([url, url, socket_url, socket_url], "j100", 100, SEARCH_SLEEP_S="0.3"))
    for code, out in results:
        assert code == 0, out
    ran = [int(out.split(" ran ")[1].split()[0]) for _, out in results]
    assert sum(ran) == 100 and all(n > 0 for n in ran)  # all four took part
    trials = optuna.load_study(study_name="j100", storage=make_storage(url)).trials
    states = Counter(t.state for t in trials)
    assert states[TrialState.COMPLETE] == 100  # and any others pruned unrun (over the total)
    assert set(states) <= {TrialState.COMPLETE, TrialState.PRUNED}
    assert sorted(t.number for t in trials) == list(range(len(trials)))


def test_a_sigkilled_workers_trial_fails_and_is_retried(pg_server: PostgresServer) -> None:
    url = _journal(pg_server, "journal_kill")
    optuna.create_study(study_name="kill", storage=make_storage(url))
    procs = _workers([url, url], "kill", 6, SEARCH_SLEEP_S="1.0", RUNNERCTL_OPTUNA_HEARTBEAT_S="1",
                     RUNNERCTL_OPTUNA_GRACE_S="8")  # 3: a live worker starved 3 s lost its trial
    watcher = make_storage(url)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:  # both workers inside a trial, all parameters sampled
        running = watcher.get_all_trials(0, deepcopy=False, states=(TrialState.RUNNING,))
        if len(running) == 2 and all(len(t.params) == 3 for t in running):
            break
        time.sleep(0.05)
    else:
        pytest.fail("two workers never ran trials at once")
    procs[0].send_signal(signal.SIGKILL)  # mid-trial: OOM killer, node loss
    (killed, _), (code, out) = _finish(procs)
    assert killed == -signal.SIGKILL and code == 0, out
    trials = optuna.load_study(study_name="kill", storage=make_storage(url)).trials
    states = Counter(t.state for t in trials)
    assert states[TrialState.COMPLETE] == 6 and states[TrialState.RUNNING] == 0
    (failed,) = [t for t in trials if t.state == TrialState.FAIL]
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == failed.number]
    assert retry.state == TrialState.COMPLETE and retry.params == failed.params


def test_the_log_reads_the_same_in_every_worker(pg_server: PostgresServer) -> None:
    """Appends from many connections at once: each reader's view is a prefix of one order,
    with no entry skipped, so every worker replays the same study."""
    url = _journal(pg_server, "journal_order")
    views: list[list[Any]] = []

    def writer(me: int) -> None:
        backend = PostgresJournalBackend(url)
        seen: list[Any] = []
        for i in range(40):
            backend.next_read = len(seen)
            backend.append_logs([{"w": me, "i": i}, {"w": me, "i": i, "second": True}])
            seen += backend.read_logs(len(seen))
            assert {"w": me, "i": i} in seen  # its own entry is there at once
        views.append(seen)
        backend.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    final = PostgresJournalBackend(url).read_logs(0)
    assert len([e for e in final if e != FILLER]) == 6 * 40 * 2 and len(views) == 6
    for view in views:
        assert view == final[:len(view)]
    for me in range(6):  # each writer's entries in its own order
        assert [(e["i"], "second" in e) for e in final if e.get("w") == me] == \
            [(i, second) for i in range(40) for second in (False, True)]


def test_an_append_that_never_committed_is_filled_and_skipped(pg_server: PostgresServer) -> None:
    """A number taken by an append that failed would stop every reader at it: the first
    reader that sees entries after it fills it with an entry Optuna's replay skips."""
    import psycopg

    url = _journal(pg_server, "journal_gap")
    study = optuna.create_study(study_name="gap", storage=make_storage(url))
    with psycopg.connect(libpq_url(url)) as conn:  # a worker that died inside its append
        conn.execute(f"SELECT nextval('{SEQUENCE}')")
        conn.rollback()
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    other = optuna.load_study(study_name="gap", storage=make_storage(url))
    assert [t.state for t in other.trials] == [TrialState.COMPLETE] * 2
    assert FILLER in PostgresJournalBackend(url).read_logs(0)


def test_report_and_dashboard_open_a_journal_study(pg_server: PostgresServer, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    url = _journal(pg_server, "journal_report")
    monkeypatch.setenv("OPTUNA_STORAGE", url)
    monkeypatch.setenv("OPTUNA_STUDY_NAME", "shown")
    assert tools_main(["create-study", "--direction", "maximize"]) == 0
    assert tools_main(["create-study"]) == 3  # exists; the sweep's job says --skip-if-exists
    assert tools_main(["create-study", "--skip-if-exists", "--direction", "maximize"]) == 0
    assert tools_main(["create-study", "--skip-if-exists"]) == 3  # minimize: not this study
    study = study_from_env()
    assert isinstance(study._storage, SweepJournalStorage)
    assert run_worker(lambda t: t.suggest_float("x", 0, 1), study=study, n_trials=5) == 5
    assert tools_main(["report", "--out", str(tmp_path / "r")]) == 0
    assert '"complete_trials": 5' in (tmp_path / "r" / "best_trial.json").read_text()
    (tmp_path / "a-file").write_text("")
    assert tools_main(["report", "--out", str(tmp_path / "a-file")]) == 3  # one line, not a traceback

    from optuna_dashboard import wsgi

    server = wsgiref.simple_server.make_server("127.0.0.1", 0, wsgi(make_storage(url)),
                                               handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        studies = httpx.get(f"{base}/api/studies", timeout=30).json()["study_summaries"]
        (shown,) = [s for s in studies if s["study_name"] == "shown"]
        detail = httpx.get(f"{base}/api/studies/{shown['study_id']}", timeout=30).json()
        assert len(detail["trials"]) == 5 and detail["best_trials"][0]["number"] == study.best_trial.number
    finally:
        server.shutdown()


def test_the_dashboard_command_serves_the_storage(pg_server: PostgresServer,
                                                  spawned: list[subprocess.Popen[bytes]]) -> None:
    from tests.pg import free_port

    url = _journal(pg_server, "journal_dash")
    optuna.create_study(study_name="dash", storage=make_storage(url))
    port = free_port()
    spawned.append(subprocess.Popen(
        [sys.executable, "-m", "runnerctl.optuna", "dashboard", "--port", str(port)],
        env={**os.environ, "PYTHONPATH": str(ROOT), "OPTUNA_STORAGE": url},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    deadline = time.monotonic() + 60
    while True:
        try:
            studies = httpx.get(f"http://127.0.0.1:{port}/api/studies", timeout=5).json()
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline, "the dashboard never answered"
            time.sleep(0.2)
    assert [s["study_name"] for s in studies["study_summaries"]] == ["dash"]


class _QuietHandler(wsgiref.simple_server.WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
        return


def test_url_kinds_and_moving_an_rdb_study_into_the_journal(
        pg_server: PostgresServer, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["postgres", "--dir", str(pg_server.config.base_dir), "--port", str(pg_server.config.port),
            "--config", str(defaults_toml(pg_server.config.base_dir))]
    assert cli_main([*args, "url", "moved"]) == 0
    journal_url = capsys.readouterr().out.strip()
    assert cli_main([*args, "url", "moved", "--kind", "rdb"]) == 0
    rdb_url = capsys.readouterr().out.strip()
    assert journal_url.startswith("journal+postgresql://moved:") and rdb_url.startswith("postgresql+psycopg://")
    assert libpq_url(journal_url) == libpq_url(rdb_url)  # one database, two kinds in it
    assert cli_main([*args, "url", "moved", "--kind", "sql"]) == 2
    assert "'sql' is not one of" in capsys.readouterr().err

    old = optuna.create_study(study_name="moved", storage=rdb_url, direction="maximize")  # plain Optuna
    old.optimize(lambda t: t.suggest_int("n", 0, 9), n_trials=3)
    assert cli_main([*args, "migrate-study", "moved"]) == 0
    assert capsys.readouterr().out.strip() == journal_url
    study = optuna.load_study(study_name="moved", storage=make_storage(journal_url))
    assert [(t.number, t.params, t.value) for t in study.trials] == \
        [(t.number, t.params, t.value) for t in old.trials]
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE
    assert run_worker(lambda t: t.suggest_int("n", 0, 9), study=study, n_trials=5) == 2
    assert len(optuna.load_study(study_name="moved", storage=rdb_url).trials) == 3  # left as it was
    assert run_worker(lambda t: t.suggest_int("n", 0, 9), n_trials=4,  # and still works there
                      study=optuna.load_study(study_name="moved", storage=make_storage(rdb_url))) == 1
    assert cli_main([*args, "migrate-study", "moved"]) == 3
    assert "already holds a study 'moved'" in capsys.readouterr().err
    assert cli_main([*args, "migrate-study", "absent_study"]) == 3
    assert "no database 'absent_study': no study 'absent_study' to move" in capsys.readouterr().err
    assert not (pg_server.config.secrets_dir / "absent_study.password").exists()  # it made one first

    assert cli_main([*args, "create-study", "fresh"]) == 0
    fresh = capsys.readouterr().out.strip()
    assert fresh.startswith("journal+postgresql://fresh:")
    assert optuna.load_study(study_name="fresh", storage=make_storage(fresh)).trials == []


def test_log_table_is_one_row_per_entry(pg_server: PostgresServer) -> None:
    import psycopg

    url = _journal(pg_server, "journal_rows")
    study = optuna.create_study(study_name="rows", storage=make_storage(url))
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    with psycopg.connect(libpq_url(url)) as conn:
        row = conn.execute(f"SELECT COUNT(*), MIN(id), MAX(id) FROM {LOG_TABLE}").fetchone()
    assert row is not None and row[0] == row[2] + 1 and row[1] == 0  # numbered 0..n-1, no gaps


def test_trial_counts_match_the_study_and_leave_out_one_number(pg_server: PostgresServer) -> None:
    """The admission check's counts, taken in place on the journal, agree with the trials."""
    url = _journal(pg_server, "journal_counts")
    storage = make_storage(url)
    study = optuna.create_study(study_name="counts", storage=storage)
    assert isinstance(storage, SweepJournalStorage)
    for state in (TrialState.COMPLETE, TrialState.RUNNING, TrialState.FAIL, TrialState.COMPLETE,
                  TrialState.RUNNING, TrialState.PRUNED):
        trial = study.ask()
        if state != TrialState.RUNNING:
            study.tell(trial, 1.0 if state == TrialState.COMPLETE else None, state=state)
    storage.expire()
    assert storage.count_states(study._study_id) == (2, 2)
    assert storage.count_states(study._study_id, exclude_number=0) == (1, 2)  # a COMPLETE one
    assert storage.count_states(study._study_id, exclude_number=4) == (2, 1)  # a RUNNING one
    assert storage.count_states(study._study_id, exclude_number=2) == (2, 2)  # a FAIL one


def test_a_gap_below_an_append_still_committing_is_waited_for_not_filled(
        pg_server: PostgresServer) -> None:
    """An append reads up to its own entry. When an earlier number's append has not
    committed yet, the reader waits for it (filling the number fails on it) and, in the
    same round trip, reads it: the entry, not a filler."""
    import psycopg

    url = _journal(pg_server, "journal_wait")
    backend = PostgresJournalBackend(url)
    backend.next_read = 0
    done: list[list[Any]] = []
    with psycopg.connect(libpq_url(url)) as slow, psycopg.connect(libpq_url(url), autocommit=True) as look:
        slow.execute(f"INSERT INTO {LOG_TABLE} (id, log) VALUES (nextval('{SEQUENCE}'), '{{\"slow\":1}}')")
        fast = threading.Thread(target=lambda: (backend.append_logs([{"fast": 1}]),
                                                done.append(backend.read_logs(0))))
        fast.start()
        deadline = time.monotonic() + 60
        while not look.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'transactionid'"
                               ).fetchone() == (1,):  # the fast append waits on the slow one
            assert time.monotonic() < deadline and fast.is_alive()
        slow.commit()
        fast.join(timeout=60)
    assert done == [[{"slow": 1}, {"fast": 1}]]
    assert FILLER not in PostgresJournalBackend(url).read_logs(0)


def test_several_numbers_that_never_committed_are_filled_at_once(pg_server: PostgresServer) -> None:
    import psycopg

    url = _journal(pg_server, "journal_gaps")
    backend = PostgresJournalBackend(url)
    backend.append_logs([{"first": 1}])
    with psycopg.connect(libpq_url(url)) as conn:  # three appends that died
        conn.execute(f"SELECT nextval('{SEQUENCE}'), nextval('{SEQUENCE}'), nextval('{SEQUENCE}')")
        conn.rollback()
    backend.next_read = 1
    backend.append_logs([{"last": 1}])
    assert backend.read_logs(1) == [FILLER, FILLER, FILLER, {"last": 1}]


def test_a_system_attribute_goes_with_the_next_write_and_is_read_back_at_once(
        pg_server: PostgresServer) -> None:
    """The sampler's system attribute and the first parameter: one statement, one round
    trip; a read in between sends it first, so the worker reads its own write."""
    url = _journal(pg_server, "journal_attrs")
    statements: list[str] = []

    def counting(conninfo: str) -> Any:
        import psycopg

        conn = psycopg.connect(conninfo, autocommit=True)
        execute = conn.execute
        conn.execute = lambda query, *args, **kw: (statements.append(str(query)),  # type: ignore[method-assign]
                                                   execute(query, *args, **kw))[1]
        return conn

    storage = SweepJournalStorage(PostgresJournalBackend(url, connect=counting), heartbeat_interval=60,
                                  grace_period=240, stale_trial_callback=None)
    study = optuna.create_study(study_name="attrs", storage=storage)
    trial_id = study.ask()._trial_id
    statements.clear()
    storage.set_trial_system_attr(trial_id, "sampled", "x=0.5")
    storage.set_trial_param(trial_id, "x", 0.5, optuna.distributions.FloatDistribution(0, 1))
    assert len(statements) == 1 and storage.get_trial(trial_id).system_attrs == {"sampled": "x=0.5"}
    storage.set_trial_system_attr(trial_id, "again", 1)
    assert storage.get_trial(trial_id).system_attrs["again"] == 1  # read back before any write
    other = optuna.load_study(study_name="attrs", storage=make_storage(url))
    assert other.trials[0].system_attrs == {"sampled": "x=0.5", "again": 1}
    assert other.trials[0].params == {"x": 0.5}


def test_a_grid_sweep_reads_its_own_system_attributes(pg_server: PostgresServer) -> None:
    """GridSampler writes a trial's grid point as system attributes and reads them back
    within the same trial's start."""
    url = _journal(pg_server, "journal_grid")
    grid = {"x": [0, 1, 2, 3]}
    study = optuna.create_study(study_name="grid", storage=make_storage(url),
                                sampler=optuna.samplers.GridSampler(grid, seed=1))
    study.optimize(lambda t: t.suggest_categorical("x", grid["x"]), n_trials=4)
    assert sorted(t.params["x"] for t in study.trials) == [0, 1, 2, 3]


def _terminate(pg_server: PostgresServer, pid: int) -> None:
    """The server ends a worker's connection, as in a restart."""
    import psycopg

    deadline = time.monotonic() + 60
    with psycopg.connect(libpq_url(pg_server.admin_url()), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            assert time.monotonic() < deadline


def test_writes_on_a_dropped_connection_are_sent_again_and_bad_values_fail_at_once(
        pg_server: PostgresServer) -> None:
    """A write, an attribute waiting for the next write and a read each go on over a new
    connection when the server dropped the old one; a value JSON cannot hold is refused
    by the call that sets it."""
    url = _journal(pg_server, "journal_attr_drop")
    storage = make_storage(url)
    assert isinstance(storage, SweepJournalStorage)
    study = optuna.create_study(study_name="drop", storage=storage)
    trial_id = study.ask()._trial_id
    with pytest.raises(TypeError):
        storage.set_trial_system_attr(trial_id, "bad", object())
    storage.set_trial_system_attr(trial_id, "first", 1)
    _terminate(pg_server, storage._journal._conn.info.backend_pid)
    storage.set_trial_param(trial_id, "x", 0.5, optuna.distributions.FloatDistribution(0, 1))  # raised before
    storage.set_trial_system_attr(trial_id, "second", 2)
    _terminate(pg_server, storage._journal._conn.info.backend_pid)
    assert storage.get_trial(trial_id).system_attrs == {"first": 1, "second": 2}  # read: reconnects
    other = optuna.load_study(study_name="drop", storage=make_storage(url))
    assert other.trials[0].system_attrs == {"first": 1, "second": 2} and other.trials[0].params == {"x": 0.5}


class _AnswerLost:
    """A connection whose next statement commits, and then the connection breaks before
    its answer arrives (a server or network failing at the worst moment)."""

    def __init__(self, conn: Any, armed: list[bool]) -> None:
        self._conn, self._armed = conn, armed

    def execute(self, query: Any, *args: Any, **kw: Any) -> Any:
        import psycopg

        cursor = self._conn.execute(query, *args, **kw)
        if self._armed and self._armed.pop():
            self._conn.close()
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return cursor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def test_an_append_whose_answer_was_lost_is_sent_again_and_appended_once(pg_server: PostgresServer) -> None:
    import psycopg

    url = _journal(pg_server, "journal_answer_lost")
    armed: list[bool] = []
    connects: list[int] = []

    def connect(conninfo: str) -> Any:
        connects.append(1)
        return _AnswerLost(psycopg.connect(conninfo, autocommit=True), armed)

    storage = SweepJournalStorage(PostgresJournalBackend(url, connect=connect), heartbeat_interval=60,
                                  grace_period=240, stale_trial_callback=None)
    study = optuna.create_study(study_name="lost", storage=storage)
    armed.append(True)
    study.ask()  # its creation committed, its answer lost: sent again on a new connection
    assert not armed and len(connects) == 2
    study.ask()
    other = optuna.load_study(study_name="lost", storage=make_storage(url))
    assert [t.number for t in other.trials] == [0, 1]  # a second copy would have made three


def test_a_worker_gives_up_reconnecting_after_its_limit_and_says_so_once(
        pg_server: PostgresServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import psycopg

    from runnerctl import optuna_journal

    url = _journal(pg_server, "journal_gone")
    refused: list[int] = []

    def connect(conninfo: str) -> Any:
        if refused:
            refused.append(1)
            raise psycopg.OperationalError("connection refused")
        return psycopg.connect(conninfo, autocommit=True)

    backend = PostgresJournalBackend(url, connect=connect)
    monkeypatch.setattr(optuna_journal, "RECONNECT_S", 2.0)
    refused.append(1)  # the server goes away for good
    _terminate(pg_server, backend._conn.info.backend_pid)
    with pytest.raises(psycopg.OperationalError, match="refused"):
        backend.read_logs(0)
    assert len(refused) > 2  # tried again meanwhile
    said = [r.getMessage() for r in caplog.records if "connecting again" in r.getMessage()]
    assert len(said) == 1 and "up to 2 s" in said[0]


def test_workers_go_on_through_a_server_restart_and_complete_the_exact_total() -> None:
    """`systemctl restart runnerctl-postgres` mid-sweep: every worker's connection is
    ended and the server is away for a while; the workers connect again and the study
    still gets exactly its trial count."""
    from tests.pg import running_server

    with running_server() as server:
        url = storage_url(server.create_database("restart"), "journal")
        optuna.create_study(study_name="restart", storage=make_storage(url))
        procs = _workers([url, url], "restart", 24, SEARCH_SLEEP_S="0.3")
        watcher = make_storage(url)
        deadline = time.monotonic() + 120
        while len(watcher.get_all_trials(0, deepcopy=False, states=(TrialState.COMPLETE,))) < 4:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), _finish(procs)
            time.sleep(0.05)
        watcher._journal.close()
        server.stop()
        server.start()
        results = _finish(procs)
        assert [code for code, _ in results] == [0, 0], results
        trials = optuna.load_study(study_name="restart", storage=make_storage(url)).trials
        assert Counter(t.state for t in trials)[TrialState.COMPLETE] == 24


def test_rdb_workers_go_on_through_a_server_restart_without_losing_a_trial() -> None:
    """The same restart on the RDB path (`--kind rdb`): Optuna's heartbeat thread died at its
    first failed beat (the live trial was later failed by another worker and run again)
    and a `tell` during the outage ended its worker with the trial RUNNING (found by a
    review as a researcher sweeping). Beats missed while the server is away are skipped,
    every other call is sent again."""
    from tests.pg import running_server

    with running_server() as server:
        url = storage_url(server.create_database("restart_rdb"), "rdb")
        optuna.create_study(study_name="restart", storage=make_storage(url))
        procs = _workers([url, url], "restart", 16, SEARCH_SLEEP_S="0.5",
                         RUNNERCTL_OPTUNA_HEARTBEAT_S="1", RUNNERCTL_OPTUNA_GRACE_S="30")
        watcher = make_storage(url)
        assert isinstance(watcher, RDBStorage)
        study_id = watcher.get_study_id_from_name("restart")
        deadline = time.monotonic() + 120
        while len(watcher.get_all_trials(study_id, deepcopy=False, states=(TrialState.COMPLETE,))) < 3:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), _finish(procs)
            time.sleep(0.05)
        watcher.engine.dispose()
        server.stop()
        time.sleep(2.0)  # away across at least one beat of every running trial
        server.start()
        results = _finish(procs)
        assert [code for code, _ in results] == [0, 0], results
        out = "\n".join(text for _, text in results)
        assert "Exception in thread" not in out and "the study's database is away" in out, out
        trials = optuna.load_study(study_name="restart", storage=make_storage(url)).trials
        states = Counter(t.state for t in trials)
        assert states[TrialState.COMPLETE] == 16 and states[TrialState.FAIL] == 0, states


@pytest.mark.parametrize("kind", ["journal", "rdb"])
def test_a_study_in_a_sql_ascii_database_keeps_japanese_text(pg_server: PostgresServer, kind: str) -> None:
    """A site's server made by `initdb` under LANG=C: psycopg read its text as bytes (found
    by a review as an internationalisation reviewer)."""
    import psycopg
    from psycopg import sql

    name = f"ascii_{kind}"
    url = storage_url(pg_server.create_database(name), kind)
    with psycopg.connect(libpq_url(pg_server.admin_url()), autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(name)))
        ident = sql.Identifier(name)
        admin.execute(sql.SQL("CREATE DATABASE {} ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' "
                              "TEMPLATE template0 OWNER {}").format(ident, ident))
    study = optuna.create_study(study_name="学習率", storage=make_storage(url))
    study.set_user_attr("メモ", "ファン交換 🔧")
    study.optimize(lambda t: t.suggest_categorical("opt", ["アダム", "sgd"]) == "sgd", n_trials=2)
    again = optuna.load_study(study_name="学習率", storage=make_storage(url))
    assert again.user_attrs == {"メモ": "ファン交換 🔧"} and len(again.trials) == 2
    assert {t.params["opt"] for t in again.trials} <= {"アダム", "sgd"}


def test_a_storage_url_libpq_cannot_read_is_one_line_without_its_password() -> None:
    """libpq quotes the part of a URL it cannot decode, which may be the password: it went
    into the job log in a ProgrammingError's traceback (found by a secrets audit)."""
    from runnerctl.errors import ConfigError
    from runnerctl.optuna_journal import _connect

    with pytest.raises(ConfigError) as caught:
        _connect("postgresql://optuna:pa%zzS3CRETpw@127.0.0.1:1/optuna")
    assert "S3CRETpw" not in str(caught.value) and "not one PostgreSQL reads" in str(caught.value)
