"""The controller store on SQLite and on a real PostgreSQL: toggles, drains, claims, gate."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runnerctl.controller.migrations import StoreError
from runnerctl.controller.store import Event, Store, Toggle
from runnerctl.postgres import PostgresServer


@pytest.fixture(scope="module")
def pg_url(pg_server: PostgresServer) -> str:
    """The controller store's own database and least-privilege role on the session's real
    PostgreSQL (runnerctl's server management; it fails, never skips, when PostgreSQL is
    missing)."""
    return pg_server.create_database("controller_store")


@pytest.fixture(params=["sqlite", "postgres"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Store, Store]]:
    """Two connections to one store, as two hosts (or serve and the CLI) hold them."""
    if request.param == "sqlite":
        a, b = Store.open(state_dir=tmp_path), Store.open(state_dir=tmp_path)
    else:
        url = request.getfixturevalue("pg_url")
        a, b = Store.open(url=url), Store.open(url=url)
        with a._tx() as cur:
            for table in ("events", "toggles", "drains", "claims", "gate"):
                cur.execute(f"DELETE FROM {table}")
    yield a, b
    a.close()
    b.close()


def test_toggles_with_who_when_why(stores: tuple[Store, Store]) -> None:
    a, b = stores
    a.set_toggle(Toggle("gpu-a", "gpu:3", "drain", "carol", 10.0, "new fan"))
    a.set_toggle(Toggle("gpu-a", "host", "pause", "dave", 11.0, ""))
    a.set_toggle(Toggle("gpu-a", "gpu:3", "pause", "erin", 12.0, "still broken"))
    assert b.toggles("gpu-a") == [Toggle("gpu-a", "gpu:3", "pause", "erin", 12.0, "still broken"),
                                  Toggle("gpu-a", "host", "pause", "dave", 11.0, "")]
    assert b.toggles("gpu-b") == []
    assert b.clear_toggles("gpu-a", "host") == 1
    assert b.clear_toggles("gpu-a") == 1 and a.toggles("gpu-a") == []


def test_drains_gate_and_events_survive_a_new_connection(stores: tuple[Store, Store]) -> None:
    a, b = stores
    a.save_drains("gpu-a", {"runnerctl/gpu-a/gpu0-3": 42}, 5.0)
    a.save_gate("gpu-a", {3: {"closed": True, "reason": "foreign process 1 (x)"}})
    a.record(Event(1.0, "gpu-a", "pause", "runnerctl/gpu-a/gpu3", "drained"))
    assert b.drains("gpu-a") == {"runnerctl/gpu-a/gpu0-3": 42}
    assert b.gate("gpu-a")[3]["closed"] is True
    assert [e.kind for e in b.events("gpu-a")] == ["pause"]
    a.save_drains("gpu-a", {}, 6.0)
    assert b.drains("gpu-a") == {}


def test_one_host_claims_a_job_until_its_claim_expires(stores: tuple[Store, Store]) -> None:
    a, b = stores
    assert a.claim(7, "gpu-a", now=100.0, ttl_s=60.0)
    assert not b.claim(7, "gpu-b", now=110.0, ttl_s=60.0)  # taken
    assert a.claim(7, "gpu-a", now=150.0, ttl_s=60.0)  # renewed to 210
    assert not b.claim(7, "gpu-b", now=200.0, ttl_s=60.0)
    assert b.claims(200.0) == {7: "gpu-a"}
    assert b.claim(7, "gpu-b", now=211.0, ttl_s=60.0)  # expired: gpu-b takes it
    assert a.claims(211.0) == {7: "gpu-b"}
    b.release_claims("gpu-b", keep=[])
    assert a.claims(211.0) == {}


def test_concurrent_claims_have_one_winner(stores: tuple[Store, Store]) -> None:
    import threading

    a, b = stores
    results: list[tuple[str, bool]] = []
    now = time.time()

    def race(store: Store, host: str) -> None:
        for job in range(30):
            results.append((f"{host}:{job}", store.claim(1000 + job, host, now=now, ttl_s=60.0)))

    threads = [threading.Thread(target=race, args=(s, h)) for s, h in ((a, "gpu-a"), (b, "gpu-b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [name for name, won in results if won]
    assert len(winners) == 30 and len({w.split(":")[1] for w in winners}) == 30


def test_writers_of_one_toggle_user_or_host_view_at_once_all_succeed(stores: tuple[Store, Store]) -> None:
    """The web page, the CLI and the controller's own reopen write the same toggle; a
    DELETE then INSERT failed one of two writers at once with a duplicate key (found by a
    review as a DBA: over 100 of 800 writes). One upsert each now."""
    import threading

    from runnerctl.controller import host_views

    a, b = stores
    errors: list[BaseException] = []

    def write(store: Store, who: str) -> None:
        try:
            for i in range(100):
                store.set_toggle(Toggle("gpu-a", "gpu:1", "pause", who, float(i), "race"))
                store.save_user("ann", f"hash-{who}-{i}", "admin", float(i))
                host_views.save(store, host="gpu-a", at=float(i), interval_s=5.0, tick=i, view={"by": who})
        except BaseException as exc:  # noqa: BLE001 - any failure of a writer fails the test
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(s, w)) for s, w in ((a, "carol"), (b, "dave"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    [toggle] = a.toggles("gpu-a")
    assert toggle.who in ("carol", "dave") and toggle.at == 99.0
    assert a.user("ann") is not None and [row.host for row in host_views.load(a)] == ["gpu-a"]


def test_releasing_claims_never_deletes_one_another_host_took_meanwhile(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu-a stalled and its claim lapsed; gpu-b took it between gpu-a's read of its own
    claims and its delete by job: gpu-b's live claim went (found by a review as a DBA).
    Hosts share PostgreSQL (SQLite is one host's)."""
    from runnerctl.controller.store_db import Cursor

    a, b = Store.open(url=pg_url), Store.open(url=pg_url)
    with a._tx() as cur:
        cur.execute("DELETE FROM claims")
    now = time.time()
    assert a.claim(7, "gpu-a", now=now - 300, ttl_s=60.0) and a.claim(8, "gpu-a", now=now, ttl_s=60.0)
    query, execute = Cursor.query, Cursor.execute
    taken = []

    def b_takes_it_now(cur: Cursor, sql: str, params: tuple[object, ...] = ()) -> object:
        if sql.startswith("DELETE FROM claims") and not taken:  # the moment before gpu-a deletes
            taken.append(b.claim(7, "gpu-b", now=now, ttl_s=60.0))
        return execute(cur, sql, params)

    def read_then_b_takes_it(cur: Cursor, sql: str, params: tuple[object, ...] = ()) -> object:
        rows = query(cur, sql, params)
        if sql.startswith("SELECT job_id FROM claims") and not taken:  # between the read and the delete
            taken.append(b.claim(7, "gpu-b", now=now, ttl_s=60.0))
        return rows

    monkeypatch.setattr(Cursor, "query", read_then_b_takes_it)
    monkeypatch.setattr(Cursor, "execute", b_takes_it_now)
    a.release_claims("gpu-a", keep=[8])
    monkeypatch.undo()
    assert taken == [True]
    assert a.claims(now) == {7: "gpu-b", 8: "gpu-a"}
    a.close()
    b.close()


