"""The ASGI app `serve` runs: the controller's view as JSON, and GitLab's webhooks.

Requests never reach NVML or GitLab: `GET /api/state` returns the last
`ControllerView` (replaced once per tick), and `POST /webhooks/gitlab` hands a job
event to the demand tracker after checking `X-Gitlab-Token`. `GET /healthz` is 200 only
while `health()` (the loop's `Liveness.report`) says ticks succeed and the reconcile
thread lives, 503 otherwise, so a stalled controller is seen by whatever probes it. `GET /metrics` answers
with whatever `metrics()` renders (the exporter's scrape of the same view) when given.
A `RunnerctlError` a route raises becomes 422 (bad input) or 503 (the store is
unavailable), one line. The web page (runnerctl.web) hangs on this app through `extend`: callables the caller
passes in, so the controller layer imports neither the page nor the exporter.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Header, Request, Response
from fastapi.responses import JSONResponse

from runnerctl.controller.loop import ControllerView
from runnerctl.controller.store import StoreError
from runnerctl.errors import RunnerctlError

log = logging.getLogger(__name__)


def create_app(view: Callable[[], ControllerView],
               webhook: Callable[[str | None, Mapping[str, Any]], bool],
               metrics: Callable[[], tuple[bytes, str]] | None = None, *,
               extend: Sequence[Callable[[FastAPI], None]] = (),
               health: Callable[[], tuple[bool, dict[str, Any]]] | None = None) -> FastAPI:
    app = FastAPI(title="runnerctl", docs_url=None, redoc_url=None)

    @app.exception_handler(RunnerctlError)
    def refused(request: Request, exc: RunnerctlError) -> JSONResponse:
        """A request runnerctl refuses (a toggle naming no such GPU: 422) or cannot serve
        now (the store is unreachable or busy: 503), in one line, never a 500."""
        unavailable = isinstance(exc, StoreError)
        log.warning("%s %s: %s", request.method, request.url.path, exc)
        return JSONResponse({"detail": str(exc)}, status_code=503 if unavailable else 422)
    if metrics is not None:
        render = metrics

        @app.get("/metrics", include_in_schema=False)
        def prometheus_metrics() -> Response:
            body, content_type = render()
            return Response(body, media_type=content_type)

    @app.get("/api/state")
    def state() -> JSONResponse:
        return JSONResponse(view().to_json())

    @app.get("/healthz", responses={503: {"description": "no good tick lately, or the loop's thread died"}})
    def healthz() -> JSONResponse:
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
            payload = json.loads(await request.body())
        except ValueError:
            return JSONResponse({"error": "body is not JSON"}, status_code=400)
        if not isinstance(payload, dict):
            return JSONResponse({"error": "body is not a JSON object"}, status_code=400)
        if not webhook(x_gitlab_token, payload):
            log.warning("webhook refused: missing or wrong X-Gitlab-Token")
            return JSONResponse({"error": "invalid X-Gitlab-Token"}, status_code=401)
        return JSONResponse({"ok": True})

    for hook in extend:
        hook(app)
    return app
