"""Store schema versions: upgrades from the unversioned schema, migrations applied once
under a lock by any number of openers, a newer store refused, failures as one line."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import psycopg
import pytest

from runnerctl.controller.migrations import MIGRATIONS, Migration, check
from runnerctl.controller.store import Event, Store, StoreError, Toggle
from runnerctl.postgres import PostgresServer, libpq_url

DATA = Path(__file__).parent / "data" / "store"
NOTE = Migration(len(MIGRATIONS) + 1, "a note on toggles", (
    "ALTER TABLE toggles ADD COLUMN note TEXT NOT NULL DEFAULT ''",))


def _assert_old_rows_kept(store: Store) -> None:
    assert store.toggles("gpu-a") == [Toggle("gpu-a", "gpu:3", "pause", "carol", 1700000000.0, "new fan")]
    assert store.toggles("gpu-b") == [Toggle("gpu-b", "host", "drain", "dave", 1700000002.0, "")]
    assert store.drains("gpu-a") == {"runnerctl/gpu-a/gpu0-3": 42}
    assert store.protected("gpu-a") == frozenset({42})
    assert store.claims(1700000100.0) == {42: "gpu-a"}
    assert store.gate("gpu-a") == {5: {"closed": True, "reason": "foreign process 77 (alice)"}}
    assert store.user("olga") is not None and store.users()[0][:2] == ("olga", "operator")
    store.record(Event(1700000010.0, "gpu-a", "resume", "gpu:3", "by carol"))
    assert [e.kind for e in store.events("gpu-a")] == ["resume", "drain", "pause"]  # ids go on after 2


def _versions(store: Store) -> list[int]:
    with store._tx() as cur:
        return [int(r[0]) for r in cur.query("SELECT version FROM schema_migrations ORDER BY version")]


def test_an_unversioned_sqlite_store_is_upgraded_in_place(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "controller.sqlite") as conn:
        conn.executescript((DATA / "unversioned.sqlite.sql").read_text())
    store = Store.open(state_dir=tmp_path)
    assert store.version == len(MIGRATIONS) and _versions(store) == [m.version for m in MIGRATIONS]
    _assert_old_rows_kept(store)
    store.close()
    again = Store.open(state_dir=tmp_path, migrations=(*MIGRATIONS, NOTE))
    assert _versions(again) == [*[m.version for m in MIGRATIONS], NOTE.version]
    with again._tx() as cur:
        assert cur.query("SELECT note FROM toggles WHERE target = 'gpu:3'") == [("",)]
    again.close()


def test_an_unversioned_postgres_store_is_upgraded_in_place(pg_server: PostgresServer) -> None:
    url = pg_server.create_database("store_unversioned")
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute((DATA / "unversioned.postgres.sql").read_text().encode())
    store = Store.open(url=url)
    assert _versions(store) == [m.version for m in MIGRATIONS]
    _assert_old_rows_kept(store)
    store.close()


def test_a_migration_runs_once_and_a_newer_store_is_refused(tmp_path: Path) -> None:
    moved: list[int] = []

    def backfill(cur: object) -> None:
        moved.append(1)

    newer = (*MIGRATIONS, Migration(NOTE.version, NOTE.name, NOTE.statements, run=backfill))
    Store.open(state_dir=tmp_path, migrations=newer).close()
    Store.open(state_dir=tmp_path, migrations=newer).close()
    assert moved == [1]
    with pytest.raises(StoreError, match=f"schema version {NOTE.version}, this runnerctl knows up to "
                                         f"{len(MIGRATIONS)}"):
        Store.open(state_dir=tmp_path)


def test_a_failed_migration_leaves_the_old_version(tmp_path: Path) -> None:
    Store.open(state_dir=tmp_path).close()
    broken = Migration(NOTE.version, "half done",
                       (NOTE.statements[0], "ALTER TABLE nowhere ADD COLUMN x TEXT"))
    with pytest.raises(StoreError, match="no such table: nowhere"):
        Store.open(state_dir=tmp_path, migrations=(*MIGRATIONS, broken))
    store = Store.open(state_dir=tmp_path, migrations=(*MIGRATIONS, NOTE))  # the first ALTER was undone
    assert _versions(store)[-1] == NOTE.version
    store.close()


@pytest.mark.parametrize("versions", [(2,), (1, 3), (1, 1)])
def test_versions_are_consecutive(versions: Sequence[int]) -> None:
    with pytest.raises(ValueError, match="must be 1.."):
        check([Migration(v, "x", ()) for v in versions])


def test_ten_hosts_opening_an_empty_postgres_store_at_once_all_succeed(pg_server: PostgresServer) -> None:
    url = pg_server.create_database("store_race")
    start = threading.Barrier(10)
    opened: list[Store] = []
    failed: list[BaseException] = []

    def open_one() -> None:
        start.wait()
        try:
            opened.append(Store.open(url=url, migrations=(*MIGRATIONS, NOTE)))
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            failed.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failed == [] and len(opened) == 10
    assert _versions(opened[0]) == [*[m.version for m in MIGRATIONS], NOTE.version]
    for store in opened:
        store.close()


def test_a_sqlite_store_locked_longer_than_its_timeout_is_busy_then_usable(tmp_path: Path) -> None:
    store = Store.open(state_dir=tmp_path, timeout_s=0.2)
    holder = sqlite3.connect(tmp_path / "controller.sqlite", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    with pytest.raises(StoreError, match="is busy: database is locked"):
        store.set_toggle(Toggle("gpu-a", "host", "pause", "carol", 1.0, ""))
    holder.execute("ROLLBACK")
    store.set_toggle(Toggle("gpu-a", "host", "pause", "carol", 1.0, ""))
    assert [t.target for t in store.toggles("gpu-a")] == ["host"]
    holder.close()
    store.close()


def test_an_unreachable_postgres_store_is_one_line() -> None:
    with pytest.raises(StoreError) as caught:
        Store.open(url="postgresql+psycopg://runnerctl:s3cret@127.0.0.1:1/controller", timeout_s=2)
    message = str(caught.value)
    assert "\n" not in message and "s3cret" not in message
    assert message.startswith("the controller store postgresql://127.0.0.1:1/controller failed: ")
