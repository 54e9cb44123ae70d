"""The exporter's HTTP server (`runnerctl.exporter.http`): a scrape is answered, a
connection whose headers are late is closed, and a full server answers 503 at once and
serves again once connections close. prometheus_client's own server did none of the
last two. Real sockets on loopback, with short limits for the test."""

from __future__ import annotations

import contextlib
import itertools
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client import CollectorRegistry, Gauge

from runnerctl.exporter.http import start_server

WAIT_S = 60.0  # what a test waits at most for a state: CI machines are slow


@contextlib.contextmanager
def _server(header_timeout_s: float = 0.5, max_connections: int = 64,
            host: str = "127.0.0.1") -> Iterator[tuple[str, int]]:
    registry = CollectorRegistry()
    Gauge("runnerctl_test_value", "a value", registry=registry).set(7)
    server, thread = start_server(host, 0, registry, header_timeout_s=header_timeout_s,
                                  max_connections=max_connections)
    try:
        yield host, server.server_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(WAIT_S)


def _connect(address: tuple[str, int]) -> socket.socket:
    return socket.create_connection(address, timeout=WAIT_S)


def _closed_by_server(sock: socket.socket) -> bytes:
    """What the server sent before closing; a socket timeout of WAIT_S fails the test."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _url(address: tuple[str, int]) -> str:
    host, port = address
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}/metrics"


def test_a_scrape_is_answered_with_the_registry() -> None:
    with _server() as address:
        answer = httpx.get(_url(address), timeout=WAIT_S)
    assert answer.status_code == 200
    assert "runnerctl_test_value 7.0" in answer.text


def test_an_ipv6_listen_address_is_served() -> None:
    with _server(host="::1") as address:
        assert "runnerctl_test_value 7.0" in httpx.get(_url(address), timeout=WAIT_S).text


def test_connections_whose_headers_are_late_are_closed() -> None:
    with _server() as address:
        with _connect(address) as sock:  # sends nothing
            assert _closed_by_server(sock) == b""
        with _connect(address) as sock:  # half a request, then nothing more
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Half: ")
            assert _closed_by_server(sock) == b""
        with _connect(address) as sock, pytest.raises(OSError):  # a byte every 10 ms, never done
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")
            deadline = time.monotonic() + WAIT_S
            for byte in itertools.cycle(b"X-Drip: a\r\n"):
                assert time.monotonic() < deadline, "a client sending a byte every 10 ms kept its connection"
                sock.send(bytes([byte]))  # fails once the server has closed
                time.sleep(0.01)


def test_a_full_server_answers_503_and_serves_again_once_connections_close() -> None:
    with _server(header_timeout_s=WAIT_S, max_connections=3) as address:
        silent = [_connect(address) for _ in range(3)]
        try:
            with _connect(address) as sock:  # refused at once, long before the deadline
                sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                assert _closed_by_server(sock).startswith(b"HTTP/1.0 503")
        finally:
            for sock in silent:
                sock.close()
        deadline = time.monotonic() + WAIT_S
        while (answer := httpx.get(_url(address), timeout=WAIT_S)).status_code != 200:
            assert answer.status_code == 503 and time.monotonic() < deadline
            time.sleep(0.05)  # polling the state: the closed connections' threads end by themselves
        assert "runnerctl_test_value 7.0" in answer.text


def test_a_fault_in_the_handler_is_logged_not_hidden(monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """A cut connection is a debug line; any other error in handling is ours and logged."""
    from runnerctl.exporter import http

    def broken(self: object) -> bool:
        raise RuntimeError("a bug")

    monkeypatch.setattr(http._Handler, "parse_request", broken)
    with _server() as address, _connect(address) as sock:
        sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        _closed_by_server(sock)
    deadline = time.monotonic() + WAIT_S
    while "handling a request from" not in caplog.text:
        assert time.monotonic() < deadline, caplog.text
        time.sleep(0.01)  # polling the state: the handler thread logs as it ends
    assert "RuntimeError: a bug" in caplog.text
