"""`runnerctl sim runner`: a stand-in for the gitlab-runner process, run as its own process.

It reads config.toml (runnerctl/sim/runner_toml.py), asks GitLab for jobs with each
runner's token, runs each job through the custom executor exactly as gitlab-runner
does (runner_build.py, runner_exec.py, runner_script.py) and reports the result and
the trace (runner_api.py). The job loop follows gitlab-org/gitlab-runner
commands/multi.go:

- `concurrent` workers take runners from an unbuffered channel, which a feeder fills
  with every runner in turn, `check_interval / len(runners)` apart (`feedRunners`);
  a worker that got a job requeues the runner at once if a worker is free, unless
  `strict_check_interval` (`requeueRunner`).
- a runner takes a job only under its `limit` (running jobs) and
  `request_concurrency` (requests in flight) (`processRunner`, buildsHelper).
- after `unhealthy_requests_limit` (3) requests answered 403 or not answered at all
  (network/gitlab.go `RequestJob`: forbidden, client error) a runner is left out for
  an hour (`unhealthy_interval`), or until the configuration is reloaded (healthHelper).
- config.toml is checked every 3 s (ReloadConfigInterval) and reloaded when its mtime
  changed; a file that does not load keeps the old configuration and is logged once
  (`checkConfig`). `concurrent` changes the number of workers.
- a job received is first set `running` (`requestJob`); GitLab answering `canceling`
  there fails it with job_canceled at once.
- SIGQUIT stops asking for jobs and waits for the running ones (graceful shutdown; a
  SIGQUIT again goes on waiting); SIGTERM and SIGINT, also after a SIGQUIT, abort the
  running jobs (runner_interrupted: stage killed, cleanup_exec run, result sent) and
  exit within `shutdown_timeout` (30 s); a signal after that exits at once
  (`handleGracefulShutdown`, `handleForcefulShutdown`; cli/sim_runner.py).

One line per job start and end goes to stderr.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runnerctl.errors import ConfigError
from runnerctl.sim.runner_api import Answer, JobTrace, RunnerApi
from runnerctl.sim.runner_build import Build
from runnerctl.sim.runner_toml import UNHEALTHY_INTERVAL_S, RunnerEntry, RunnerToml, load
from runnerctl.sim.runner_trace import Outcome

RELOAD_CONFIG_INTERVAL_S = 3.0  # common/consts.go ReloadConfigInterval

Say = Callable[[str], None]


def _stderr(line: str) -> None:
    print(f"runnerctl sim runner: {line}", file=sys.stderr, flush=True)


class Rendezvous:
    """Go's unbuffered channel: `put` waits for a worker that waits in `get`."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._takers = 0
        self._items: collections.deque[RunnerEntry] = collections.deque()

    def put(self, item: RunnerEntry, *, block: bool, stop: threading.Event) -> bool:
        with self._cond:
            while self._takers <= len(self._items):
                if not block or stop.is_set():
                    return False
                self._cond.wait(0.2)
            self._items.append(item)
            self._cond.notify_all()
            return True

    def get(self, timeout_s: float) -> RunnerEntry | None:
        with self._cond:
            self._takers += 1
            self._cond.notify_all()
            try:
                end = time.monotonic() + timeout_s
                while not self._items:
                    left = end - time.monotonic()
                    if left <= 0:
                        return None
                    self._cond.wait(left)
                return self._items.popleft()
            finally:
                self._takers -= 1


@dataclasses.dataclass(eq=False)
class _Slot:
    """One job slot of a runner (buildsHelper): taken before the request, counted by `limit`."""

    concurrent_id: int
    project: int = -1
    project_runner_id: int = 0


@dataclasses.dataclass
class _RunnerState:
    slots: list[_Slot] = dataclasses.field(default_factory=list)
    requests: int = 0
    failures: int = 0
    unhealthy_until: float = 0.0
    last_update: str = ""
    last_error: int = 204


