"""gitlab-runner's side of GitLab's runner API, and its job trace, for `runnerctl sim runner`.

This is gitlab-runner's HTTP client, not runnerctl's: runnerctl reaches GitLab only
through runnerctl/gitlab.py, while this module stands in for the separate gitlab-runner
program. It follows gitlab-org/gitlab-runner:

- network/gitlab.go `RequestJob`: `POST /api/v4/jobs/request` with `token`,
  `system_id`, `info` (executor, shell, features) and `last_update`; 201 is a job,
  204 none; 403 or no answer at all count against the runner's health (commands/multi.go
  healthHelper); anything else is logged and tried again.
- network/gitlab.go `UpdateJob` (`PUT /api/v4/jobs/:id`, JOB-TOKEN, `state`,
  `failure_reason`, `exit_code`, `output {checksum, bytesize}`) and `PatchTrace`
  (`PATCH /api/v4/jobs/:id/trace`, `Content-Range: start-end`, 202 accepted, 416 with
  `Range` to rewind); network/remote_job_state_response.go: `Job-Status: canceling`
  asks for a cancel, `canceled`, `failed` or a 403 for an abort;
  `X-GitLab-Trace-Update-Interval` sets the update interval.
- network/trace.go `clientJobTrace`: every update interval (3 s) the new output is
  PATCHed; with nothing new, the job is touched with `PUT state=running` only every
  30 s (MinTraceForceSendInterval), so a cancel of a quiet job is seen within about
  30 s. The final update sends what is left of the trace, then the state, retried up
  to 10 times; 202 (two-phase commit) is asked again after the update interval.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable
from typing import Any

from runnerctl import __version__
from runnerctl.sim.runner_toml import RunnerEntry
from runnerctl.sim.runner_trace import Outcome

UPDATE_INTERVAL_S = 3.0  # common/consts.go DefaultUpdateInterval
MAX_UPDATE_INTERVAL_S = 900.0
FORCE_SEND_INTERVAL_S = 30.0  # common/consts.go MinTraceForceSendInterval
TRACE_PATCH_LIMIT = 1024 * 1024  # common/consts.go DefaultTracePatchLimit
FINAL_UPDATE_RETRIES = 10  # common/consts.go DefaultFinalUpdateRetryLimit
FEATURES = {  # network/gitlab.go getFeatures, executors/custom/custom.go, shells/bash.go
    "variables": True, "shared": True, "service_variables": True, "upload_multiple_artifacts": True,
    "upload_raw_artifacts": True, "refspecs": True, "masking": True, "artifacts_exclude": True,
    "multi_build_steps": True, "return_exit_code": True, "raw_variables": True, "trace_reset": True,
    "trace_checksum": True, "trace_size": True, "cancelable": True, "cancel_gracefully": True,
    "two_phase_job_commit": True, "job_inputs": True}


@dataclasses.dataclass(frozen=True)
class Answer:
    status: int  # 0: no answer (connection failed)
    body: Any = None
    headers: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def job_status(self) -> str:
        return self.headers.get("job-status", "")

    @property
    def canceling(self) -> bool:
        return self.job_status == "canceling"

    @property
    def failed(self) -> bool:
        """remote_job_state_response.go IsFailed."""
        return self.job_status in ("canceled", "failed") or self.status == 403

    @property
    def update_interval_s(self) -> float | None:
        raw = self.headers.get("x-gitlab-trace-update-interval", "")
        return min(float(raw), MAX_UPDATE_INTERVAL_S) if raw.isdigit() and int(raw) > 0 else None


class RunnerApi:
    """The runner API of one GitLab (`<url>/api/v4`)."""

    def __init__(self, api_url: str, *, timeout_s: float = 60.0) -> None:
        self.api_url = api_url.rstrip("/")
        self.timeout_s = timeout_s

    def request_job(self, runner: RunnerEntry, *, last_update: str = "") -> Answer:
        info = {"name": "gitlab-runner", "version": f"runnerctl-sim-{__version__}", "revision": "sim",
                "platform": "linux", "architecture": "amd64", "executor": runner.executor, "shell": "bash",
                "features": FEATURES, "config": {}}
        return self._call("POST", "/jobs/request", body={
            "token": runner.token, "system_id": runner.system_id, "info": info, "last_update": last_update})

    def update_job(self, job_id: int, job_token: str, *, state: str, failure_reason: str | None = None,
                   exit_code: int | None = None, checksum: str = "", bytesize: int = 0) -> Answer:
        body: dict[str, Any] = {"token": job_token, "state": state,
                                "output": {"checksum": checksum, "bytesize": bytesize}, "checksum": checksum}
        if failure_reason:
            body["failure_reason"] = failure_reason
        if exit_code is not None:
            body["exit_code"] = exit_code
        return self._call("PUT", f"/jobs/{job_id}", body=body, headers={"JOB-TOKEN": job_token})

    def patch_trace(self, job_id: int, job_token: str, content: bytes, offset: int) -> Answer:
        return self._call("PATCH", f"/jobs/{job_id}/trace?debug_trace=false", data=content, headers={
            "JOB-TOKEN": job_token, "Content-Range": f"{offset}-{offset + len(content) - 1}",
            "Content-Type": "text/plain"})

    def _call(self, method: str, path: str, *, body: Any = None, data: bytes | None = None,
              headers: dict[str, str] | None = None) -> Answer:
        sent = dict(headers or {})
        if body is not None:
            data = json.dumps(body).encode()
            sent["Content-Type"] = "application/json"
        request = urllib.request.Request(self.api_url + path, data=data, method=method, headers=sent)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return _answer(response.status, response.read(), dict(response.headers))
        except urllib.error.HTTPError as exc:
            return _answer(exc.code, exc.read(), dict(exc.headers))
        except (urllib.error.URLError, OSError):
            return Answer(0)


def _answer(status: int, raw: bytes, headers: dict[str, str]) -> Answer:
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = raw.decode(errors="replace")
    return Answer(status, body, {k.lower(): v for k, v in headers.items()})


class JobTrace:
    """network/trace.go clientJobTrace for one job."""

    def __init__(self, api: RunnerApi, job_id: int, job_token: str, *,
                 update_interval_s: float = UPDATE_INTERVAL_S,
                 force_send_interval_s: float = FORCE_SEND_INTERVAL_S,
                 on_cancel: Callable[[], None] | None = None) -> None:
        self.api, self.job_id, self.job_token = api, job_id, job_token
        self.on_cancel = on_cancel
        self.update_interval_s = update_interval_s
        self.force_send_interval_s = force_send_interval_s
        self._lock = threading.Lock()
        self._buffer = bytearray()
        self._crc = 0
        self._sent = 0
        self._sent_at = time.monotonic()
        self._cancel: Callable[[], None] | None = None
        self._abort: Callable[[], None] | None = None
        self._finished = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name=f"trace-{job_id}", daemon=True)

    # -- what a build uses ------------------------------------------------------------------
    def write(self, text: str) -> None:
        data = text.encode()
        with self._lock:
            self._buffer += data
            self._crc = zlib.crc32(data, self._crc)

    def set_cancel(self, fn: Callable[[], None] | None) -> None:
        with self._lock:
            self._cancel = fn

    def set_abort(self, fn: Callable[[], None] | None) -> None:
        with self._lock:
            self._abort = fn

    def cancel(self) -> bool:
        with self._lock:
            fn, self._cancel = self._cancel, None
        if fn:
            if self.on_cancel:
                self.on_cancel()
            fn()
        return fn is not None

    def abort(self) -> bool:
        with self._lock:
            fn, self._abort, self._cancel = self._abort, None, None
        if fn:
            fn()
        return fn is not None

    def start(self) -> None:
        self._watcher.start()

    def finish(self, outcome: Outcome) -> Answer:
        """Stop the periodic updates; send the rest of the trace and the final state."""
        self._finished.set()
        if self._watcher.is_alive():
            self._watcher.join(timeout=60)
        answer = Answer(0)
        delay = 1.0
        for _ in range(FINAL_UPDATE_RETRIES):
            self._send_all()
            answer = self._update(outcome.state, outcome)
            if answer.status == 200 or answer.failed or answer.status in (404, 403) \
                    or 400 <= answer.status < 500 and answer.status != 412:
                return answer
            if answer.status == 412:  # trace validation failed: send the whole trace again
                with self._lock:
                    self._sent = 0
            time.sleep(self.update_interval_s if answer.status in (202, 412) else delay)
            delay = min(delay * 2, 60.0)
        return answer

    @property
    def checksum(self) -> str:
        with self._lock:
            return f"crc32:{self._crc:08x}"

    # -- the periodic update ----------------------------------------------------------------
    def _watch(self) -> None:
        while not self._finished.wait(self.update_interval_s):
            if not self._incremental_update():
                self._finished.wait()
                return

    def _incremental_update(self) -> bool:
        patch = self._send_patch()
        if patch.canceling:
            self.cancel()
        if patch.failed or patch.status in (400, 401, 409, 410, 422):
            self.abort()
            return False
        if patch.status in (202, -1):
            with self._lock:
                quiet = time.monotonic() - self._sent_at > self.force_send_interval_s
            if quiet:
                touch = self._update("running", None)
                if touch.canceling:
                    self.cancel()
                if touch.failed or touch.status == 404:
                    self.abort()
                    return False
        return True

    def _send_patch(self) -> Answer:
        with self._lock:
            start = self._sent
            content = bytes(self._buffer[start:start + TRACE_PATCH_LIMIT])
        if not content:
            return Answer(-1)  # nothing to send counts as sent (trace.go sendPatch)
        answer = self.api.patch_trace(self.job_id, self.job_token, content, start)
        self._adopt_interval(answer)
        if answer.status == 202:
            with self._lock:
                self._sent, self._sent_at = start + len(content), time.monotonic()
        elif answer.status == 416:
            _, _, end = answer.headers.get("range", "").partition("-")
            if end.isdigit():
                with self._lock:
                    self._sent, self._sent_at = int(end), time.monotonic()
        return answer

    def _send_all(self) -> None:
        for _ in range(100):
            with self._lock:
                if self._sent >= len(self._buffer):
                    return
            answer = self._send_patch()
            if answer.status not in (202, 416):
                return

    def _update(self, state: str, outcome: Outcome | None) -> Answer:
        with self._lock:
            size = len(self._buffer)
        failed = outcome is not None and outcome.state == "failed"
        answer = self.api.update_job(
            self.job_id, self.job_token, state=state, checksum=self.checksum, bytesize=size,
            failure_reason=outcome.failure_reason if failed and outcome else None,
            exit_code=outcome.exit_code if failed and outcome else None)
        self._adopt_interval(answer)
        if answer.status == 200:
            with self._lock:
                self._sent_at = time.monotonic()
        return answer

    def _adopt_interval(self, answer: Answer) -> None:
        if answer.update_interval_s:
            self.update_interval_s = answer.update_interval_s
