"""The ASGI app `serve` runs: the controller's view as JSON, and GitLab's webhooks.

Requests never reach NVML or GitLab: `GET /api/state` returns the last
`ControllerView` (replaced once per tick), and `POST /webhooks/gitlab` hands a job
event to the demand tracker after checking `X-Gitlab-Token` (the body is parsed only
after the token passed: `_JsonBody`). `GET /healthz` is 200 only
while `health()` (the loop's `Liveness.report`) says ticks succeed and the reconcile
thread lives, 503 otherwise, so a stalled controller is seen by whatever probes it. `GET /metrics` answers
with whatever `metrics()` renders (the exporter's scrape of the same view) when given.
A `RunnerctlError` a route raises becomes 422 (bad input) or 503 (the store is
unavailable), one line. The web page (runnerctl.web) hangs on this app through `extend`: callables the caller
passes in, so the controller layer imports neither the page nor the exporter.

Bad input is a 4xx, never a 500: bodies over `max_body_bytes` get 413 before they are
read (`BodyLimit`), and a 422 names the fields that failed but never echoes their input
(it may hold a password, or a lone surrogate that cannot be encoded as UTF-8). HEAD
is answered as GET without the body (`HeadAsGet`), for probes and `curl -I`.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Header, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runnerctl.controller.store import StoreError
from runnerctl.controller.view import ControllerView
from runnerctl.errors import RunnerctlError
from runnerctl.logline import one_line

log = logging.getLogger(__name__)
REFUSAL_LOG_S = 600.0
"""A refused webhook is logged once per client and reason in this long."""
GZIP_MIN_BYTES = 4096
"""Answers at least this large are gzipped for a client that accepts it."""


def create_app(view: Callable[[], ControllerView],
               webhook: Callable[[str | None, Mapping[str, Any]], bool],
               metrics: Callable[[], tuple[bytes, str]] | None = None, *,
               extend: Sequence[Callable[[FastAPI], None]] = (),
               health: Callable[[], tuple[bool, dict[str, Any]]] | None = None,
               max_body_bytes: int = 1024 * 1024,
               webhook_refusal: Callable[[str | None], str] | None = None) -> FastAPI:
    """`webhook_refusal(token)`: why a refused webhook was refused, for the log."""
    app = FastAPI(title="runnerctl", docs_url=None, redoc_url=None)
    refusals_logged: dict[tuple[str, str], float] = {}  # (client, why) -> when last logged
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(ClientDisconnect, _gone)
    app.exception_handler(RunnerctlError)(refused)
    if metrics is not None:
        render = metrics

        # async: answered on the event loop, never queued behind page requests that fill the
        # thread pool while they wait on a slow store (found by a review as a concurrency
        # engineer: /healthz and /metrics hung for as long, and the wrong alert fired)
        @app.get("/metrics", include_in_schema=False)
        async def prometheus_metrics() -> Response:
            body, content_type = render()
            return Response(body, media_type=content_type)

    @app.get("/api/state")
    async def state() -> JSONResponse:
        return JSONResponse(view().to_json())

    @app.get("/healthz", responses={503: {"description": "no good tick lately, the loop's thread died, or "
                                                  "GitLab or the GPUs failing for as long"}})
    async def healthz() -> JSONResponse:
        current = view()
        ok, detail = health() if health is not None else (True, {})
        return JSONResponse({"ok": ok, "tick": current.tick, "host": current.host, **detail},
                            status_code=200 if ok else 503)

    @app.post("/webhooks/gitlab", responses={400: {"description": "body is not a JSON object"},
                                             401: {"description": "missing or wrong X-Gitlab-Token"}},
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": {"type": "object"}}}}})
    async def gitlab_webhook(request: Request,
                             x_gitlab_token: str | None = Header(default=None)) -> Response:
        try:
            payload = _JsonBody(await request.body())
            accepted = webhook(x_gitlab_token, payload)
        except _BadBody as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        if not accepted:
            why = (webhook_refusal(x_gitlab_token) if webhook_refusal is not None else "") \
                or "missing or wrong X-Gitlab-Token"
            client = request.client.host if request.client else "?"
            now = time.monotonic()
            if now - refusals_logged.get((client, why), -math.inf) >= REFUSAL_LOG_S:  # not a line per job
                if len(refusals_logged) >= 1024:  # many clients: memory stays bounded, lines a few more
                    refusals_logged.clear()
                refusals_logged[(client, why)] = now
                log.warning("webhook from %s refused: %s (its body is not read; logged again after "
                            "%.0f min if it goes on)", client, why, REFUSAL_LOG_S / 60)
            return JSONResponse({"error": "invalid X-Gitlab-Token"}, status_code=401)
        return JSONResponse({"ok": True})

    for hook in extend:
        hook(app)
    # the fleet's queue is about 1.7 MB at 30 hosts and 500 pending jobs, polled every 2 s
    # per open page; it compresses 60-fold (found by a review sizing a big lab). No answer
    # puts what a request sent beside a secret (BREACH needs both in one compressed body).
    app.add_middleware(GZipMiddleware, minimum_size=GZIP_MIN_BYTES)
    app.add_middleware(HeadAsGet)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)  # added last: runs first
    return app


def refused(request: Request, exc: RunnerctlError) -> JSONResponse:
    """A request runnerctl refuses (a toggle naming no such GPU: 422) or cannot serve
    now (the store is unreachable or busy: 503), in one line, never a 500. Also for
    middleware (runnerctl.web.routes' guard), which runs outside the exception handlers."""
    unavailable = isinstance(exc, StoreError)
    now, key = _clock(), f"{request.method} {request.url.path}"
    if not unavailable or now - _store_trouble_logged.get(key, -math.inf) >= STORE_TROUBLE_LOG_S:
        if unavailable:  # the loop logs the outage once; each open page asks every 2 s
            if len(_store_trouble_logged) >= 256:  # paths come from clients: bounded
                _store_trouble_logged.clear()
            _store_trouble_logged[key] = now
        log.warning("%s %s: %s%s", request.method, request.url.path, one_line(str(exc)),
                    " (logged once a minute for this path while the store fails)" if unavailable else "")
    return JSONResponse({"detail": str(exc)}, status_code=503 if unavailable else 422)


STORE_TROUBLE_LOG_S = 60.0
"""Requests the store cannot serve are logged at most once in this long per method and
path: one browser tab polls four endpoints every 2 s, 7,200 lines an hour during an
outage (found by a review hunting leaks in a long-running serve), and a toggle that
failed is still said beside them."""
_store_trouble_logged: dict[str, float] = {}
_clock = time.monotonic


class _BadBody(ValueError):
    pass


class _JsonBody(Mapping[str, Any]):
    """A webhook body parsed on first use, so the tracker checks the token before any
    parsing happens (a 100k-deep nesting from anyone costs nothing)."""

    def __init__(self, raw: bytes) -> None:
        self._raw = raw
        self._data: dict[str, Any] | None = None

    def _parsed(self) -> dict[str, Any]:
        if self._data is None:
            try:
                data = json.loads(self._raw)
            except (ValueError, RecursionError):
                raise _BadBody("body is not JSON (or nested too deeply)") from None
            if not isinstance(data, dict):
                raise _BadBody("body is not a JSON object")
            try:  # a lone surrogate (\ud800) would break every JSON answer that shows it
                json.dumps(data, ensure_ascii=False).encode()
            except UnicodeEncodeError:
                raise _BadBody("body is not valid Unicode text") from None
            self._data = data
        return self._data

    def __getitem__(self, key: str) -> Any:
        return self._parsed()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._parsed())

    def __len__(self) -> int:
        return len(self._parsed())


