"""What the controller must not forget: events, admin toggles, drains, claims, gate state.

SQLite in the state dir for one host (the default); PostgreSQL (psycopg 3) when hosts
share a URL, so that they agree on who drains for which pending job. Every write is
one short transaction, so a controller killed at any point leaves a consistent store;
on restart the loop reads drains, toggles, claims and the gate back from here.

A claim is a row `(job_id, host, expires_at)`: a host may take it when it is free,
expired or already its own (one atomic upsert), and renews it every tick while it
drains for that job.

The schema is versioned (controller/migrations.py): every opener brings it to the newest
version under a lock, so any number of hosts may start together.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from runnerctl import private
from runnerctl.controller.migrations import MIGRATIONS, Migration, StoreError, has_tables, migrate
from runnerctl.controller.store_db import Cursor, close_quietly, db_errors, describe_url, first_line

__all__ = ["Event", "Migration", "Store", "StoreError", "Toggle", "WebSession"]
log = logging.getLogger(__name__)

@dataclasses.dataclass(frozen=True)
class Toggle:
    """An admin's pause/drain of a GPU (`gpu:3`), a slot (`slot:gpu0-3`) or the `host`."""

    host: str
    target: str
    action: str  # pause | drain
    who: str
    at: float
    why: str


@dataclasses.dataclass(frozen=True)
class WebSession:
    """A signed-in browser: `key` is the SHA-256 of the id in its cookie (a copy of the
    store does not sign anyone in); `checked_at`: when a GitLab role was last read."""

    key: str
    name: str
    via: str  # local | gitlab
    role: str
    gitlab_id: int | None
    created_at: float
    checked_at: float
    expires_at: float


@dataclasses.dataclass(frozen=True)
class Event:
    at: float
    host: str
    kind: str
    subject: str
    detail: str


KEEPALIVE_IDLE_S = 30
"""A PostgreSQL connection quiet this long is probed (TCP keepalive), every 10 s, 3 times."""


def pg_params(conninfo: str, timeout_s: float) -> dict[str, Any]:
    """libpq parameters of a store connection: the URL's own, and where it sets none, limits
    so that no call waits for ever. A statement or a lock wait longer than `timeout_s`
    fails (`statement_timeout`, `lock_timeout`: a host holding a lock, a server that
    stopped answering mid-query), and so does a connection whose server vanished
    (keepalives; `tcp_user_timeout` for data left unacknowledged): without them a
    partitioned server held the loop, and every web request behind the store's lock,
    until the kernel gave up, hours later. The store reconnects at the next transaction.
    `PGOPTIONS` is kept where the URL sets no `options` (libpq reads it only then). Text
    goes as UTF-8 whatever the database's encoding: psycopg took a SQL_ASCII database's
    (what `initdb` makes under LANG=C) text for bytes, and the store failed at its first
    query (`operator does not exist: text = bytea`; found by a review as an
    internationalisation reviewer). `application_name` names runnerctl and its host in
    `pg_stat_activity` (where it was blank beside Optuna's and everyone's)."""
    from psycopg.conninfo import conninfo_to_dict

    params: dict[str, Any] = conninfo_to_dict(conninfo)
    limit_ms = max(1000, int(timeout_s * 1000))
    for name, value in (("connect_timeout", max(1, int(timeout_s))), ("keepalives", 1),
                        ("keepalives_idle", KEEPALIVE_IDLE_S), ("keepalives_interval", 10),
                        ("keepalives_count", 3), ("tcp_user_timeout", limit_ms),
                        ("client_encoding", "UTF8"),
                        ("application_name", f"runnerctl@{socket.gethostname()}")):
        params.setdefault(name, value)
    options = str(params.get("options", os.environ.get("PGOPTIONS", "")))
    for setting in ("statement_timeout", "lock_timeout"):
        if setting not in options:
            options = f"{options} -c {setting}={limit_ms}".strip()
    if "plan_cache_mode" not in options:  # psycopg prepares a statement run 5 times; its generic
        # plan read `events` whole for a quiet host's newest event (hosts(), every 2 s: 80 ms at
        # a million events, 0.1 ms planned for the value; found by a review as a DBA)
        options = f"{options} -c plan_cache_mode=force_custom_plan"
    params["options"] = options
    return params


