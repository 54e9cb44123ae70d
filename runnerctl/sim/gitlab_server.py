"""A real HTTP server that speaks the part of GitLab's API v4 runnerctl and gitlab-runner use.

python-gitlab talks to it exactly as to GitLab, so the real client code runs in the demo
and in tests; the runner stand-in polls it as gitlab-runner polls GitLab. The rules live
in the modules it wires together: runnerctl.sim.gitlab_state (runners, jobs, queue, drop
rules), gitlab_directory (users, groups, projects), gitlab_access (token scopes, roles,
GitLab's error bodies), gitlab_runner_api (the runner side), gitlab_rest_ci and
gitlab_rest_users (the user side), gitlab_hooks (job webhooks), gitlab_oauth (GitLab as
an OAuth provider). Authentication as in lib/api/api_guard.rb and lib/gitlab/auth/auth_finders.rb:
a `PRIVATE-TOKEN` header, a `private_token` parameter or `Authorization: Bearer` (personal
or OAuth token); none or an unknown one is 401 `{"message": "401 Unauthorized"}`.
Pagination by `page`/`per_page` with `X-Page`, `X-Per-Page`, `X-Total`, `X-Total-Pages`,
`X-Next-Page` and `Link` (lib/gitlab/pagination/offset_pagination.rb). An unknown route
is 404 `{"error": "404 Not Found"}` (lib/api/api.rb `route :any, '*path'`).

GitLab's StuckBuildsDropWorker runs hourly from cron (config/initializers/1_settings.rb,
`stuck_ci_jobs_worker` `0 * * * *`); here a watched thread runs `drop_stuck_jobs` every
`drop_interval_s` (None: never, the caller does it).

Test hooks, outside GitLab's API, under `/-/sim/`: `POST /-/sim/jobs` {project_id, tags,
duration_s, user[, name, after_script_s]} -> {"id"}: a job whose script is `sleep
<duration_s>`; `POST /-/sim/drop` runs the drop rules now; `POST /-/sim/clock`
{advance_s} moves an `OffsetClock`; `GET /-/sim/health` says whether the server's
threads live.

Tests inject faults (`Fault`): a status (401, 403, 404, 429 with or without `Retry-After`,
500, 502), `drop` (close the connection with no answer), `lost` (carry the request out,
then close the connection with no answer: a create that happened although the client
saw a failure) or `delay` (answer late, so a client times out). Every request is logged in `requests`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import threading
import time
import urllib.parse
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from runnerctl.sim.gitlab_access import Access, ApiError, Caller, check_scope, invalid_token, unauthorized
from runnerctl.sim.gitlab_directory import AccessToken
from runnerctl.sim.gitlab_hooks import Hooks
from runnerctl.sim.gitlab_oauth import OAuthProvider
from runnerctl.sim.gitlab_rest_ci import CiRoutes
from runnerctl.sim.gitlab_rest_users import UserRoutes
from runnerctl.sim.gitlab_runner_api import RunnerApi
from runnerctl.sim.gitlab_sim_hooks import SimHooks
from runnerctl.sim.gitlab_state import GitLabState

log = logging.getLogger(__name__)
CHANGING = frozenset({"POST", "PUT", "DELETE", "PATCH"})
Answer = tuple[int, Any, dict[str, str]]


RATE_LIMITED = "This endpoint has been requested too many times. Try again later."
"""GitLab's 429 text (lib/api/helpers/rate_limiter.rb)."""


@dataclasses.dataclass
class Fault:
    method: str  # "*" for any
    path: str  # regex matched against the path without /api/v4
    kind: str  # "401", "403", "404", "429", "500", "502", "drop", "lost" or "delay"
    count: int = 1  # how many requests it hits
    retry_after: int | None = 1
    """Seconds, for 429; None: no header, as GitLab's `check_rate_limit!` answers in most
    versions (lib/api/helpers/rate_limiter.rb `render_api_error!({ error: ... }, 429)`)."""
    delay_s: float = 0.0  # for "delay"


@dataclasses.dataclass(frozen=True)
class LoggedRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    status: int | None


