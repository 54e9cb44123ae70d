"""Store schema versions: upgrades from the unversioned schema, migrations applied once
under a lock by any number of openers, a newer store refused, failures as one line."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import psycopg
import pytest

from runnerctl.controller import host_views, jobs_store
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


def _sqlite_from(dump: str, state_dir: Path) -> Store:
    """Today's Store opened on a SQLite store loaded from tests/data/store/`dump`."""
    with sqlite3.connect(state_dir / "controller.sqlite") as conn:
        conn.executescript((DATA / dump).read_text())
    return Store.open(state_dir=state_dir)


def _postgres_from(dump: str, pg_server: PostgresServer, database: str) -> Store:
    """Today's Store opened on a new PostgreSQL database loaded from tests/data/store/`dump`."""
    url = pg_server.create_database(database)
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute((DATA / dump).read_text().encode())
    return Store.open(url=url)


def test_an_unversioned_sqlite_store_is_upgraded_in_place(tmp_path: Path) -> None:
    store = _sqlite_from("unversioned.sqlite.sql", tmp_path)
    assert store.version == len(MIGRATIONS) and _versions(store) == [m.version for m in MIGRATIONS]
    _assert_old_rows_kept(store)
    store.close()
    again = Store.open(state_dir=tmp_path, migrations=(*MIGRATIONS, NOTE))
    assert _versions(again) == [*[m.version for m in MIGRATIONS], NOTE.version]
    with again._tx() as cur:
        assert cur.query("SELECT note FROM toggles WHERE target = 'gpu:3'") == [("",)]
    again.close()


def _assert_version_3_rows_kept(store: Store) -> None:
    _assert_old_rows_kept(store)
    assert store.inventory("gpu-a") == (list(range(8)), ["runnerctl/gpu-a/gpu0", "runnerctl/gpu-a/gpu0-3"])
    olga = store.web_session("5e" * 32, 1700000100.0)
    assert olga is not None and (olga.name, olga.via, olga.role) == ("olga", "local", "operator")
    pat = store.web_session("a1" * 32, 1700000100.0)
    assert pat is not None and (pat.gitlab_id, pat.role) == (17, "viewer")


def _assert_version_3_rows_kept_and_job_history_usable(store: Store) -> None:
    assert _versions(store) == [m.version for m in MIGRATIONS] and store.version >= 4
    _assert_version_3_rows_kept(store)
    assert jobs_store.jobs(store) == []  # migration 4: the job history table, empty, usable
    record = jobs_store.JobRecord("gpu-a", 7, "runnerctl/gpu-a/gpu0", (0,), "p", "1", "train", "olga", "u",
                                  None, 1700000200.0, 1700000260.0, 1700000260.0, "success")
    jobs_store.save_jobs(store, [record])
    assert jobs_store.jobs(store) == [record]


def test_a_version_3_sqlite_store_gets_job_history_and_keeps_every_row(tmp_path: Path) -> None:
    store = _sqlite_from("v3.sqlite.sql", tmp_path)
    _assert_version_3_rows_kept_and_job_history_usable(store)
    store.close()


def test_a_version_3_postgres_store_gets_job_history_and_keeps_every_row(pg_server: PostgresServer) -> None:
    store = _postgres_from("v3.postgres.sql", pg_server, "store_v3")
    _assert_version_3_rows_kept_and_job_history_usable(store)
    store.close()


# The job_history rows of tests/data/store/v4.*.sql: one ended, one running (no queue time).
V4_JOBS = (
    jobs_store.JobRecord("gpu-a", 41, "runnerctl/gpu-a/gpu0-3", (0, 1, 2, 3), "ml/train", "9001", "train",
                         "olga", "https://gitlab.example.com/ml/train/-/jobs/41", 1699999000.0, 1699999100.0,
                         1699999900.5, 1699999950.5, "success", 12.5, 16, 120.0, None, None),
    jobs_store.JobRecord("gpu-b", 43, "runnerctl/gpu-b/gpu5", (5,), "ml/eval", "9002", "eval", "pat",
                         "https://gitlab.example.com/ml/eval/-/jobs/43", None, 1700000050.0, 1700000090.25,
                         None, "running", 0.25, 4, 37.5, 1700000060.0, 1700000085.0),
)


def _assert_version_4_rows_kept_and_host_views_usable(store: Store) -> None:
    assert _versions(store) == [m.version for m in MIGRATIONS] and store.version == len(MIGRATIONS)
    _assert_version_3_rows_kept(store)
    assert jobs_store.jobs(store) == list(V4_JOBS)  # every row, every column
    assert jobs_store.open_jobs(store) == [V4_JOBS[1]]
    assert host_views.load(store) == []  # migration 5: the host views table, empty, usable
    view = {"gpus": [{"index": 3, "state": "paused"}], "queue": [{"job": 44, "waiting": "resources"}]}
    host_views.save(store, host="gpu-a", at=1700000300.0, interval_s=30.5, tick=12, view=view)
    assert host_views.load(store) == [host_views.HostRow("gpu-a", 1700000300.0, 30.5, 12, view)]


