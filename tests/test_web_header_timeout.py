"""`serve`'s web server gives a client a deadline for each request's headers
(`HeaderTimeoutProtocol`): uvicorn itself waits forever for a connection that sends
nothing or half a request, so MAX_CONNECTIONS such connections shut the page to all.
A real uvicorn on a loopback port, with the deadline short for the test."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest
import uvicorn
from fastapi import FastAPI, Request, Response

from runnerctl.controller.serve import MAX_CONNECTIONS, http_config
from runnerctl.settings import WebSettings
from tests.pg import free_port

DEADLINE_S = 0.5
WAIT_S = 60.0  # what a test waits at most for a state: CI machines are slow


@contextlib.contextmanager
def _server(deadline_s: float, slow_s: float = 0.0) -> Iterator[str]:
    app = FastAPI()

    @app.get("/")
    async def root() -> dict[str, str]:
        return {"ok": "yes"}

    @app.get("/slow")
    async def slow() -> dict[str, str]:
        await asyncio.sleep(slow_s)
        return {"ok": "late"}

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    @app.get("/big")
    async def big() -> Response:
        return Response(b"x" * (64 << 20))

    port = free_port()
    server = uvicorn.Server(http_config(app, "127.0.0.1", port, WebSettings(), "error",
                                       header_timeout_s=deadline_s))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT_S
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(WAIT_S)


@pytest.fixture
def url() -> Iterator[str]:
    with _server(DEADLINE_S) as address:
        yield address


def _connect(url: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=WAIT_S)


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the server closes (EOF); a socket timeout of WAIT_S fails the test."""
    while sock.recv(65536):
        pass
    return True


def test_a_connection_that_sends_nothing_is_closed(url: str) -> None:
    with _connect(url) as sock:
        assert _closed_by_server(sock)


def test_half_a_request_is_closed_also_after_a_kept_alive_one(url: str) -> None:
    with _connect(url) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half: ")
        assert _closed_by_server(sock)
    with _connect(url) as sock:  # a whole request, then the next one's first line only
        sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET / HTTP/1.1\r\n")  # uvicorn cancels its keep-alive timer on this
        assert _closed_by_server(sock)


def _ask(sock: socket.socket, path: str) -> bytes:
    """One request on `sock` and its whole answer (the app's bodies end with '}')."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    answer = b""
    while not answer.endswith(b"}"):
        chunk = sock.recv(65536)
        assert chunk, f"closed after {answer!r}"
        answer += chunk
    return answer


def test_requests_whose_headers_came_are_answered_however_long_they_take() -> None:
    with _server(2.0, slow_s=3.0) as url, _connect(url) as sock:
        assert _ask(sock, "/slow").endswith(b'{"ok":"late"}')  # handled for longer than the deadline
        assert _ask(sock, "/").endswith(b'{"ok":"yes"}')  # on the same connection, kept alive


def test_the_connection_limit_filled_by_silent_clients_frees_itself() -> None:
    needed = 2 * (MAX_CONNECTIONS + 10) + 100  # both ends of each connection are in this process
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        assert hard == resource.RLIM_INFINITY or hard >= needed, f"ulimit -Hn {hard}: the test needs {needed}"
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    with _server(15.0) as url:  # long enough to open them all and ask once on a slow machine
        silent = [_connect(url) for _ in range(MAX_CONNECTIONS + 10)]
        try:
            with httpx.Client(timeout=WAIT_S, headers={"Connection": "close"}) as client:
                codes = [client.get(f"{url}/").status_code]
                deadline = time.monotonic() + WAIT_S
                while codes[-1] != 200:
                    assert time.monotonic() < deadline, codes[-5:]
                    time.sleep(0.1)  # polling the state: each refused request is answered at once
                    codes.append(client.get(f"{url}/").status_code)
            assert codes[0] == 503 and set(codes) == {503, 200}, codes[:5]
        finally:
            for sock in silent:
                sock.close()


def test_part_of_a_body_or_an_answer_left_unread_does_not_hold_a_connection(url: str) -> None:
    """Headers, then one byte of a 100-byte body; or a request whose answer the client never
    reads: each held its connection for ever (found by a review hunting leaks in a
    long-running serve). Closed once nothing moved between two looks a deadline apart; a
    body that keeps coming, however slowly, is answered."""
    with _connect(url) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{")
        assert _closed_by_server(sock)
    with _connect(url) as sock:
        sock.sendall(b"GET /big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        deadline, client_end = time.monotonic() + WAIT_S, sock.getsockname()
        while any(c.raddr and tuple(c.raddr) == client_end for c in psutil.Process().net_connections("tcp")):
            assert time.monotonic() < deadline, "the server kept a connection whose answer nobody reads"
            time.sleep(0.05)  # polling the state (reading nothing): the server lets it go once nothing moved
    slow_deadline_s = 2.0  # a loaded machine may hold this thread up for a while between bytes
    with _server(slow_deadline_s) as slow_url, _connect(slow_url) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 20\r\n\r\n")
        for _ in range(20):  # a byte every 8th of a deadline: 2.5 deadlines in all, never standing still
            time.sleep(slow_deadline_s / 8)  # pacing the client, not waiting for a state
            sock.sendall(b"x")
        answer = b""
        while not answer.endswith(b"}"):
            chunk = sock.recv(65536)
            assert chunk, f"closed after {answer!r}"
            answer += chunk
        assert answer.endswith(b'{"bytes":20}')