def _missing_table(exc: BaseException) -> bool:
    """PostgreSQL's undefined_table (42P01), SQLite's "no such table"."""
    return getattr(exc, "sqlstate", None) == "42P01" or str(exc).startswith("no such table")


DEADLINE_GRACE_S = 15.0
"""A PostgreSQL transaction is cut this long after the server's own statement timeout
would have ended it (`Store.deadline_s`)."""

RETIRED = "retired"
"""The event `retire_host` records: the host left the fleet."""


class _Watchdog:
    """One thread per store that calls `on_expiry` when a transaction outlives its
    deadline. A `threading.Timer` per transaction started a thread for each, some eight
    a tick and one per page read, about 130,000 a day (found by a review hunting leaks in
    a long-running serve). Started at the first `arm`, again if it ever ended."""

    def __init__(self, on_expiry: Callable[[], None]) -> None:
        self._on_expiry = on_expiry
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float) -> None:
        with self._cond:
            self._deadline = time.monotonic() + seconds
            self._closed = False  # a store used again after close() is watched again
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="store-watchdog", daemon=True)
                self._thread.start()
            self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._deadline = None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                left = None if self._deadline is None else self._deadline - time.monotonic()
                if left is None or left > 0:
                    self._cond.wait(left)
                    continue
                self._deadline = None
                self._cond.release()
                try:
                    self._on_expiry()
                except Exception:  # noqa: BLE001 (said, and the next transaction is watched again)
                    log.exception("the store's deadline could not cut its connection")
                finally:
                    self._cond.acquire()