def test_a_version_4_sqlite_store_gets_host_views_and_keeps_every_row(tmp_path: Path) -> None:
    store = _sqlite_from("v4.sqlite.sql", tmp_path)
    _assert_version_4_rows_kept_and_host_views_usable(store)
    store.close()


def test_a_version_4_postgres_store_gets_host_views_and_keeps_every_row(pg_server: PostgresServer) -> None:
    store = _postgres_from("v4.postgres.sql", pg_server, "store_v4")
    _assert_version_4_rows_kept_and_host_views_usable(store)
    store.close()


def test_an_unversioned_postgres_store_is_upgraded_in_place(pg_server: PostgresServer) -> None:
    store = _postgres_from("unversioned.postgres.sql", pg_server, "store_unversioned")
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


def test_report_reads_but_never_upgrades_a_store_older_controllers_share(
        pg_server: PostgresServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`runnerctl report` of a newer runnerctl on a shared version-4 store: upgrading it
    would make every older controller sharing it refuse the store (a newer schema); it
    says so in one line and leaves the store at version 4."""
    from runnerctl.cli import main

    url = pg_server.create_database("store_v4_report")
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute((DATA / "v4.postgres.sql").read_text().encode())
    settings = tmp_path / "runnerctl.toml"
    settings.write_text(f'[paths]\nstate_dir = "{tmp_path / "state"}"\n[controller]\nstore_url = "{url}"\n')
    assert main(["report", "--config", str(settings)]) != 0
    err = capsys.readouterr().err
    assert f"schema version 4, this runnerctl reads version {len(MIGRATIONS)}" in err and "serve" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 2
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY 1")]
    assert versions == [1, 2, 3, 4]
    store = Store.open(url=url)  # serve upgrades it; then report reads it
    store.close()
    assert main(["report", "--config", str(settings), "--json"]) == 0


def test_a_store_numbered_by_an_older_main_is_upgraded_by_name(tmp_path: Path) -> None:
    """On main at 488e030 job history was version 3; today web sessions are 3 and job history
    4. Taken for a version-3 store, it failed every start with "table job_history already
    exists" (found by a review as a lab admin upgrading)."""
    store = _sqlite_from("v3-job-history.sqlite.sql", tmp_path)
    assert _versions(store) == [m.version for m in MIGRATIONS] and store.version == len(MIGRATIONS)
    with store._tx() as cur:
        names = [r[0] for r in cur.query("SELECT name FROM schema_migrations ORDER BY version")]
    assert names == [m.name for m in MIGRATIONS]
    assert len(jobs_store.jobs(store)) == 24 and len(store.events("demo", limit=100)) == 31
    assert host_views.load(store) == []
    store.close()
    again = Store.open(state_dir=tmp_path)  # the normal path from now on
    assert _versions(again) == [m.version for m in MIGRATIONS]
    again.close()


def test_a_store_naming_a_migration_this_runnerctl_does_not_know_is_refused(tmp_path: Path) -> None:
    store = Store.open(state_dir=tmp_path)
    with store._tx() as cur:
        cur.execute("UPDATE schema_migrations SET name = 'a branch of someone else' WHERE version = 2")
    store.close()
    with pytest.raises(StoreError, match="records schema version 2 as 'a branch of someone else', which"):
        Store.open(state_dir=tmp_path)


def test_commands_but_serve_make_a_new_store_but_never_upgrade_an_older_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`user list` and the CLI toggles upgraded a store, and older controllers sharing it
    then refused it (found by a review as a lab admin upgrading): like `report`, they now
    leave an older store as it is; a store that does not exist yet is made."""
    from runnerctl.cli import main

    with sqlite3.connect(tmp_path / "controller.sqlite") as conn:
        conn.executescript((DATA / "v4.sqlite.sql").read_text())
    settings = tmp_path / "runnerctl.toml"
    settings.write_text(f'[paths]\nstate_dir = "{tmp_path}"\n')
    for args in (["user", "list"], ["pause", "--gpu", "3", "--why", "x", "--host-name", "gpu-a"]):
        assert main([*args, "--config", str(settings)]) != 0
        err = capsys.readouterr().err
        assert f"schema version 4, this runnerctl reads version {len(MIGRATIONS)}" in err, err
    with sqlite3.connect(tmp_path / "controller.sqlite") as conn:
        assert [r[0] for r in conn.execute("SELECT version FROM schema_migrations")] == [1, 2, 3, 4]
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert main(["user", "list", "--state-dir", str(fresh), "--config", str(settings)]) == 0
