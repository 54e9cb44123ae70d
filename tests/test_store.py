"""The controller store on SQLite and on a real PostgreSQL: toggles, drains, claims, gate."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

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
