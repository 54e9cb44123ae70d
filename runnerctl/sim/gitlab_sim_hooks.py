"""What the simulated GitLab offers tests beyond GitLab's API, under `/-/sim/`, and its cron.

Clearly outside GitLab's API (GitLab has no such paths): enqueue a job as a pipeline
would, run the drop rules now, move the clock, ask whether the server's threads live.
The drop timer stands in for GitLab's hourly StuckBuildsDropWorker cron
(config/initializers/1_settings.rb `stuck_ci_jobs_worker`); it is a watched thread: a
failed run is logged once, counted, and the next run still happens.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from runnerctl.sim.gitlab_state import GitLabState

log = logging.getLogger(__name__)
Answer = tuple[int, Any, dict[str, str]]


class OffsetClock:
    """Wall-clock time plus an offset that `POST /-/sim/clock` moves forward."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


class SimHooks:
    def __init__(self, state: GitLabState, lock: threading.RLock, drop_interval_s: float | None) -> None:
        self.state = state
        self.lock = lock
        self.drop_interval_s = drop_interval_s
        self.drop_runs = 0
        self.drop_errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False

    def start(self) -> None:
        if self.drop_interval_s is not None:
            self._thread = threading.Thread(target=self._cron, name="gitlab-sim-drop", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _cron(self) -> None:
        assert self.drop_interval_s is not None
        while not self._stop.wait(self.drop_interval_s):
            self.drop_now()

    def drop_now(self) -> list[int]:
        try:
            with self.lock:
                dropped = [j.id for j in self.state.drop_stuck_jobs()]
        except Exception:  # a bug here must not stop the next run; it is logged and counted
            self.drop_errors += 1
            if not self._warned:
                self._warned = True
                log.exception("simulated GitLab: the stuck-jobs run failed (later failures are counted only)")
            return []
        self.drop_runs += 1
        return dropped

    def handle(self, method: str, path: str, body: dict[str, Any]) -> Answer:
        if method == "POST" and path == "/-/sim/jobs":
            return self._enqueue(body)
        if method == "POST" and path == "/-/sim/drop":
            return 200, {"dropped": self.drop_now()}, {}
        if method == "POST" and path == "/-/sim/clock":
            clock = self.state.clock
            seconds = body.get("advance_s")
            if not isinstance(clock, OffsetClock):
                return 400, {"error": "this server's clock cannot be moved"}, {}
            if not isinstance(seconds, (int, float)) or seconds < 0:
                return 400, {"error": "advance_s must be a number of seconds >= 0"}, {}
            with self.lock:
                clock.advance(float(seconds))
            return 200, {"now": clock()}, {}
        if method == "GET" and path == "/-/sim/health":
            timer_ok = self.drop_interval_s is None or self.alive()
            payload = {"drop_timer_alive": self.alive(), "drop_runs": self.drop_runs,
                       "drop_errors": self.drop_errors, "ok": timer_ok}
            return (200 if timer_ok else 503), payload, {}
        return 404, {"error": "404 Not Found"}, {}

    def _enqueue(self, body: dict[str, Any]) -> Answer:
        project_id, tags, duration = body.get("project_id"), body.get("tags", []), body.get("duration_s", 0)
        after = body.get("after_script_s")
        if not isinstance(project_id, int) or isinstance(project_id, bool):
            return 400, {"error": "project_id must be an integer"}, {}
        if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
            return 400, {"error": "tags must be a list of non-empty strings"}, {}
        for name, value in (("duration_s", duration), ("after_script_s", after)):
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if value is not None and (not number or value < 0):
                return 400, {"error": f"{name} must be a number of seconds >= 0"}, {}
        user = str(body.get("user") or "")
        with self.lock:
            directory = self.state.directory
            if directory.project(project_id) is None:
                return 404, {"message": "404 Project Not Found"}, {}
            if user:
                directory.add_user(user)  # the pipeline's author exists in GitLab
            name = str(body.get("name") or "job")
            job = self.state.enqueue_job(project_id=project_id, tags=tags, name=name, user=user or "root",
                                         script=[f"sleep {duration}"],
                                         after_script=[f"sleep {after}"] if after is not None else ())
        return 201, {"id": job.id}, {}
