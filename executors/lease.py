"""Host-side GPU leases: the ground truth of which job holds which GPU (invariant S2).

GitLab may race (two runners over one GPU picking jobs at once, a controller that is
down); the lease cannot. `prepare` takes one lease file per GPU of its set, all or
nothing, under a host-wide lock; `cleanup` releases them. A lease names its job and the
process that owns the job (gitlab-runner, the parent of every stage): when that process
is gone and no process of the job's process group is left, the lease is stale and the
next prepare (or the controller) reclaims it; never while anything of the job runs.

Files: <state_dir>/leases/gpu<N>.json (one JSON record each) and .lock (flock mutex).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

LEASE_ENV = "RUNNERCTL_LEASE"
"""Set in every process a job runs: `<job id>@<slot>`; tells CI processes from foreign ones."""


@dataclasses.dataclass(frozen=True)
class Lease:
    gpu: int
    job_id: str
    slot: str
    driver: str
    owner_pid: int  # gitlab-runner: the parent of the driver's stages
    owner_started: float  # its create time, so a reused pid is not mistaken for it
    created_at: float
    pipeline_id: str = ""
    project: str = ""
    user: str = ""
    pgid: int | None = None  # the job's process group (shell driver)
    container: str | None = None  # docker driver
    slurm_job: str | None = None  # slurm driver

    @property
    def token(self) -> str:
        return f"{self.job_id}@{self.slot}"


class LeaseBusy(Exception):
    def __init__(self, holders: list[Lease]) -> None:
        super().__init__(", ".join(f"GPU {h.gpu} held by job {h.job_id} ({h.user or '?'})"
                                   for h in holders))
        self.holders = holders


def process_started(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None


def group_alive(pgid: int | None) -> bool:
    if pgid is None:
        return False
    try:
        os.killpg(pgid, 0)  # signal 0: an existence check, nothing is sent
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_stale(lease: Lease) -> bool:
    owner_alive = process_started(lease.owner_pid) == lease.owner_started
    return not owner_alive and not group_alive(lease.pgid)


class LeaseTable:
    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir) / "leases"

    @contextlib.contextmanager
    def _mutex(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        with (self.dir / ".lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _path(self, gpu: int) -> Path:
        return self.dir / f"gpu{gpu}.json"

    def _read(self, gpu: int) -> Lease | None:
        try:
            data = json.loads(self._path(gpu).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return None  # a torn or foreign file holds nothing; it is rewritten on acquire
        return Lease(**data)

    def _write(self, lease: Lease) -> None:
        tmp = self._path(lease.gpu).with_suffix(".tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(lease)))
        os.replace(tmp, self._path(lease.gpu))

    def all(self) -> list[Lease]:
        if not self.dir.exists():
            return []
        found = (self._read(int(p.stem[3:])) for p in self.dir.glob("gpu*.json"))
        return sorted((lease for lease in found if lease is not None), key=lambda x: x.gpu)

    def try_acquire(self, gpus: tuple[int, ...], template: Lease) -> list[Lease]:
        """Take every GPU or none; returns the live leases in the way (empty on success)."""
        with self._mutex():
            holders = []
            for gpu in gpus:
                held = self._read(gpu)
                if held is not None and held.job_id != template.job_id and not is_stale(held):
                    holders.append(held)
            if holders:
                return holders
            for gpu in gpus:
                self._write(dataclasses.replace(template, gpu=gpu))
            return []

    def acquire(self, gpus: tuple[int, ...], template: Lease, *, wait_s: float,
                poll_s: float = 1.0, sleep: Callable[[float], None] = time.sleep,
                clock: Callable[[], float] = time.monotonic) -> None:
        deadline = clock() + wait_s
        while True:
            holders = self.try_acquire(gpus, template)
            if not holders:
                return
            if clock() >= deadline:
                raise LeaseBusy(holders)
            sleep(poll_s)

    def held_by(self, job_id: str) -> list[Lease]:
        return [lease for lease in self.all() if lease.job_id == job_id]

    def update(self, job_id: str, **fields: Any) -> None:
        with self._mutex():
            for lease in self.held_by(job_id):
                self._write(dataclasses.replace(lease, **fields))

    def release(self, job_id: str) -> list[int]:
        """Remove this job's leases (only its own); returns the GPUs freed."""
        with self._mutex():
            freed = []
            for lease in self.held_by(job_id):
                self._path(lease.gpu).unlink(missing_ok=True)
                freed.append(lease.gpu)
            return freed

    def reclaim_stale(self) -> list[Lease]:
        with self._mutex():
            stale = [lease for lease in self.all() if is_stale(lease)]
            for lease in stale:
                self._path(lease.gpu).unlink(missing_ok=True)
            return stale
