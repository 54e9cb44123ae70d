"""Optuna's journal storage on PostgreSQL: a study shared across hosts at the cost of a local file.

Optuna's `RDBStorage` keeps every trial as rows of a dozen tables and re-reads the
unfinished ones through SQLAlchemy's ORM several times per trial; at 16 workers on a
small host that CPU, not the database, caps the trial rate (benchmarks/RESULTS.md).
Optuna's `JournalStorage` instead keeps the whole study in memory and appends each
change to a log; a worker reads only the log entries that are new since its last read.
Its only backends are a file (one host: every worker must see the same file system
with working locks) and Redis. `PostgresJournalBackend` puts the log into one table of
the study's PostgreSQL database, so workers on any host share it:

- an entry's number comes from a sequence; one append is one statement, one round
  trip, that inserts the entry and returns every entry new to this worker (the journal
  reads right after each write). No lock is held across a commit, so concurrent
  appends share their WAL flushes (group commit);
- a reader takes entries up to the first missing number only (see `_read`): every
  worker replays the same entries in the same order, and after its own append it has
  seen every entry numbered before it, which the exact trial total relies on;
- a read is one indexed range query (`id >= n`), mostly empty.

Heartbeats, which Optuna implements only for RDBStorage, are rows of a second table
(trial id, last beat by the server's clock, so hosts' clocks do not matter; see
`record_heartbeat` for the first beat):
`SweepJournalStorage` records them and finds stale trials among the RUNNING ones of
its in-memory study; Optuna's `fail_stale_trials` then fails them in the journal (of two
workers failing the same trial, the journal's order keeps the first) and the retry
callback queues a copy. One connection per worker, shared by its heartbeat thread.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Container
from typing import Any

from optuna.storages import JournalStorage
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.storages.journal import BaseJournalBackend
from optuna.storages.journal._storage import JournalOperation
from optuna.trial import FrozenTrial, TrialState

from runnerctl.errors import ConfigError, first_line, redact
from runnerctl.postgres import JOURNAL_SCHEME as SCHEME
from runnerctl.postgres import libpq_url

# SCHEME: `journal+postgresql://ROLE:PASSWORD@HOST:PORT/DATABASE` is this storage, in the
# database that the same URL with `postgresql+psycopg://` names (Optuna's RDB tables may
# live beside it).
LOG_TABLE = "runnerctl_optuna_journal"
BEAT_TABLE = "runnerctl_optuna_heartbeats"
APPEND_TABLE = "runnerctl_optuna_appends"
CONNECT_TIMEOUT_S = 10
RECONNECT_S = 120.0
"""How long a worker whose connection was lost (a server restart) tries to connect again
before it gives up; the first connection fails at once."""
log = logging.getLogger(__name__)

SEQUENCE = "runnerctl_optuna_journal_ids"
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {LOG_TABLE} (id bigint PRIMARY KEY, log text NOT NULL);
CREATE SEQUENCE IF NOT EXISTS {SEQUENCE} MINVALUE 0 START WITH 0;
CREATE TABLE IF NOT EXISTS {BEAT_TABLE} (trial_id bigint PRIMARY KEY, beat timestamptz NOT NULL);
CREATE TABLE IF NOT EXISTS {APPEND_TABLE} (append_id uuid PRIMARY KEY);
"""
_ONCE = f"{APPEND_TABLE}_pkey"


def _insert(count: int) -> str:
    """One statement appending `count` entries, numbered in the order given (a VALUES list
    is evaluated row by row, so each row's nextval follows the one before)."""
    rows = ", ".join([f"(nextval('{SEQUENCE}'), %s)"] * count)
    return f"INSERT INTO {LOG_TABLE} (id, log) VALUES {rows} RETURNING id"


_ONCE_CTE = f"once AS (INSERT INTO {APPEND_TABLE} (append_id) VALUES (%s))"
"""The append's own id, inserted by the same statement: a second try of an append that
committed fails on it (`_ONCE`) and appends nothing, so an append is sent again safely."""


def _append(count: int, *, read: bool) -> str:
    """`_insert` with its id, and with `read`, in the same statement, every entry from a
    number on (own entries come back as NULL: the caller has their text)."""
    if not read:
        return f"WITH {_ONCE_CTE} {_insert(count)}"
    return (f"WITH {_ONCE_CTE}, mine AS ({_insert(count)}) SELECT id, NULL FROM mine "
            f"UNION ALL SELECT id, log FROM {LOG_TABLE} WHERE id >= %s ORDER BY 1")


_READ = f"SELECT id, log FROM {LOG_TABLE} WHERE id >= %s ORDER BY id"
_FILL = (f"INSERT INTO {LOG_TABLE} (id, log) SELECT n, %s FROM unnest(%s::bigint[]) AS n "
         "ON CONFLICT (id) DO NOTHING")