def test_postgres_connections_bound_every_wait_and_keep_the_urls_own_settings() -> None:
    from runnerctl.controller.store import pg_params

    params = pg_params("postgresql://u@db.lab/store?keepalives_idle=5&options=-c%20search_path%3Dx", 2.0)
    assert params["keepalives_idle"] == "5" and params["keepalives"] == 1 and params["keepalives_count"] == 3
    assert params["connect_timeout"] == 2 and params["tcp_user_timeout"] == 2000
    assert params["options"] == ("-c search_path=x -c statement_timeout=2000 -c lock_timeout=2000 "
                                 "-c plan_cache_mode=force_custom_plan")
    own = pg_params("postgresql://u@db.lab/store?options=-c%20statement_timeout%3D0&connect_timeout=9", 30.0)
    assert own["options"] == ("-c statement_timeout=0 -c lock_timeout=30000 "
                              "-c plan_cache_mode=force_custom_plan")
    assert own["connect_timeout"] == "9"
    assert params["application_name"].startswith("runnerctl@")  # who it is in pg_stat_activity
    assert pg_params("postgresql://u@db.lab/store?application_name=mine", 2.0)["application_name"] == "mine"


def test_a_lock_held_by_another_host_fails_the_write_after_the_timeout_then_it_heals(pg_url: str) -> None:
    import threading

    import psycopg

    from runnerctl.controller.migrations import StoreError
    from runnerctl.postgres import libpq_url

    store = Store.open(url=pg_url, timeout_s=1.0)
    outcome: list[BaseException | None] = []

    def write() -> None:
        try:
            store.record(Event(time.time(), "gpu-a", "toggle", "gpu:0", "blocked"))
            outcome.append(None)
        except StoreError as exc:
            outcome.append(exc)

    with psycopg.connect(libpq_url(pg_url)) as other:  # another host's transaction, left open
        other.execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        writer.join(timeout=60)  # waited for ever before: no lock or statement timeout
        assert not writer.is_alive(), "the write still waits for the lock"
        other.rollback()
    assert isinstance(outcome[0], StoreError) and "canceling statement due to" in str(outcome[0])
    store.record(Event(time.time(), "gpu-a", "toggle", "gpu:0", "after"))
    assert [e.detail for e in store.events("gpu-a")] == ["after"]
    store.close()


