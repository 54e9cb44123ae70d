"""The custom executor as gitlab-runner drives it: processes, exit codes, kills.

Follows gitlab-org/gitlab-runner:

- executors/custom/custom.go: `Prepare` makes a temporary directory per job (per
  prepare attempt), writes the job JSON to `response.json` in it, runs config_exec
  (its stdout is the JSON of api.ConfigExecOutput: builds_dir, cache_dir, hostname,
  builds_dir_is_shared, job_env, driver), then prepare_exec; `Run` writes each stage
  script to a fresh `script*/script` in that directory and runs
  `run_exec <run_args...> <script path> <stage>`, saying `build_script` for
  `step_script`; `Cleanup` runs cleanup_exec with its own timeout (whatever became of
  the job), then removes the directory.
- executors/custom/command/command.go: every command's environment is the runner's
  own plus TMPDIR (the job's directory, also the working directory),
  BUILD_FAILURE_EXIT_CODE=1, SYSTEM_FAILURE_EXIT_CODE=2, BUILD_EXIT_CODE_FILE,
  JOB_RESPONSE_FILE, then config_exec's job_env, then CUSTOM_ENV_<variable> for every
  job variable. Exit 1 is a build failure whose code is the first line of
  BUILD_EXIT_CODE_FILE (1 when the file is missing, a system failure when it does not
  parse); exit 2 is a system failure; any other code an "unknown" (system) failure.
- helpers/process/killer_unix.go, killer.go: a command whose context ends gets SIGTERM
  on its process group, SIGKILL on the group after graceful_kill_timeout, and is
  abandoned after force_kill_timeout more.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from runnerctl.sim.runner_toml import CustomConfig

BUILD_FAILURE_EXIT_CODE, SYSTEM_FAILURE_EXIT_CODE = 1, 2
_POLL_S = 0.05


class JobError(Exception):
    """An error as common/build.go sees one; `reason` set means a BuildError.

    A BuildError is reported with its failure reason and exit code; any other error is
    reported as runner_system_failure (build.go setTraceStatus)."""

    def __init__(self, message: str, *, reason: str | None = None, exit_code: int = 0) -> None:
        super().__init__(message)
        self.reason = reason
        self.exit_code = exit_code


class CtxError(JobError):
    """context.Canceled or context.DeadlineExceeded."""

    def __init__(self, kind: str) -> None:
        super().__init__("context canceled" if kind == "canceled" else "context deadline exceeded")
        self.kind = kind


class Ctx:
    """Go's context, as far as the runner needs it: cancel, deadline, parent, cause."""

    def __init__(self, parent: Ctx | None = None, *, timeout_s: float | None = None,
                 cause: JobError | None = None) -> None:
        self._parent = parent
        self._deadline = time.monotonic() + timeout_s if timeout_s is not None else None
        self._deadline_cause = cause
        self._lock = threading.Lock()
        self._err: CtxError | None = None
        self._cause: JobError | None = None

    def cancel(self) -> None:
        with self._lock:
            if self._err is None:
                self._err, self._cause = CtxError("canceled"), None

    def err(self) -> CtxError | None:
        with self._lock:
            if self._err is None and self._parent is not None and self._parent.err() is not None:
                self._err, self._cause = self._parent.err(), self._parent.cause()
            if self._err is None and self._deadline is not None and time.monotonic() >= self._deadline:
                self._err, self._cause = CtxError("deadline"), self._deadline_cause
            return self._err

    def left_s(self) -> float | None:
        """`time.Until(ctx.Deadline())`: seconds to the nearest deadline up the chain; None
        without one."""
        own = self._deadline - time.monotonic() if self._deadline is not None else None
        up = self._parent.left_s() if self._parent is not None else None
        return min((x for x in (own, up) if x is not None), default=None)

    def cause(self) -> JobError | None:
        """context.Cause: the deadline's own cause where one was given, else the error."""
        err = self.err()
        with self._lock:
            return self._cause or err

    def sleep(self, seconds: float) -> bool:
        """Wait `seconds` or until done; True when done."""
        end = time.monotonic() + seconds
        while self.err() is None:
            left = end - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, _POLL_S))
        return True


Sink = Callable[[str], None]