FILLER = {"op_code": 3, "worker_id": "runnerctl-gap", "study_id": -1, "system_attr": {}}
"""What fills the number of an append that never committed: an entry Optuna's replay skips
(an attribute of a study that does not exist, from no worker)."""
MAX_TRIES = 20
_FILLER_TEXT = json.dumps(FILLER, separators=(",", ":"))
_BEAT = (f"INSERT INTO {BEAT_TABLE} (trial_id, beat) VALUES (%s, now()) "
         "ON CONFLICT (trial_id) DO UPDATE SET beat = EXCLUDED.beat")
_STALE = (f"WITH seen AS (INSERT INTO {BEAT_TABLE} (trial_id, beat) SELECT unnest(%s::bigint[]), now() "
          "ON CONFLICT (trial_id) DO NOTHING) "
          f"SELECT trial_id FROM {BEAT_TABLE} WHERE trial_id = ANY(%s) "
          "AND beat < now() - make_interval(secs => %s)")


def is_journal_url(url: str) -> bool:
    return url.startswith(SCHEME + "://")


class PostgresJournalBackend(BaseJournalBackend):
    """Optuna's journal as an append-only table of a PostgreSQL database.

    Thread-safe (one connection behind a lock): JournalStorage calls it under its own
    lock, the heartbeat thread beside that. A call on a connection the server dropped (a
    restart) is tried again on a new one, for up to `RECONNECT_S` while the server is
    away; an append too, since its id makes a second copy of one that committed append
    nothing.
    """

    def __init__(self, url: str, *, connect: Callable[[str], Any] | None = None) -> None:
        if not is_journal_url(url):
            raise ConfigError(f"not a {SCHEME}:// URL: {url.split('://', 1)[0]!r}")
        self._url = libpq_url(url)
        self._connect = connect or _connect
        self._lock = threading.Lock()
        self._conn: Any = None
        self._prefetched: tuple[int, list[dict[str, Any]]] | None = None
        self._beating: set[int] = set()
        self.next_read: int | None = None
        """The log number the journal reads from next (SweepJournalStorage keeps it up to
        date after each read); None: do not read ahead on append."""
        with self._lock:
            self._ensure_schema()

    # -- BaseJournalBackend ---------------------------------------------------------------
    def read_logs(self, log_number_from: int) -> list[dict[str, Any]]:
        with self._lock:
            prefetched, self._prefetched = self._prefetched, None
            if prefetched is not None and prefetched[0] == log_number_from:
                return prefetched[1]  # read with this worker's last append, one round trip ago
            logs: list[dict[str, Any]] = self._retrying(lambda conn: self._read(conn, log_number_from, None))
            return logs

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        """Append in order in one statement, then read everything new since this worker's
        last read, in the same round trip."""
        import psycopg

        if not logs:
            return
        texts = [json.dumps(entry, separators=(",", ":")) for entry in logs]
        append_id = uuid.uuid4()

        def append(conn: Any) -> bool:
            """True once appended (here or by a try whose answer was lost)."""
            try:
                if self.next_read is None:
                    conn.execute(_append(len(texts), read=False), [append_id, *texts])
                    return True
                rows = conn.execute(_append(len(texts), read=True),
                                    [append_id, *texts, self.next_read]).fetchall()
            except psycopg.errors.UniqueViolation as exc:
                # ours: an earlier try committed; else a reader filled one of our numbers
                # as we took it: take others
                return exc.diag.constraint_name == _ONCE
            own = iter(texts)
            rows = [(i, next(own) if entry is None else entry) for i, entry in rows]
            self._prefetched = (self.next_read, self._read(conn, self.next_read, rows))
            return True

        with self._lock:
            for _ in range(MAX_TRIES):
                if self._retrying(append):
                    return
            raise RuntimeError(f"no free log number after {MAX_TRIES} tries")

    def _read(self, conn: Any, start: int, rows: list[tuple[int, str]] | None) -> list[dict[str, Any]]:
        """The entries from `start` on that every worker reads alike: up to the first gap.

        Numbers are taken in order but committed in any order, so number N may be missing
        while N+1 is there: its append is still committing, or it failed. Inserting a
        filler at N waits for that append's end and does nothing when it committed; when
        it failed, the filler takes N, and every worker reads the same entries in the
        same order either way. Every missing number below the highest one read is filled
        by one statement, sent with the read after it in one round trip (a pipeline: the
        read's snapshot is taken once the fill has waited). The entries after the last
        gap come at the next read.
        """
        out: list[dict[str, Any]] = []
        if rows is None:
            rows = conn.execute(_READ, (start,)).fetchall()
        for _ in range(MAX_TRIES):
            expect = start + len(out)
            numbers = [number for number, _text in rows if number >= expect]
            missing = sorted(set(range(expect, max(numbers, default=expect - 1) + 1)) - set(numbers))
            for number, text in rows:
                if number < expect:
                    continue
                if number > expect:
                    break
                out.append(json.loads(text))
                expect += 1
            if not missing:
                return out
            with conn.pipeline():
                conn.execute(_FILL, (_FILLER_TEXT, missing))
                cursor = conn.execute(_READ, (expect,))
            rows = cursor.fetchall()
        return out

    # -- heartbeats -----------------------------------------------------------------------
    def record_heartbeat(self, trial_id: int) -> None:
        """A beat of a RUNNING trial; the first one (as its trial starts) is not written.

        A trial shorter than one heartbeat interval then costs no heartbeat write (a
        durable commit: most of the server's CPU per statement). A trial without a row
        is given one, beating "now", by the first worker that looks for stale trials and
        sees it RUNNING: one that never beats is stale a grace period after that.
        """
        with self._lock:
            if trial_id not in self._beating:
                self._beating.add(trial_id)
                return
            self._retrying(lambda conn: conn.execute(_BEAT, (trial_id,)))

    def stale_trial_ids(self, trial_ids: list[int], grace_period_s: int) -> list[int]:
        """Those of `trial_ids` whose last heartbeat is older than the grace period."""
        if not trial_ids:
            return []
        with self._lock:
            rows = self._retrying(lambda conn: conn.execute(
                _STALE, (trial_ids, trial_ids, grace_period_s)).fetchall())
        return [int(row[0]) for row in rows]

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -- the connection -------------------------------------------------------------------
    def _connection(self) -> Any:
        """The connection; one the server dropped is replaced, trying for up to
        `RECONNECT_S` while the server is away (a restart), saying so once."""
        import psycopg

        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            return self._conn
        lost, self._conn = self._conn is not None, None
        if not lost:
            self._conn = self._connect(self._url)
            return self._conn
        deadline, wait, said = time.monotonic() + RECONNECT_S, 0.5, False
        while True:
            try:
                self._conn = self._connect(self._url)
            except (ConfigError, psycopg.OperationalError) as exc:
                if time.monotonic() + wait > deadline:
                    raise
                if not said:
                    log.warning("lost the connection to the study's PostgreSQL; connecting again for up "
                                "to %.0f s (%s)", RECONNECT_S, str(exc).splitlines()[0] if str(exc) else exc)
                    said = True
                time.sleep(wait)
                wait = min(2 * wait, 5.0)
                continue
            if said:
                log.warning("connected to the study's PostgreSQL again")
            return self._conn

    def _retrying(self, call: Callable[[Any], Any]) -> Any:
        """`call(connection)`, on a new connection again while the server drops it."""
        import psycopg

        for attempt in range(MAX_TRIES):
            conn = self._connection()
            try:
                return call(conn)
            except psycopg.OperationalError:
                if attempt + 1 == MAX_TRIES or not (conn.closed or conn.broken):
                    raise  # a failed statement on a good connection, not a lost one
        raise AssertionError("unreachable")

    def _ensure_schema(self) -> None:
        conn = self._connection()
        found = conn.execute("SELECT to_regclass(%s), to_regclass(%s), to_regclass(%s), to_regclass(%s)",
                             (LOG_TABLE, BEAT_TABLE, SEQUENCE, APPEND_TABLE)).fetchone()
        if found is not None and None not in found:
            return
        with conn.transaction():  # workers starting together: one creates, the others wait
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (LOG_TABLE,))
            conn.execute(_SCHEMA)


