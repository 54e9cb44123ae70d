"""What the controller must not forget: events, admin toggles, drains, claims, gate state.

SQLite in the state dir for one host (the default); PostgreSQL (psycopg 3) when hosts
share a URL, so that they agree on who drains for which pending job. Every write is
one short transaction, so a controller killed at any point leaves a consistent store;
on restart the loop reads drains, toggles, claims and the gate back from here.

A claim is a row `(job_id, host, expires_at)`: a host may take it when it is free,
expired or already its own (one atomic upsert), and renews it every tick while it
drains for that job.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from runnerctl import private

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS events (id {serial}, at DOUBLE PRECISION NOT NULL,
        host TEXT NOT NULL, kind TEXT NOT NULL, subject TEXT NOT NULL, detail TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS toggles (host TEXT NOT NULL, target TEXT NOT NULL,
        action TEXT NOT NULL, who TEXT NOT NULL, at DOUBLE PRECISION NOT NULL, why TEXT NOT NULL,
        PRIMARY KEY (host, target))""",
    """CREATE TABLE IF NOT EXISTS drains (host TEXT NOT NULL, slot TEXT NOT NULL,
        job_id BIGINT NOT NULL, since DOUBLE PRECISION NOT NULL, PRIMARY KEY (host, slot))""",
    """CREATE TABLE IF NOT EXISTS protected (host TEXT NOT NULL, job_id BIGINT NOT NULL,
        PRIMARY KEY (host, job_id))""",
    """CREATE TABLE IF NOT EXISTS claims (job_id BIGINT PRIMARY KEY, host TEXT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS gate (host TEXT NOT NULL, gpu INTEGER NOT NULL,
        state TEXT NOT NULL, PRIMARY KEY (host, gpu))""",
    """CREATE TABLE IF NOT EXISTS users (name TEXT PRIMARY KEY, password_hash TEXT NOT NULL,
        role TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL)""",
)


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
class Event:
    at: float
    host: str
    kind: str
    subject: str
    detail: str


class _Conn(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...


class Store:
    """One store API over SQLite or PostgreSQL; only the placeholders differ."""

    def __init__(self, conn: Any, *, postgres: bool) -> None:
        self._conn = conn
        self._pg = postgres
        self._lock = threading.Lock()  # the web thread and the loop share one connection
        serial = "BIGSERIAL PRIMARY KEY" if postgres else "INTEGER PRIMARY KEY AUTOINCREMENT"
        with self._tx() as cur:
            for statement in SCHEMA:
                cur.execute(statement.format(serial=serial))

    @classmethod
    def open(cls, *, url: str = "", state_dir: Path | None = None) -> Store:
        """PostgreSQL when `url` is set (libpq's form, or SQLAlchemy's as `runnerctl
        postgres url` prints it), else SQLite at <state_dir>/controller.sqlite."""
        if url:
            import psycopg

            from runnerctl.postgres import libpq_url

            return cls(psycopg.connect(libpq_url(url), autocommit=True), postgres=True)
        if state_dir is None:
            raise ValueError("a store needs a PostgreSQL URL or a state directory")
        private.state_dir(state_dir)
        private.create_private_file(state_dir / "controller.sqlite")  # its -wal/-shm take its mode
        conn = sqlite3.connect(state_dir / "controller.sqlite", timeout=30.0,
                               isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        return cls(conn, postgres=False)

    def close(self) -> None:
        self._conn.close()

    @contextmanager
    def _tx(self) -> Iterator[_Cursor]:
        with self._lock:
            cur = _Cursor(self._conn.cursor(), self._pg)
            cur.execute("BEGIN" if self._pg else "BEGIN IMMEDIATE")
            try:
                yield cur
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            cur.execute("COMMIT")

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
        with self._tx() as cur:
            cur.execute("DELETE FROM toggles WHERE host = ? AND target = ?", (toggle.host, toggle.target))
            cur.execute("INSERT INTO toggles (host, target, action, who, at, why) VALUES (?, ?, ?, ?, ?, ?)",
                        dataclasses.astuple(toggle))

    def clear_toggles(self, host: str, target: str | None = None) -> int:
        """Remove one target's toggle, or every toggle of the host; returns how many."""
        with self._tx() as cur:
            if target is None:
                return cur.execute("DELETE FROM toggles WHERE host = ?", (host,))
            return cur.execute("DELETE FROM toggles WHERE host = ? AND target = ?", (host, target))

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
        with self._tx() as cur:
            for job_id, in cur.query("SELECT job_id FROM claims WHERE host = ?", (host,)):
                if int(job_id) not in keep:
                    cur.execute("DELETE FROM claims WHERE job_id = ?", (job_id,))

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


    def hosts(self) -> list[str]:
        """Every host that wrote to this store (the fleet, when hosts share PostgreSQL)."""
        with self._tx() as cur:
            rows = cur.query("SELECT DISTINCT host FROM events UNION SELECT DISTINCT host FROM toggles")
        return sorted(r[0] for r in rows)

    # -- web users (local accounts; the hash comes from runnerctl.web.auth) -----------
    def save_user(self, name: str, password_hash: str, role: str, now: float) -> None:
        with self._tx() as cur:
            cur.execute("DELETE FROM users WHERE name = ?", (name,))
            cur.execute("INSERT INTO users (name, password_hash, role, created_at) VALUES (?, ?, ?, ?)",
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
            return cur.execute("DELETE FROM users WHERE name = ?", (name,)) > 0


class _Cursor:
    """A cursor that takes `?` placeholders on both databases."""

    def __init__(self, cursor: Any, postgres: bool) -> None:
        self._cursor = cursor
        self._pg = postgres

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        self._cursor.execute(sql.replace("?", "%s") if self._pg else sql, tuple(params))
        return int(self._cursor.rowcount or 0)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self.execute(sql, params)
        return [tuple(row) for row in self._cursor.fetchall()]
