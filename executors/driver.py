"""What every driver gets and does: the stage context, the driver protocol, the registry.

A driver implements the stages for one way of running a job (a process group, a
container, a Slurm job) and `reap`, which ends whatever a job left behind given only its
lease record: cleanup, a later prepare and the controller all reap through it, so what
a dead job left is found the same way everywhere. The stage logic shared by all drivers
(GPU leases, the gate, exit-code mapping) lives in `stages`; drivers only start, run
and remove.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from runnerctl.executors.contract import (
    CUSTOM_ENV_PREFIX,
    ENV_BUILD_FAILURE,
    ENV_JOB_RESPONSE_FILE,
    ENV_SYSTEM_FAILURE,
    DriverArgs,
    exit_code,
)
from runnerctl.executors.lease import Lease
from runnerctl.executors.registry_auth import RegistryCredential
from runnerctl.gpus import GpuSource, open_gpu_source
from runnerctl.settings import Settings


class SystemFailure(Exception):
    """Infrastructure failed (not the user's script): exit with SYSTEM_FAILURE_EXIT_CODE."""


def remove_tree(path: Path, what: str) -> bool:
    """Remove `path` and everything below it, going on past what cannot be removed; what
    is left is one line on stderr naming `what` and the first reason (no path: a
    stale lease's directory is named by its token, and a later job's prepare may reap
    it), never the job's result. True when nothing is left; a tree not there is gone."""
    left: list[BaseException] = []

    def note(exc: BaseException) -> None:
        if not isinstance(exc, FileNotFoundError):
            left.append(exc)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=lambda _f, _p, exc: note(exc))
    else:  # onerror is deprecated from 3.12
        shutil.rmtree(path, onerror=lambda _f, _p, info: note(info[1]))
    if left:
        reason = getattr(left[0], "strerror", None) or left[0]
        more = f", {len(left)} entries left" if len(left) > 1 else ""
        print(f"runnerctl: cannot remove all of the {what}: {reason}{more}", file=sys.stderr, flush=True)
    return not left


