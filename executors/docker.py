"""The docker driver: one container per job that sees exactly the slot's GPUs.

prepare creates and starts the container from the job's image (the job's `image:`, else
`[executor] docker_image`) with a GPU device request naming the slot's GPU UUIDs (what
`docker run --gpus '"device=UUID,..."'` sends), so the NVIDIA runtime mounts only those
devices whatever the job's variables say; the slot's own builds dir
(`<builds_dir>/<slot key>`, where gitlab-runner puts the job's checkout) is bind-mounted
at the same path, and nothing else of the host: the container is often root, and with
the whole builds dir it could read other slots' checkouts or plant a symlink there that
a root step of a later job follows. The stage scripts reach it through a read-only
mount of a directory of their own (`<state_dir>/scripts/<lease nonce>`, at
`SCRIPTS_INSIDE`), which the container can neither change nor link elsewhere. Labels tie
the container to the job, its lease token and runnerctl's state dir. The user's script
stages (build_script, after_script, step_*) are exec'd inside it with the lease token
in their environment; git, cache and artifact stages run on the host, where
gitlab-runner's helpers are.

A timeout or cancel (SIGTERM from gitlab-runner) stops the stage's processes inside the
container, not the container, so after_script can still run. reap removes every
container labelled with the lease's token, also after the driver itself was killed. A
stopped engine or an image that cannot be pulled is a system failure.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.auth
import docker.errors
import psutil
from docker.types import DeviceRequest

from runnerctl.executors import registry_auth
from runnerctl.executors.contract import GRACEFUL_KILL_TIMEOUT_S, USER_SCRIPT_STAGES
from runnerctl.executors.driver import Job, StageContext, SystemFailure, remove_tree
from runnerctl.executors.lease import LEASE_ENV, Lease, LeaseTable, job_processes
from runnerctl.executors.shell import ShellDriver
from runnerctl.executors.stop import on_stop
from runnerctl.model import slot_key
from runnerctl.settings import Settings

LABEL_JOB, LABEL_LEASE, LABEL_SLOT, LABEL_STATE = (
    "runnerctl.job", "runnerctl.lease", "runnerctl.slot", "runnerctl.state")
KEEPALIVE = ["sleep", "2147483647"]
"""The container's main process: it idles while stages are exec'd into it."""
STOP_GRACE_S = max(GRACEFUL_KILL_TIMEOUT_S - 10, 1)
"""SIGTERM to SIGKILL for a stage's processes: well inside gitlab-runner's graceful_kill_timeout."""
STOP_POLL_S = 0.2
"""How often a stop looks for stage processes that appeared since its last look."""
LAUNCHER = 'if command -v bash >/dev/null 2>&1; then exec bash "$0"; else exec sh "$0"; fi'
"""gitlab-runner's stage scripts are bash scripts: bash where the image has it, else sh."""
SCRIPTS_INSIDE = "/.runnerctl-scripts"
"""Where the job's stage scripts appear in its container (read-only)."""


