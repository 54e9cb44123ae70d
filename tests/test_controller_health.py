"""The reconcile loop survives any failing tick, heals when its store comes back, and says
so honestly: /healthz (503 while no tick succeeds or the thread is gone) and the
age-of-last-good-tick metric."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from runnerctl.controller.app import create_app
from runnerctl.controller.liveness import BACKOFF_MAX_S, Liveness
from runnerctl.controller.store import Store, Toggle
from runnerctl.controller.toggles import set_toggle
from runnerctl.errors import GpuError
from runnerctl.exporter.scrape import RunnerctlCollector
from runnerctl.gitlab import PythonGitLab
from runnerctl.settings import ControllerSettings
from runnerctl.sim.gitlab_server import Fault
from runnerctl.sim.world import PROJECT, TOKEN, World, build_world

INTERVAL_S = 0.1


def wait_until(what: str, check: Callable[[], object], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.02)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = build_world(tmp_path, settings=ControllerSettings(projects=(PROJECT,), interval_s=INTERVAL_S))
    w.controller.liveness.stale_after_s = 1.0  # a few intervals, without waiting 10 s in a test
    yield w
    w.close()


@pytest.fixture
def running(world: World) -> Iterator[tuple[World, TestClient]]:
    """The controller's own loop on its thread, as `serve` runs it, and its app."""
    stop = threading.Event()
    thread = threading.Thread(target=world.controller.run, args=(stop,), name="reconcile", daemon=True)
    world.controller.liveness.watch(thread)
    thread.start()
    app = create_app(lambda: world.controller.view, world.controller.demand.webhook,
                     health=world.controller.liveness.report)
    with TestClient(app) as client:
        yield world, client
    stop.set()
    thread.join(timeout=60)
    assert not thread.is_alive()


def health(client: TestClient) -> tuple[int, dict[str, Any]]:
    answer = client.get("/healthz")
    body: dict[str, Any] = answer.json()
    return answer.status_code, body


def _unhealthy_with(client: TestClient, error: str) -> bool:
    """503 naming `error`: a loaded machine may show a 503 for a slow tick before the failure."""
    status, body = health(client)
    return status == 503 and error in body["problem"]


def test_any_exception_in_a_tick_is_logged_once_backed_off_and_retried(
        running: tuple[World, TestClient], caplog: pytest.LogCaptureFixture) -> None:
    world, client = running
    # a tick that has begun (`ticks` counts those) may not have ended well yet: broken
    # then, no tick ever worked and /healthz rightly said "since the start"
    wait_until("a first good tick", lambda: health(client)[0] == 200
               and world.controller.liveness.last_good is not None)
    real = world.controller.wiring.jobs.running
    def broken() -> Any:
        raise KeyError("slot gone")

    caplog.set_level(logging.DEBUG, logger="runnerctl.controller.liveness")
    world.controller.wiring.jobs.running = broken  # type: ignore[method-assign]
    # the 503 comes when the age passes its bound, which a slow machine reaches in fewer
    # than three failed ticks: wait for both
    wait_until("healthz reports the stall after three failed ticks",
               lambda: world.controller.liveness.streak >= 3
               and _unhealthy_with(client, "KeyError: 'slot gone'"))
    status, body = health(client)
    assert "no good tick for" in body["problem"]
    assert body["reconcile_thread"] == "alive" and body["failed_ticks_in_a_row"] >= 3
    failing = [r for r in caplog.records if r.levelno == logging.ERROR and r.name.endswith("liveness")]
    assert len(failing) == 1 and failing[0].exc_info is not None  # once, with its traceback
    collector = RunnerctlCollector(lambda: world.controller.stats.view, {}, world.controller.liveness)
    scraped = {m.name: m for m in collector.collect()}
    age = scraped["runnerctl_reconcile_last_success_age_seconds"].samples[0].value
    assert age > 1.0
    assert scraped["runnerctl_reconcile_failures"].samples[0].labels["kind"] == "KeyError"
    world.controller.wiring.jobs.running = real  # type: ignore[method-assign]
    wait_until("healthz is ok again", lambda: health(client)[0] == 200, timeout_s=BACKOFF_MAX_S + 30)
    assert any("work again" in r.getMessage() for r in caplog.records)