def _connect(url: str) -> Any:
    import psycopg

    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.OperationalError as exc:
        message = (str(exc).strip().splitlines() or [str(exc)])[0]
        raise ConfigError(f"cannot reach the study's PostgreSQL: {redact(message)}",
                          hint="check the storage URL and that the server runs "
                               "(`runnerctl postgres status`)") from None
    except psycopg.Error as exc:  # a URL libpq cannot read: its message may quote the password
        raise ConfigError(f"the study's storage URL is not one PostgreSQL reads: {redact(first_line(exc))}",
                          hint="percent-encode special characters in the password") from None


class SweepJournalStorage(JournalStorage, BaseHeartbeat):
    """JournalStorage with heartbeats kept beside the log in PostgreSQL, reading less often.

    Optuna's JournalStorage reads the log before every call, about ten times per trial
    (the sampler alone asks for the study's trials three times). Here the trial reads
    (`get_all_trials`, `get_trial`) read the log at most once per `refresh_s`, like the
    RDB path's `SweepStorage`: the sampler sees other workers' trials up to that much
    later. Every write still reads everything new in the same round trip, so after
    creating a trial a worker sees every trial created before it (which the exact
    total relies on), and a trial's state is decided by the log's order, as before.
    Stale trials are looked for at most once per heartbeat interval (a trial is stale
    only after a grace period of several intervals anyway).
    """

    def __init__(self, backend: PostgresJournalBackend, *, heartbeat_interval: int, grace_period: int,
                 stale_trial_callback: Callable[..., None] | None, refresh_s: float = 1.0) -> None:
        self.heartbeat_interval, self.grace_period = heartbeat_interval, grace_period
        self.refresh_s = refresh_s
        self._stale_callback = stale_trial_callback
        self._stale_checked_at: dict[int, float] = {}
        self._synced_at = -1e9
        self._journal = backend
        self._unsent: list[dict[str, Any]] = []
        super().__init__(backend)

    def _write_log(self, op_code: int, extra_fields: dict[str, Any]) -> None:
        log = {"op_code": op_code, "worker_id": self._replay_result.worker_id, **extra_fields}
        self._journal.append_logs([*self._unsent, log])
        self._unsent = []  # kept when the append failed: sent again with the next one

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        """Sent with this worker's next write or read, not on its own.

        The TPE sampler (constant liar) writes a trial's sampled parameters as a system
        attribute just before the objective's first `suggest_*` writes the first of them:
        sending both in one statement saves a round trip and a commit per trial. Any
        read of the study sends it first, so this worker reads its own writes as before.
        A value JSON cannot hold is refused here, as Optuna's journal does. An attribute
        is sent until an append carrying it succeeds; a second copy of it changes
        nothing. One thing moves: when the trial was finished elsewhere meanwhile (taken
        for dead), the error comes from the next write of this thread, not from here.
        """
        log = {"op_code": JournalOperation.SET_TRIAL_SYSTEM_ATTR, "trial_id": trial_id,
               "system_attr": {key: value}}
        json.dumps(value)  # TypeError now, not at some later call
        with self._thread_lock:
            self._unsent.append({**log, "worker_id": self._replay_result.worker_id})

    def _sync_with_backend(self) -> None:
        if self._unsent:  # reads what is new in the same round trip
            self._journal.append_logs(self._unsent)
            self._unsent = []
        super()._sync_with_backend()
        self._journal.next_read = self._replay_result.log_number_read
        self._synced_at = time.monotonic()

    def _sync_if_old(self) -> None:
        if self._unsent or time.monotonic() - self._synced_at >= self.refresh_s:
            self._sync_with_backend()

    def expire(self) -> None:
        """Make the next trial read go to the database (a worker's last look at the study)."""
        self._synced_at = -1e9

    def get_all_trials(self, study_id: int, deepcopy: bool = True,
                       states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        with self._thread_lock:
            self._sync_if_old()
            trials = self._replay_result.get_all_trials(study_id, states)
            return copy.deepcopy(trials) if deepcopy else trials

    def count_states(self, study_id: int, *, exclude_number: int = -1) -> tuple[int, int]:
        """(COMPLETE, RUNNING) trials of the study but number `exclude_number`, counted in
        place (a trial's number is its place in the study's list): the worker's admission
        check asks three times per trial, and copying the trial list each time cost
        more than the storage."""
        with self._thread_lock:
            self._sync_if_old()
            replay = self._replay_result
            trials = replay._trials
            complete = running = 0
            for number, trial_id in enumerate(replay._study_id_to_trial_ids[study_id]):
                state = trials[trial_id].state
                if state == TrialState.COMPLETE:
                    complete += number != exclude_number
                elif state == TrialState.RUNNING:
                    running += number != exclude_number
            return complete, running

    def get_trial(self, trial_id: int) -> FrozenTrial:
        with self._thread_lock:
            self._sync_if_old()
            if trial_id not in self._replay_result._trials:
                self._sync_with_backend()  # created elsewhere since: read now, not later
            return self._replay_result.get_trial(trial_id)

    # -- BaseHeartbeat --------------------------------------------------------------------
    def record_heartbeat(self, trial_id: int) -> None:
        self._journal.record_heartbeat(trial_id)

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        now = time.monotonic()
        if now - self._stale_checked_at.get(study_id, -1e9) < self.heartbeat_interval:
            return []
        self._stale_checked_at[study_id] = now
        with self._thread_lock:
            self._sync_with_backend()  # trials just finished are not taken for stale
            running = self._replay_result.get_all_trials(study_id, (TrialState.RUNNING,))
        return self._journal.stale_trial_ids([t._trial_id for t in running], self.grace_period)

    def get_heartbeat_interval(self) -> int | None:
        return self.heartbeat_interval

    def get_heartbeat_stale_trial_callback(self) -> Callable[..., None] | None:
        return self._stale_callback

    def get_failed_trial_callback(self) -> Callable[..., None] | None:
        """The name Optuna before 4.9 asks for."""
        return self._stale_callback

