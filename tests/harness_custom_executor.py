"""Drive a custom executor as gitlab-runner does, with `runnerctl sim runner`'s own driver.

`run_job` is one whole job through runnerctl/sim/runner_build.py, the stage driver of
the gitlab-runner stand-in (so there is one implementation of gitlab-runner's rules):
config_exec, prepare_exec (a system failure retried 3 times 3 s apart, each try with
its cleanup_exec), prepare_script, get_sources, restore_cache, the job's steps
(`build_script`), after_script, archive_cache / archive_cache_on_failure,
upload_artifacts_on_success / _on_failure, cleanup_file_variables and cleanup_exec;
each stage script generated and wrapped as shells/bash.go does, each job with its own
TMPDIR and working directory, SIGTERM then SIGKILL to a stage's process group on a
timeout or cancel (gitlab-org/gitlab-runner common/build.go, shells/bash.go,
executors/custom/custom.go, executors/custom/command/command.go,
helpers/process/killer_unix.go).

`stage`, `start` and `script` drive one stage by hand (for the tests of what happens
between stages); they use the same environment, script wrapping and kill rules.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
import threading
from pathlib import Path
from typing import Any

from runnerctl.executors import contract
from runnerctl.executors.contract import DriverArgs, stage_command
from runnerctl.sim.runner_build import Build
from runnerctl.sim.runner_exec import (
    BUILD_FAILURE_EXIT_CODE,
    SYSTEM_FAILURE_EXIT_CODE,
    Ctx,
    CustomExecutor,
    run_command,
)
from runnerctl.sim.runner_script import finish
from runnerctl.sim.runner_toml import CustomConfig, RunnerEntry
from runnerctl.sim.runner_trace import LocalTrace, Outcome

BUILD_FAILURE, SYSTEM_FAILURE = BUILD_FAILURE_EXIT_CODE, SYSTEM_FAILURE_EXIT_CODE
TERM_TRAP = "trap 'echo stopped by TERM; exit 143' TERM"
"""Script lines that say so when the driver's SIGTERM reaches them (a SIGKILL leaves no word)."""
RUNNER_URL = "https://gitlab.example"


@dataclasses.dataclass
class FakeJob:
    id: int
    variables: dict[str, str] = dataclasses.field(default_factory=dict)
    user: str = "alice"
    project: str = "ml/experiments"
    pipeline_id: int = 500
    image: str | None = None
    after_script: list[str] = dataclasses.field(default_factory=lambda: ["echo after_script ran"])
    cache_paths: list[str] = dataclasses.field(default_factory=list)  # ["cache/"]: the cache stages run
    artifact_paths: list[str] = dataclasses.field(default_factory=list)  # ["out/"]: the upload stages run
    services: list[str] = dataclasses.field(default_factory=list)
    registry: str = "registry.gitlab.test:5050"
    """Where GitLab's container registry is: the payload's credentials name it with the job
    token (lib/gitlab/ci/build/credentials/registry/gitlab_registry.rb)."""

    def ci_variables(self) -> dict[str, str]:
        variables = {"CI_JOB_ID": str(self.id), "CI_PIPELINE_ID": str(self.pipeline_id),
                     "GITLAB_USER_LOGIN": self.user, "CI_PROJECT_PATH": self.project,
                     "CI_JOB_URL": f"{RUNNER_URL}/{self.project}/-/jobs/{self.id}", **self.variables}
        if self.image:
            variables["CI_JOB_IMAGE"] = self.image
        return variables

    def json(self, body: str, *, timeout: float) -> dict[str, Any]:
        """The job as POST /jobs/request answers it (lib/api/entities/ci/job_request/response.rb)."""
        steps: list[dict[str, Any]] = [{"name": "script", "script": [body], "timeout": int(timeout),
                                        "when": "on_success", "allow_failure": False}]
        if self.after_script:
            steps.append({"name": "after_script", "script": self.after_script, "timeout": int(timeout),
                          "when": "always", "allow_failure": True})
        return {
            "id": self.id, "token": f"glcbt-job{self.id}",
            "job_info": {"id": self.id, "name": "test", "stage": "test", "project_id": 7,
                         "project_name": self.project.rsplit("/", 1)[-1]},
            "git_info": {"repo_url": f"{RUNNER_URL}/{self.project}.git", "ref": "main", "sha": "0" * 40},
            "runner_info": {"timeout": int(timeout)},
            "variables": [{"key": k, "value": v, "public": True, "masked": False}
                          for k, v in self.ci_variables().items()],
            "steps": steps,
            "image": {"name": self.image} if self.image else None,
            "services": [{"name": name} for name in self.services],
            "credentials": [{"type": "registry", "url": self.registry, "username": "gitlab-ci-token",
                             "password": f"glcbt-job{self.id}"}],
            "cache": [{"key": "default", "paths": self.cache_paths, "policy": "pull-push",
                       "when": "always"}] if self.cache_paths else [],
            "artifacts": [{"name": "out", "paths": self.artifact_paths, "when": "always",
                           "artifact_type": "archive"}] if self.artifact_paths else [],
            "features": {"failure_reasons": ["script_failure", "runner_system_failure",
                                             "job_execution_timeout", "unknown_failure"]},
        }