def test_the_fleets_hosts_and_a_hosts_last_events_come_from_the_host_index(
        stores: tuple[Store, Store]) -> None:
    """`hosts()` read every event twice (DISTINCT, max(id) GROUP BY) and a quiet host's
    latest events scanned the table: 2.3 s a call at 13 million events, polled every 2 s
    by the fleet page (found by a review sizing a lab of 30 hosts). Both are index steps
    now; the hosts and retired ones as before."""
    a, _ = stores
    for i, host in enumerate(["gpu-a", "gpu-b", "gpu-c", "gpu-a"]):
        a.record(Event(1700000000.0 + i, host, "pause", "gpu:1", "x"))
    a.set_toggle(Toggle("gpu-d", "host", "pause", "olga", 1700000000.0, "only a toggle"))
    a.retire_host("gpu-b", 1700000010.0, "uninstalled")
    assert a.hosts() == ["gpu-a", "gpu-c", "gpu-d"]
    a.record(Event(1700000020.0, "gpu-b", "pause", "gpu:1", "back"))  # runs again
    assert a.hosts() == ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]
    assert [e.detail for e in a.events("gpu-b", 1)] == ["back"]
    with a._tx() as cur:
        if a._pg:
            cur.execute("SET LOCAL enable_seqscan = off")  # a small table: ask what it would do at size
            plan = " ".join(r[0] for r in cur.query(
                "EXPLAIN SELECT kind FROM events WHERE host = 'gpu-a' ORDER BY id DESC LIMIT 1"))
        else:
            plan = " ".join(str(r[-1]) for r in cur.query(
                "EXPLAIN QUERY PLAN SELECT kind FROM events WHERE host = 'gpu-a' ORDER BY id DESC LIMIT 1"))
    assert "events_host_id" in plan, plan