@dataclasses.dataclass(frozen=True)
class Job:
    """The job as gitlab-runner describes it in JOB_RESPONSE_FILE (trusted), else CI vars."""

    id: str
    pipeline_id: str
    project: str
    user: str
    image: str | None
    url: str = ""  # CI_JOB_URL: the job's page, shown on runnerctl's web page
    timeout_s: int | None = None
    """The job's timeout: gitlab-runner kills the job then. From the job response's
    `runner_info.timeout`, which is also what gitlab-runner exports as CI_JOB_TIMEOUT
    (gitlab-org/gitlab-runner common/build.go; common/build_test.go checks the two agree)."""
    name: str = ""  # CI_JOB_NAME: the job's key in .gitlab-ci.yml (the run-time history's key)
    docker_auth_config: str = dataclasses.field(default="", repr=False)
    """The job's DOCKER_AUTH_CONFIG variable (registry passwords: never in a repr)."""
    registry_credentials: tuple[RegistryCredential, ...] = dataclasses.field(default=(), repr=False)
    """The payload's `credentials` (GitLab's registry with the job token)."""
    services: tuple[str, ...] = ()
    """The images of the job's `services:` (the docker driver starts none)."""
    set_by_job: frozenset[str] = frozenset()
    """The names of the payload's variables: GitLab's and the job's, never gitlab-runner's
    own (CI_PROJECT_DIR, CI_JOB_TIMEOUT, ...), so one of those here was set by the job."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Job:
        data: dict[str, Any] = {}
        path = env.get(ENV_JOB_RESPONSE_FILE)
        if path and Path(path).exists():
            data = json.loads(Path(path).read_text(encoding="utf-8"))  # JSON is UTF-8, whatever LANG says
        variables: dict[Any, Any] = {}
        latest: dict[Any, Any] = {}
        for v in data.get("variables", []):
            if isinstance(v, dict):  # GitLab's own come first (predefined: the lowest precedence);
                variables.setdefault(v.get("key"), v.get("value"))  # a job's later copy changes no id
                latest[v.get("key")] = v.get("value")
        custom = {k.removeprefix(CUSTOM_ENV_PREFIX): v for k, v in env.items()
                  if k.startswith(CUSTOM_ENV_PREFIX)}

        def pick(name: str, default: str = "") -> str:
            return str(variables.get(name) or custom.get(name) or default)

        job_id = str(data.get("id") or pick("CI_JOB_ID"))
        if not job_id:
            raise SystemFailure("no job id: neither JOB_RESPONSE_FILE nor CUSTOM_ENV_CI_JOB_ID")
        image = (data.get("image") or {}).get("name") if isinstance(data.get("image"), dict) else None
        # gitlab-runner adds CI_JOB_IMAGE, the image's name with its $VARs expanded
        # (common/build.go getBaseVariablesBeforeJob, GetAllVariables().Expand()), as its
        # executors use it (executors/docker/docker.go ExpandValue): the payload's name is
        # as written, `$CI_REGISTRY_IMAGE/train:latest` included
        image = custom.get("CI_JOB_IMAGE") or image
        auth = custom.get("DOCKER_AUTH_CONFIG") or latest.get("DOCKER_AUTH_CONFIG") or ""
        # GitLab's user variables come after the YAML's (lib/gitlab/ci/variables/builder.rb
        # `scoped_variables`: yaml_variables, then user_variables): its copy is a later one.
        # Project and pipeline variables come later still, so the controller asks GitLab
        # (controller/orphans.py, History.confirm) before it bills anyone
        user = str(latest.get("GITLAB_USER_LOGIN") or custom.get("GITLAB_USER_LOGIN") or "")
        return cls(id=job_id, pipeline_id=pick("CI_PIPELINE_ID"), project=pick("CI_PROJECT_PATH"),
                   user=user, image=image or None,
                   url=pick("CI_JOB_URL"), timeout_s=_timeout(data, pick("CI_JOB_TIMEOUT")),
                   name=pick("CI_JOB_NAME"),
                   # as gitlab-runner reads it: the last copy wins, its $VARs expanded
                   # (spec/variables.go value(), GetAllVariables().Expand()), which is what
                   # it passes as CUSTOM_ENV_; the payload's last copy without it
                   docker_auth_config=str(auth),
                   registry_credentials=_credentials(data), services=_services(data),
                   set_by_job=frozenset(k for k in variables if isinstance(k, str)))


def _credentials(data: Mapping[str, Any]) -> tuple[RegistryCredential, ...]:
    """The payload's `credentials` (lib/api/entities/ci/job_request/credentials.rb: type,
    url, username, password), the malformed left out."""
    found = []
    for entry in data.get("credentials") or ():
        fields = ("type", "url", "username")
        if isinstance(entry, dict) and all(isinstance(entry.get(k), str) for k in fields):
            found.append(RegistryCredential(entry["type"], entry["url"], entry["username"],
                                            str(entry.get("password") or "")))
    return tuple(found)


def _services(data: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(s["name"]) for s in data.get("services") or () if isinstance(s, dict) and s.get("name"))


def _timeout(data: Mapping[str, Any], variable: str) -> int | None:
    """`runner_info.timeout` of the job response, else the CI_JOB_TIMEOUT variable;
    None where neither is a positive number of seconds."""
    info = data.get("runner_info")
    raw = info.get("timeout") if isinstance(info, dict) else None
    if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0:
        return raw
    return int(variable) if variable.isascii() and variable.isdigit() and int(variable) > 0 else None


@dataclasses.dataclass(frozen=True)
class StageContext:
    args: DriverArgs
    settings: Settings
    env: Mapping[str, str]
    job: Job
    lease: Lease | None = None  # this job's lease on one of its GPUs, once taken

    @property
    def build_failure_code(self) -> int:
        return exit_code(self.env, ENV_BUILD_FAILURE, 1)

    @property
    def system_failure_code(self) -> int:
        return exit_code(self.env, ENV_SYSTEM_FAILURE, 2)

    @property
    def lease_token(self) -> str:
        if self.lease is None:
            raise SystemFailure(f"job {self.job.id} holds no lease on GPUs "
                                f"{','.join(str(g) for g in self.args.gpus)}")
        return self.lease.token

    def gpu_source(self) -> GpuSource:
        return open_gpu_source(self.args.gpu_source, host=self.settings.host.name)

    def gpu_uuids(self) -> list[str]:
        """The UUIDs of the slot's GPUs, in slot order (one NVML read)."""
        snapshot = self.gpu_source().snapshot()
        return [snapshot.gpu(g).uuid for g in self.args.gpus]

    def gpu_env(self, uuids: list[str]) -> dict[str, str]:
        """What the job's processes see, whatever the job's own variables say."""
        return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in self.args.gpus),
                "NVIDIA_VISIBLE_DEVICES": ",".join(uuids),
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "RUNNERCTL_LEASE": self.lease_token}


class Driver(Protocol):
    name: str

    def config(self, ctx: StageContext) -> dict[str, Any]:
        """The config_exec JSON (builds_dir, cache_dir, hostname, driver, job_env)."""

    def prepare(self, ctx: StageContext) -> None:
        """Create what the job runs in; ctx.lease is held. Raise SystemFailure if it cannot."""

    def run(self, ctx: StageContext, script: Path, stage: str) -> int:
        """Run one stage script; return its exit code (SystemFailure for infrastructure)."""

    def reap(self, lease: Lease, settings: Settings) -> None:
        """End and remove what the lease's job left: only things carrying its token (S4)."""


def load_registry() -> dict[str, Callable[[], Driver]]:
    from runnerctl.executors.docker import DockerDriver
    from runnerctl.executors.pbs import PbsDriver
    from runnerctl.executors.pjm import PjmDriver
    from runnerctl.executors.sge import SgeDriver
    from runnerctl.executors.shell import ShellDriver
    from runnerctl.executors.slurm import SlurmDriver

    return {"shell": ShellDriver, "docker": DockerDriver, "slurm": SlurmDriver, "sge": SgeDriver,
            "pbs": PbsDriver, "pjm": PjmDriver}
