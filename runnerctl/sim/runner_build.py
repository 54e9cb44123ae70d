"""One job from start to result, in the order and with the rules of gitlab-runner.

Follows gitlab-org/gitlab-runner common/build.go:

- `Run`: the job's context carries the job timeout (`runner_info.timeout`, 7200 s when
  unset, common/consts.go DefaultTimeout); prepare has its own (`prepare_timeout`, else
  the job's). The executor is made by `retryCreateExecutor`: up to 3 tries
  (PreparationRetries) 3 s apart (PreparationRetryInterval); each try runs config_exec
  and prepare_exec, and a failed try runs cleanup_exec. A build failure (exit 1) is not
  retried. cleanup_exec of a prepared executor always runs, before the result is sent.
- `executeScript`: prepare_script (a failure ends the job there), get_sources,
  restore_cache, download_artifacts (each retried per GET_SOURCES_ATTEMPTS,
  RESTORE_CACHE_ATTEMPTS, ARTIFACT_DOWNLOAD_ATTEMPTS; a get_sources retry first runs
  clear_worktree), then the user's steps (`step_script`, ...), after_script (with
  CI_JOB_STATUS, its own 5 min timeout or RUNNER_AFTER_SCRIPT_TIMEOUT; its failure is
  ignored unless AFTER_SCRIPT_IGNORE_ERRORS=false), then archive_cache or
  archive_cache_on_failure, upload_artifacts_on_success or _on_failure, and
  cleanup_file_variables, whatever became of the steps.
- Cancel: before the user's steps a cancel ends the whole job context; from the steps
  on it ends only the steps (RUNNER_SCRIPT_TIMEOUT context), so after_script and the
  later stages still run and the job fails with `job_canceled`. The job timeout ends
  everything (`job_execution_timeout`); a runner shutdown is `runner_interrupted`.
- Masked variables' values are written `[MASKED]` in the trace (common/buildlogger).
- `setTraceStatus`: no error is success; a BuildError reports its failure reason
  (mapped by common/failure_reason_mapper.go to what the job's `features.failure_reasons`
  lists, always allowing script_failure, runner_system_failure and
  job_execution_timeout) and exit code; any other error is runner_system_failure.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from runnerctl.executors.contract import AFTER_SCRIPT_TIMEOUT_S, parse_duration
from runnerctl.sim.runner_exec import Ctx, CtxError, CustomExecutor, JobError
from runnerctl.sim.runner_script import ScriptInfo, Variable, description, generate
from runnerctl.sim.runner_toml import RunnerEntry
from runnerctl.sim.runner_trace import MaskingTrace, Outcome, Trace

DEFAULT_TIMEOUT_S = 7200.0
PREPARATION_RETRIES = 3
PREPARATION_RETRY_INTERVAL_S = 3.0
WAIT_FOR_BUILD_FINISH_S = 300.0
ALWAYS_SUPPORTED = ("script_failure", "runner_system_failure", "job_execution_timeout")
COMPATIBLE = {"image_pull_failure": "runner_system_failure", "runner_configuration_error": "script_failure",
              "runner_external_dependency_failure": "runner_system_failure"}
_CYAN, _RESET = "\x1b[36;1m", "\x1b[0;m"


CommandObserver = Callable[[str, int | None, str], None]


class Build:
    def __init__(self, job: dict[str, Any], runner: RunnerEntry, *, trace: Trace, concurrent_id: int = 0,
                 project_runner_id: int = 0, interrupt: threading.Event | None = None,
                 on_command: CommandObserver | None = None,
                 retry_interval_s: float = PREPARATION_RETRY_INTERVAL_S) -> None:
        self.job = job
        self.runner = runner
        masked = {str(v["value"]) for v in job.get("variables") or []
                  if isinstance(v, dict) and v.get("masked") and v.get("value")}
        self.trace: Trace = MaskingTrace(trace, masked) if masked else trace
        self.concurrent_id = concurrent_id
        self.project_runner_id = project_runner_id
        self.interrupt = interrupt or threading.Event()
        self.on_command = on_command
        self.retry_interval_s = retry_interval_s
        self.job_status = "running"
        self.root_dir = self.build_dir = ""
        self.hostname = ""
        timeout = float((job.get("runner_info") or {}).get("timeout") or 0)
        self.timeout_s = timeout if timeout > 0 else DEFAULT_TIMEOUT_S

    # -- variables and directories (common/build.go GetAllVariables, StartBuild) -------------
    def variables(self) -> list[Variable]:
        found: list[Variable] = []
        image = (self.job.get("image") or {}).get("name") if isinstance(self.job.get("image"), dict) else None
        if image:
            found.append(Variable("CI_JOB_IMAGE", str(image)))
        found.append(Variable("CI_RUNNER_SHORT_TOKEN", self.runner.short_token))
        for entry in self.runner.environment:
            key, _, value = entry.partition("=")
            found.append(Variable(key, value))
        found += [Variable("CI_BUILDS_DIR", self.root_dir), Variable("CI_PROJECT_DIR", self.build_dir),
                  Variable("CI_CONCURRENT_ID", str(self.concurrent_id)),
                  Variable("CI_CONCURRENT_PROJECT_ID", str(self.project_runner_id)),
                  Variable("CI_SERVER", "yes"), Variable("CI_JOB_STATUS", self.job_status),
                  Variable("CI_JOB_TIMEOUT", str(int(self.timeout_s)))]  # the runner's, not GitLab's
        for var in self.job.get("variables") or []:
            if isinstance(var, dict) and var.get("key"):
                found.append(Variable(str(var["key"]), str(var.get("value", "")), bool(var.get("file"))))
        found += [Variable("CI_SHARED_ENVIRONMENT", "true"),
                  Variable("RUNNER_TEMP_PROJECT_DIR", self.build_dir + ".tmp" if self.build_dir else "")]
        return found

    def variable_pairs(self) -> list[tuple[str, str]]:
        return [(v.key, v.value) for v in self.variables()]

    def value(self, key: str, default: str = "") -> str:
        values = [v.value for v in self.variables() if v.key == key]
        return values[-1] if values else default

    def start_build(self, executor: CustomExecutor) -> JobError | None:
        builds = str(executor.config.get("builds_dir") or self.runner.builds_dir)
        cache = str(executor.config.get("cache_dir") or self.runner.cache_dir)
        if not builds:
            return JobError("the builds_dir is not configured", reason="runner_configuration_error")
        if not cache:
            return JobError("the cache_dir is not configured", reason="runner_configuration_error")
        self.hostname = str(executor.config.get("hostname") or "")
        repo = str((self.job.get("git_info") or {}).get("repo_url") or "")
        slug = urlparse(repo).path.removesuffix(".git").strip("/") if urlparse(repo).netloc else ""
        if not slug or ".." in slug:
            slug = f"project-{(self.job.get('job_info') or {}).get('project_id', 0)}"
        if executor.config.get("builds_dir_is_shared"):
            slug = f"{self.runner.short_token}/{self.project_runner_id}/{slug}"
        self.root_dir, self.build_dir = builds.rstrip("/"), builds.rstrip("/") + "/" + slug
        return None

    def script_info(self) -> ScriptInfo:
        def items(key: str) -> tuple[dict[str, Any], ...]:
            return tuple(x for x in self.job.get(key) or [] if isinstance(x, dict))

        return ScriptInfo(variables=tuple(self.variables()), project_dir=self.build_dir,
                          hostname=self.hostname, steps=items("steps"), cache=items("cache"),
                          artifacts=items("artifacts"), dependencies=items("dependencies"),
                          runner_url=self.runner.url, pre_build_script=self.runner.pre_build_script,
                          post_build_script=self.runner.post_build_script)

    # -- the run ------------------------------------------------------------------------------
    def run(self) -> Outcome:
        """common/build.go Run + setTraceStatus."""
        err = self._run_all()
        return self.outcome(err)

    def _run_all(self) -> JobError | None:
        job_ctx = Ctx(timeout_s=self.timeout_s)
        self.trace.set_cancel(job_ctx.cancel)
        self.trace.set_abort(job_ctx.cancel)
        prepare_s = min(self.runner.prepare_timeout_s or self.timeout_s, self.timeout_s)
        prepare_timeout = JobError(f"job prepare timeout: exceeded timeout of {prepare_s:.0f}s",
                                   reason="job_execution_timeout")
        prepare_ctx = Ctx(job_ctx, timeout_s=prepare_s, cause=prepare_timeout)
        executor, err = self._create_executor(prepare_ctx)
        if executor is None:
            if prepare_ctx.cause() is prepare_timeout:
                return prepare_timeout
            return err
        try:
            return self._run(job_ctx, prepare_ctx, executor)
        finally:
            executor.cleanup()

    def _create_executor(self, ctx: Ctx) -> tuple[CustomExecutor | None, JobError | None]:
        err: JobError | None = None
        for _ in range(PREPARATION_RETRIES):
            executor = CustomExecutor(self.runner.custom, job=self.job, variables=self.variable_pairs,
                                      log=self.trace.write, on_command=self.on_command)
            err = executor.prepare(ctx) or self.start_build(executor)
            if err is None:
                return executor, None
            executor.cleanup()
            if err.reason is not None:
                return None, err
            if ctx.err() is not None:
                return None, handle_error(ctx.cause())
            self.trace.write(f"WARNING: Preparation failed: {err}\n"
                             f"Will be retried in {self.retry_interval_s:.0f}s ...\n")
            if ctx.sleep(self.retry_interval_s):
                return None, handle_error(ctx.cause())
        return None, err

    def _run(self, job_ctx: Ctx, prepare_ctx: Ctx, executor: CustomExecutor) -> JobError | None:
        """build.go run: the script in a thread; the job context, an interrupt or the end."""
        run_ctx = Ctx(job_ctx)
        finished = threading.Event()
        result: list[JobError | None] = []

        def body() -> None:
            try:
                result.append(self._execute_script(run_ctx, prepare_ctx, executor))
            finally:
                finished.set()

        threading.Thread(target=body, name=f"job-{self.job.get('id')}", daemon=True).start()
        err: JobError | None
        while True:
            if finished.wait(0.05):
                if job_ctx.err() is not None:
                    return handle_error(job_ctx.cause())
                return result[0] if result else JobError("the job's script thread died")
            if job_ctx.err() is not None:
                err = handle_error(job_ctx.cause())
                break
            if self.interrupt.is_set():
                err = JobError("aborted: terminated", reason="runner_interrupted")
                break
        run_ctx.cancel()
        finished.wait(WAIT_FOR_BUILD_FINISH_S)
        return err

    def _execute_script(self, ctx: Ctx, prepare_ctx: Ctx, executor: CustomExecutor) -> JobError | None:
        err = self._stage(prepare_ctx, "prepare_script", executor)
        if err is not None:
            cause = prepare_ctx.cause()
            if isinstance(cause, JobError) and cause.reason == "job_execution_timeout":
                return cause
            return err
        err = self._attempts(ctx, "get_sources", executor, "GET_SOURCES_ATTEMPTS", clear=True)
        if err is None:
            err = self._attempts(ctx, "restore_cache", executor, "RESTORE_CACHE_ATTEMPTS")
        if err is None:
            err = self._attempts(ctx, "download_artifacts", executor, "ARTIFACT_DOWNLOAD_ATTEMPTS")
        if err is None:
            err = self._user_scripts(ctx, executor)
        cache_err = self._stage(ctx, "archive_cache" if err is None else "archive_cache_on_failure", executor)
        upload_err = self._stage(ctx, "upload_artifacts_on_success" if err is None
                                 else "upload_artifacts_on_failure", executor)
        err = err or cache_err or upload_err  # build.go pickPriorityError
        if self._stage(ctx, "cleanup_file_variables", executor) is not None:
            self.trace.write("WARNING: Error while executing file based variables removal script\n")
        return err

    def _user_scripts(self, ctx: Ctx, executor: CustomExecutor) -> JobError | None:
        left = ctx.left_s()  # build.go reads both stage timeouts here, before the steps run
        script_ctx = Ctx(ctx, timeout_s=self._stage_timeout("RUNNER_SCRIPT_TIMEOUT", None, left))
        self.trace.set_cancel(script_ctx.cancel)
        err: JobError | None = None
        for step in self.job.get("steps") or []:
            if not isinstance(step, dict) or step.get("name") == "after_script":
                continue
            err = self._stage(script_ctx, "step_" + str(step.get("name", "")).lower(), executor)
            if err is not None:
                break
        script_err, parent_err = script_ctx.err(), ctx.err()
        if parent_err is None and script_err is not None and script_err.kind == "canceled":
            err = JobError("canceled", reason="job_canceled")
            self.trace.write("WARNING: script canceled externally (UI, API)\n")
        elif (parent_err is None or parent_err.kind != "deadline") and script_err is not None \
                and script_err.kind == "deadline":
            err = JobError("script timeout: context deadline exceeded", reason="job_execution_timeout")
        after_s = self._stage_timeout("RUNNER_AFTER_SCRIPT_TIMEOUT", AFTER_SCRIPT_TIMEOUT_S, left)
        after_ctx = Ctx(ctx, timeout_s=after_s)
        self.job_status = runtime_state(err)
        after_err = self._stage(after_ctx, "after_script", executor)
        ctx_err = ctx.err()
        if after_err is not None and (ctx_err is None or ctx_err.kind != "deadline"):
            if self.value("AFTER_SCRIPT_IGNORE_ERRORS", "true").lower() != "false":
                self.trace.write("WARNING: after_script failed, but job will continue unaffected: "
                                 f"{after_err}\n")
            elif err is None:
                err = after_err
        return err

    def _stage(self, ctx: Ctx, stage: str, executor: CustomExecutor) -> JobError | None:
        """build.go executeStage: nothing once the context ended; skipped when nothing to do."""
        if (ctx_err := ctx.err()) is not None:
            return ctx_err
        script = generate(stage, self.script_info())
        if script is None:
            return None
        self.trace.write(f"{_CYAN}{description(stage)}{_RESET}\n")
        return executor.run(ctx, script, stage)

    def _attempts(self, ctx: Ctx, stage: str, executor: CustomExecutor, variable: str, *,
                  clear: bool = False) -> JobError | None:
        try:
            attempts = min(max(int(self.value(variable, "1")), 1), 10)
        except ValueError:
            attempts = 1
        err: JobError | None = None
        for attempt in range(attempts):
            if clear and attempt == 1:
                self._stage(ctx, "clear_worktree", executor)
            err = self._stage(ctx, stage, executor)
            if err is None:
                return None
        return err

    def _stage_timeout(self, variable: str, default: float | None, left: float | None) -> float | None:
        """build.go getStageTimeoutContexts: a Go duration in a variable, else the default;
        one longer than the job has `left` keeps the default (the warning says "Setting to
        job timeout", but the default is what stays)."""
        raw = self.value(variable).strip()
        if not raw:
            return default
        seconds = parse_duration(raw)
        if seconds is None or seconds < 0:
            self.trace.write(f"WARNING: Ignoring malformed {variable} timeout: {raw}\n")
            return default
        if left is not None and seconds > left:
            self.trace.write(f"WARNING: {variable} timeout: {raw} is longer than job timeout. "
                             "Setting to job timeout\n")
            return default
        return seconds or default

    def outcome(self, err: JobError | None) -> Outcome:
        if err is None:
            return Outcome("success")
        if err.reason is None:
            self.trace.write(f"ERROR: Job failed (system failure): {err}\n")
            return Outcome("failed", "runner_system_failure", 0, str(err))
        self.trace.write(f"ERROR: Job failed: {err}\n")
        return Outcome("failed", self.map_reason(err.reason), err.exit_code, str(err))

    def map_reason(self, reason: str) -> str:
        """common/failure_reason_mapper.go Map."""
        supported = set((self.job.get("features") or {}).get("failure_reasons") or []) | set(ALWAYS_SUPPORTED)
        for _ in range(10):
            if reason in supported:
                return reason
            if reason not in COMPATIBLE:
                break
            reason = COMPATIBLE[reason]
        return "unknown_failure"


def handle_error(cause: JobError | None) -> JobError | None:
    """build.go runtimeStateAndError for a context's cause."""
    if isinstance(cause, CtxError):
        if cause.kind == "canceled":
            return JobError("canceled", reason="job_canceled")
        return JobError("execution took longer than the job timeout", reason="job_execution_timeout")
    return cause


def runtime_state(err: JobError | None) -> str:
    if err is None:
        return "success"
    if err.reason == "job_canceled" or (isinstance(err, CtxError) and err.kind == "canceled"):
        return "canceled"
    if err.reason == "job_execution_timeout" or (isinstance(err, CtxError) and err.kind == "deadline"):
        return "timedout"
    return "failed"