def run_command(ctx: Ctx, argv: Sequence[str], *, env: Mapping[str, str], cwd: str,
                graceful_s: float, force_s: float, stdout: Sink, stderr: Sink,
                exit_code_file: str | None = None, on_exit: Callable[[int | None], None] | None = None,
                ) -> JobError | None:
    """command.go `Run`: start in a new process group, wait, or kill it when ctx ends."""
    try:
        proc = subprocess.Popen(list(argv), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, process_group=0)
    except OSError as exc:
        if on_exit:
            on_exit(None)
        return JobError(f"failed to start command: {exc}")
    readers = [threading.Thread(target=_pump, args=(pipe, sink), daemon=True)
               for pipe, sink in ((proc.stdout, stdout), (proc.stderr, stderr))]
    for reader in readers:
        reader.start()
    # Go's cmd.Wait returns once the process has exited and its output pipes are closed
    # (os/exec: the copying goroutines; helpers/process sets no WaitDelay): a process the
    # stage left behind that holds them keeps the stage running, as it does for real
    while (proc.poll() is None or _reading(readers)) and ctx.err() is None:
        time.sleep(_POLL_S)
    abandoned = None
    if proc.poll() is None or _reading(readers):
        abandoned = _kill_and_wait(proc, readers, graceful_s, force_s)
    for reader in readers:
        reader.join(timeout=5)
    if on_exit:
        on_exit(proc.returncode)
    if abandoned:
        return abandoned
    return classify(proc.returncode, exit_code_file)


def _pump(pipe: Any, sink: Sink) -> None:
    for raw in iter(pipe.readline, b""):
        sink(raw.decode(errors="replace"))
    pipe.close()


def _reading(readers: Sequence[threading.Thread]) -> bool:
    return any(reader.is_alive() for reader in readers)


def _kill_and_wait(proc: subprocess.Popen[bytes], readers: Sequence[threading.Thread], graceful_s: float,
                   force_s: float) -> JobError | None:
    """killer.go KillAndWait: SIGTERM the group, SIGKILL it after graceful_s, give up after
    force_s; waiting, as cmd.Wait does, for the output pipes to close too."""
    if not _signal_group(proc.pid, signal.SIGTERM):
        _signal_group(proc.pid, signal.SIGKILL)
    if _waited(proc, readers, graceful_s):
        return None
    _signal_group(proc.pid, signal.SIGKILL)
    if _waited(proc, readers, force_s):
        return None
    return JobError(f"failed to kill process PID={proc.pid}, likely process is dormant")


def _waited(proc: subprocess.Popen[bytes], readers: Sequence[threading.Thread], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None or _reading(readers):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)
    return True


def _signal_group(pgid: int, signum: int) -> bool:
    try:
        os.killpg(pgid, signum)
        return True
    except ProcessLookupError:
        return False


def classify(code: int | None, exit_code_file: str | None) -> JobError | None:
    """command.go waitForCommand / parseBuildFailure."""
    if code == 0:
        return None
    if code == BUILD_FAILURE_EXIT_CODE:
        try:
            first = Path(exit_code_file or "").read_text().splitlines()[:1]
        except OSError:
            return JobError("exit status 1", reason="script_failure", exit_code=1)
        try:
            real = int(first[0])
        except (IndexError, ValueError):
            return JobError("unknown Custom executor executable exit code 2; executable execution "
                            "terminated with: exit status 1")
        return JobError(f"exit status {real}", reason="script_failure", exit_code=real)
    if code == SYSTEM_FAILURE_EXIT_CODE:
        return JobError("exit status 2")
    shown = -1 if code is None or code < 0 else code  # Go's ExitCode() is -1 for a signal
    return JobError(f"unknown Custom executor executable exit code {shown}; executable execution "
                    f"terminated with: exit status {shown}")


