"""The controller store's schema, as numbered migrations applied once under a lock.

Several hosts (and the CLI beside `serve`) open one PostgreSQL store at the same time,
so creating tables is not something each of them may simply try: two concurrent
`CREATE TABLE IF NOT EXISTS` race in PostgreSQL's catalog (`UniqueViolation`). Instead
every opener runs `migrate` in one transaction that first takes a lock, the
transaction-scoped advisory lock `LOCK_KEY` on PostgreSQL (SQLite's `BEGIN IMMEDIATE`
already holds the database's only write lock), then reads the highest version in
`schema_migrations`, applies the newer migrations in order, and records each. Both
databases run DDL inside transactions, so a killed opener leaves either the old or the
new version, never half of one.

Version 1 is the schema runnerctl wrote before versions existed (`IF NOT EXISTS`
throughout), so an unversioned store upgrades by recording version 1 over its tables.

Adding a migration: append `Migration(N + 1, "what it does", ("SQL", ...))` to
`MIGRATIONS` (never edit or renumber one that has shipped). `{serial}` in a statement
becomes the database's auto-increment primary key; statements use SQL both databases
accept. A migration that must move data passes `run`, called with the transaction's
cursor after its statements.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from runnerctl.errors import ExitCode, RunnerctlError

LOCK_KEY = 0x72756E6E  # "runn": PostgreSQL advisory lock key of schema changes


class StoreError(RunnerctlError):
    """The controller store cannot be reached, is busy, or has a schema this runnerctl
    does not know."""

    exit_code = ExitCode.UNAVAILABLE


class Cursor(Protocol):
    """`?` placeholders on both databases (store_db.Cursor)."""

    def execute(self, sql: str, params: Sequence[Any] = ...) -> int: ...

    def query(self, sql: str, params: Sequence[Any] = ...) -> list[tuple[Any, ...]]: ...


@dataclasses.dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]
    run: Callable[[Cursor], None] | None = None
    """Data changes after the statements, in the same transaction."""


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "controller tables (the schema before versions)", (
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
    )),
    Migration(2, "host inventory: the GPUs and slots each controller drives (toggle targets are checked "
                 "against it)", (
        """CREATE TABLE inventory (host TEXT PRIMARY KEY, gpus TEXT NOT NULL, slots TEXT NOT NULL,
            at DOUBLE PRECISION NOT NULL)""",
    )),
    Migration(3, "web sessions on the server, so that they can be ended (runnerctl.web.sessions)", (
        """CREATE TABLE web_sessions (key TEXT PRIMARY KEY, name TEXT NOT NULL, via TEXT NOT NULL,
            role TEXT NOT NULL, gitlab_id BIGINT, created_at DOUBLE PRECISION NOT NULL,
            checked_at DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION NOT NULL)""",
        "CREATE INDEX web_sessions_name ON web_sessions (name, via)",
    )),
    Migration(4, "job history (one row per job a runner of the host ran) and indexes for retention", (
        """CREATE TABLE job_history (host TEXT NOT NULL, job_id BIGINT NOT NULL, slot TEXT NOT NULL,
            gpus TEXT NOT NULL, project TEXT NOT NULL, pipeline TEXT NOT NULL, name TEXT NOT NULL,
            username TEXT NOT NULL, url TEXT NOT NULL, queued_at DOUBLE PRECISION,
            started_at DOUBLE PRECISION NOT NULL, seen_at DOUBLE PRECISION NOT NULL,
            ended_at DOUBLE PRECISION, outcome TEXT NOT NULL, util_sum DOUBLE PRECISION NOT NULL,
            util_samples INTEGER NOT NULL, idle_gpu_s DOUBLE PRECISION NOT NULL,
            low_since DOUBLE PRECISION, unused_at DOUBLE PRECISION, PRIMARY KEY (host, job_id))""",
        "CREATE INDEX job_history_ended ON job_history (ended_at)",
        "CREATE INDEX job_history_started ON job_history (started_at)",
        "CREATE INDEX events_at ON events (at)",
    )),
    Migration(5, "host views: each controller's last good tick, GPUs and queue, for the fleet page", (
        """CREATE TABLE host_views (host TEXT PRIMARY KEY, at DOUBLE PRECISION NOT NULL,
            interval_s DOUBLE PRECISION NOT NULL, tick BIGINT NOT NULL, view TEXT NOT NULL)""",
    )),
    Migration(6, "events by host: a host's latest events and the fleet's hosts without reading every event", (
        "CREATE INDEX events_host_id ON events (host, id)",
    )),
)

_VERSIONS = """CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY,
    name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"""


def migrate(cur: Cursor, *, postgres: bool, migrations: Sequence[Migration] = MIGRATIONS,
            upgrade: bool = True) -> int:
    """Bring the store to the newest version inside the caller's transaction; returns it.
    Refuses a store newer than `migrations` (a newer runnerctl wrote it), and without
    `upgrade` (every command but serve) an older one, which it leaves as it is: older
    controllers sharing it would refuse it once upgraded. A new, empty store is made
    either way (no controller uses it yet)."""
    check(migrations)
    if postgres:  # hosts wait here while one migrates, and a migration takes what it takes
        cur.execute("SET LOCAL statement_timeout = 0")
        cur.execute("SET LOCAL lock_timeout = 0")
        cur.query(f"SELECT pg_advisory_xact_lock({LOCK_KEY})")
    cur.execute(_VERSIONS)
    current = int(cur.query("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")[0][0])
    newest = migrations[-1].version if migrations else 0
    recorded = {int(v): str(n) for v, n in cur.query("SELECT version, name FROM schema_migrations")}
    if current <= newest and any(migrations[v - 1].name != n for v, n in recorded.items()):
        return _renumbered(cur, recorded, migrations, postgres=postgres, upgrade=upgrade)
    if current > newest:
        raise StoreError(f"the controller store has schema version {current}, this runnerctl knows "
                         f"up to {newest}", hint="upgrade runnerctl on this host")
    if current < newest and not upgrade and (current or has_tables(cur, postgres=postgres)):
        raise StoreError(f"the controller store has schema version {current}, this runnerctl reads "
                         f"version {newest} and does not upgrade a store to read it",
                         hint="upgrade it by starting this version's `runnerctl serve` (docs/operations.md, "
                              "Upgrade), or use the runnerctl the controllers run")
    for migration in migrations:
        if migration.version > current:
            _apply(cur, migration, postgres=postgres)
            cur.execute("INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                        (migration.version, migration.name, time.time()))
    return max(current, newest)


def _apply(cur: Cursor, migration: Migration, *, postgres: bool) -> None:
    serial = "BIGSERIAL PRIMARY KEY" if postgres else "INTEGER PRIMARY KEY AUTOINCREMENT"
    for statement in migration.statements:
        cur.execute(statement.format(serial=serial))
    if migration.run is not None:
        migration.run(cur)


def _renumbered(cur: Cursor, recorded: dict[int, str], migrations: Sequence[Migration], *, postgres: bool,
                upgrade: bool) -> int:
    """A store whose versions name other migrations than ours: on main at 488e030 job
    history was version 3, before web sessions took 3 and job history became 4, so such a
    store had job history and no web sessions, and was taken for one at version 3
    ("table job_history already exists" at every start; found by a review as a lab admin
    upgrading). Migrations are known by name: the missing ones are applied, and the
    versions recorded again in our numbering. A name we do not know is refused."""
    ours = {m.name for m in migrations}
    unknown = sorted((v, n) for v, n in recorded.items() if n not in ours)
    if unknown:
        version, name = unknown[0]
        raise StoreError(f"the controller store records schema version {version} as {name!r}, which this "
                         "runnerctl does not know",
                         hint="use the runnerctl that wrote the store, or restore a backup "
                              "(docs/operations.md, Back up and restore)")
    applied_at = {n: at for n, at in cur.query("SELECT name, applied_at FROM schema_migrations")}
    missing = [m for m in migrations if m.name not in applied_at]
    if missing and not upgrade:
        raise StoreError(f"the controller store lacks {len(missing)} of this runnerctl's {len(migrations)} "
                         "schema versions and this command does not upgrade it",
                         hint="upgrade it by starting this version's `runnerctl serve` "
                              "(docs/operations.md, Upgrade)")
    for migration in missing:
        _apply(cur, migration, postgres=postgres)
    cur.execute("DELETE FROM schema_migrations")
    for migration in migrations:
        cur.execute("INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                    (migration.version, migration.name, applied_at.get(migration.name, time.time())))
    return migrations[-1].version


def has_tables(cur: Cursor, *, postgres: bool, besides: tuple[str, ...] = ("schema_migrations",)) -> bool:
    """Whether the store holds any table but those `besides` (an unversioned store holds
    some but `schema_migrations`; one whose database was dropped and made again, none)."""
    left_out = ", ".join(f"'{name}'" for name in (*besides, "sqlite_sequence"))
    if postgres:
        rows = cur.query("SELECT COUNT(*) FROM information_schema.tables "
                         f"WHERE table_schema = current_schema() AND table_name NOT IN ({left_out})")
    else:
        rows = cur.query("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' "
                         f"AND name NOT IN ({left_out})")
    return bool(rows[0][0])


def check(migrations: Sequence[Migration]) -> None:
    """Versions are 1, 2, 3, ... with no gap (a programming error otherwise)."""
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise ValueError(f"migration versions must be 1..{len(versions)} in order, not {versions}")