def test_a_store_locked_longer_than_its_timeout_stalls_then_heals_and_loses_nothing(
        world: World, tmp_path: Path) -> None:
    store = Store.open(state_dir=tmp_path, timeout_s=0.2)
    world.controller.wiring.store = store
    set_toggle(store, Toggle("demo", "gpu:3", "pause", "carol", world.clock(), "fan"))
    stop = threading.Event()
    thread = threading.Thread(target=world.controller.run, args=(stop,), daemon=True)
    world.controller.liveness.watch(thread)
    client = TestClient(create_app(lambda: world.controller.view, world.controller.demand.webhook,
                                   health=world.controller.liveness.report))
    thread.start()
    try:
        wait_until("gpu3 paused by the toggle", lambda: health(client)[0] == 200 and any(
            r.paused for r in world.state.runners.values() if r.description.endswith("/gpu3")))
        holder = sqlite3.connect(tmp_path / "controller.sqlite", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock, far past 0.2 s
        wait_until("healthz reports the locked store",
                   lambda: _unhealthy_with(client, "is busy: database is locked"))
        stalled_at = world.controller.view.tick  # the last good tick's view
        holder.execute("ROLLBACK")
        holder.close()
        wait_until("ticks resume", lambda: health(client)[0] == 200, timeout_s=BACKOFF_MAX_S + 30)
        assert world.controller.view.tick > stalled_at
        set_toggle(store, Toggle("demo", "gpu:5", "pause", "dave", world.clock(), "after the lock"))
        wait_until("a toggle made after the stall is applied", lambda: any(
            r.paused for r in world.state.runners.values() if r.description.endswith("/gpu5")))
    finally:
        stop.set()
        thread.join(timeout=60)
    assert [t.target for t in store.toggles("demo")] == ["gpu:3", "gpu:5"]
    kinds = [e.kind for e in store.events("demo", limit=1000)]
    assert kinds.count("pause") >= 2  # both toggles' events are kept


def test_healthz_fails_when_the_reconcile_thread_is_gone() -> None:
    live = Liveness(host="h", interval_s=5.0)
    live.good()
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    live.watch(dead)

    class View:
        tick, host = 7, "h"

    client = TestClient(create_app(lambda: View(), lambda token, body: False,  # type: ignore[arg-type,return-value]
                                   health=live.report))
    status, body = health(client)
    assert status == 503 and body["problem"] == "the reconcile thread has stopped"


def test_failed_ticks_back_off_doubling_up_to_ten_intervals_or_30_s() -> None:
    live = Liveness(host="h", interval_s=0.1)
    waits = []
    for _ in range(6):
        live.failed(KeyError("x"), 1)
        waits.append(live.backoff_s())
    assert waits == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    slow = Liveness(host="h", interval_s=5.0)
    for _ in range(8):
        slow.failed(OSError("x"), 1)
    assert slow.backoff_s() == BACKOFF_MAX_S and slow.backoff_s(every_s=1.0) == 10.0
    slow.good()
    assert slow.backoff_s() == 5.0 and slow.streak == 0


def test_healthz_counts_from_start_before_the_first_tick() -> None:
    now = [100.0]
    live = Liveness(host="h", interval_s=5.0, clock=lambda: now[0])
    assert live.stale_after_s == 15.0 and live.report()[0]
    now[0] += 15.5
    ok, detail = live.report()
    assert not ok and detail["problem"] == "no good tick for 15.5 s (limit 15.0 s)"
    live.good()
    assert live.report()[0] and live.age_s() == 0.0


def test_healthz_fails_at_once_when_every_tick_since_the_start_failed() -> None:
    now = [100.0]
    live = Liveness(host="h", interval_s=5.0, clock=lambda: now[0])
    live.failed(OSError("database is locked"), 1)  # a store that never opened, a bad token
    now[0] += 1.0
    ok, detail = live.report()
    assert not ok and detail["problem"] == ("no good tick since the start (1 failed); "
                                            "last error: OSError: database is locked")
    live.good()
    live.failed(OSError("database is locked"), 2)  # after a good tick: the age decides
    assert live.report()[0]


def test_the_standalone_exporter_loop_survives_a_failing_tick(caplog: pytest.LogCaptureFixture) -> None:
    from runnerctl.controller.gate import GateThresholds
    from runnerctl.exporter.standalone import Observer
    from runnerctl.gpus import open_gpu_source

    broken = [True]

    def held() -> dict[int, tuple[int, ...]]:
        if broken[0]:
            raise KeyError("lease 7")
        return {}

    observer = Observer(host="gpu-c", gpus=open_gpu_source("sim:2", host="gpu-c", watch_xid=True), held=held,
                        is_ci=lambda gpu, process: False, limits=GateThresholds.from_settings())
    observer.liveness = Liveness(host="gpu-c", interval_s=INTERVAL_S)
    stop = threading.Event()
    thread = threading.Thread(target=observer.run, args=(stop, INTERVAL_S), daemon=True)
    thread.start()
    try:
        wait_until("three failed ticks", lambda: observer.liveness.failures["KeyError"] >= 3)
        assert thread.is_alive() and observer.liveness.last_good is None
        assert len([r for r in caplog.records if r.name.endswith("liveness")]) == 1
        broken[0] = False
        wait_until("a good tick", lambda: observer.liveness.streak == 0 and observer.stats.view is not None,
                   timeout_s=BACKOFF_MAX_S + 30)
    finally:
        stop.set()
        thread.join(timeout=60)


def test_a_part_in_trouble_longer_than_the_limit_makes_healthz_fail() -> None:
    now = [100.0]
    live = Liveness(host="h", interval_s=5.0, clock=lambda: now[0])
    live.good()
    live.trouble("gitlab", "connection refused")
    now[0] += 10.0
    live.good()
    live.trouble("gitlab", "503 Service Unavailable")  # still in trouble: since the first
    ok, detail = live.report()
    assert ok and detail["troubles"] == {"gitlab": {"for_s": 10.0, "error": "503 Service Unavailable"}}
    now[0] += 6.0
    live.good()
    ok, detail = live.report()
    assert not ok and detail["problem"] == "GitLab fails for 16 s: 503 Service Unavailable"
    live.trouble("gitlab", "")
    assert live.report() == (True, {**detail, "troubles": {}, "problem": ""})


def test_healthz_fails_while_the_gpus_cannot_be_read_and_logs_it_once(
        running: tuple[World, TestClient], caplog: pytest.LogCaptureFixture) -> None:
    world, client = running
    wait_until("a first good tick", lambda: health(client)[0] == 200 and world.controller.ticks > 0)
    real = world.controller.wiring.gpus.snapshot

    def unreadable() -> Any:
        raise GpuError("NVML: driver not loaded")

    caplog.set_level(logging.WARNING, logger="runnerctl.controller.liveness")
    world.controller.wiring.gpus.snapshot = unreadable  # type: ignore[method-assign]
    wait_until("healthz names the GPUs", lambda: _unhealthy_with(
        client, "the GPUs cannot be read (every runner stays closed)"))
    ticks = world.controller.ticks
    wait_until("more ticks", lambda: world.controller.ticks > ticks + 3)
    status, body = health(client)
    assert status == 503 and body["failed_ticks_in_a_row"] == 0  # the ticks work; the GPUs do not
    assert body["problem"].endswith("NVML: driver not loaded")
    warned = [r for r in caplog.records if "cannot read GPUs" in r.getMessage()]
    assert len(warned) == 1  # once while it lasts, not every tick
    world.controller.wiring.gpus.snapshot = real  # type: ignore[method-assign]
    wait_until("healthz is ok again", lambda: health(client)[0] == 200)
    assert any(r.getMessage() == "reading the GPUs works again" for r in caplog.records)


def test_healthz_fails_while_gitlab_cannot_be_reached_and_heals(world: World) -> None:
    """On the world's clock: GitLab gone (nothing listens at its address) for longer than
    the limit, while every tick succeeds; back, and healthz is ok on the next tick."""
    live = world.controller.liveness = Liveness(host="demo", interval_s=INTERVAL_S, clock=world.clock)
    world.advance(5)
    assert live.report()[0]
    gitlab = world.controller.wiring.gitlab
    world.controller.wiring.gitlab = PythonGitLab("http://127.0.0.1:1", "x", timeout=1.0)
    world.advance(live.stale_after_s + 5)
    ok, detail = live.report()
    assert not ok and detail["failed_ticks_in_a_row"] == 0
    assert detail["problem"].startswith("GitLab fails for ") and "cannot reach GitLab" in detail["problem"]
    world.controller.wiring.gitlab = gitlab
    world.advance(world.controller.health.retry_at - world.clock() + 1)
    assert live.report() == (True, {**live.report()[1], "troubles": {}, "problem": ""})


def test_gitlab_answering_reads_clears_its_failures_in_steady_state(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """With nothing to pause or resume, only the loop's reads show that GitLab is back:
    its error and failure count go (else the page and `runnerctl_gitlab_up` said GitLab
    was down for good, and one later 502 backed off 300 s and failed /healthz)."""
    w = build_world(tmp_path, settings=ControllerSettings(projects=(PROJECT,), interval_s=5.0))
    try:
        health = w.controller.health
        w.advance(60)
        assert health.failures == 0
        w.server.faults.append(Fault("*", ".", "502", count=8))
        w.advance(900)
        assert w.server.faults[-1].count == 0 and "GitLab failed" in caplog.text
        w.advance(60)
        assert (health.failures, health.last_error, w.controller.view.gitlab_error) == (0, "", "")
        assert "GitLab answers again" in caplog.text
        w.server.faults.append(Fault("GET", "/runners/", "502", count=1))
        w.advance(30)
        assert w.server.faults[-1].count == 0 and health.failures == 0  # one 502: backed off 5 s
    finally:
        w.close()


def test_writes_refused_for_good_stay_a_trouble_said_once_while_reads_answer(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    """The token cut to `read_api`: every pause and resume gets 403 while reads answer.
    Each read said "GitLab answers again" and the next write logged the refusal anew (12
    lines in 25 s) with /healthz green (found by a review as a GitLab admin). Now the
    refusal is logged once and /healthz names it until a write succeeds."""
    live = world.controller.liveness = Liveness(host="demo", interval_s=INTERVAL_S, clock=world.clock)
    world.advance(5)
    token = world.server.state.directory.tokens[TOKEN]
    token.scopes = frozenset({"read_api"})
    for _ in range(8):
        world.submit(1, 600.0)
    world.submit(4, 60.0)  # the host must pause singles for it: a write
    with caplog.at_level(logging.WARNING):
        world.advance(live.stale_after_s + 120)
    said = [r.getMessage() for r in caplog.records]
    assert sum("GitLab failed" in m for m in said) == 1, said
    assert not any("answers again" in m for m in said), said
    ok, detail = live.report()
    assert not ok and "missing the `api` scope" in detail["problem"], detail
    token.scopes = frozenset({"api"})
    world.advance(400)  # the next write, after the back-off (at most backoff_max_s)
    assert world.controller.health.write_error == "" and live.report()[0]


def test_health_and_metrics_answer_while_page_requests_fill_the_thread_pool(world: World) -> None:
    """Page requests are sync handlers on the thread pool and wait on the store's lock; a
    slow store filled the pool and /healthz and /metrics queued behind them (found by a
    review as a concurrency engineer). Here the pool has one thread, held by a request."""
    import anyio.to_thread

    entered, release = threading.Event(), threading.Event()

    def page(app: Any) -> None:
        @app.on_event("startup")
        async def one_thread() -> None:
            anyio.to_thread.current_default_thread_limiter().total_tokens = 1

        @app.get("/api/slow")
        def slow() -> dict[str, bool]:  # as a page read waiting on a busy store
            entered.set()
            release.wait(60)
            return {"ok": True}

    app = create_app(lambda: world.controller.view, world.controller.demand.webhook,
                     lambda: (b"runnerctl_up 1\n", "text/plain"), extend=[page],
                     health=lambda: (True, {}))
    with TestClient(app) as client:
        held = threading.Thread(target=lambda: client.get("/api/slow"), daemon=True)
        held.start()
        assert entered.wait(60)
        answers: dict[str, int] = {}

        def ask() -> None:
            for path in ("/healthz", "/metrics", "/api/state"):
                answers[path] = client.get(path).status_code

        asking = threading.Thread(target=ask, daemon=True)
        asking.start()
        asking.join(30)
        done = not asking.is_alive()
        release.set()
        held.join(60)
    assert done and answers == {"/healthz": 200, "/metrics": 200, "/api/state": 200}, answers


def test_how_long_each_part_has_failed_is_a_metric() -> None:
    """A clock off the shared store's failed /healthz and nothing else: no metric, so no
    alert could say so (found by a review as an on-call engineer)."""
    from prometheus_client.core import Metric

    from runnerctl.exporter.reconcile import liveness

    now = [100.0]
    live = Liveness(host="h", interval_s=5.0, clock=lambda: now[0])
    live.trouble("clock", "60 s ahead of the store's server")
    now[0] = 160.0
    ages = {"clock": 60.0, "gitlab": 0.0, "gpus": 0.0, "leases": 0.0}
    assert live.trouble_ages() == ages
    [family] = [m for m in liveness(live)
                if isinstance(m, Metric) and m.name == "runnerctl_reconcile_trouble_seconds"]
    assert {s.labels["part"]: s.value for s in family.samples} == ages
    live.trouble("clock", "")
    assert live.trouble_ages()["clock"] == 0.0


def test_a_settings_file_or_runners_changed_while_serve_runs_is_a_notice(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Each job's stages read runnerctl.toml again, serve does not: a state_dir changed
    while serve ran had two jobs lease one GPU, and a runner registered again went
    undriven, while /healthz said ok (found by a review as a lab admin)."""
    from runnerctl.controller.serve import INPUTS_CHECK_S

    settings_file, config = tmp_path / "runnerctl.toml", tmp_path / "config.toml"
    live, now, watch = _inputs_watch(tmp_path)
    watch(None)
    assert live.notices == {}
    settings_file.write_text(f'[paths]\nstate_dir = "{tmp_path / "other"}"\n')
    watch(None)
    assert live.notices == {}  # looked at most every INPUTS_CHECK_S
    now[0] += INPUTS_CHECK_S
    with caplog.at_level(logging.WARNING):
        watch(None)
    assert "changed since serve started: restart serve" in live.notices["inputs"]
    assert live.report()[0] and "restart serve" in caplog.text  # healthy, and said in the log
    settings_file.write_text("[paths\n")
    now[0] += INPUTS_CHECK_S
    watch(None)
    assert "no longer loads" in live.notices["inputs"]
    settings_file.write_text(f'# put back\n[paths]\nstate_dir = "{tmp_path / "state"}"\n')
    now[0] += INPUTS_CHECK_S
    watch(None)
    assert live.notices == {}  # the same settings; a comment is no change
    config.write_text('[[runners]]\nname = "runnerctl/h/gpu0"\nid = 9\ntoken = "glrt-y"\n')
    now[0] += INPUTS_CHECK_S
    watch(None)
    assert "runnerctl runners in" in live.notices["inputs"] and "restart serve" in live.notices["inputs"]


def test_a_lease_directory_prepare_cannot_write_is_a_trouble(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """With the store elsewhere (PostgreSQL), nothing serve wrote touched the lease
    directory: on a full or read-only file system every prepare failed while /healthz
    said ok (found by a review of a host out of disk space). A file size limit makes the
    kernel refuse the write here (EFBIG) as a full disk would (ENOSPC)."""
    import resource

    from runnerctl.controller.serve import INPUTS_CHECK_S
    from runnerctl.executors.lease import LeaseTable

    live, now, watch = _inputs_watch(tmp_path)
    watch(None)
    assert "leases" not in live.troubles  # no job made the directory yet: nothing to say
    leases = LeaseTable(tmp_path / "state").dir
    leases.mkdir(parents=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    now[0] += INPUTS_CHECK_S
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, hard))
    try:
        with caplog.at_level(logging.WARNING):
            watch(None)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    error = live.troubles["leases"][1]
    assert error.startswith(f"prepare cannot write a lease in {leases} (") and "every job's prepare" in error
    assert "the lease directory: prepare cannot write" in caplog.text
    assert list(leases.iterdir()) == []  # the probe went
    now[0] += INPUTS_CHECK_S
    with caplog.at_level(logging.WARNING):
        watch(None)
    assert "leases" not in live.troubles and "writing leases works again" in caplog.text


def _inputs_watch(tmp_path: Path) -> tuple[Liveness, list[float], Callable[[object], None]]:
    """serve's watch on runnerctl.toml (state under tmp_path/state), config.toml (one
    runner, id 5) and the lease directory, on a clock the test moves (`now[0]`)."""
    from runnerctl.controller.serve import InputsWatch
    from runnerctl.settings import load_settings

    settings_file = tmp_path / "runnerctl.toml"
    settings_file.write_text(f'[paths]\nstate_dir = "{tmp_path / "state"}"\n')
    config = tmp_path / "config.toml"
    config.write_text('[[runners]]\nname = "runnerctl/h/gpu0"\nid = 5\ntoken = "glrt-x"\n')
    live = Liveness(host="h", interval_s=5.0)
    now = [0.0]
    return live, now, InputsWatch(live, load_settings(settings_file), config, {"runnerctl/h/gpu0": 5},
                                  clock=lambda: now[0])
