"""A real HTTP server that speaks the part of GitLab's REST API v4 runnerctl uses.

python-gitlab talks to it exactly as to GitLab, so the real client code runs in the
demo and in tests. Shapes follow docs.gitlab.com/api/runners (POST /user/runners,
GET/PUT/DELETE /runners/:id, GET /runners, GET /runners/:id/jobs, POST
/runners/verify), docs.gitlab.com/api/jobs (GET /projects/:id/jobs?scope[]=...) and
docs.gitlab.com/api/users (GET /user), docs.gitlab.com/api/members (GET
/groups/:id/members/all/:user_id) and GitLab as an OAuth 2.0 provider (/oauth/authorize,
/oauth/token: runnerctl.sim.gitlab_oauth); authentication by the `PRIVATE-TOKEN` header
or an OAuth `Authorization: Bearer` token (401 `{"message": "401 Unauthorized"}`
otherwise); pagination by `page`/`per_page` with `X-Page`, `X-Per-Page`, `X-Total`,
`X-Total-Pages`, `X-Next-Page` and `Link`.

Tests inject faults (`Fault`): a status (401, 403, 404, 429 with `Retry-After`, 500,
502), `drop` (close the connection with no answer), `lost` (carry the request out,
then close the connection with no answer: a create that happened although the client
saw a failure) or `delay` (answer late, so a client times out). Every request is logged in `requests`.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from runnerctl.sim.gitlab_oauth import OAuthProvider
from runnerctl.sim.gitlab_state import GitLabState, SimJob, SimRunner

CHANGING = frozenset({"POST", "PUT", "DELETE", "PATCH"})


@dataclasses.dataclass
class Fault:
    method: str  # "*" for any
    path: str  # regex matched against the path without /api/v4
    kind: str  # "401", "403", "404", "429", "500", "502", "drop", "lost" or "delay"
    count: int = 1  # how many requests it hits
    retry_after: int = 1  # seconds, for 429
    delay_s: float = 0.0  # for "delay"


@dataclasses.dataclass(frozen=True)
class LoggedRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    status: int | None


class _HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class GitLabServer:
    """`with GitLabServer(state, tokens={"glpat-x": "alice"}) as server: server.url`."""

    def __init__(self, state: GitLabState | None = None, *, tokens: dict[str, str] | None = None,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        self.state = state or GitLabState()
        self.tokens = dict(tokens or {"glpat-runnerctl-test": "admin"})
        self.faults: list[Fault] = []
        self.oauth = OAuthProvider()
        self.requests: list[LoggedRequest] = []
        self.lock = threading.Lock()
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
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> GitLabServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def changing_requests(self) -> list[LoggedRequest]:
        return [r for r in self.requests if r.method in CHANGING]

    def take_fault(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.count > 0 and fault.method in ("*", method) and re.search(fault.path, path):
                    fault.count -= 1
                    return fault
        return None

    # -- routes ------------------------------------------------------------------
    def route(self, method: str, path: str, query: dict[str, list[str]],
              body: dict[str, Any], user: str) -> tuple[int, Any, dict[str, str]]:
        s = self.state
        if method == "GET" and path == "/user":
            return 200, {"id": self.oauth.users.get(user, 1), "username": user, "name": user,
                         "state": "active"}, {}
        match = re.fullmatch(r"/groups/([^/]+)/members/all/(\d+)", path)
        if match and method == "GET":
            code, member = self.oauth.member(match.group(1), int(match.group(2)))
            return code, member, {}
        if method == "POST" and path == "/user/runners":
            return 201, self._create(body), {}
        if method == "POST" and path == "/runners/verify":
            runner = s.runner_by_token(str(body.get("token", "")))
            if runner is None:
                raise _HttpError(403, "403 Forbidden")
            # lib/api/ci/runner.rb `POST /runners/verify`: authenticate_runner! heartbeats the
            # runner and the manager of `system_id` (lib/api/ci/helpers/runner.rb)
            s.heartbeat(runner, str(body.get("system_id") or "<legacy>"))
            return 200, {"id": runner.id, "token": runner.token,
                         "token_expires_at": runner.token_expires_at}, {}
        if method == "GET" and path in ("/runners", "/runners/all"):
            runners = [r for r in s.runners.values() if _runner_matches(r, query, s)]
            return self._page([self._runner_brief(r) for r in runners], query)
        match = re.fullmatch(r"/runners/(\d+)(/jobs)?", path)
        if match:
            runner = s.runners.get(int(match.group(1)))
            if runner is None:
                raise _HttpError(404, "404 Not found")
            if match.group(2):
                status = query.get("status", [None])[0]
                return self._page([self._job(j) for j in s.jobs_of_runner(runner.id, status)], query)
            if method == "GET":
                return 200, self._runner_detail(runner), {}
            if method == "PUT":
                s.update_runner(runner.id, paused=_bool(body.get("paused")),
                                tags=_tags(body["tag_list"]) if "tag_list" in body else None,
                                description=body.get("description"))
                return 200, self._runner_detail(runner), {}
            if method == "DELETE":
                s.delete_runner(runner.id)
                return 204, None, {}
        match = re.fullmatch(r"/projects/(\d+)/jobs", path)
        if match and method == "GET":
            scopes = query.get("scope[]", []) + query.get("scope", [])
            jobs = s.project_jobs(int(match.group(1)), scopes)
            return self._page([self._job(j) for j in jobs], query)
        raise _HttpError(404, "404 Not found")

    def _create(self, body: dict[str, Any]) -> dict[str, Any]:
        kind = body.get("runner_type")
        if kind not in ("instance_type", "group_type", "project_type"):
            raise _HttpError(400, "runner_type is missing or invalid")
        if kind == "group_type" and not body.get("group_id"):
            raise _HttpError(400, "group_id is missing")
        if kind == "project_type" and not body.get("project_id"):
            raise _HttpError(400, "project_id is missing")
        runner = self.state.create_runner(
            description=str(body.get("description", "")), tags=_tags(body.get("tag_list", [])),
            paused=bool(_bool(body.get("paused")) or False), runner_type=kind,
            group_id=_int(body.get("group_id")), project_id=_int(body.get("project_id")),
            run_untagged=bool(_bool(body.get("run_untagged", True))),
            locked=bool(_bool(body.get("locked", True))),
            maximum_timeout=_int(body.get("maximum_timeout")))
        return {"id": runner.id, "token": runner.token, "token_expires_at": None}

    def _runner_brief(self, r: SimRunner) -> dict[str, Any]:
        online = self.state.online(r)
        return {"id": r.id, "description": r.description, "ip_address": None, "active": not r.paused,
                "paused": r.paused, "is_shared": r.runner_type == "instance_type",
                "runner_type": r.runner_type, "name": "gitlab-runner", "online": online,
                "status": ("paused" if r.paused else "online" if online else "offline")}

    def _runner_detail(self, r: SimRunner) -> dict[str, Any]:
        return {**self._runner_brief(r), "tag_list": sorted(r.tags), "run_untagged": r.run_untagged,
                "locked": r.locked, "maximum_timeout": r.maximum_timeout, "access_level": "not_protected",
                "contacted_at": _iso(r.contacted_at), "version": None,
                "groups": [{"id": r.group_id}] if r.group_id else [],
                "projects": [{"id": r.project_id}] if r.project_id else []}

    def _job(self, j: SimJob) -> dict[str, Any]:
        runner = self.state.runners.get(j.runner_id) if j.runner_id else None
        return {"id": j.id, "status": j.status, "stage": "test", "name": j.name, "ref": "main",
                "tag_list": sorted(j.tags), "created_at": _iso(j.created_at),
                "started_at": _iso(j.started_at), "finished_at": _iso(j.finished_at),
                "queued_duration": ((j.started_at or self.state.clock()) - j.created_at),
                "user": {"id": abs(hash(j.user)) % 10_000, "username": j.user},
                "web_url": self.state.web_url(j),
                "project": {"id": j.project_id},
                "pipeline": {"id": j.pipeline_id, "project_id": j.project_id},
                "runner": None if runner is None else self._runner_brief(runner)}

    def _page(self, items: list[Any], query: dict[str, list[str]]) -> tuple[int, Any, dict[str, str]]:
        page = max(1, int(query.get("page", ["1"])[0]))
        per_page = min(100, max(1, int(query.get("per_page", ["20"])[0])))
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
            if parsed.path.startswith("/oauth/"):
                query = urllib.parse.parse_qs(parsed.query)
                body = self._body()
                with server.lock:
                    status, payload, headers = server.oauth.handle(self.command, parsed.path, query, body)
                server.requests.append(LoggedRequest(self.command, parsed.path, query, status))
                self._send(status, payload, headers, parsed)
                return
            path = parsed.path.removeprefix("/api/v4")
            query = urllib.parse.parse_qs(parsed.query)
            body = self._body()
            fault = server.take_fault(self.command, path)
            if fault is not None and fault.kind == "drop":
                server.requests.append(LoggedRequest(self.command, path, query, None))
                self.close_connection = True
                self.connection.close()
                return
            if fault is not None and fault.kind == "delay":
                time.sleep(fault.delay_s)
            status, payload, headers = self._answer(path, query, body, fault)
            server.requests.append(LoggedRequest(self.command, path, query, status))
            if fault is not None and fault.kind == "lost":  # done, but the answer never arrives
                self.close_connection = True
                self.connection.close()
                return
            self._send(status, payload, headers, parsed)

        def _answer(self, path: str, query: dict[str, list[str]], body: dict[str, Any],
                    fault: Fault | None) -> tuple[int, Any, dict[str, str]]:
            if fault is not None and fault.kind.isdigit():
                status = int(fault.kind)
                headers = {"Retry-After": str(fault.retry_after)} if status == 429 else {}
                return status, {"message": f"{status} {_REASONS.get(status, 'Error')}"}, headers
            user = (server.tokens.get(self.headers.get("PRIVATE-TOKEN", ""))
                    or server.oauth.user_of(self.headers.get("Authorization")))
            verify = path == "/runners/verify"  # authenticated by the runner token itself
            if user is None and not verify:
                return 401, {"message": "401 Unauthorized"}, {}
            try:
                with server.lock:
                    return server.route(self.command, path, query, body, user or "")
            except _HttpError as exc:
                return exc.status, {"message": exc.message}, {}

        def _body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if not raw:
                return {}
            if "json" in (self.headers.get("Content-Type") or ""):
                loaded = json.loads(raw)
                return loaded if isinstance(loaded, dict) else {}
            return {k: v[-1] for k, v in urllib.parse.parse_qs(raw.decode()).items()}

        def _send(self, status: int, payload: Any, headers: dict[str, str],
                  parsed: urllib.parse.SplitResult) -> None:
            page = isinstance(payload, str)  # the simulated sign-in/consent page
            data = b"" if payload is None else payload.encode() if page else json.dumps(payload).encode()
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
                self.send_header("Content-Type", "text/html; charset=utf-8" if page else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _serve

    return Handler


_REASONS = {401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 429: "Too Many Requests",
            500: "Internal Server Error", 502: "Bad Gateway"}


def _runner_matches(r: SimRunner, query: dict[str, list[str]], state: GitLabState) -> bool:
    if "paused" in query and _bool(query["paused"][0]) != r.paused:
        return False
    if "type" in query and query["type"][0] != r.runner_type:
        return False
    if "tag_list" in query and not _tags(query["tag_list"][0]) <= r.tags:
        return False
    return True


def _tags(value: Any) -> frozenset[str]:
    items = value.split(",") if isinstance(value, str) else list(value or [])
    return frozenset(str(t).strip() for t in items if str(t).strip())


def _bool(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    return str(value).lower() in ("true", "1", "yes")


def _int(value: Any) -> int | None:
    return None if value in (None, "") else int(value)


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat().replace("+00:00", "Z")