@dataclasses.dataclass
class StageResult:
    code: int
    output: str


class Harness:
    def __init__(self, args: DriverArgs, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.runner = runner_entry(args)
        self.outcomes: dict[int, Outcome] = {}
        self.traces: dict[int, str] = {}
        self.commands: dict[int, list[tuple[str, int | None]]] = {}
        self._executors: dict[int, CustomExecutor] = {}

    # -- one whole job ---------------------------------------------------------------------------
    def run_job(self, job: FakeJob, body: str, *, timeout: float = 60,
                cancel: threading.Event | None = None) -> dict[str, StageResult]:
        """The job through gitlab-runner's stages; results by stage (the last try of each).

        `cancel`, when set while the job runs, is GitLab answering `Job-Status: canceling`."""
        results: dict[str, StageResult] = {}
        commands = self.commands.setdefault(job.id, [])
        trace = LocalTrace()

        def record(name: str, code: int | None, out: str) -> None:
            results[name] = StageResult(-1 if code is None else code, out)
            commands.append((name, code))

        build = Build(job.json(body, timeout=timeout), self.runner, trace=trace, on_command=record)
        if cancel is not None:
            done = threading.Event()

            def watch() -> None:
                while not done.is_set():
                    if cancel.wait(0.05):
                        trace.cancel()
                        return

            threading.Thread(target=watch, daemon=True).start()
        try:
            self.outcomes[job.id] = build.run()
        finally:
            if cancel is not None:
                done.set()
        self.traces[job.id] = trace.text()
        return results

    # -- one stage by hand -----------------------------------------------------------------------
    def executor(self, job: FakeJob) -> CustomExecutor:
        """The job's executor state: its own TMPDIR, response.json and exit code file."""
        if job.id not in self._executors:
            variables = job.ci_variables()
            executor = CustomExecutor(self.runner.custom, job=job.json("true", timeout=3600),
                                      variables=lambda: list(variables.items()), log=lambda _: None)
            executor.temp_dir = str(self.workdir / f"custom-executor-{job.id}")
            Path(executor.temp_dir).mkdir(parents=True, exist_ok=True)
            Path(executor.temp_dir, "response.json").write_text(
                json.dumps(job.json("true", timeout=3600)))
            self._executors[job.id] = executor
        return self._executors[job.id]

    def env(self, job: FakeJob) -> dict[str, str]:
        return self.executor(job).env()

    def build_exit_code(self, job_id: int) -> str:
        return Path(self._executors[job_id].exit_code_file).read_text().strip()

    def start(self, stage: str, job: FakeJob, *extra: str,
              stopped_at_start: bool = False) -> subprocess.Popen[str]:
        """The stage running; `stopped_at_start`: SIGTERM lands as the job's process starts."""
        exe, argv = stage_command(stage, self.args)
        if stopped_at_start:
            argv = [str(Path(__file__).with_name("stage_stopped_at_start.py")), *argv[2:]]
        executor = self.executor(job)
        return subprocess.Popen([exe, *argv, *extra], env=executor.env(), cwd=executor.temp_dir, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, process_group=0)

    def stage(self, stage: str, job: FakeJob, *extra: str, timeout: float = 60,
              graceful: float = 5, stop_once: Path | None = None) -> StageResult:
        """One stage as gitlab-runner runs it; `stop_once`: stopped (SIGTERM to its group, as
        at a timeout or cancel) as soon as that file exists, not after a fixed time that a
        loaded machine may spend before the script is ready for it."""
        exe, argv = stage_command(stage, self.args)
        executor = self.executor(job)
        out: list[str] = []
        codes: list[int | None] = []
        ctx = Ctx(timeout_s=timeout)
        done = threading.Event()

        def stop_when_there(marker: Path) -> None:
            while not done.wait(0.05):
                if marker.exists():
                    ctx.cancel()
                    return

        if stop_once is not None:
            threading.Thread(target=stop_when_there, args=(stop_once,), daemon=True).start()
        try:
            run_command(ctx, [exe, *argv, *extra], env=executor.env(), cwd=executor.temp_dir,
                        graceful_s=graceful, force_s=10, stdout=out.append, stderr=out.append,
                        exit_code_file=executor.exit_code_file, on_exit=codes.append)
        finally:
            done.set()
        return StageResult(-1 if codes[0] is None else codes[0], "".join(out))

    def script(self, job: FakeJob, stage: str, body: str) -> Path:
        path = self.workdir / f"script-{job.id}-{stage}"
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in job.variables.items())
        path.write_text(finish(exports + body + "\n"))
        return path