NOT_RUNNING = ("is not running: its image's entrypoint ended instead of running the command it is "
               "given (a CI image's entrypoint must exec its arguments)")

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
        if ctx.job.services:  # gitlab-runner's docker executor would start them; this driver cannot
            print(f"runnerctl: WARNING: this job's services ({', '.join(ctx.job.services)}) are not "
                  f"started: runnerctl's docker driver runs only the job's image", flush=True)
        _ensure_image(client, image, ctx.job, always=ctx.settings.executor.docker_pull_policy == "always")
        uuids = ctx.gpu_uuids()
        builds = str(Path(ctx.settings.builds_dir).resolve() / slot_key(ctx.args.slot))
        Path(builds).mkdir(mode=0o700, exist_ok=True)
        inside = str(Path(ctx.settings.builds_dir).absolute() / slot_key(ctx.args.slot))  # as config said
        scripts = _scripts_dir(ctx)
        scripts.mkdir(mode=0o755, parents=True, exist_ok=True)
        env = ctx.gpu_env(uuids)
        env.pop(LEASE_ENV)  # only exec'd stages carry the token: the idle container is no work
        labels = _labels(ctx.lease_token, ctx.settings) | {LABEL_JOB: ctx.job.id, LABEL_SLOT: ctx.args.slot}
        try:  # a bridge of its own: jobs on one host cannot reach each other's open ports
            network = client.networks.create(_name(ctx), driver="bridge", labels=labels)
        except docker.errors.DockerException as exc:
            raise SystemFailure(f"cannot make the job's network: {exc}") from None
        try:
            container = client.containers.run(
                image, KEEPALIVE, detach=True, name=_name(ctx),
                labels=labels, network=network.name,
                device_requests=[DeviceRequest(driver="nvidia", device_ids=uuids,
                                               capabilities=[["gpu"]])],
                environment=env | {"CUDA_VISIBLE_DEVICES": ",".join(uuids)},
                volumes={builds: {"bind": inside, "mode": "rw"},
                         str(scripts): {"bind": SCRIPTS_INSIDE, "mode": "ro"}}, working_dir=inside,
                shm_size=f"{ctx.settings.executor.docker_shm_mib}m",
            )
        except docker.errors.DockerException as exc:
            raise SystemFailure(f"cannot start the job's container from {image}: {exc}") from None
        LeaseTable(ctx.settings.state_dir).update(ctx.lease_token, container=container.id)
        try:
            container.reload()
        except docker.errors.DockerException as exc:
            raise SystemFailure(f"cannot inspect the job's container from {image}: {exc}") from None
        if container.status not in ("created", "running"):  # an ENTRYPOINT that ended at once
            raise SystemFailure(f"the container from {image} {NOT_RUNNING}")
        print(f"runnerctl: container {container.name} ({image}) on GPUs {','.join(uuids)}",
              flush=True)

    def run(self, ctx: StageContext, script: Path, stage: str) -> int:
        if stage not in USER_SCRIPT_STAGES and not stage.startswith("step_"):
            with _frozen(ctx):  # nothing in the container moves while the host works in its dir
                _refuse_planted_links(ctx, stage)
                return self._host.run(ctx, script, stage)
        if ctx.lease is None or ctx.lease.container is None:
            raise SystemFailure(f"job {ctx.job.id} has no container: prepare did not finish")
        outside = _scripts_dir(ctx) / f"{stage}.sh"
        outside.write_bytes(script.read_bytes())
        outside.chmod(0o644)  # the image's user reads it; only root on the host reaches the dir
        inside = f"{SCRIPTS_INSIDE}/{stage}.sh"
        api = _client().api
        uuids = ctx.gpu_uuids()
        env = ctx.gpu_env(uuids) | {"CUDA_VISIBLE_DEVICES": ",".join(uuids)}
        try:
            lease = ctx.lease
            with on_stop() as stop:  # a SIGTERM from here on is latched, never lost
                exec_id = api.exec_create(ctx.lease.container, ["sh", "-c", LAUNCHER, inside],
                                          environment=env)["Id"]
                stream = api.exec_start(exec_id, stream=True, demux=True)
                stopping = _StageStop(lease)
                stop.arm(stopping.start)
                for out, err in stream:
                    _write(sys.stdout, out)
                    _write(sys.stderr, err)
                stopping.finish()
            code = api.exec_inspect(exec_id)["ExitCode"]
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # "is not running": it ended, most likely its entrypoint
                raise SystemFailure(f"the job's container {NOT_RUNNING}") from None
            raise SystemFailure(f"docker exec in the job's container failed: {exc}") from None
        except docker.errors.DockerException as exc:
            raise SystemFailure(f"docker exec in the job's container failed: {exc}") from None
        finally:
            outside.unlink(missing_ok=True)
        return int(code if code is not None else 1)

    def reap(self, lease: Lease, settings: Settings) -> None:
        try:
            client = _client()
            for container in client.containers.list(all=True,
                                                    filters={"label": _label_filter(lease, settings)}):
                container.remove(force=True, v=True)  # and its anonymous volumes (an image's VOLUME)
            for network in client.networks.list(filters={"label": _label_filter(lease, settings)}):
                network.remove()
            if lease.nonce:  # a lease of an older runnerctl has none, and no scripts there
                remove_tree(_scripts_root(settings) / lease.nonce, "job's scripts")
        finally:
            self._host.reap(lease, settings)


def _labels(token: str, settings: Settings) -> dict[str, str]:
    return {LABEL_LEASE: token, LABEL_STATE: str(settings.state_dir.resolve())}


