"""Host-side GPU leases: the ground truth of which job holds which GPU (invariant S2).

GitLab may race (two runners over one GPU picking jobs at once, a controller that is
down); the lease cannot. `prepare` takes one lease file per GPU of its set, all or
nothing, under a host-wide lock; `cleanup` releases them. A lease names its job and the
process that owns the job (gitlab-runner, the parent of every stage). It is stale only
when that owner is gone *and* nothing of the job still runs (its process group, a
process carrying its token, its Slurm job); then the next prepare or the controller
reclaims it, never while the job's processes run.

Each lease carries a random token, `<job id>@<slot>:<nonce>`, that every process of the
job gets as RUNNERCTL_LEASE: a user cannot guess it, so a process outside CI cannot pass
for one (gate) and cleanup cannot be led to signal it (S4).

A lease counts for a process only when it runs as the job's user (`uid`: the user the
driver runs the job as), or in the job's container or Slurm cgroup: another user who
copies the token from a job's environment gains nothing. The lease dir is 0700 and its
files 0600 (runnerctl.private), written whole (temp + fsync + rename).

Leases fail closed: a file that cannot be read as a lease (truncated, empty, binary, not
an object, a missing or mistyped field) holds its GPU, is never stale and is reported
(`problem`, in prepare's failure and the controller's log) until an admin removes it.
Fields a newer version adds are ignored.

Files: <state_dir>/leases/gpu<N>.json (one JSON record each) and .lock (flock mutex).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import logging
import os
import secrets
import subprocess
import time
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from runnerctl.private import private_dir, state_dir, write_private

log = logging.getLogger(__name__)

LEASE_ENV = "RUNNERCTL_LEASE"
"""Set in every process a job runs to the lease's token; tells CI processes from foreign ones."""


@dataclasses.dataclass(frozen=True)
class Lease:
    gpu: int
    job_id: str
    slot: str
    driver: str
    owner_pid: int  # gitlab-runner: the parent of the driver's stages
    owner_started: float  # its create time (wall clock), read only in leases without owner_since_boot
    created_at: float
    pipeline_id: str = ""
    project: str = ""
    user: str = ""
    url: str = ""  # the job's page in GitLab (CI_JOB_URL)
    nonce: str = ""  # random per prepare: makes the token unguessable
    pgid: int | None = None  # the process group of the job's latest host stage
    container: str | None = None  # docker driver
    slurm_job: str | None = None  # slurm driver
    uid: int = dataclasses.field(default_factory=os.getuid)  # the user the job's processes run as
    problem: str = ""  # set on a file that could not be read: it holds the GPU (fail closed)
    batch_job: str | None = None  # batch drivers: "<driver>:<scheduler's job id>"
    batch_gpus: str | None = None  # the GPU set the batch system gave the job (its CUDA_VISIBLE_DEVICES)
    timeout_s: float | None = None  # the job's GitLab timeout: it ends by created_at + this
    job_name: str = ""  # CI_JOB_NAME (the job history's run-time estimates read it)
    owner_since_boot: str = ""  # "<boot id>:<start in clock ticks>": a reused pid is not the owner

    @property
    def token(self) -> str:
        return f"{self.job_id}@{self.slot}:{self.nonce}"

    @classmethod
    def parse(cls, gpu: int, text: str) -> Lease:
        """The lease in `text`; an unreadable one comes back with `problem` set, holding `gpu`."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            return cls.unreadable(gpu, f"not JSON ({exc})")
        if not isinstance(data, dict):
            return cls.unreadable(gpu, f"a JSON {type(data).__name__}, not an object")
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "problem"}
        missing = [name for name, f in fields.items() if name not in data
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if missing:
            return cls.unreadable(gpu, f"no {', '.join(missing)}")
        known = {k: v for k, v in data.items() if k in fields}  # newer versions' keys are ignored
        for name, value in known.items():
            if not _fits(value, hints[name]):
                return cls.unreadable(gpu, f"{name} is {value!r}")
        if known["gpu"] != gpu:
            return cls.unreadable(gpu, f"it names GPU {known['gpu']}")
        return cls(**known)

    @classmethod
    def unreadable(cls, gpu: int, problem: str) -> Lease:
        return cls(gpu=gpu, job_id="", slot="", driver="", owner_pid=0, owner_started=0.0,
                   created_at=0.0, uid=-1, problem=problem)

    def describe(self) -> str:
        if self.problem.startswith(READ_FAILED_NOW):
            return f"GPU {self.gpu}'s lease {self.problem}: it stays held, and is read again at the next look"
        if self.problem:
            return (f"GPU {self.gpu} has an unreadable lease ({self.problem}): it stays held until an "
                    "admin removes the file")
        return f"GPU {self.gpu} held by job {self.job_id} ({self.user or '?'})"


def _fits(value: object, kind: object) -> bool:
    allowed = typing.get_args(kind) or (kind,)
    if isinstance(value, bool):
        return False  # JSON true is no pid, gpu or time
    if value is None:
        return type(None) in allowed
    if isinstance(value, int) and float in allowed:
        return True
    return any(isinstance(value, t) for t in allowed if isinstance(t, type) and t is not type(None))


def new_nonce() -> str:
    return secrets.token_hex(8)


class LeaseBusy(Exception):
    def __init__(self, holders: list[Lease]) -> None:
        super().__init__(", ".join(h.describe() for h in holders))
        self.holders = holders


def process_started(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None


_BOOT: list[str] = []  # this boot's id, once read: it changes only with a reboot


def this_boot() -> str:
    """The kernel's id of this boot ("" when it cannot be read, say out of descriptors)."""
    if not _BOOT:
        try:
            _BOOT.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
        except OSError:
            return ""
    return _BOOT[0]


