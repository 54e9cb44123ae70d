"""The page and its JSON API, hung on the app that `serve` runs (`install(app, ...)`).

Reads come from the controller's last frozen view and the store; toggles go through
`runnerctl.controller.toggles.request`, the same path as `runnerctl pause|drain|resume`,
so they are stored with who, when and why and survive a restart. Access: reads are
public or need a session (`[web] public_read`; looked up off the event loop, and a store
too busy to tell is a 503, never a 500); toggles need a signed-in operator and the
session's CSRF token in `X-CSRF-Token`. Security headers go on every response.
"""

# no `from __future__ import annotations`: FastAPI reads the Depends() of closures at def time

import datetime
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import AfterValidator, BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.middleware.sessions import SessionMiddleware

from runnerctl.controller.app import refused
from runnerctl.controller.store import Store, StoreError
from runnerctl.controller.toggles import request as toggle_request
from runnerctl.controller.view import ControllerView
from runnerctl.logline import one_line
from runnerctl.settings import WebSettings, public_path
from runnerctl.web import auth, fleet
from runnerctl.web.oauth import GitLabOAuth, RoleCheck
from runnerctl.web.oauth import install as install_oauth
from runnerctl.web.sessions import Sessions
from runnerctl.web.view import EventOut, HostOut, JobMemory, event_out, host_page

log = logging.getLogger(__name__)

HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; "
                               "form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
OPEN_PATHS = ("/api/session", "/healthz", "/webhooks/")
"""Reachable without a session even when reads are not public (sign-in, probes, GitLab)."""
ASSETS = {"app.js": "text/javascript", "style.css": "text/css"}


class SessionOut(BaseModel):
    user: str | None
    role: str | None
    can_toggle: bool
    csrf: str
    public_read: bool
    gitlab_signin: bool


def _utf8(value: str) -> str:
    """JSON may carry a lone surrogate (\\ud800): no password hash, database or log takes it."""
    try:
        value.encode()
    except UnicodeEncodeError:
        raise ValueError("not valid Unicode text (a lone surrogate)") from None
    return value


Text = Annotated[str, AfterValidator(_utf8)]
Filter = Annotated[str | None, Query(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$",
                                     description="equal to this (case matters)")]


class SignIn(BaseModel):
    name: Text = Field(min_length=1, max_length=100)
    password: Text = Field(min_length=1, max_length=1000)


class ToggleIn(BaseModel):
    action: Literal["pause", "drain", "resume"]
    target: Text = Field(pattern=r"^(host|gpu:[0-9]{1,3}|slot:gpu[0-9]{1,3}([-+][0-9]{1,3})*)$",
                         description="host, gpu:N or slot:KEY (e.g. slot:gpu0-3)")
    reason: Text = Field("", max_length=500,
                         description="Why; stored and shown in the log. Pause and drain need one.")


class ToggleResult(BaseModel):
    message: str


