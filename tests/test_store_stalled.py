"""A PostgreSQL server that stops answering without going away (its processes stopped,
its storage hung) while the machine's kernel still answers TCP.

The server's statement timeout needs a running server and keepalives are answered by the
kernel, so a store call on it waited for as long as it stayed stopped: the reconcile
loop silent, every web read behind the store's lock (found by a review as an operator
breaking things). `Store.deadline_s` cuts the connection: the call fails with a one-line
`StoreError` saying so, and the store reconnects once the server runs again."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Iterator

import psutil
import pytest

from runnerctl.controller.store import Event, Store, StoreError
from runnerctl.postgres import PostgresServer
from tests.pg import running_server


@pytest.fixture
def own_server() -> Iterator[PostgresServer]:
    """A server of its own: stopping the session's would stall every other test."""
    with running_server() as server:
        yield server


def _server_processes(server: PostgresServer) -> list[psutil.Process]:
    pid = int((server.config.data_dir / "postmaster.pid").read_text().split()[0])
    main = psutil.Process(pid)
    return [main, *main.children(recursive=True)]


def test_a_stopped_server_fails_the_call_within_the_deadline_and_the_store_heals(
        own_server: PostgresServer) -> None:
    store = Store.open(url=own_server.create_database("stalled"), timeout_s=2.0)
    store.record(Event(1.0, "gpu-a", "drain", "gpu0-7", "before"))
    stopped = _server_processes(own_server)
    for proc in stopped:
        os.kill(proc.pid, signal.SIGSTOP)
    failed: list[BaseException] = []

    def call() -> None:
        try:
            store.record(Event(2.0, "gpu-a", "drain", "gpu0-7", "while stopped"))
        except BaseException as exc:  # noqa: BLE001 - whatever it is, the test says it
            failed.append(exc)

    caller = threading.Thread(target=call, daemon=True)  # a call that hangs fails the test, not CI
    try:
        started = time.monotonic()
        caller.start()
        assert store.deadline_s is not None
        caller.join(timeout=store.deadline_s + 15)
        took = time.monotonic() - started
        assert not caller.is_alive(), f"the call still waits after {took:.0f} s"
    finally:
        for proc in stopped:
            os.kill(proc.pid, signal.SIGCONT)
        caller.join(timeout=60)
    assert took >= store.deadline_s and len(failed) == 1 and isinstance(failed[0], StoreError), failed
    assert re.search(r"did not answer within 17 s \(a stopped or hung server\?\)", str(failed[0])), failed
    store.record(Event(3.0, "gpu-a", "drain", "gpu0-7", "after"))  # reconnected
    assert [e.detail for e in store.events("gpu-a", 5)] == ["after", "before"]
    store.close()


def test_the_deadline_watches_every_transaction_with_one_thread(pg_server: PostgresServer,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A threading.Timer per transaction started a thread each, some eight a tick and one
    per page read, about 130,000 a day (found by a review hunting leaks in a long-running
    serve). One watchdog thread serves them all, and is gone after close()."""
    started: list[str] = []
    real_start = threading.Thread.start

    def counted(thread: threading.Thread) -> None:
        started.append(thread.name)
        real_start(thread)

    store = Store.open(url=pg_server.create_database("watchdog"), timeout_s=2.0)
    monkeypatch.setattr(threading.Thread, "start", counted)
    for n in range(100):
        store.record(Event(float(n), "gpu-a", "drain", "gpu0-7", "one of many"))
    assert len(started) <= 1, started
    watchdog = store._watchdog._thread
    assert watchdog is not None and watchdog.is_alive()
    store.close()
    assert not watchdog.is_alive()
