"""Drive a custom executor exactly as gitlab-runner does (docs/executors/custom.md).

Stages are separate processes: config_exec (stdout JSON), prepare_exec once, run_exec
`<args> <script path> <stage name>` for each stage, cleanup_exec always. Job variables
arrive as CUSTOM_ENV_<NAME>; JOB_RESPONSE_FILE holds the job JSON; exit codes come from
BUILD_FAILURE_EXIT_CODE / SYSTEM_FAILURE_EXIT_CODE, and the real build exit code is
written to BUILD_EXIT_CODE_FILE. Like gitlab-runner's bash scripts, each stage script
starts with `set -eo pipefail` and exports the job's variables. Each stage runs in its
own process group; one past its timeout gets SIGTERM to that group, then SIGKILL to it
after the graceful timeout (gitlab-runner helpers/process/killer_unix.go signals -pid;
`graceful_kill_timeout`, `force_kill_timeout` in docs/executors/custom.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import subprocess
from pathlib import Path

from runnerctl.executors.contract import DriverArgs, stage_command

BUILD_FAILURE, SYSTEM_FAILURE = 1, 2


@dataclasses.dataclass
class FakeJob:
    id: int
    variables: dict[str, str] = dataclasses.field(default_factory=dict)
    user: str = "alice"
    project: str = "ml/experiments"
    pipeline_id: int = 500
    image: str | None = None


@dataclasses.dataclass
class StageResult:
    code: int
    output: str


class Harness:
    def __init__(self, args: DriverArgs, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)

    def env(self, job: FakeJob) -> dict[str, str]:
        job_file = self.workdir / f"job-{job.id}.json"
        variables = {"CI_JOB_ID": str(job.id), "CI_PIPELINE_ID": str(job.pipeline_id),
                     "GITLAB_USER_LOGIN": job.user, "CI_PROJECT_PATH": job.project,
                     "CI_JOB_URL": f"https://gitlab.example/{job.project}/-/jobs/{job.id}", **job.variables}
        if job.image:
            variables["CI_JOB_IMAGE"] = job.image
        job_file.write_text(json.dumps({"id": job.id, "image": {"name": job.image} if job.image else None,
                                        "variables": [{"key": k, "value": v, "public": True}
                                                      for k, v in variables.items()]}))
        env = {k: v for k, v in os.environ.items() if not k.startswith("CUSTOM_ENV_")}
        env.update({f"CUSTOM_ENV_{k}": v for k, v in variables.items()})
        env.update({"JOB_RESPONSE_FILE": str(job_file),
                    "BUILD_FAILURE_EXIT_CODE": str(BUILD_FAILURE),
                    "SYSTEM_FAILURE_EXIT_CODE": str(SYSTEM_FAILURE),
                    "BUILD_EXIT_CODE_FILE": str(self.workdir / f"exit-{job.id}"),
                    "TMPDIR": str(self.workdir)})
        return env

    def start(self, stage: str, job: FakeJob, *extra: str) -> subprocess.Popen[str]:
        exe, argv = stage_command(stage, self.args)
        return subprocess.Popen([exe, *argv, *extra], env=self.env(job), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def stage(self, stage: str, job: FakeJob, *extra: str, timeout: float = 60,
              graceful: float = 5) -> StageResult:
        proc = self.start(stage, job, *extra)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                out, _ = proc.communicate(timeout=graceful)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, _ = proc.communicate()
        return StageResult(proc.returncode, out)

    def script(self, job: FakeJob, stage: str, body: str) -> Path:
        path = self.workdir / f"script-{job.id}-{stage}"
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in job.variables.items())
        path.write_text(f"#!/usr/bin/env bash\nset -eo pipefail\n{exports}{body}\n")
        return path

    def run_job(self, job: FakeJob, body: str, *, timeout: float = 60) -> dict[str, StageResult]:
        results = {"config": self.stage("config", job)}
        results["prepare"] = self.stage("prepare", job)
        if results["prepare"].code == 0:
            for stage, text in (("prepare_script", "true"), ("get_sources", "true"),
                                ("build_script", body)):
                results[stage] = self.stage("run", job, str(self.script(job, stage, text)), stage,
                                            timeout=timeout)
                if results[stage].code != 0:
                    break
        results["cleanup"] = self.stage("cleanup", job)
        return results


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
