"""The docker driver: one container per job that sees exactly the slot's GPUs.

prepare creates and starts the container from the job's image (the job's `image:`, else
`[executor] docker_image`) with a GPU device request naming the slot's GPU UUIDs (what
`docker run --gpus '"device=UUID,..."'` sends), so the NVIDIA runtime mounts only those
devices whatever the job's variables say; the builds dir is bind-mounted at the same
path; labels tie the container to the job, its lease token and runnerctl's state dir.
The user's script stages (build_script, after_script, step_*) are exec'd inside it with
the lease token in their environment; git, cache and artifact stages run on the host,
where gitlab-runner's helpers are.

A timeout or cancel (SIGTERM from gitlab-runner) stops the stage's processes inside the
container, not the container, so after_script can still run. reap removes every
container labelled with the lease's token, also after the driver itself was killed. A
stopped engine or an image that cannot be pulled is a system failure.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import docker
import docker.errors
import psutil
from docker.types import DeviceRequest

from runnerctl.executors.contract import GRACEFUL_KILL_TIMEOUT_S, USER_SCRIPT_STAGES
from runnerctl.executors.driver import StageContext, SystemFailure, on_stop
from runnerctl.executors.lease import LEASE_ENV, Lease, LeaseTable, job_processes
from runnerctl.executors.shell import ShellDriver
from runnerctl.settings import Settings

LABEL_JOB, LABEL_LEASE, LABEL_SLOT, LABEL_STATE = (
    "runnerctl.job", "runnerctl.lease", "runnerctl.slot", "runnerctl.state")
KEEPALIVE = ["sleep", "2147483647"]
"""The container's main process: it idles while stages are exec'd into it."""
STOP_GRACE_S = max(GRACEFUL_KILL_TIMEOUT_S - 10, 1)
"""SIGTERM to SIGKILL for a stage's processes: well inside gitlab-runner's graceful_kill_timeout."""
LAUNCHER = 'if command -v bash >/dev/null 2>&1; then exec bash "$0"; else exec sh "$0"; fi'
"""gitlab-runner's stage scripts are bash scripts: bash where the image has it, else sh."""


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
        env = ctx.gpu_env(uuids)
        env.pop(LEASE_ENV)  # only exec'd stages carry the token: the idle container is no work
        try:
            container = client.containers.run(
                image, KEEPALIVE, detach=True, name=_name(ctx),
                labels=_labels(ctx.lease_token, ctx.settings) | {
                    LABEL_JOB: ctx.job.id, LABEL_SLOT: ctx.args.slot},
                device_requests=[DeviceRequest(driver="nvidia", device_ids=uuids,
                                               capabilities=[["gpu"]])],
                environment=env | {"CUDA_VISIBLE_DEVICES": ",".join(uuids)},
                volumes={builds: {"bind": builds, "mode": "rw"}}, working_dir=builds,
            )
        except docker.errors.DockerException as exc:
            raise SystemFailure(f"cannot start the job's container from {image}: {exc}") from None
        LeaseTable(ctx.settings.state_dir).update(ctx.lease_token, container=container.id)
        print(f"runnerctl: container {container.name} ({image}) on GPUs {','.join(uuids)}",
              flush=True)

    def run(self, ctx: StageContext, script: Path, stage: str) -> int:
        if stage not in USER_SCRIPT_STAGES and not stage.startswith("step_"):
            return self._host.run(ctx, script, stage)
        if ctx.lease is None or ctx.lease.container is None:
            raise SystemFailure(f"job {ctx.job.id} has no container: prepare did not finish")
        inside = Path(ctx.settings.builds_dir).resolve() / ".runnerctl" / f"{ctx.lease.nonce}-{stage}.sh"
        inside.parent.mkdir(parents=True, exist_ok=True)
        inside.write_bytes(script.read_bytes())
        api = _client().api
        uuids = [ctx.gpu_source().snapshot().gpu(g).uuid for g in ctx.args.gpus]
        env = ctx.gpu_env(uuids) | {"CUDA_VISIBLE_DEVICES": ",".join(uuids)}
        try:
            exec_id = api.exec_create(ctx.lease.container, ["sh", "-c", LAUNCHER, str(inside)],
                                      environment=env)["Id"]
            stream = api.exec_start(exec_id, stream=True, demux=True)
            lease = ctx.lease
            with on_stop(lambda: _stop_stage(lease)):
                for out, err in stream:
                    _write(sys.stdout, out)
                    _write(sys.stderr, err)
            code = api.exec_inspect(exec_id)["ExitCode"]
        except docker.errors.DockerException as exc:
            raise SystemFailure(f"docker exec in the job's container failed: {exc}") from None
        finally:
            inside.unlink(missing_ok=True)
        return int(code if code is not None else 1)

    def reap(self, lease: Lease, settings: Settings) -> None:
        try:
            client = _client()
            for container in client.containers.list(all=True,
                                                    filters={"label": _label_filter(lease, settings)}):
                container.remove(force=True)
        finally:
            self._host.reap(lease, settings)


def _labels(token: str, settings: Settings) -> dict[str, str]:
    return {LABEL_LEASE: token, LABEL_STATE: str(settings.state_dir.resolve())}


def _label_filter(lease: Lease, settings: Settings) -> list[str]:
    return [f"{k}={v}" for k, v in _labels(lease.token, settings).items()]


def _stop_stage(lease: Lease) -> None:
    """SIGTERM the stage's processes in the container, SIGKILL what is left after a grace.

    Runs from a signal handler, so the work goes to a thread. Only processes carrying the
    lease's token inside the lease's container are touched: the ones this stage started.
    """
    def stop() -> None:
        for signum in ("terminate", "kill"):
            for proc in job_processes(lease):
                try:
                    if lease.container and lease.container in Path(f"/proc/{proc.pid}/cgroup").read_text():
                        getattr(proc, signum)()
                except (psutil.NoSuchProcess, OSError):
                    continue
            if signum == "terminate":
                time.sleep(STOP_GRACE_S)

    threading.Thread(target=stop, daemon=True).start()


def _write(stream: Any, data: bytes | None) -> None:
    if data:
        stream.buffer.write(data)
        stream.flush()


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
    except docker.errors.DockerException as exc:
        raise SystemFailure(f"cannot inspect image {image}: {exc}") from None
    try:
        client.images.pull(image)
    except docker.errors.DockerException as exc:
        raise SystemFailure(f"cannot pull image {image}: {exc}") from None


def _name(ctx: StageContext) -> str:
    nonce = ctx.lease.nonce if ctx.lease else "none"
    return f"runnerctl-job-{ctx.job.id}-{ctx.args.slot.rsplit('/', 1)[-1]}-{nonce}"