class Store:
    """One store API over SQLite or PostgreSQL; only the placeholders differ.

    `connect()` opens the connection; a PostgreSQL connection that broke (the server
    restarted: `AdminShutdown`) is dropped and opened again by the next transaction, so a
    long-running `serve` heals once the server is back. Database failures surface as
    `StoreError` (one line for the CLI; the loop logs it and retries the tick)."""

    def __init__(self, connect: Callable[[], Any], *, postgres: bool, where: str,
                 migrations: Sequence[Migration] = MIGRATIONS, upgrade: bool = True,
                 deadline_s: float | None = None) -> None:
        self._connect = connect
        self._pg = postgres
        self.deadline_s = deadline_s
        """PostgreSQL: a transaction still waiting this long has its connection cut
        (`_cut`). The server's own timeouts need a server that runs, and keepalives a
        kernel that answers: a stopped one (SIGSTOP, storage hung) held the loop, silent,
        and every web read behind the lock, for as long as it stayed stopped."""
        self._cut_off = False  # the last transaction's connection was cut by the deadline
        self._watchdog = _Watchdog(self._cut)
        self.where = where  # for messages: the SQLite path or PostgreSQL host/db, never a password
        self._lock = threading.Lock()  # the web thread and the loop share one connection
        self._conn: Any = None
        self._migrations, self._upgrade = migrations, upgrade
        self._schema_gone = False  # a table was missing: the next transaction looks why first
        with self._tx() as cur:
            self.version = migrate(cur, postgres=postgres, migrations=migrations, upgrade=upgrade)

    @classmethod
    def open(cls, *, url: str = "", state_dir: Path | None = None, timeout_s: float = 30.0,
             migrations: Sequence[Migration] = MIGRATIONS, upgrade: bool = True) -> Store:
        """PostgreSQL when `url` is set (libpq's form, or SQLAlchemy's as `runnerctl
        postgres url` prints it), else SQLite at <state_dir>/controller.sqlite. `timeout_s`
        bounds waiting for a lock (SQLite), and for a connection, a statement or a lock
        on PostgreSQL (`pg_params`). Without `upgrade` an older store is refused, not
        migrated (`migrate`)."""
        if url:
            import psycopg

            from runnerctl.postgres import libpq_url

            conninfo = libpq_url(url)
            return cls(lambda: psycopg.connect(**pg_params(conninfo, timeout_s), autocommit=True),
                       postgres=True, where=describe_url(url), migrations=migrations, upgrade=upgrade,
                       deadline_s=timeout_s + DEADLINE_GRACE_S)
        if state_dir is None:
            raise ValueError("a store needs a PostgreSQL URL or a state directory")
        try:
            private.state_dir(state_dir)
            private.create_private_file(state_dir / "controller.sqlite")  # its -wal/-shm take its mode
        except OSError as exc:
            raise StoreError(f"cannot create the state directory {state_dir}: {exc.strerror}") from None
        path = state_dir / "controller.sqlite"

        def connect() -> sqlite3.Connection:
            conn = sqlite3.connect(path, timeout=timeout_s, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            return conn

        return cls(connect, postgres=False, where=str(path), migrations=migrations, upgrade=upgrade)

    def server_time(self) -> float | None:
        """The PostgreSQL server's clock (Unix seconds), the one clock every host sharing
        the store reads; None for SQLite (one host's file, its own clock)."""
        if not self._pg:
            return None
        with self._tx() as cur:
            return float(cur.query("SELECT extract(epoch FROM clock_timestamp())", ())[0][0])

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        self._watchdog.close()

    @contextmanager
    def _tx(self) -> Iterator[Cursor]:
        with self._lock:
            self._cut_off = False
            watched = self._pg and self.deadline_s is not None
            if watched:
                self._watchdog.arm(self.deadline_s or 0.0)
            try:
                cur = self._begin()
                remade = False
                try:
                    if self._schema_gone:
                        remade = self._make_schema_again(cur)
                    yield cur
                except BaseException as exc:
                    self._rollback()
                    if isinstance(exc, db_errors()):
                        self._schema_gone = self._schema_gone or _missing_table(exc)
                        raise self._error(exc) from None
                    raise
                try:
                    cur.execute("COMMIT")
                except db_errors() as exc:
                    self._rollback()
                    raise self._error(exc) from None
                if remade:
                    self._schema_gone = False
                    log.warning("the controller store %s had lost its tables (dropped, or restored empty?): "
                                "made them again; what it held (toggles, users, history) is gone", self.where)
            finally:
                if watched:
                    self._watchdog.disarm()

    def _make_schema_again(self, cur: Cursor) -> bool:
        """A table was missing at the last transaction. With none left (the database dropped
        and made again, or restored from an empty dump, under a running serve, which then
        failed every tick with `relation "toggles" does not exist` until restarted; found by
        a review as a disaster-recovery engineer), the schema is made again in this
        transaction: True. With some left (another host made them again meanwhile, or a part
        was dropped by hand, which only a restore mends), nothing is made: False."""
        if has_tables(cur, postgres=self._pg, besides=()):
            self._schema_gone = False
            return False
        self.version = migrate(cur, postgres=self._pg, migrations=self._migrations, upgrade=self._upgrade)
        return True

    def _cut(self) -> None:
        """The deadline passed (a watchdog thread): shut the connection's socket down, so
        the call blocked on it fails now (and the store reconnects at the next one)."""
        conn = self._conn
        if conn is None:  # still connecting: libpq's connect_timeout ends that
            return
        self._cut_off = True
        try:
            with socket.socket(fileno=os.dup(conn.fileno())) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        except (OSError, ValueError):  # closed meanwhile
            pass

    def _begin(self) -> Cursor:
        """A cursor in a new transaction; a connection found broken at BEGIN (nothing done
        yet) is replaced once."""
        for attempt in (1, 2):
            try:
                if self._conn is None:
                    self._conn = self._connect()
                cur = Cursor(self._conn.cursor(), self._pg)
                cur.execute("BEGIN" if self._pg else "BEGIN IMMEDIATE")
                return cur
            except db_errors() as exc:
                broken = self._drop_if_broken()
                if attempt == 2 or not broken:
                    raise self._error(exc) from None
        raise AssertionError("unreachable")

    def _rollback(self) -> None:
        conn = self._conn
        if conn is None or self._drop_if_broken():
            return
        if not self._pg and not conn.in_transaction:
            return
        try:
            conn.execute("ROLLBACK")
        except db_errors() as exc:  # the connection is unusable: start over next time
            log.warning("rolling back on the controller store failed (%s); reconnecting", first_line(exc))
            self._conn = None
            close_quietly(conn)

    def _drop_if_broken(self) -> bool:
        """True (and the connection forgotten) when it cannot be used again."""
        conn = self._conn
        if conn is None:
            return True
        if self._pg and (conn.closed or conn.broken):
            self._conn = None
            close_quietly(conn)
            return True
        return False

    def _error(self, exc: BaseException) -> StoreError:
        what = first_line(exc)
        if self._cut_off:
            return StoreError(f"the controller store {self.where} did not answer within "
                              f"{self.deadline_s:.0f} s (a stopped or hung server?); the connection "
                              f"was dropped: {what}")
        if "locked" in what or "busy" in what:
            return StoreError(f"the controller store {self.where} is busy: {what}",
                              hint="another process holds its write lock; try again")
        return StoreError(f"the controller store {self.where} failed: {what}")

    # -- events --------------------------------------------------------------------
    def record(self, event: Event) -> None:
        with self._tx() as cur:
            cur.execute("INSERT INTO events (at, host, kind, subject, detail) VALUES (?, ?, ?, ?, ?)",
                        (event.at, event.host, event.kind, event.subject, event.detail))

    def events(self, host: str, limit: int = 100) -> list[Event]:
        with self._tx() as cur:
            rows = cur.query("SELECT at, host, kind, subject, detail FROM events WHERE host = ? "
                             "ORDER BY id DESC LIMIT ?", (host, limit))
        return [Event(float(r[0]), r[1], r[2], r[3], r[4]) for r in rows]

    # -- toggles -------------------------------------------------------------------
    def set_toggle(self, toggle: Toggle) -> None:
        with self._tx() as cur:  # one statement: a DELETE then INSERT raced another writer's (duplicate key)
            cur.execute("INSERT INTO toggles (host, target, action, who, at, why) VALUES (?, ?, ?, ?, ?, ?) "
                        "ON CONFLICT (host, target) DO UPDATE SET action = excluded.action, "
                        "who = excluded.who, at = excluded.at, why = excluded.why",
                        dataclasses.astuple(toggle))

    def clear_toggles(self, host: str, target: str | None = None) -> int:
        """Remove one target's toggle, or every toggle of the host; returns how many."""
        with self._tx() as cur:
            if target is None:
                return cur.execute("DELETE FROM toggles WHERE host = ?", (host,))
            return cur.execute("DELETE FROM toggles WHERE host = ? AND target = ?", (host, target))

    def clear_toggle(self, toggle: Toggle) -> bool:
        """Remove this very toggle (not one set on its target since it was read)."""
        with self._tx() as cur:
            return bool(cur.execute("DELETE FROM toggles WHERE host = ? AND target = ? AND action = ? "
                                    "AND who = ? AND at = ?", (toggle.host, toggle.target, toggle.action,
                                                               toggle.who, toggle.at)))

    def toggles(self, host: str) -> list[Toggle]:
        with self._tx() as cur:
            rows = cur.query("SELECT host, target, action, who, at, why FROM toggles WHERE host = ? "
                             "ORDER BY target", (host,))
        return [Toggle(r[0], r[1], r[2], r[3], float(r[4]), r[5]) for r in rows]

    # -- drains (block -> the job it drains for) -------------------------------------
    def save_drains(self, host: str, drains: Mapping[str, int], now: float) -> None:
        with self._tx() as cur:
            old = dict(cur.query("SELECT slot, job_id FROM drains WHERE host = ?", (host,)))
            if old == dict(drains):
                return
            cur.execute("DELETE FROM drains WHERE host = ?", (host,))
            for slot, job in drains.items():
                cur.execute("INSERT INTO drains (host, slot, job_id, since) VALUES (?, ?, ?, ?)",
                            (host, slot, job, now))

    def drains(self, host: str) -> dict[str, int]:
        with self._tx() as cur:
            return {r[0]: int(r[1]) for r in cur.query(
                "SELECT slot, job_id FROM drains WHERE host = ?", (host,))}

    def save_protected(self, host: str, jobs: Iterable[int]) -> None:
        """The pending jobs no later job may delay (plan.py's L1 protection)."""
        wanted = set(jobs)
        with self._tx() as cur:
            stored = {int(r[0]) for r in cur.query("SELECT job_id FROM protected WHERE host = ?", (host,))}
            if stored == wanted:
                return
            cur.execute("DELETE FROM protected WHERE host = ?", (host,))
            for job in sorted(wanted):
                cur.execute("INSERT INTO protected (host, job_id) VALUES (?, ?)", (host, job))

    def protected(self, host: str) -> frozenset[int]:
        with self._tx() as cur:
            return frozenset(int(r[0]) for r in cur.query("SELECT job_id FROM protected WHERE host = ?",
                                                           (host,)))

    # -- claims ----------------------------------------------------------------------
    def claim(self, job_id: int, host: str, *, now: float, ttl_s: float) -> bool:
        """Take or renew the claim on a pending job; False when another host holds it."""
        with self._tx() as cur:
            rows = cur.query(
                "INSERT INTO claims (job_id, host, expires_at) VALUES (?, ?, ?) "
                "ON CONFLICT (job_id) DO UPDATE SET host = excluded.host, expires_at = excluded.expires_at "
                "WHERE claims.host = excluded.host OR claims.expires_at < ? RETURNING host",
                (job_id, host, now + ttl_s, now))
        return bool(rows)

    def release_claims(self, host: str, keep: Sequence[int] = ()) -> None:
        """Drop this host's claims but `keep`'s, in one statement: a read of them then a
        delete by job deleted a lapsed claim another host had taken in between (found by a
        review as a DBA), and a third host could drain for the job too."""
        kept = sorted({int(job) for job in keep})
        unless = f" AND job_id NOT IN ({', '.join('?' * len(kept))})" if kept else ""
        with self._tx() as cur:
            cur.execute(f"DELETE FROM claims WHERE host = ?{unless}", (host, *kept))  # noqa: S608 - placeholders

    def claims(self, now: float) -> dict[int, str]:
        """Unexpired claims: job id -> host."""
        with self._tx() as cur:
            return {int(r[0]): r[1] for r in cur.query(
                "SELECT job_id, host FROM claims WHERE expires_at >= ?", (now,))}

    # -- gate ----------------------------------------------------------------------
    def save_gate(self, host: str, states: Mapping[int, Mapping[str, Any]]) -> None:
        with self._tx() as cur:
            cur.execute("DELETE FROM gate WHERE host = ?", (host,))
            for gpu, state in states.items():
                cur.execute("INSERT INTO gate (host, gpu, state) VALUES (?, ?, ?)",
                            (host, gpu, json.dumps(dict(state), sort_keys=True)))

    def gate(self, host: str) -> dict[int, dict[str, Any]]:
        with self._tx() as cur:
            return {int(r[0]): json.loads(r[1]) for r in cur.query(
                "SELECT gpu, state FROM gate WHERE host = ?", (host,))}


    # -- inventory (what toggle targets may name) ----------------------------------------
    def save_inventory(self, host: str, gpus: Sequence[int], slots: Sequence[str], now: float) -> None:
        """The GPU indices and slot keys the host's controller drives (kept when unchanged)."""
        row = (json.dumps(sorted(gpus)), json.dumps(sorted(slots)))
        with self._tx() as cur:
            if cur.query("SELECT gpus, slots FROM inventory WHERE host = ?", (host,)) == [row]:
                return
            cur.execute("DELETE FROM inventory WHERE host = ?", (host,))
            cur.execute("INSERT INTO inventory (host, gpus, slots, at) VALUES (?, ?, ?, ?)",
                        (host, *row, now))

    def inventory(self, host: str) -> tuple[list[int], list[str]] | None:
        """(GPU indices, slot keys) of a host, None before its controller first ran."""
        with self._tx() as cur:
            rows = cur.query("SELECT gpus, slots FROM inventory WHERE host = ?", (host,))
        return (json.loads(rows[0][0]), json.loads(rows[0][1])) if rows else None

    def hosts(self) -> list[str]:
        """Every host that wrote to this store (the fleet, when hosts share PostgreSQL), but
        those whose last event is `retired` (`retire_host`)."""
        with self._tx() as cur:
            # one index step per host (events_host_id), where DISTINCT and max(id) GROUP BY read
            # every event: 2.3 s a call at 13 million events, polled every 2 s by the page
            # (found by a review sizing a lab of 30 hosts)
            hosts = {r[0] for r in cur.query(
                "WITH RECURSIVE h(host) AS (SELECT MIN(host) FROM events UNION ALL "
                "SELECT (SELECT MIN(host) FROM events WHERE host > h.host) FROM h WHERE h.host IS NOT NULL) "
                "SELECT host FROM h WHERE host IS NOT NULL")}
            hosts |= {r[0] for r in cur.query("SELECT DISTINCT host FROM toggles")}
            gone = {host for host in hosts if cur.query(
                "SELECT kind FROM events WHERE host = ? ORDER BY id DESC LIMIT 1", (host,)) == [(RETIRED,)]}
        return sorted(hosts - gone)

    def retire_host(self, host: str, now: float, detail: str) -> None:
        """A host taken out of the fleet (`runnerctl uninstall`): its toggles, drains,
        claims, gate, inventory and fleet-page row go, and a `retired` event says so, so
        the fleet page no longer lists it as stopped; its job history and events stay
        (`report`). A host that runs again is back with its first tick."""
        with self._tx() as cur:
            for table in ("toggles", "drains", "protected", "claims", "gate", "inventory", "host_views"):
                cur.execute(f"DELETE FROM {table} WHERE host = ?", (host,))  # noqa: S608 - names above
            cur.execute("INSERT INTO events (at, host, kind, subject, detail) VALUES (?, ?, ?, ?, ?)",
                        (now, host, RETIRED, "host", detail))

    # -- web users (local accounts; the hash comes from runnerctl.web.auth) -----------
    def save_user(self, name: str, password_hash: str, role: str, now: float) -> None:
        """Add or replace an account; a replaced one's sessions end (new password or role)."""
        with self._tx() as cur:
            cur.execute("DELETE FROM web_sessions WHERE name = ? AND via = 'local'", (name,))
            cur.execute("INSERT INTO users (name, password_hash, role, created_at) VALUES (?, ?, ?, ?) "
                        "ON CONFLICT (name) DO UPDATE SET password_hash = excluded.password_hash, "
                        "role = excluded.role, created_at = excluded.created_at",
                        (name, password_hash, role, now))

    def user(self, name: str) -> tuple[str, str] | None:
        """(password hash, role) of a local account, None when there is none."""
        with self._tx() as cur:
            rows = cur.query("SELECT password_hash, role FROM users WHERE name = ?", (name,))
        return (rows[0][0], rows[0][1]) if rows else None

    def users(self) -> list[tuple[str, str, float]]:
        """(name, role, created_at) of every local account; never the hashes."""
        with self._tx() as cur:
            rows = cur.query("SELECT name, role, created_at FROM users ORDER BY name")
        return [(r[0], r[1], float(r[2])) for r in rows]

    def remove_user(self, name: str) -> bool:
        with self._tx() as cur:
            cur.execute("DELETE FROM web_sessions WHERE name = ? AND via = 'local'", (name,))
            return cur.execute("DELETE FROM users WHERE name = ?", (name,)) > 0

    # -- web sessions (the cookie holds a random id; the store only its SHA-256, `key`) ----
    def save_session(self, session: WebSession) -> None:
        """Store a new session, and forget the expired ones."""
        with self._tx() as cur:
            cur.execute("DELETE FROM web_sessions WHERE expires_at < ?", (session.created_at,))
            cur.execute("INSERT INTO web_sessions (key, name, via, role, gitlab_id, created_at, checked_at, "
                        "expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", dataclasses.astuple(session))

    def web_session(self, key: str, now: float) -> WebSession | None:
        """The live session with this key; None when it ended or expired."""
        with self._tx() as cur:
            rows = cur.query("SELECT key, name, via, role, gitlab_id, created_at, checked_at, expires_at "
                             "FROM web_sessions WHERE key = ? AND expires_at >= ?", (key, now))
        if not rows:
            return None
        r = rows[0]
        return WebSession(r[0], r[1], r[2], r[3], None if r[4] is None else int(r[4]), float(r[5]),
                          float(r[6]), float(r[7]))

    def end_session(self, key: str) -> None:
        with self._tx() as cur:
            cur.execute("DELETE FROM web_sessions WHERE key = ?", (key,))

    def end_sessions(self, name: str, via: str) -> int:
        """End every session of one user (signed in locally or with GitLab); returns how many."""
        with self._tx() as cur:
            return cur.execute("DELETE FROM web_sessions WHERE name = ? AND via = ?", (name, via))

    def recheck_sessions(self, gitlab_id: int, role: str, now: float) -> int:
        """The role GitLab gives this user now, for all their sessions."""
        with self._tx() as cur:
            return cur.execute("UPDATE web_sessions SET role = ?, checked_at = ? WHERE via = 'gitlab' "
                               "AND gitlab_id = ?", (role, now, gitlab_id))

    # -- for store modules beside this one (controller/jobs_store.py) -------------------
    @contextmanager
    def transaction(self) -> Iterator[Cursor]:
        """One transaction with `?` placeholders; database failures become StoreError."""
        with self._tx() as cur:
            yield cur
