"""The docker driver: one container per job that sees exactly the slot's GPUs.

prepare creates and starts the container from the job's image (CI_JOB_IMAGE from the
job, else the configured default) with a GPU device request naming the slot's GPU UUIDs
(what `docker run --gpus '"device=UUID,..."'` sends), the builds dir bind-mounted at
the same path, and labels tying it to the job and lease. The user's script stages
(build_script, after_script, step_*) run inside it with `docker exec`; git, cache and
artifact stages run on the host, where gitlab-runner's helpers are. cleanup removes
every container labelled with the job's lease, also after the driver was killed.
A stopped engine or an image that cannot be pulled is a system failure.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.types import DeviceRequest

from runnerctl.executors.contract import USER_SCRIPT_STAGES
from runnerctl.executors.driver import StageContext, SystemFailure, on_stop
from runnerctl.executors.lease import LeaseTable
from runnerctl.executors.shell import ShellDriver

LABEL_JOB, LABEL_LEASE, LABEL_SLOT = "runnerctl.job", "runnerctl.lease", "runnerctl.slot"
STOP_TIMEOUT_S = 20
"""SIGTERM to SIGKILL inside the container: within gitlab-runner's graceful_kill_timeout."""
KEEPALIVE = ["sleep", "2147483647"]
"""The container's main process: it idles while stages are exec'd into it."""


class DockerDriver:
    name = "docker"

    def __init__(self) -> None:
        self._host = ShellDriver()

    def config(self, ctx: StageContext) -> dict[str, Any]:
        return {**self._host.config(ctx), "driver": {"name": "runnerctl docker", "version": "1"}}

    def prepare(self, ctx: StageContext) -> None:
        self._host.prepare(ctx)
        client = _client()
        image = ctx.job.image or ctx.settings.executor.docker_image
        _ensure_image(client, image)
        uuids = [ctx.gpu_source().snapshot().gpu(g).uuid for g in ctx.args.gpus]
        builds = str(Path(ctx.settings.builds_dir).resolve())
        try:
            container = client.containers.run(
                image, KEEPALIVE, detach=True, name=_name(ctx),
                labels={LABEL_JOB: ctx.job.id, LABEL_LEASE: ctx.lease_token, LABEL_SLOT: ctx.args.slot},
                device_requests=[DeviceRequest(driver="nvidia", device_ids=uuids,
                                               capabilities=[["gpu"]])],
                environment=ctx.gpu_env(uuids) | {"CUDA_VISIBLE_DEVICES": ",".join(uuids)},
                volumes={builds: {"bind": builds, "mode": "rw"}}, working_dir=builds,
            )
        except docker.errors.APIError as exc:
            raise SystemFailure(f"cannot start the job's container from {image}: "
                                f"{exc.explanation}") from None
        LeaseTable(ctx.settings.state_dir).update(ctx.job.id, container=container.id)

    def run(self, ctx: StageContext, script: Path, stage: str) -> int:
        if stage not in USER_SCRIPT_STAGES and not stage.startswith("step_"):
            return self._host.run(ctx, script, stage)
        container = self._container(ctx)
        inside = Path(ctx.settings.builds_dir).resolve() / ".runnerctl" / f"{ctx.job.id}-{stage}.sh"
        inside.parent.mkdir(parents=True, exist_ok=True)
        inside.write_bytes(script.read_bytes())
        # `docker exec` through the CLI streams output as it comes; gitlab-runner's stage
        # scripts are bash scripts, so bash where the image has it
        launcher = 'if command -v bash >/dev/null; then exec bash "$0"; else exec sh "$0"; fi'
        proc = subprocess.Popen(["docker", "exec", container, "sh", "-c", launcher, str(inside)],
                                stdout=sys.stdout, stderr=sys.stderr)

        def stop() -> None:
            threading.Thread(target=subprocess.run, daemon=True, kwargs={
                "args": ["docker", "stop", "-t", str(STOP_TIMEOUT_S), container],
                "check": False, "capture_output": True}).start()

        try:
            with on_stop(stop):
                return proc.wait()
        finally:
            inside.unlink(missing_ok=True)

    def cleanup(self, ctx: StageContext) -> None:
        try:
            client = _client()
            for container in client.containers.list(all=True,
                                                    filters={"label": f"{LABEL_LEASE}={ctx.lease_token}"}):
                container.remove(force=True)
        finally:
            self._host.cleanup(ctx)

    def _container(self, ctx: StageContext) -> str:
        for lease in LeaseTable(ctx.settings.state_dir).held_by(ctx.job.id):
            if lease.container:
                return lease.container
        raise SystemFailure(f"job {ctx.job.id} has no container: prepare did not finish")


def _client() -> docker.DockerClient:
    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except docker.errors.DockerException as exc:
        raise SystemFailure(f"the Docker engine is not reachable ({exc}); start dockerd") from None
    return client


def _ensure_image(client: docker.DockerClient, image: str) -> None:
    try:
        client.images.get(image)
        return
    except docker.errors.ImageNotFound:
        pass
    try:
        client.images.pull(image)
    except docker.errors.DockerException as exc:
        raise SystemFailure(f"cannot pull image {image}: {exc}") from None


def _name(ctx: StageContext) -> str:
    return f"runnerctl-job-{ctx.job.id}-{ctx.args.slot.rsplit('/', 1)[-1]}"