class MultiRunner:
    def __init__(self, config_path: Path, *, say: Say = _stderr,
                 api_for: Callable[[RunnerEntry], RunnerApi] | None = None) -> None:
        self.config_path = config_path
        self.say = say
        self.api_for = api_for or (lambda runner: RunnerApi(runner.api_url))
        self.config: RunnerToml = load(config_path)
        self.stopping = threading.Event()  # no more job requests
        self.interrupt = threading.Event()  # abort running jobs
        self._lock = threading.Lock()
        self._states: dict[str, _RunnerState] = {}
        self._channel = Rendezvous()
        self._workers: list[tuple[threading.Thread, threading.Event]] = []
        self._running: dict[int, Build] = {}

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> None:
        """Feed, work and reload until `stop`; then `wait` for the workers."""
        self.say(f"loaded {self.config_path}: concurrent={self.config.concurrent}, "
                 f"{len(self.config.runners)} runner(s), system_id={self._system_id()}")
        feeder = threading.Thread(target=self._feed, name="feeder", daemon=True)
        feeder.start()
        while not self.stopping.is_set():
            if not feeder.is_alive():  # watched: a dead feeder would stop all job requests
                self.say("the feeder thread died; starting it again")
                feeder = threading.Thread(target=self._feed, name="feeder", daemon=True)
                feeder.start()
            self._update_workers()
            if self.stopping.wait(RELOAD_CONFIG_INTERVAL_S):
                break
            self._check_config()
        for _, stop in self._workers:
            stop.set()

    def wait(self, timeout_s: float | None) -> bool:
        """Until every worker ended (True) or `timeout_s` passed (False)."""
        end = None if timeout_s is None else time.monotonic() + timeout_s
        for thread, _ in self._workers:
            thread.join(None if end is None else max(end - time.monotonic(), 0.0))
        return not any(thread.is_alive() for thread, _ in self._workers)

    def stop(self, *, abort: bool) -> None:
        self.stopping.set()
        if abort:
            self.interrupt.set()

    def running_jobs(self) -> list[int]:
        with self._lock:
            return sorted(self._running)

    def _system_id(self) -> str:
        return self.config.runners[0].system_id if self.config.runners else "-"

    def _check_config(self) -> None:
        try:
            mtime = self.config_path.stat().st_mtime
        except OSError as exc:
            self.say(f"failed to load config: {exc}")
            return
        if mtime <= self.config.mtime:
            return
        try:
            config = load(self.config_path)
        except ConfigError as exc:
            self.say(f"failed to load config: {exc}")
            self.config = dataclasses.replace(self.config, mtime=mtime)  # don't reload the same file
            return
        with self._lock:
            for state in self._states.values():
                state.failures, state.unhealthy_until = 0, 0.0
        self.config = config
        self.say(f"configuration reloaded: concurrent={config.concurrent}, {len(config.runners)} runner(s)")

    def _update_workers(self) -> None:
        self._workers = [(t, s) for t, s in self._workers if t.is_alive()]
        active = [(t, s) for t, s in self._workers if not s.is_set()]
        for _, stop in active[self.config.concurrent:]:
            stop.set()
        for _ in range(self.config.concurrent - len(active)):
            stop = threading.Event()
            thread = threading.Thread(target=self._work, args=(stop,), name="worker", daemon=True)
            thread.start()
            self._workers.append((thread, stop))

    def _feed(self) -> None:
        while not self.stopping.is_set():
            runners = self.config.runners
            if not runners:
                self.stopping.wait(self.config.check_interval_s)
                continue
            interval = self.config.check_interval_s / len(runners)
            for runner in runners:
                if self.stopping.is_set():
                    return
                if runner.token.strip() and self._healthy(runner):
                    self._channel.put(runner, block=True, stop=self.stopping)
                self.stopping.wait(interval)

    def _work(self, stop: threading.Event) -> None:
        while not stop.is_set() and not self.stopping.is_set():
            runner = self._channel.get(0.2)
            if runner is None:
                continue
            try:
                self._process_runner(runner)
            except Exception as exc:  # a bug must not end the worker unseen
                self.say(f"processing runner {runner.name} failed: {exc!r}")

    # -- one runner, one job ------------------------------------------------------------------
    def _process_runner(self, runner: RunnerEntry) -> None:
        slot = self._acquire(runner)
        if slot is None:
            return
        job: dict[str, Any] | None = None
        try:
            try:
                job = self._request_job(runner)
            finally:
                with self._lock:
                    self._state(runner).requests -= 1
            if job is not None:
                self._take(runner, job, slot)
        finally:
            with self._lock:
                self._state(runner).slots.remove(slot)
                if job is not None:
                    self._running.pop(int(job["id"]), None)

    def _acquire(self, runner: RunnerEntry) -> _Slot | None:
        with self._lock:
            state = self._state(runner)
            if runner.limit > 0 and len(state.slots) >= runner.limit:
                return None
            if state.requests >= runner.request_concurrency:
                return None
            state.requests += 1
            used = {slot.concurrent_id for slot in state.slots}
            slot = _Slot(next(i for i in range(len(used) + 1) if i not in used))
            state.slots.append(slot)
            return slot

    def _state(self, runner: RunnerEntry) -> _RunnerState:
        return self._states.setdefault(runner.token, _RunnerState())

    def _healthy(self, runner: RunnerEntry) -> bool:
        with self._lock:
            return self._state(runner).unhealthy_until <= time.monotonic()

    def _request_job(self, runner: RunnerEntry) -> dict[str, Any] | None:
        with self._lock:
            last_update = self._state(runner).last_update
        answer = self.api_for(runner).request_job(runner, last_update=last_update)
        healthy = answer.status not in (403, 0)  # network/gitlab.go RequestJob: forbidden, client error
        with self._lock:
            state = self._state(runner)
            last_error, state.last_error = state.last_error, answer.status
            state.last_update = answer.headers.get("x-gitlab-last-update", state.last_update)
            state.failures = 0 if healthy else state.failures + 1
            if state.failures >= runner.unhealthy_requests_limit:
                state.failures, state.unhealthy_until = 0, time.monotonic() + UNHEALTHY_INTERVAL_S
                self.say(f"runner {runner.name} is unhealthy after {runner.unhealthy_requests_limit} "
                         f"failed job requests (last: HTTP {answer.status}); left out for an hour")
        if answer.status == 201 and isinstance(answer.body, dict) and "id" in answer.body:
            return answer.body
        if answer.status not in (201, 204) and answer.status != last_error:  # each new failure once
            self.say(f"checking for jobs for runner {runner.name}: HTTP {answer.status or 'no answer'}")
        return None

    def _take(self, runner: RunnerEntry, job: dict[str, Any], slot: _Slot) -> None:
        job_id, token = int(job["id"]), str(job.get("token", ""))
        project = int((job.get("job_info") or {}).get("project_id") or 0)
        with self._lock:
            used = {s.project_runner_id for s in self._state(runner).slots if s.project == project}
            slot.project, slot.project_runner_id = project, next(
                i for i in range(len(used) + 1) if i not in used)
        api = self.api_for(runner)
        first = api.update_job(job_id, token, state="running")
        if first.failed or first.status in (403, 404):
            self.say(f"job {job_id}: GitLab answered {first.status} {first.job_status}; dropped")
            return
        trace = JobTrace(api, job_id, token, on_cancel=lambda: self.say(
            f"job {job_id}: GitLab asks to cancel it; stopping its script (after_script and cleanup run)"))
        if first.canceling:
            # multi.go requestJob: trace.Fail(job_canceled) before any mapper is set: sent as is
            self._report(job_id, runner, trace.finish(Outcome("failed", "job_canceled")), 0.0, "canceled")
            return
        if not runner.strict_check_interval:
            self._channel.put(runner, block=False, stop=self.stopping)
        build = Build(job, runner, trace=trace, concurrent_id=slot.concurrent_id,
                      project_runner_id=slot.project_runner_id,
                      interrupt=self.interrupt)
        with self._lock:
            self._running[job_id] = build
        self.say(f"job {job_id} started on runner {runner.name} "
                 f"(project {project}, {(job.get('job_info') or {}).get('name', '?')})")
        started = time.monotonic()
        trace.start()
        outcome = build.run()
        answer = trace.finish(outcome)
        how = outcome.state if outcome.state == "success" else \
            f"failed ({outcome.failure_reason}, exit code {outcome.exit_code})"
        self._report(job_id, runner, answer, time.monotonic() - started, how)

    def _report(self, job_id: int, runner: RunnerEntry, answer: Answer, elapsed: float, how: str) -> None:
        sent = "" if answer.status == 200 else f"; final update answered {answer.status or 'nothing'}"
        self.say(f"job {job_id} ended on runner {runner.name}: {how} after {elapsed:.1f}s{sent}")