def earlier_boot(lease: Lease, now: str | None = None) -> bool:
    """Written before the machine last booted (`now`: this boot's id, read when not given):
    none of its processes can still run here. False when this boot's id cannot be read: a
    live job's process group must not look gone because a read failed."""
    boot, now = lease.owner_since_boot.partition(":")[0], this_boot() if now is None else now
    return bool(boot) and bool(now) and boot != now


def process_since_boot(pid: int) -> str | None:
    """"<boot id>:<start in clock ticks since boot>" of a running process (proc(5),
    /proc/<pid>/stat field 22), None when there is none. Unlike psutil's create_time, which
    adds the start to the boot's wall-clock time, it does not move when the clock is stepped
    (NTP, `date -s`): compared by create_time, every live owner looked dead after a step
    and its job's GPUs could be leased again."""
    boot = this_boot()
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    if not boot:
        return None
    fields = stat.rpartition(")")[2].split()  # the name, in parentheses, may hold anything
    return f"{boot}:{fields[19]}" if len(fields) > 19 else None


def owner_alive(lease: Lease) -> bool:
    if lease.owner_since_boot:
        return process_since_boot(lease.owner_pid) == lease.owner_since_boot
    return process_started(lease.owner_pid) == lease.owner_started  # written by an older runnerctl