def runner_entry(args: DriverArgs) -> RunnerEntry:
    """The `[[runners]]` entry `runnerctl init` writes for a slot (executors/contract.py)."""
    section = contract.custom_section(args)

    def argv(stage: str) -> tuple[str, ...]:
        return tuple(str(a) for a in section[f"{stage}_args"])  # type: ignore[attr-defined]

    custom = CustomConfig(
        config_exec=str(section["config_exec"]), config_args=argv("config"),
        config_exec_timeout_s=contract.CONFIG_EXEC_TIMEOUT_S,
        prepare_exec=str(section["prepare_exec"]), prepare_args=argv("prepare"),
        prepare_exec_timeout_s=contract.PREPARE_EXEC_TIMEOUT_S,
        run_exec=str(section["run_exec"]), run_args=argv("run"),
        cleanup_exec=str(section["cleanup_exec"]), cleanup_args=argv("cleanup"),
        cleanup_exec_timeout_s=contract.CLEANUP_EXEC_TIMEOUT_S,
        graceful_kill_timeout_s=contract.GRACEFUL_KILL_TIMEOUT_S,
        force_kill_timeout_s=contract.FORCE_KILL_TIMEOUT_S)
    return RunnerEntry(name=args.slot, url=RUNNER_URL, token="glrt-harnesstoken", executor="custom",
                       custom=custom)


def write_runner_config(tmp: Path, url: str, runners: list[dict[str, Any]], *,
                        concurrent: int = 4) -> Path:
    """config.toml as `runnerctl init --executor custom` writes it (executors/contract.py).

    One runner per entry of `runners` ({token, executor?, other keys as TOML values}), runner
    i on GPU i of a simulated 8-GPU host in `tmp/host`, shell driver."""
    host = tmp / "host"
    if not host.exists():
        host.mkdir()
        make_host(host, gate_wait_s=1)
    lines = [f"concurrent = {concurrent}", "check_interval = 1", ""]
    for i, entry in enumerate(runners):
        args = DriverArgs(f"runnerctl/gpu-a/gpu{i}", (i,), f"sim:{host / 'gpus.yaml'}",
                          str(host / "runnerctl.toml"), "shell")
        lines += ["[[runners]]", f'name = "runnerctl/gpu-a/gpu{i}"', f'url = "{url}"',
                  f'token = "{entry["token"]}"', f'executor = "{entry.get("executor", "custom")}"']
        lines += [f"{key} = {value}" for key, value in entry.items() if key not in ("token", "executor")]
        lines.append("[runners.custom]")
        for key, value in contract.custom_section(args).items():
            lines.append(f"{key} = {json.dumps(value)}")
        lines.append("")
    path = tmp / "config.toml"
    path.write_text("\n".join(lines))
    return path


def make_host(root: Path, *, gate_wait_s: float = 3, docker_image: str | None = None,
              shell_user: str | None = "root") -> Path:
    """A simulated 8-GPU host `gpu-a`: gpus.yaml (edit it to add processes) and settings.
    The shell driver runs jobs as `shell_user`: root (CI's own user) is allowed explicitly,
    None leaves both settings at their defaults."""
    (root / "gpus.yaml").write_text("host: gpu-a\ngpus: 8\n")
    image = f'docker_image = "{docker_image}"\n' if docker_image else ""
    user = ("" if shell_user is None else "allow_root = true\n" if shell_user == "root"
            else f'run_as_user = "{shell_user}"\n')
    (root / "runnerctl.toml").write_text(
        f'[host]\nname = "gpu-a"\n[paths]\nstate_dir = "{root / "state"}"\n'
        f"[executor]\ngate_wait_s = {gate_wait_s}\n{image}{user}")
    return root


def harness_for(host: Path, gpus: tuple[int, ...], driver: str) -> Harness:
    span = f"gpu{gpus[0]}" if len(gpus) == 1 else f"gpu{gpus[0]}-{gpus[-1]}"
    args = DriverArgs(slot=f"runnerctl/gpu-a/{span}", gpus=gpus, gpu_source=f"sim:{host / 'gpus.yaml'}",
                      config=str(host / "runnerctl.toml"), driver=driver)
    return Harness(args, host / "work")
