"""A deadline for a request's headers, which uvicorn does not have.

uvicorn's h11 protocol (uvicorn/protocols/http/h11_impl.py) arms its keep-alive timer
only after a response, and cancels it on the first byte of the next request: a client
that connects and sends nothing, or sends a request's headers a byte at a time, holds
its connection for as long as it likes. `serve` answers 503 once `MAX_CONNECTIONS` are
open, so a few hundred such connections from one client shut the page to everyone.

`HeaderTimeoutProtocol` closes a connection whose next request's headers have not all
arrived `timeout_s` after the connection opened or the previous response ended, and one
whose request's body stopped coming, or whose answer the client stopped reading
(uvicorn waits for its writes to drain), with no byte moved between two looks
`timeout_s` apart: part of a body,
or an answer left unread, held a connection for ever, and 499 of them turned /healthz and
/metrics into 503 (found by a review hunting leaks in a long-running serve). A request
the application is still working on is left alone, however long it takes.
It relies on the h11 protocol's internals (`cycle`, made once a request's headers are
whole; `on_response_complete`; `loop`; `transport`), stable across uvicorn's releases
so far: tests/test_web_header_timeout.py fails if they change.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 20.0
"""Seconds a client has for a request's headers (nginx's client_header_timeout is 60 s,
Apache's mod_reqtimeout 20-40 s); a browser sends them in one packet."""

log = logging.getLogger(__name__)


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's headers."""

    timeout_s = HEADER_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_after: object = None  # the request cycle whose successor must come in time
        self._stuck: object = None  # the request cycle whose body or answer stood still at the last look
        self._unsent = 0  # bytes of an ended answer still unsent at the last look
        self._received = 0  # bytes received on the connection, to tell a slow body from a stopped one
        self._progress: tuple[int, int] = (-1, -1)  # (received, unsent) at the last look at a request

    @classmethod
    def with_timeout(cls, timeout_s: float) -> type[HeaderTimeoutProtocol]:
        return type(cls.__name__, (cls,), {"timeout_s": timeout_s})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def data_received(self, data: bytes) -> None:
        self._received += len(data)
        super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._waiting_after = self.cycle
        self._unsent = 0
        self._deadline = self.loop.call_later(self.timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self.transport.get_protocol() is not self:
            return  # closed, or upgraded to a websocket whose protocol now reads it
        idle = self.cycle is None or self.cycle.response_complete  # else a request is being answered
        if idle:
            if self.cycle is not self._waiting_after:
                return
            unsent = self.transport.get_write_buffer_size()  # an answer the client is not reading
            if not unsent:  # no request's headers came whole since the deadline was set
                log.debug("closing %s: no request's headers within %g s", self.client, self.timeout_s)
                self.transport.close()
            elif unsent == self._unsent:
                log.debug("closing %s: it read none of its answer for %g s", self.client, self.timeout_s)
                self.transport.abort()  # close() would wait for the unread answer to be sent
            else:
                self._unsent = unsent
                self._deadline = self.loop.call_later(self.timeout_s, self._expired)
            return
        # a request is being answered: its body must keep coming, and its answer keep being read
        progress = (self._received, self.transport.get_write_buffer_size())
        waiting = self.cycle.more_body or self.flow.write_paused  # on the client, not on the app
        if waiting and self._stuck is self.cycle and progress == self._progress:
            log.debug("closing %s: its request's body or its answer stood still for %g s", self.client,
                      self.timeout_s)
            self.transport.abort()  # close() would wait for the unread answer to be sent
            return
        self._stuck, self._progress = (self.cycle if waiting else None), progress
        self._deadline = self.loop.call_later(self.timeout_s, self._expired)