def test_a_store_whose_tables_were_dropped_makes_them_again_at_the_next_call(
        stores: tuple[Store, Store], caplog: pytest.LogCaptureFixture) -> None:
    """The database dropped and made again (or restored from an empty dump) under a running
    serve: every tick failed with `relation "toggles" does not exist` until serve was
    restarted (found by a review as a disaster-recovery engineer)."""
    a, b = stores
    a.set_toggle(Toggle("gpu-a", "gpu:3", "pause", "carol", 10.0, "ECC errors"))
    with b._tx() as cur:
        if b._pg:
            tables = cur.query("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
        else:
            tables = cur.query("SELECT name FROM sqlite_master WHERE type = 'table' "
                               "AND name NOT LIKE 'sqlite_%'")
        for (table,) in tables:
            cur.execute(f'DROP TABLE "{table}"' + (" CASCADE" if b._pg else ""))
    with pytest.raises(StoreError, match="toggles"):
        a.toggles("gpu-a")  # the call that finds the tables gone fails, saying so
    assert a.toggles("gpu-a") == []  # the next makes them again
    a.set_toggle(Toggle("gpu-a", "gpu:5", "pause", "dave", 11.0, ""))
    assert [t.target for t in b.toggles("gpu-a")] == ["gpu:5"]
    said = [r.getMessage() for r in caplog.records if "had lost its tables" in r.getMessage()]
    assert len(said) == 1, said


def test_a_store_missing_only_some_tables_makes_nothing_and_says_nothing_false(
        stores: tuple[Store, Store], caplog: pytest.LogCaptureFixture) -> None:
    """With some tables left (one dropped by hand), making the schema again would change
    nothing: each call fails naming the table, and no log line claims the tables were made
    again (found by a review of the change). The other tables still work."""
    a, b = stores
    with b._tx() as cur:
        cur.execute("DROP TABLE toggles")
    for _ in range(3):
        with pytest.raises(StoreError, match="toggles"):
            a.toggles("gpu-a")
    a.record(Event(1.0, "gpu-a", "pause", "runnerctl/gpu-a/gpu3", "still written"))
    assert [e.detail for e in a.events("gpu-a")] == ["still written"]
    assert not [r for r in caplog.records if "had lost its tables" in r.getMessage()]


def test_a_failed_schema_rebuild_leaves_no_transaction_open(tmp_path: Path) -> None:
    """A rebuild that fails (here a broken statement; a server refusing CREATE in real
    life) is rolled back whole: a SQLite transaction left open had locked every other
    writer out until serve restarted (found by a review of the change)."""
    a, b = Store.open(state_dir=tmp_path), Store.open(state_dir=tmp_path)
    try:
        with b._tx() as cur:
            for (table,) in cur.query("SELECT name FROM sqlite_master WHERE type = 'table' "
                                      "AND name NOT LIKE 'sqlite_%'"):
                cur.execute(f'DROP TABLE "{table}"')
        with pytest.raises(StoreError):
            a.toggles("gpu-a")  # finds the tables gone
        last = a._migrations[-1]
        broken = dataclasses.replace(last, statements=("CREATE TABLE broken (",))
        a._migrations = (*a._migrations[:-1], broken)
        with pytest.raises(StoreError, match="incomplete input"):
            a.toggles("gpu-a")  # the rebuild fails
        with pytest.raises(StoreError, match="no such table"):  # not "database is locked" by `a`
            b.set_toggle(Toggle("gpu-a", "gpu:5", "pause", "dave", 11.0, ""))
        b.set_toggle(Toggle("gpu-a", "gpu:5", "pause", "dave", 11.0, ""))  # b makes them again
        a._migrations = (*a._migrations[:-1], last)
        assert [t.target for t in a.toggles("gpu-a")] == ["gpu:5"]  # b made them; a uses them
    finally:
        a.close()
        b.close()


def test_a_sql_ascii_database_holds_a_japanese_reason(pg_server: PostgresServer) -> None:
    """A site's PostgreSQL made by `initdb` under LANG=C has SQL_ASCII databases: psycopg
    read their text as bytes and the store failed at its first query (`operator does not
    exist: text = bytea`; found by a review as an internationalisation reviewer)."""
    import psycopg
    from psycopg import sql

    from runnerctl.postgres import libpq_url

    url = pg_server.create_database("ascii_store")
    with psycopg.connect(libpq_url(pg_server.admin_url()), autocommit=True) as admin:
        admin.execute("DROP DATABASE ascii_store")
        admin.execute(sql.SQL("CREATE DATABASE ascii_store ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' "
                              "TEMPLATE template0 OWNER ascii_store"))
    store = Store.open(url=url)
    try:
        store.set_toggle(Toggle("gpu-a", "gpu:3", "pause", "田中", 10.0, "ファン交換 🔧"))
        assert store.toggles("gpu-a") == [Toggle("gpu-a", "gpu:3", "pause", "田中", 10.0, "ファン交換 🔧")]
    finally:
        store.close()


@pytest.fixture(params=["sqlite", "postgres"])
def own_stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Store, Store]]:
    """Two connections to a store of the test's own (the module's PostgreSQL database has
    tables dropped by the schema tests above)."""
    if request.param == "sqlite":
        a, b = Store.open(state_dir=tmp_path), Store.open(state_dir=tmp_path)
    else:
        url = request.getfixturevalue("pg_server").create_database(f"forget_{tmp_path.name[-12:].lower()}")
        a, b = Store.open(url=url), Store.open(url=url)
    yield a, b
    a.close()
    b.close()