def group_alive(pgid: int | None, uid: int) -> bool:
    """Does a process of user `uid` still run in process group `pgid`? Another user's
    process that was given the number once the job's group was gone does not count
    (a user who forked until they had it kept a finished job's lease, and its GPUs, held)."""
    if pgid is None:
        return False
    try:
        os.killpg(pgid, 0)  # signal 0: an existence check, nothing is sent
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's group: whose is read below
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.uids().real == uid:
                return True
        except (ProcessLookupError, psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return False


def environ_token(pid: int) -> str | None:
    """The RUNNERCTL_LEASE a process runs with; None when it has none or cannot be read."""
    try:
        return psutil.Process(pid).environ().get(LEASE_ENV)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def token_processes(token: str, *, uid: int | None = None) -> list[psutil.Process]:
    """Processes carrying `token` and running as `uid` (default: this process's user, S4)."""
    found = []
    wanted = os.getuid() if uid is None else uid
    for proc in psutil.process_iter():
        if environ_token(proc.pid) != token:
            continue
        try:
            if proc.uids().real == wanted:
                found.append(proc)
        except psutil.NoSuchProcess:
            continue
    return found


def in_cgroup_of(pid: int, lease: Lease) -> bool:
    """Is the process in the lease's container or Slurm job (its cgroup path says so)?

    A cgroup's path is matched name by name, never as text, and not under user.slice:
    systemd gives each user a subtree there to make cgroups of any name in (`systemd-run
    --user --scope --unit=docker-<id>`), and a user's process in `.../docker-<id>.scope`
    counted as the container's, free to use its GPUs (found by a review as a local user).
    Docker names a container's cgroup `docker-<id>.scope` (systemd driver) or `docker/<id>`
    (cgroupfs); Slurm a job's `job_<id>` (task/cgroup)."""
    if not lease.container and not lease.slurm_job:
        return False
    try:
        cgroup = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False
    return cgroup_is_of(cgroup, lease)


def cgroup_is_of(cgroup: str, lease: Lease) -> bool:
    """`in_cgroup_of` for the text of a /proc/<pid>/cgroup."""
    for line in cgroup.splitlines():
        names = line.split(":", 2)[-1].split("/")
        if "user.slice" in names:
            continue
        pairs = zip(names, names[1:], strict=False)
        if lease.container and (f"docker-{lease.container}.scope" in names
                                or any(a == "docker" and b == lease.container for a, b in pairs)):
            return True
        if lease.slurm_job and f"job_{lease.slurm_job}" in names:
            return True
    return False


def job_processes(lease: Lease) -> list[psutil.Process]:
    """Processes carrying the lease's token as the job's user or inside its container/Slurm job;
    a copy of the token in another user's process is not the job."""
    found = []
    for proc in psutil.process_iter():
        if environ_token(proc.pid) != lease.token:
            continue
        try:
            if proc.uids().real == lease.uid or in_cgroup_of(proc.pid, lease):
                found.append(proc)
        except psutil.NoSuchProcess:
            continue
    return found


_SLURM_DONE = ("", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
               "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


def slurm_active(job: str | None) -> bool:
    """True while Slurm still lists the job as pending or running (unknown counts as active)."""
    if job is None:
        return False
    try:
        result = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True,
                                text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return True  # cannot ask Slurm: keep the lease rather than guess
    if result.returncode != 0 and "Invalid job id" not in result.stderr:
        return True
    return result.stdout.strip() not in _SLURM_DONE


def job_running(lease: Lease) -> bool:
    """A process group of an earlier boot is gone, whatever now has its number (a host that
    lost power: its shell job's pgid, reused, held the GPUs until the orphan audit); a
    batch job may outlive the submit host's reboot, so the scheduler is asked."""
    return ((group_alive(lease.pgid, lease.uid) and not earlier_boot(lease)) or bool(job_processes(lease))
            or slurm_active(lease.slurm_job) or batch_active(lease.batch_job))


def batch_active(job: str | None) -> bool:
    """True while a batch driver's job is pending or running (executors/batch.py)."""
    if not job or job.startswith("slurm:"):
        return False
    from runnerctl.executors.driver import SystemFailure, load_registry  # drivers import this module

    name, _, job_id = job.partition(":")
    driver = load_registry().get(name)
    scheduler = getattr(driver() if driver else None, "scheduler", None)
    if scheduler is None:
        return True  # a driver this host lacks: keep the lease rather than guess
    try:
        return bool(scheduler.active(job_id))
    except SystemFailure as exc:  # the scheduler cannot be asked: keep the lease
        logging.getLogger(__name__).warning("cannot ask %s about batch job %s: %s", name, job_id, exc)
        return True


def is_stale(lease: Lease) -> bool:
    if lease.problem:
        return False  # unreadable: nobody can tell it is over, so it holds the GPU
    return not owner_alive(lease) and not job_running(lease)


class LeaseTable:
    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir) / "leases"

    @contextlib.contextmanager
    def _mutex(self) -> Iterator[None]:
        state_dir(self.dir.parent)
        private_dir(self.dir)
        fd = os.open(self.dir / ".lock", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _path(self, gpu: int) -> Path:
        return self.dir / f"gpu{gpu}.json"

    def write_problem(self) -> str:
        """Why prepare cannot write a lease here now (a full or read-only file system, no
        inodes left), "" when it can or no job has made the directory yet. serve asks it:
        with the store elsewhere (PostgreSQL), nothing else it does writes here, and
        /healthz said ok while every prepare failed (found by a review of a host out of
        disk space)."""
        probe = self.dir / f".probe-{os.getpid()}"
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                data = memoryview(b"\n" * 4096)  # as much as a lease takes: a block, an inode
                while data:  # a write may take part of it, then fail on the rest
                    data = data[os.write(fd, data):]
                os.fsync(fd)
            finally:
                os.close(fd)
        except FileNotFoundError:
            return "" if not self.dir.exists() else f"cannot write a lease in {self.dir}"
        except OSError as exc:
            return (f"prepare cannot write a lease in {self.dir} ({exc.strerror or exc}): every job's "
                    "prepare fails until it can")
        finally:
            with contextlib.suppress(OSError):
                probe.unlink()
        return ""

    def _read(self, gpu: int) -> Lease | None:
        """The GPU's lease, None when it has none; an unreadable file holds it (fail closed)."""
        path = self._path(gpu)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            said = READ_FAILED_NOW if exc.errno in _PASSING else "cannot read it"
            lease = Lease.unreadable(gpu, f"{said}: {exc.strerror}")
        else:
            try:
                lease = Lease.parse(gpu, raw.decode())
            except UnicodeDecodeError:
                lease = Lease.unreadable(gpu, "not UTF-8 text")
        if lease.problem:
            _report(path, lease.problem)
        return lease

    def _write(self, lease: Lease) -> None:
        record = {k: v for k, v in dataclasses.asdict(lease).items() if k != "problem"}
        write_private(self._path(lease.gpu), json.dumps(record))

    def all(self) -> list[Lease]:
        if not self.dir.exists():
            return []
        found = (self._read(int(p.stem[3:])) for p in self.dir.glob("gpu*.json")
                 if p.stem[3:].isdigit())
        return sorted((lease for lease in found if lease is not None), key=lambda x: x.gpu)

    def try_acquire(self, gpus: tuple[int, ...], template: Lease) -> list[Lease]:
        """Take every GPU or none; returns the live leases in the way (empty on success)."""
        return self._take(gpus, template)[0]

    def _take(self, gpus: tuple[int, ...], template: Lease) -> tuple[list[Lease], list[Lease]]:
        """Take every GPU or none: (live leases in the way, leases replaced).

        Replaced leases are stale ones and this job's own from an earlier prepare attempt;
        the caller reaps what they left (a container, say) once it holds the GPUs.
        """
        with self._mutex():
            holders, replaced = [], []
            for gpu in gpus:
                held = self._read(gpu)
                if held is None:
                    continue
                if held.job_id == template.job_id or is_stale(held):
                    replaced.append(held)
                else:
                    holders.append(held)
            if holders:
                return holders, []
            before = {lease.gpu: lease for lease in replaced}
            written: list[int] = []
            try:
                for gpu in gpus:
                    self._write(dataclasses.replace(template, gpu=gpu))
                    written.append(gpu)
            except OSError:  # a full disk part way: all or none, so none
                self._undo(written, before)
                raise
            return [], replaced

    def _undo(self, gpus: list[int], before: dict[int, Lease]) -> None:
        """Put back what `_take` replaced on `gpus` (else remove its lease there): a
        multi-GPU prepare that failed on its third lease held the first two until its
        cleanup came (found by a review of a host out of disk space)."""
        for gpu in gpus:
            try:
                if gpu in before:
                    self._write(before[gpu])
                    continue
            except OSError:
                pass  # no room for the old one either: the GPU goes free, its stale job with it
            self._path(gpu).unlink(missing_ok=True)

    def acquire(self, gpus: tuple[int, ...], template: Lease, *, wait_s: float,
                poll_s: float = 1.0, sleep: Callable[[float], None] = time.sleep,
                clock: Callable[[], float] = time.monotonic) -> list[Lease]:
        """Wait up to wait_s for the GPUs; returns the leases replaced (see try_acquire)."""
        deadline = clock() + wait_s
        while True:
            holders, replaced = self._take(gpus, template)
            if not holders:
                return replaced
            if clock() >= deadline:
                raise LeaseBusy(holders)
            sleep(poll_s)

    def held_by(self, job_id: str) -> list[Lease]:
        return [lease for lease in self.all() if lease.job_id == job_id]

    def update(self, token: str, **fields: Any) -> None:
        """Record a handle (pgid, container, Slurm job) on every lease with this token."""
        with self._mutex():
            for lease in self.all():
                if lease.token == token:
                    self._write(dataclasses.replace(lease, **fields))

    def release(self, job_id: str) -> list[Lease]:
        """Remove this job's leases (only its own); returns them."""
        with self._mutex():
            freed = self.held_by(job_id)
            for lease in freed:
                self._path(lease.gpu).unlink(missing_ok=True)
            return freed



_REPORTED: set[tuple[str, str]] = set()


def _report(path: Path, problem: str) -> None:
    """Log an unreadable lease once per file and problem (it is read on every tick)."""
    if (str(path), problem) not in _REPORTED:
        _REPORTED.add((str(path), problem))
        if problem.startswith(READ_FAILED_NOW):  # the host's trouble, not the file's: never remove it
            log.error("lease %s %s: its GPU stays held while it cannot be read (the file may be "
                      "fine: keep it)", path, problem)
        else:
            log.error("lease %s is unreadable (%s): its GPU stays held; remove the file once the GPU "
                      "is free", path, problem)


READ_FAILED_NOW = "cannot be read now"
_PASSING = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EIO, errno.EAGAIN, errno.EINTR, errno.ESTALE}
"""Read errors of the host, not of the file (no descriptors or memory left, an I/O error,
a stale NFS handle): told to remove the file, an admin would free a running job's GPUs
(found by a review of a host out of resources)."""


def read_leases(state_dir: Path) -> list[Lease]:
    """Every lease on this host, one per GPU (the controller's and the web page's view)."""
    return LeaseTable(state_dir).all()