def _label_filter(lease: Lease, settings: Settings) -> list[str]:
    return [f"{k}={v}" for k, v in _labels(lease.token, settings).items()]


class _StageStop:
    """SIGTERM the stage's processes in the container, SIGKILL what is left after a grace.

    `start` runs from a signal handler, so the work goes to a thread. Only processes
    carrying the lease's token inside the lease's container are touched: the ones this
    stage started. A stop may come as the `docker exec` starts, before its process
    exists: each process that appears during the grace gets its SIGTERM too, once.
    `finish`, once the exec'd shell has ended, waits for that thread: it died with the
    driver, and a worker that ignored the SIGTERM lived on beside after_script until
    cleanup removed the container (found by a review of cancellation).
    """

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.ended = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._stop, daemon=True)
        self.thread.start()

    def finish(self) -> None:
        self.ended.set()
        if self.thread is not None:
            self.thread.join(STOP_GRACE_S + 30)

    def _stop(self) -> None:
        deadline, warned = time.monotonic() + STOP_GRACE_S, set[int]()
        while time.monotonic() < deadline:
            warned.update(_signal_stage(self.lease, "terminate", skip=warned))
            if self.ended.is_set() and not _signal_stage(self.lease, "pid", skip=set()):
                return  # the exec ended and nothing of the stage is left
            time.sleep(STOP_POLL_S)
        _signal_stage(self.lease, "kill", skip=set())


def _signal_stage(lease: Lease, signum: str, *, skip: set[int]) -> set[int]:
    """`terminate` or `kill` the stage's processes in the lease's container but `skip` (`pid`:
    only find them); their pids."""
    signalled = set[int]()
    for proc in job_processes(lease):
        try:
            if proc.pid not in skip and lease.container and \
                    lease.container in Path(f"/proc/{proc.pid}/cgroup").read_text():
                if signum != "pid":
                    getattr(proc, signum)()
                signalled.add(proc.pid)
        except (psutil.NoSuchProcess, OSError):
            continue
    return signalled


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


def _ensure_image(client: docker.DockerClient, image: str, job: Job, *, always: bool) -> None:
    """Pull `image` unless it is here (`docker_pull_policy = "if-not-present"`) or always,
    with the credentials gitlab-runner's docker executor would use (`registry_auth`)."""
    if not always:
        try:
            client.images.get(image)
            return
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.DockerException as exc:
            raise SystemFailure(f"cannot inspect image {image}: {exc}") from None
    found, notes = registry_auth.for_image(image, variable=job.docker_auth_config, home=_home_auth,
                                           payload=job.registry_credentials)
    for note in notes:  # gitlab-runner too goes on without a source it cannot read
        print(f"runnerctl: WARNING: {note}; pulling without those credentials", flush=True)
    if found is not None:
        print(f"runnerctl: pulling {image} with credentials from {found.source} ({found.path})", flush=True)
    try:
        client.images.pull(image, auth_config=found.auth_config() if found else None)
    except docker.errors.DockerException as exc:
        hint = "" if found else (f" (no credentials for {registry_auth.image_path(image)}: give the job a "
                                 f"DOCKER_AUTH_CONFIG variable, docs/executors.md)")
        raise SystemFailure(f"cannot pull image {image}: {exc}{hint}") from None


def _home_auth(host: str) -> list[tuple[str, str, str]]:
    """(server, username, password) of gitlab-runner's user's own Docker config: every
    `auths` entry, and what its credential helper says for `host`."""
    try:
        config = docker.auth.load_config()
        found = [(server, str(entry.get("username") or ""), str(entry.get("password") or ""))
                 for server, entry in config.auths.items() if entry.get("username")]
        if config.creds_store or host in (config.cred_helpers or {}):
            helped = docker.auth.resolve_authconfig(config, host)
            if helped and (helped.get("Username") or helped.get("username")):
                found.append((host, str(helped.get("Username") or helped.get("username")),
                              str(helped.get("Password") or helped.get("password") or "")))
    except (docker.errors.DockerException, OSError, ValueError) as exc:
        print(f"runnerctl: WARNING: cannot read this user's Docker config ({exc})", flush=True)
        return []
    return found