def test_forgetting_a_person_erases_their_rows_and_keeps_their_holds(own_stores: tuple[Store, Store]) -> None:
    """A student who leaves asks for their data to go: only raw SQL did it (found by a
    privacy review). Their history, the events naming them (as a whole word), sessions
    and account go; a pause they made stays in force, by `someone`; others' rows stay."""
    from runnerctl.controller import jobs_store
    from runnerctl.controller.forget import forget
    from runnerctl.controller.jobs_store import JobRecord
    from runnerctl.controller.store import WebSession
    from runnerctl.web.auth import add_user

    a, b = own_stores
    now = time.time()

    def ran(job_id: int, user: str, ended: float | None) -> JobRecord:
        return JobRecord("gpu-f", job_id, "gpu0", (0,), "lab/app", "7", "train", user, "https://gl/x",
                         now - 90, now - 60, now - 1, ended, "success" if ended else "running", 1.0, 1)

    jobs_store.save_jobs(a, [ran(901, "zoe.k", now - 30), ran(902, "zoe.k", None), ran(903, "zoe.kb", now)])
    for detail in ("zoe.k holds GPU 0 at under 2% utilization", "by zoe.k: fan", "zoe.kb holds GPU 1",
                   "job 9 of zoe.k.", "user zoe.ka"):
        a.record(Event(now, "gpu-f", "unused", "job 9", detail))
    a.set_toggle(Toggle("gpu-f", "gpu:0", "pause", "zoe.k", now, "fan"))
    a.save_session(WebSession("k-zoe", "zoe.k", "gitlab", "viewer", 3, now, now, now + 600))
    add_user(a, "zoe.k", "a long enough password", "viewer")
    assert forget(b, "zoe.k", dry_run=True) == (2, 1, 3, 1, True, 1)
    assert len([e for e in a.events("gpu-f") if "zoe" in e.detail]) == 5  # a dry run erases nothing
    assert forget(b, "zoe.k") == (2, 1, 3, 1, True, 1)
    assert [(r.job_id, r.user) for r in jobs_store.jobs(a) if r.host == "gpu-f"] == [(903, "zoe.kb")]
    assert sorted(e.detail for e in a.events("gpu-f")) == ["user zoe.ka", "zoe.kb holds GPU 1"]
    assert a.toggles("gpu-f") == [Toggle("gpu-f", "gpu:0", "pause", "someone", now, "fan")]
    assert a.web_session("k-zoe", now) is None and a.user("zoe.k") is None
    assert forget(b, "zoe.k") == (0, 0, 0, 0, False, 0)


def test_user_forget_says_what_it_erased_and_what_it_cannot(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from runnerctl.cli import main

    store = Store.open(state_dir=tmp_path)
    store.set_toggle(Toggle("gpu-f", "host", "drain", "yuki", 1.0, "leaving"))
    store.close()
    assert main(["user", "forget", "yuki", "--dry-run", "--state-dir", str(tmp_path)]) == 0
    said = capsys.readouterr().out.splitlines()[0]
    assert said == ("yuki: would erase 0 job history rows, 0 events, 0 web sessions; their pause or drain "
                    "would stay, by someone")
    assert main(["user", "forget", "yuki", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "; their pause or drain stays, by someone" in out and "the system journal (serve's log)" in out
    assert main(["user", "forget", "", "--state-dir", str(tmp_path)]) != 0  # would match everything
    assert "'' is no user name" in capsys.readouterr().err