def install(app: FastAPI, *, view: Callable[[], ControllerView], store: Store, settings: WebSettings,
            state_dir: Path, oauth: GitLabOAuth | None = None,
            clock: Callable[[], float] = time.time) -> None:
    limiter = auth.SignInLimiter(settings.signin_attempts, hashing=settings.max_concurrent_signins)
    auth.ready()  # the first sign-in of an unknown name takes as long as any other
    recheck = RoleCheck(oauth, store, clock) if oauth is not None and oauth.api_token else None
    sessions = Sessions(store, max_age_s=settings.session_max_age_s, recheck_s=settings.gitlab_role_check_s,
                        clock=clock, recheck=recheck)
    jobs = JobMemory()

    def reader(request: Request) -> auth.Principal | None:
        who = sessions.principal(request.session)
        if who is None and not settings.public_read:
            raise HTTPException(401, "sign in to see this page")
        return who

    def operator(request: Request, x_csrf_token: Annotated[str | None, Header()] = None) -> auth.Principal:
        if not auth.csrf_ok(request.session, x_csrf_token):
            raise HTTPException(403, "missing or wrong X-CSRF-Token")
        who = sessions.principal(request.session)
        if who is None or not who.can_toggle:
            raise HTTPException(403, "toggles need a signed-in operator")
        return who

    def session_out(request: Request) -> SessionOut:
        who = sessions.principal(request.session)
        return SessionOut(user=who.name if who else None, role=who.role if who else None,
                          can_toggle=bool(who and who.can_toggle), csrf=auth.csrf_token(request.session),
                          public_read=settings.public_read, gitlab_signin=oauth is not None)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page() -> HTMLResponse:
        return HTMLResponse(_asset("index.html"))

    @app.get("/static/{name}", include_in_schema=False)
    def asset(name: str) -> Response:
        if name not in ASSETS:
            raise HTTPException(404, "no such file")
        return Response(_asset(name), media_type=ASSETS[name])

    @app.get("/api/session", response_model=SessionOut, tags=["session"])
    def get_session(request: Request) -> SessionOut:
        """Who is signed in, whether they may toggle, and the CSRF token for state changes."""
        return session_out(request)

    @app.post("/api/session", response_model=SessionOut, tags=["session"],
              responses={401: {"description": "wrong name or password"},
                         403: {"description": "no CSRF token"},
                         429: {"description": "too many failed sign-ins"},
                         503: {"description": "too many sign-ins at once, or the store is busy; retry"}})
    def post_session(body: SignIn, request: Request,
                     x_csrf_token: Annotated[str | None, Header()] = None) -> SessionOut:
        """Sign in with a local account (`runnerctl user add`)."""
        if not auth.csrf_ok(request.session, x_csrf_token):
            raise HTTPException(403, "missing or wrong X-CSRF-Token")
        client = request.client.host if request.client else "?"  # the limiter adds up an IPv6 /64
        if not limiter.begin(client, body.name):
            raise HTTPException(429, "too many failed sign-ins; wait a minute")
        if not limiter.hash_slot():  # Argon2id: 64 MiB each
            limiter.succeeded(client, body.name)  # not evaluated: does not count
            raise HTTPException(503, "too many sign-ins at once; retry in a second",
                                headers={"Retry-After": "1"})
        try:
            who = auth.check_password(store, body.name, body.password)
        except StoreError:  # 503 (app.refused); the password was never checked: does not count
            limiter.succeeded(client, body.name)
            raise
        finally:
            limiter.hashing.release()
        if who is None:  # a name no account has may be a password typed in the wrong field: not logged
            named = repr(body.name) if store.user(body.name) is not None else "a name no account has"
            log.warning("failed sign-in for %s from %s", named, client)
            raise HTTPException(401, "wrong name or password")
        limiter.succeeded(client, body.name)
        sessions.sign_in(request.session, who)
        log.warning("%s signed in from %s", who.name, client)
        return session_out(request)

    @app.post("/api/session/end", response_model=SessionOut, tags=["session"],
              responses={403: {"description": "no CSRF token"}})
    def end_session(request: Request, x_csrf_token: Annotated[str | None, Header()] = None) -> SessionOut:
        """Sign out: the session ends on the server too (every copy of the cookie)."""
        if not auth.csrf_ok(request.session, x_csrf_token):
            raise HTTPException(403, "missing or wrong X-CSRF-Token")
        sessions.sign_out(request.session)
        return session_out(request)

    @app.get("/api/host", response_model=HostOut, tags=["host"], responses={401: {"description": "sign in"}})
    def host(who: Annotated[auth.Principal | None, Depends(reader)]) -> HostOut:
        """This host: every GPU's state, the slots, pending demand, what the controller does, the log."""
        current = view()
        return host_page(current, store.events(current.host, 50), jobs)

    @app.get("/api/events", response_model=list[EventOut], tags=["host"],
             responses={401: {"description": "sign in"}})
    def events(who: Annotated[auth.Principal | None, Depends(reader)],
               limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[EventOut]:
        """The activity log of this host, newest first (toggles with who and why, controller actions)."""
        return [event_out(e) for e in store.events(view().host, limit)]

    @app.get("/api/fleet", response_model=list[fleet.FleetHostOut], tags=["fleet"],
             responses={401: {"description": "sign in"}})
    def fleet_hosts(who: Annotated[auth.Principal | None, Depends(reader)]) -> list[fleet.FleetHostOut]:
        """Every host of the store (all hosts sharing a PostgreSQL store): running or stopped
        (no good tick for two intervals), its GPUs at its last good tick, toggles, last event."""
        return fleet.hosts(store, clock())

    @app.get("/api/queue", response_model=list[fleet.QueueJobOut], tags=["fleet"],
             responses={401: {"description": "sign in"}})
    def fleet_queue(who: Annotated[auth.Principal | None, Depends(reader)]) -> list[fleet.QueueJobOut]:
        """Every pending GPU job the running hosts see, most urgent first, with why it waits."""
        return fleet.queue(store, clock())

    @app.get("/api/history", response_model=list[fleet.HistoryJobOut], tags=["fleet"],
             responses={401: {"description": "sign in"}, 422: {"description": "a filter is not valid"}})
    def fleet_history(who: Annotated[auth.Principal | None, Depends(reader)],
                      user: Filter = None, project: Filter = None, host: Filter = None,
                      since: Annotated[datetime.datetime | None, Query(description=(
                          "YYYY-MM-DD or an ISO 8601 date and time (UTC unless it names an offset): "
                          "jobs that ran at some time since"))] = None,
                      limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[fleet.HistoryJobOut]:
        """The job history of every host sharing the store, newest first, filtered by user,
        project (path, e.g. `ml/sweeps`), host and time."""
        start = None if since is None else (
            since if since.tzinfo else since.replace(tzinfo=datetime.UTC)).timestamp()
        return fleet.history(store, limit=limit, since=start, user=user, project=project, host=host)

    @app.post("/api/toggles", response_model=ToggleResult, tags=["toggles"],
              responses={403: {"description": "not an operator, or no CSRF token"}})
    def toggle(body: ToggleIn, who: Annotated[auth.Principal, Depends(operator)]) -> ToggleResult:
        """Pause, drain or resume a GPU, a slot or the whole host, with a reason."""
        message = toggle_request(store, action=body.action, host=view().host, target=body.target,
                                 who=who.name, why=body.reason, now=clock())
        log.warning("web toggle: %s", one_line(message))
        return ToggleResult(message=message)

    if oauth is not None:
        install_oauth(app, oauth, sessions, settings.public_url)

    async def signed_out(request: Request) -> Response | None:
        """401 without a session, 503 when the store cannot tell; None: go on. The store may
        wait seconds for a lock: in a thread, never on the event loop that serves everyone."""
        try:
            who = await run_in_threadpool(sessions.principal, request.session)
        except StoreError as exc:  # middleware runs outside the app's exception handlers
            return refused(request, exc)
        return None if who is not None else JSONResponse({"detail": "sign in to see this page"}, 401)

    @app.middleware("http")
    async def guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        answer = None
        path = route_path(request.scope)
        if not settings.public_read and path.startswith("/api/") and not path.startswith(OPEN_PATHS):
            answer = await signed_out(request)
        response = answer if answer is not None else await call_next(request)
        response.headers.update(HEADERS)
        return response

    # added last, so it runs first: `guard` reads the session it decodes
    app.add_middleware(SessionMiddleware, secret_key=auth.session_key(state_dir),
                       session_cookie=session_cookie(settings.public_url), max_age=settings.session_max_age_s,
                       same_site="lax", https_only=settings.https_only_cookies,
                       path=public_path(settings.public_url) or "/")


def session_cookie(public_url: str) -> str:
    """The session cookie's name: `runnerctl_session`, and under a sub-path its own name
    too (`runnerctl_session_gpus`). The path alone does not keep two pages of one domain
    apart: a browser sends a root page's cookie of the same name to /gpus as well, and the
    last one read won (a review of the day's changes)."""
    path = public_path(public_url).strip("/")
    return "runnerctl_session" + (f"_{re.sub(r'[^A-Za-z0-9]+', '_', path)}" if path else "")


def route_path(scope: Mapping[str, Any]) -> str:
    """The path the routes match: without the root_path (`[web] public_url`'s), which
    uvicorn puts in front of it. Matched as it came, /gpus/api/state passed the sign-in
    check unasked (found by a review of the day's changes)."""
    path, root = str(scope["path"]), str(scope.get("root_path", ""))
    if root and path.startswith(root) and path[len(root):len(root) + 1] in ("", "/"):
        return path[len(root):] or "/"
    return path


def _asset(name: str) -> str:
    return resources.files("runnerctl.web").joinpath("pages", name).read_text(encoding="utf-8")
