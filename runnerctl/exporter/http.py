"""The exporter's HTTP server: prometheus_client's WSGI app with limits.

prometheus_client's `start_http_server` (exposition.py: wsgiref's server with a thread
per connection) sets no socket timeout and no limit on connections: a client that
connects and sends nothing, or sends headers a byte at a time, holds a thread for ever,
and a flood of such connections costs a thread each without bound. This server gives
a connection `HEADER_TIMEOUT_S` (the deadline `serve`'s page uses) for its request's
headers and for each later read or write, and answers 503 at once while
`MAX_CONNECTIONS` are open. A scrape (one request per connection: wsgiref speaks
HTTP/1.0 to it) sends its headers in one packet and is answered in milliseconds.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app

from runnerctl.controller.header_timeout import HEADER_TIMEOUT_S

MAX_CONNECTIONS = 256
"""Connections handled at once (a thread each); Prometheus keeps one per target. One
client that keeps this many open (reopening each 20 s) still keeps scrapes out: on a host
with untrusted users, a firewall rule must let Prometheus alone reach it (docs/operations.md)."""
BUSY = b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"

log = logging.getLogger(__name__)


class _Handler(WSGIRequestHandler):
    """One request per connection; the connection is cut when its headers are late."""

    timeout = HEADER_TIMEOUT_S  # StreamRequestHandler.setup: each later read and write
    header_timeout_s = HEADER_TIMEOUT_S

    def setup(self) -> None:
        super().setup()
        self._deadline = threading.Timer(self.header_timeout_s, self._cut)
        self._deadline.daemon = True
        self._deadline.start()

    def _cut(self) -> None:
        """The headers are late: end the handler's blocked read (it sees end of file)."""
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed by the client

    def parse_request(self) -> bool:
        """Reads the headers (after the request line), then stops the deadline."""
        try:
            return super().parse_request()
        finally:
            self._deadline.cancel()  # the headers are whole (or bad, and answered 400)

    def finish(self) -> None:
        self._deadline.cancel()
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        """No line per scrape (prometheus_client's handler is silent too)."""


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], family: socket.AddressFamily, limit: int) -> None:
        self.address_family = family
        self._slots = threading.BoundedSemaphore(limit)
        self._limit, self._full = limit, False
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            if not self._full:
                log.warning("exporter: %d connections open, answering 503 until one closes", self._limit)
            self._full = True
            try:
                request.settimeout(1.0)
                request.sendall(BUSY)
            except OSError:
                pass  # the client went: nothing to answer
            self.shutdown_request(request)
            return
        self._full = False
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection cut or timed out: one debug line, not socketserver's traceback;
        anything else is a fault of ours, logged with its traceback."""
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            log.debug("exporter: connection from %s ended: %s", client_address, exc)
        else:
            log.error("exporter: handling a request from %s failed", client_address, exc_info=exc)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def start_server(host: str, port: int, registry: CollectorRegistry, *,
                 header_timeout_s: float = HEADER_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS) -> tuple[WSGIServer, threading.Thread]:
    """Serve `registry` on HOST:PORT (an IPv6 address too) from a daemon thread; the
    caller calls `shutdown()` and `server_close()` on the server."""
    family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    server = _Server((host, port), family, max_connections)
    server.RequestHandlerClass = type("_Handler", (_Handler,), {"timeout": header_timeout_s,
                                                              "header_timeout_s": header_timeout_s})
    server.set_app(make_wsgi_app(registry))
    thread = threading.Thread(target=server.serve_forever, name="exporter-http", daemon=True)
    thread.start()
    return server, thread