async def _gone(request: Request, exc: Exception) -> Response:
    """A client that hung up before its body was read: nothing to answer, nothing to log
    (its traceback was an ERROR of 5 KB per connection, and any client can hang up;
    found by a review hunting leaks in a long-running serve)."""
    return Response(status_code=400)


async def _invalid(request: Request, exc: Exception) -> Response:
    """422 with where and what, without the input (see the module docstring)."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    detail = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
              for e in errors]
    return JSONResponse({"detail": json.loads(json.dumps(detail, ensure_ascii=True))}, status_code=422)


class BodyLimit:
    """ASGI middleware: 413 for a body over `max_bytes`, by its Content-Length before reading,
    or once that many bytes of a chunked body arrived (nothing more is read: the app sees
    the body end there, and whatever it answers is replaced by the 413)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        seen, over = 0, False

        async def limited() -> Message:
            nonlocal seen, over
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:  # stop reading; the app's answer is replaced by 413
                over = True
                return {"type": "http.request", "body": b"", "more_body": False}
            return message

        async def answer(message: Message) -> None:
            if not over:
                await send(message)
            elif message["type"] == "http.response.start":
                await self._refuse(send)

        await self.app(scope, limited, answer)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps({"detail": f"request body over {self.max_bytes} bytes"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


class HeadAsGet:
    """ASGI middleware: HEAD is answered as GET, headers only (RFC 9110 section 9.3.2).
    FastAPI's routes take GET alone, so a probe or `curl -I` got 405 without it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            await send({**message, "body": b""} if message["type"] == "http.response.body" else message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)