class GitLabServer:
    """`with GitLabServer(state, tokens={"glpat-x": "alice"}) as server: server.url`.

    Each token in `tokens` is a personal access token with scope `api` of its user; the
    users named in `admins` are administrators. `requests` logs every request for tests
    to read; a server meant to run for days passes `keep_requests` so that the log keeps
    only that many of the newest.
    """

    def __init__(self, state: GitLabState | None = None, *, tokens: dict[str, str] | None = None,
                 host: str = "127.0.0.1", port: int = 0, admins: Iterable[str] = ("admin",),
                 drop_interval_s: float | None = None, keep_requests: int | None = None) -> None:
        self.state = state or GitLabState()
        directory = self.state.directory
        for name in admins:
            directory.add_user(name, admin=True)
        for value, user in (tokens or {"glpat-runnerctl-test": "admin"}).items():
            directory.add_token(user, ["api"], name="default", token=value)
        self.faults: list[Fault] = []
        self.oauth = OAuthProvider(directory)
        self.requests: list[LoggedRequest] = []
        self.keep_requests = keep_requests
        self.lock = threading.RLock()
        self.access = Access(directory)
        self.runner_api = RunnerApi(self.state)
        self.hooks = Hooks(directory, self.state.runners.get, self.state.clock, base_url=self.state.base_url)
        self.state.listeners.append(self.hooks.job_changed)
        self.ci = CiRoutes(self.state, self.access)
        self.users = UserRoutes(self.access, self.hooks, self.state.clock)
        self.sim = SimHooks(self.state, self.lock, drop_interval_s)
        self._httpd = ThreadingHTTPServer((host, port), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> GitLabServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        self.hooks.start()
        self.sim.start()
        return self

    def stop(self) -> None:
        self.sim.stop()
        self._httpd.shutdown()
        self._httpd.server_close()
        self.hooks.stop()

    def __enter__(self) -> GitLabServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add_token(self, user: str, scopes: Iterable[str], *, admin: bool = False,
                  expires_at: str | None = None) -> str:
        """A personal access token of `user` (made if unknown) with `scopes`, expiring at the
        start of the day `expires_at` (never: None), for tests; over HTTP the same is
        `POST /users/:id/personal_access_tokens`."""
        with self.lock:
            self.state.directory.add_user(user, admin=admin)
            return self.state.directory.add_token(user, scopes, name="test", expires_at=expires_at).token

    def log(self, request: LoggedRequest) -> None:
        with self.lock:
            self.requests.append(request)
            if self.keep_requests is not None and len(self.requests) > 2 * self.keep_requests:
                del self.requests[:-self.keep_requests]

    def changing_requests(self) -> list[LoggedRequest]:
        return [r for r in self.requests if r.method in CHANGING]

    def take_fault(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.count > 0 and fault.method in ("*", method) and re.search(fault.path, path):
                    fault.count -= 1
                    return fault
        return None

    def caller(self, headers: dict[str, str],
               query: dict[str, list[str]]) -> tuple[Caller, AccessToken] | None:
        """Who is calling (lib/gitlab/auth/auth_finders.rb): the token's user and scopes."""
        value = headers.get("private-token") or query.get("private_token", [""])[0]
        if not value and headers.get("authorization", "").startswith("Bearer "):
            value = headers["authorization"][7:]
        token = self.state.directory.token(value)
        if token is None:
            return None
        if token.revoked:
            raise invalid_token("Token was revoked. You have to re-authorize from the user.")
        if token.expired(self.state.clock()):
            raise invalid_token("Token is expired. You can either do re-authorization or token refresh.")
        name = token.username
        return Caller(name, token.scopes, token.kind, self.state.directory.is_admin(name)), token

    def answer(self, method: str, path: str, query: dict[str, list[str]], body: dict[str, Any],
               headers: dict[str, str], raw: bytes) -> Answer:
        """One API v4 request (path without /api/v4), under the lock."""
        with self.lock:
            try:
                if self.runner_api.handles(method, path):
                    return self.runner_api.route(method, path, body, headers, raw)
                found = self.caller(headers, query)
                if found is None:
                    raise unauthorized()
                caller, token = found
                check_scope(caller, method, path)
                result = (self.ci.route(caller, method, path, query, body)
                          or self.users.route(caller, token, method, path, query, body))
                if result is None:
                    return 404, {"error": "404 Not Found"}, {}
                status, payload = result
                return self._page(payload, query) if isinstance(payload, list) else (status, payload, {})
            except ApiError as exc:
                return exc.status, exc.body, exc.headers

    def _page(self, items: list[Any], query: dict[str, list[str]]) -> Answer:
        try:
            page = max(1, int(query.get("page", ["1"])[0]))
            per_page = min(100, max(1, int(query.get("per_page", ["20"])[0])))
        except ValueError:
            return 400, {"error": "page is invalid"}, {}
        pages = max(1, -(-len(items) // per_page))
        headers = {"X-Page": str(page), "X-Per-Page": str(per_page), "X-Total": str(len(items)),
                   "X-Total-Pages": str(pages), "X-Next-Page": str(page + 1) if page < pages else ""}
        if page < pages:
            headers["_next_page"] = str(page + 1)
        return 200, items[(page - 1) * per_page: page * per_page], headers


def _handler_for(server: GitLabServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
            return

        def _serve(self) -> None:
            parsed = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(parsed.query)
            raw = self._raw()
            try:
                body = self._body(raw)
            except ValueError:
                self._send(400, {"error": "body is not valid JSON"}, {}, parsed)
                return
            if parsed.path.startswith("/oauth/"):
                with server.lock:
                    answer = server.oauth.handle(self.command, parsed.path, query, body)
                server.log(LoggedRequest(self.command, parsed.path, query, answer[0]))
                self._send(*answer, parsed)
                return
            if parsed.path.startswith("/-/"):
                self._send(*server.sim.handle(self.command, parsed.path, body), parsed)
                return
            path = parsed.path.removeprefix("/api/v4")
            fault = server.take_fault(self.command, path)
            if fault is not None and fault.kind == "drop":
                server.log(LoggedRequest(self.command, path, query, None))
                self.close_connection = True
                self.connection.close()
                return
            if fault is not None and fault.kind == "delay":
                time.sleep(fault.delay_s)
            if fault is not None and fault.kind.isdigit():
                status = int(fault.kind)
                headers = {"Retry-After": str(fault.retry_after)} \
                    if status == 429 and fault.retry_after is not None else {}
                payload: Any = {"message": f"{status} {_REASONS.get(status, 'Error')}"}
                if status == 429 and fault.retry_after is None:
                    payload = {"message": {"error": RATE_LIMITED}}
            else:
                lowered = {k.lower(): v for k, v in self.headers.items()}
                status, payload, headers = server.answer(self.command, path, query, body, lowered, raw)
            server.log(LoggedRequest(self.command, path, query, status))
            if fault is not None and fault.kind == "lost":  # done, but the answer never arrives
                self.close_connection = True
                self.connection.close()
                return
            self._send(status, payload, headers, parsed)

        def _raw(self) -> bytes:
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _body(self, raw: bytes) -> dict[str, Any]:
            if not raw:
                return {}
            content_type = self.headers.get("Content-Type") or ""
            if "json" in content_type:
                loaded = json.loads(raw)
                return loaded if isinstance(loaded, dict) else {}
            if "x-www-form-urlencoded" in content_type or not content_type:
                pairs = urllib.parse.parse_qs(raw.decode(errors="replace"))
                return {k: (v if k.endswith("[]") else v[-1]) for k, v in pairs.items()}
            return {}  # a trace patch or another raw body

        def _send(self, status: int, payload: Any, headers: dict[str, str],
                  parsed: urllib.parse.SplitResult) -> None:
            content_type = headers.pop("Content-Type", None)
            text = isinstance(payload, str)  # the simulated sign-in/consent page, or a plain answer
            data = b"" if payload is None else payload.encode() if text else json.dumps(payload).encode()
            self.send_response(status)
            next_page = headers.pop("_next_page", None)
            if next_page:
                query = dict(urllib.parse.parse_qsl(parsed.query))
                query["page"] = next_page
                host = self.headers.get("Host", "localhost")
                link = f"http://{host}{parsed.path}?{urllib.parse.urlencode(query)}"
                self.send_header("Link", f'<{link}>; rel="next"')
            for key, value in headers.items():
                self.send_header(key, value)
            if data:
                self.send_header("Content-Type", content_type or ("text/html; charset=utf-8" if text
                                                                  else "application/json"))
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve

    return Handler


_REASONS = {401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 429: "Too Many Requests",
            500: "Internal Server Error", 502: "Bad Gateway"}