class CustomExecutor:
    """executors/custom/custom.go for one job (one prepare attempt)."""

    def __init__(self, custom: CustomConfig | None, *, job: Mapping[str, Any],
                 variables: Callable[[], list[tuple[str, str]]], log: Sink,
                 on_command: Callable[[str, int | None, str], None] | None = None) -> None:
        self.custom = custom
        self.job = job
        self.variables = variables  # the build's variables at the time of each command
        self.log = log
        self.on_command = on_command
        self.temp_dir = ""
        self.config: dict[str, Any] = {}

    def check(self) -> JobError | None:
        if self.custom is None:
            return JobError("custom executor not configured", reason="runner_configuration_error")
        if not self.custom.run_exec:
            return JobError("custom executor is missing RunExec", reason="runner_configuration_error")
        return None

    def prepare(self, ctx: Ctx) -> JobError | None:
        """Temporary directory, response.json, config_exec (JSON), then prepare_exec."""
        err = self.check()
        if err or self.custom is None:
            return err
        self.temp_dir = tempfile.mkdtemp(prefix="custom-executor")
        Path(self.temp_dir, "response.json").write_text(json.dumps(self.job) + "\n")
        if self.custom.config_exec:
            out: list[str] = []
            err = self._command("config", Ctx(ctx, timeout_s=self.custom.config_exec_timeout_s),
                                [self.custom.config_exec, *self.custom.config_args], stdout=out.append)
            if err:
                return err
            text = "".join(out).strip()
            if text:
                try:
                    parsed = json.loads(text)
                except ValueError as exc:
                    return JobError(f"error while parsing JSON output: {exc}")
                self.config = parsed if isinstance(parsed, dict) else {}
        driver = self.config.get("driver") or {}
        name = f" with driver {driver.get('name')}" if isinstance(driver, dict) and driver.get("name") else ""
        version = f" {driver.get('version')}" if name and driver.get("version") else ""
        self.log(f"Using Custom executor{name}{version}...\n")
        if not self.custom.prepare_exec:
            return None
        return self._command("prepare", Ctx(ctx, timeout_s=self.custom.prepare_exec_timeout_s),
                             [self.custom.prepare_exec, *self.custom.prepare_args])

    def run(self, ctx: Ctx, script: str, stage: str) -> JobError | None:
        assert self.custom is not None
        script_dir = tempfile.mkdtemp(prefix="script", dir=self.temp_dir)
        path = Path(script_dir, "script")
        path.write_text(script)
        path.chmod(0o700)
        if stage == "step_script":
            stage = "build_script"  # custom.go: translated until the epic 6112 switch
        return self._command(stage, ctx, [self.custom.run_exec, *self.custom.run_args, str(path), stage])

    def cleanup(self) -> None:
        """cleanup_exec with its own timeout whatever became of the job; then rm the directory."""
        if self.check() is not None or self.custom is None or not self.temp_dir:
            return
        try:
            if self.custom.cleanup_exec:
                err = self._command("cleanup", Ctx(timeout_s=self.custom.cleanup_exec_timeout_s),
                                    [self.custom.cleanup_exec, *self.custom.cleanup_args], quiet=True)
                if err:
                    self.log(f"WARNING: Cleanup script failed: {err}\n")
        finally:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def env(self) -> dict[str, str]:
        """command.go: the runner's environment, the four variables, job_env, CUSTOM_ENV_*."""
        env = dict(os.environ)
        env.update({"TMPDIR": self.temp_dir,
                    "BUILD_FAILURE_EXIT_CODE": str(BUILD_FAILURE_EXIT_CODE),
                    "SYSTEM_FAILURE_EXIT_CODE": str(SYSTEM_FAILURE_EXIT_CODE),
                    "BUILD_EXIT_CODE_FILE": self.exit_code_file,
                    "JOB_RESPONSE_FILE": str(Path(self.temp_dir, "response.json"))})
        job_env = self.config.get("job_env")
        if isinstance(job_env, dict):
            env.update({str(k): str(v) for k, v in job_env.items()})
        env.update({f"CUSTOM_ENV_{key}": value for key, value in self.variables()})
        return env

    @property
    def exit_code_file(self) -> str:
        return str(Path(self.temp_dir, "build_exit_code"))

    def _command(self, name: str, ctx: Ctx, argv: list[str], *, stdout: Sink | None = None,
                 quiet: bool = False) -> JobError | None:
        assert self.custom is not None
        captured: list[str] = []

        def sink(text: str) -> None:
            captured.append(text)
            if not quiet:
                self.log(text)

        def out(text: str) -> None:
            captured.append(text)
            if stdout is not None:
                stdout(text)
            elif not quiet:
                self.log(text)

        def done(code: int | None) -> None:
            if self.on_command:
                self.on_command(name, code, "".join(captured))

        return run_command(ctx, argv, env=self.env(), cwd=self.temp_dir,
                           graceful_s=self.custom.graceful_kill_timeout_s,
                           force_s=self.custom.force_kill_timeout_s,
                           stdout=out, stderr=sink, exit_code_file=self.exit_code_file,
                           on_exit=done)
