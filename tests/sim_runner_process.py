"""`runnerctl sim runner` as a process for tests, and a stub of GitLab's runner API for it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.harness_custom_executor import FakeJob

NOT_PROCESSING = {"message": "403 Forbidden - Job is not processing on runner"}


class StubGitLab:
    """GitLab's runner API as lib/api/ci/runner.rb answers it, reduced to what the runner uses."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending: dict[str, list[dict[str, Any]]] = {}
        self.jobs: dict[int, dict[str, Any]] = {}  # id -> {state, failure_reason, exit_code, trace, token}
        self.requests: list[dict[str, Any]] = []
        self.in_flight: dict[str, int] = {}
        self.max_in_flight: dict[str, int] = {}
        self.max_running: dict[str, int] = {}
        self.max_total_running = 0
        self.forbidden: set[str] = set()  # runner tokens GitLab does not know: 403
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def enqueue(self, token: str, job_id: int, script: str, *, after: list[str] | None = None) -> None:
        job = FakeJob(id=job_id, after_script=after or []).json(
            script, timeout=600)
        with self.lock:
            self.pending.setdefault(token, []).append(job)
            self.jobs[job_id] = {"state": "pending", "trace": b"", "token": job["token"], "runner": token}

    def wait(self, job_id: int, states: tuple[str, ...], timeout_s: float = 90) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if self.jobs[job_id]["state"] in states:
                    return dict(self.jobs[job_id])
            time.sleep(0.05)
        raise AssertionError(f"job {job_id} never reached {states}: {self.jobs[job_id]}")

    def wait_trace(self, job_id: int, needle: bytes, timeout_s: float = 60) -> None:
        """Until the job's trace, as PATCHed so far, holds `needle`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if needle in self.jobs[job_id]["trace"]:
                    return
            time.sleep(0.05)
        raise AssertionError(f"job {job_id}'s trace never showed {needle!r}: {self.jobs[job_id]['trace']!r}")

    def running(self, token: str) -> int:
        return sum(1 for j in self.jobs.values() if j["runner"] == token and j["state"] in ("running",
                                                                                            "canceling"))

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return

            def _reply(self, status: int, body: Any = None, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _read(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def do_POST(self) -> None:
                body = json.loads(self._read())
                token = body["token"]
                with stub.lock:
                    stub.requests.append(body)
                    if token in stub.forbidden:
                        return self._reply(403, {"message": "403 Forbidden"})
                    stub.in_flight[token] = stub.in_flight.get(token, 0) + 1
                    stub.max_in_flight[token] = max(stub.max_in_flight.get(token, 0), stub.in_flight[token])
                time.sleep(0.2)  # a request takes a while: overlapping requests become visible
                with stub.lock:
                    stub.in_flight[token] -= 1
                    queue = stub.pending.get(token, [])
                    if not queue:
                        return self._reply(204)
                    job = queue.pop(0)
                    stub.jobs[job["id"]]["state"] = "running"
                    stub.max_running[token] = max(stub.max_running.get(token, 0), stub.running(token))
                    stub.max_total_running = max(stub.max_total_running, sum(
                        1 for j in stub.jobs.values() if j["state"] in ("running", "canceling")))
                return self._reply(201, job)

            def do_PUT(self) -> None:
                job_id = int(self.path.rsplit("/", 1)[-1])
                body = json.loads(self._read())
                with stub.lock:
                    job = stub.jobs[job_id]
                    if job["state"] not in ("running", "canceling"):  # authenticate_job!: not processing
                        return self._reply(403, NOT_PROCESSING, {"Job-Status": job["state"]})
                    if body["state"] in ("success", "failed"):
                        job.update(state="canceled" if job["state"] == "canceling" else body["state"],
                                   failure_reason=body.get("failure_reason"), exit_code=body.get("exit_code"))
                        status = job["state"]
                    else:
                        status = job["state"]
                return self._reply(200, None, {"Job-Status": status})

            def do_PATCH(self) -> None:
                job_id = int(self.path.split("/")[-2])
                data = self._read()
                start = int(self.headers["Content-Range"].split("-")[0])
                with stub.lock:
                    job = stub.jobs[job_id]
                    if job["state"] not in ("running", "canceling"):
                        return self._reply(403, NOT_PROCESSING, {"Job-Status": job["state"]})
                    if start != len(job["trace"]):
                        return self._reply(416, None, {"Range": f"0-{len(job['trace'])}"})
                    job["trace"] += data
                    return self._reply(202, None, {"Job-Status": job["state"],
                                                   "Range": f"0-{len(job['trace'])}"})

        return Handler


class RunnerProcess:
    """`runnerctl sim runner` as a process, its stderr lines collected as they come."""

    def __init__(self, config: Path) -> None:
        argv = [sys.executable, "-m", "runnerctl", "sim", "runner", "--runner-config", str(config)]
        self.proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def wait_line(self, pattern: str, timeout_s: float = 120) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [line for line in list(self.lines) if re.search(pattern, line)]
            if found:
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r} in:\n{self.stderr}")

    def stop(self, signum: int, timeout_s: float = 60) -> int:
        self.proc.send_signal(signum)
        code = self.proc.wait(timeout=timeout_s)
        self._reader.join(30)  # its last lines are read before `stderr` is asked
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(30)