def _scripts_root(settings: Settings) -> Path:
    """The stage scripts of every docker job, one directory per lease: 0700, so no other
    user of the host lists or reads them (they export the job's CI_JOB_TOKEN)."""
    root = settings.state_dir.resolve() / "scripts"
    root.mkdir(mode=0o700, exist_ok=True)
    root.chmod(0o700)
    return root


@contextlib.contextmanager
def _frozen(ctx: StageContext) -> Iterator[None]:
    """The job's container paused (cgroup freezer) while a stage runs on the host in the
    builds dir the container writes: a process the job left behind cannot swap a path
    for a link between the check (`_refuse_planted_links`) and the stage's use of it. A
    container that is not running (gone, its entrypoint ended) has nothing to freeze."""
    container = ctx.lease.container if ctx.lease is not None else None
    paused = False
    if container is not None:
        try:
            _client().api.pause(container)
            paused = True
        except docker.errors.DockerException as exc:
            if _may_move(container):  # the freezer failed: the check below could be raced
                raise SystemFailure(f"cannot pause the job's container for the host stage, which would "
                                    f"then race the job's processes in its builds dir: {exc}") from None
    try:
        yield
    finally:
        if paused:
            try:
                _client().api.unpause(container)
            except docker.errors.DockerException as exc:
                raise SystemFailure(f"cannot resume the job's container after the host stage: "
                                    f"{exc}") from None


def _may_move(container: str) -> bool:
    """Whether anything in the container can still run after a failed pause: it exists,
    is running and is not paused already (by an admin, say). A pause that failed for any
    other reason (no freezer in the cgroup setup, an engine error) leaves its processes
    free to move, and so does a container the engine cannot describe."""
    try:
        state = _client().api.inspect_container(container)["State"]
    except docker.errors.NotFound:
        return False
    except docker.errors.DockerException:
        return True
    return bool(state.get("Running")) and not state.get("Paused")


def _refuse_planted_links(ctx: StageContext, stage: str) -> None:
    """git, cache and artifact stages run on the host (as gitlab-runner's user, root in a
    service install) in the slot's builds dir, which the job's container writes: a link
    the job put at its project dir or at `<project dir>.tmp` (where gitlab-runner writes
    file variables and its env file) would make them write wherever it points (found by
    a review as a job trying to escape). Such a link fails the stage as a system failure.

    The project dir is read from RUNNER_TEMP_PROJECT_DIR (`<project dir>.tmp`), which
    gitlab-runner (15.5 on) puts after the job's variables (common/build.go
    getBaseVariablesAfterJob), so its value is the runner's; CI_PROJECT_DIR comes before
    them, and a job's own variable of that name replaced it and turned this check off.
    A gitlab-runner without it: CI_PROJECT_DIR, unless the job set one itself."""
    slot = Path(ctx.settings.builds_dir) / slot_key(ctx.args.slot)
    temp = ctx.env.get("CUSTOM_ENV_RUNNER_TEMP_PROJECT_DIR", "")
    if temp.endswith(".tmp"):
        project = temp.removesuffix(".tmp")
    elif "CI_PROJECT_DIR" in ctx.job.set_by_job:
        raise SystemFailure(f"the job sets CI_PROJECT_DIR and this gitlab-runner does not say where the "
                            f"project dir is (RUNNER_TEMP_PROJECT_DIR, gitlab-runner 15.5): {stage} does not "
                            "run on the host")
    else:
        project = ctx.env.get("CUSTOM_ENV_CI_PROJECT_DIR", "")
    if not project:
        return
    for target in (Path(project), Path(project + ".tmp")):
        try:
            below = target.relative_to(slot)
        except ValueError:
            continue  # not in the container's dir
        path = slot
        for part in below.parts:
            path = path / part
            if path.is_symlink():
                raise SystemFailure(f"{path} is a symbolic link, made in the job's container: {stage} "
                                    "does not run on the host through it")


def _scripts_dir(ctx: StageContext) -> Path:
    if ctx.lease is None:
        raise SystemFailure(f"job {ctx.job.id} has no lease: prepare did not take one")
    return _scripts_root(ctx.settings) / ctx.lease.nonce


def _name(ctx: StageContext) -> str:
    nonce = ctx.lease.nonce if ctx.lease else "none"
    return f"runnerctl-job-{ctx.job.id}-{slot_key(ctx.args.slot)}-{nonce}"
