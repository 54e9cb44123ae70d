"""Hosts sharing a PostgreSQL store compare their clocks with its server's.

Claims lapse by the claiming host's clock and the fleet page ages another host's rows
by its own: with hosts minutes apart, two drained for one job and a live host showed
stopped (found by a review as a lab admin running three hosts). A host more than
`MAX_CLOCK_SKEW_S` off the server's clock is in trouble "clock": logged once, named on
/healthz once it lasts."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import pytest

from runnerctl.controller.loop import CLOCK_CHECK_S, MAX_CLOCK_SKEW_S, clock_skew
from runnerctl.controller.store import Store
from runnerctl.postgres import PostgresServer
from runnerctl.sim.world import build_world


@pytest.fixture(scope="module")
def pg_url(pg_server: PostgresServer) -> str:
    return pg_server.create_database("clock_skew")


@pytest.mark.parametrize(("offset", "expected"),
                         [(0.0, ""), (300.0, "300 s ahead of"), (-120.0, "120 s behind")])
def test_the_skew_to_the_servers_clock_is_measured(pg_url: str, offset: float, expected: str) -> None:
    store = Store.open(url=pg_url)
    try:
        skew, found = clock_skew(store, lambda: time.time() + offset)
    finally:
        store.close()
    assert (expected in found) if expected else found == "", found
    assert abs(skew - offset) < 2.0, skew


def test_sqlite_is_one_hosts_store_and_has_no_other_clock(tmp_path: Path) -> None:
    store = Store.open(state_dir=tmp_path)
    assert store.server_time() is None and clock_skew(store, lambda: time.time() + 3600) == (0.0, "")
    store.close()


def test_a_controller_minutes_off_the_store_is_in_trouble_logged_once(
        pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    world = build_world(tmp_path, store_url=pg_url, start=time.time() + 300)  # 5 minutes ahead
    world.controller.wiring = dataclasses.replace(world.controller.wiring, check_clock=True)  # as serve
    try:
        with caplog.at_level(logging.WARNING):
            world.advance(2 * CLOCK_CHECK_S + 10, step=5.0)  # three checks
        troubles = world.controller.liveness.troubles
        assert "clock" in troubles and "ahead of the store's server" in troubles["clock"][1], troubles
        said = [r.getMessage() for r in caplog.records if "clock is off the shared store's" in r.getMessage()]
        assert len(said) == 1 and f"(at most {MAX_CLOCK_SKEW_S:.0f} s)" in said[0], said
        _, shown = world.controller.liveness.report()  # /healthz names it (503 once it lasts)
        assert "sync the clocks (NTP)" in shown["troubles"]["clock"]["error"], shown
    finally:
        world.close()


def test_a_controller_in_step_with_the_store_has_no_trouble(pg_url: str, tmp_path: Path) -> None:
    world = build_world(tmp_path, store_url=pg_url, start=time.time())
    world.controller.wiring = dataclasses.replace(world.controller.wiring, check_clock=True)
    try:
        world.advance(6)
        assert "clock" not in world.controller.liveness.troubles
    finally:
        world.close()


def test_a_host_behind_claims_by_the_stores_clock_so_another_cannot_take_its_claim(
        pg_url: str, tmp_path: Path) -> None:
    """gpu-a 5 minutes behind: its claim on the job it drains for expired, by the other
    hosts' clocks, before it was taken, so gpu-b took it and drained too (the review's
    double drain). Claims now take the store's clock."""
    world = build_world(tmp_path, store_url=pg_url, start=time.time() - 300)
    world.controller.wiring = dataclasses.replace(world.controller.wiring, check_clock=True)
    try:
        for _ in range(8):
            world.submit(1, 600.0)
        world.advance(5)
        big = world.submit(8, 30.0)
        world.advance(10)
        assert big in world.controller.drains.values()
        other = Store.open(url=pg_url)
        try:
            assert not other.claim(big, "gpu-b", now=time.time(), ttl_s=120.0)  # gpu-b, on time
            assert other.claims(time.time()) == {big: "demo"}
        finally:
            other.close()
    finally:
        world.close()
