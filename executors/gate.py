"""Which processes on a GPU are CI and which are foreign; the gate in prepare (S3).

A process on GPU g is CI when it belongs to the live lease of g: it lives in the lease's
container cgroup or Slurm job cgroup, or its environment carries that lease's
RUNNERCTL_LEASE token (/proc/<pid>/environ; NVML gives host PIDs, also for processes
inside containers) *and* it runs as the job's user (the lease's `uid`; /proc/<pid> owner),
or it is in (or descends from) the lease's process group and started after the lease.
Anything else is foreign: a colleague's `python train.py`, also one started with a token
copied from a job's environment, a process we cannot read, a process another job left
behind or started on a GPU it does not hold, any process on a GPU whose lease file is
unreadable.

The controller calls `classify` with `read_leases` to keep runners closed on GPUs in
foreign use; prepare calls `wait_until_free`. Both only read; nothing here signals (S4).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Mapping

import psutil

from runnerctl.executors.lease import Lease, earlier_boot, environ_token, in_cgroup_of
from runnerctl.gpus import GpuSource
from runnerctl.model import GpuProcess, GpuSnapshot

CLOCK_SLACK_S = 2.0
"""psutil dates processes from the whole-second boot time: compare creation times loosely."""


@dataclasses.dataclass(frozen=True)
class GpuUse:
    """One GPU's processes, split by whom they belong to."""

    gpu: int
    lease: Lease | None
    ci: tuple[GpuProcess, ...] = ()
    foreign: tuple[GpuProcess, ...] = ()


@dataclasses.dataclass(frozen=True)
class Foreign:
    gpu: int
    process: GpuProcess

    def describe(self) -> str:
        memory = self.process.used_memory_bytes
        size = "" if memory is None else f", {memory / 1024**3:.1f} GiB"
        return (f"GPU {self.gpu} is used by pid {self.process.pid} of user "
                f"{self.process.user or 'unknown'}{size}")


def belongs_to(pid: int, lease: Lease) -> bool:
    """Is this process part of the lease's job? Reads /proc only."""
    if lease.problem:
        return False
    if in_cgroup_of(pid, lease):
        return True
    try:
        proc = psutil.Process(pid)
        if environ_token(pid) == lease.token and proc.uids().real == lease.uid:
            return True
        if lease.pgid is None or earlier_boot(lease):  # a group of an earlier boot is gone
            return False
        if proc.create_time() < lease.created_at - CLOCK_SLACK_S:
            return False  # older than the lease: a reused group id, not the job's
        if proc.uids().real != lease.uid:
            return False  # another user's process given the group's number once it was free
        chain = [proc, *proc.parents()]
        return any(p.pid == lease.pgid or _pgid(p) == lease.pgid for p in chain)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def _pgid(proc: psutil.Process) -> int | None:
    try:
        return os.getpgid(proc.pid)
    except ProcessLookupError:
        return None


def classify(snapshot: GpuSnapshot, leases: Iterable[Lease]) -> Mapping[int, GpuUse]:
    """Every GPU of the snapshot: its lease (if any), its CI and its foreign processes."""
    by_gpu = {lease.gpu: lease for lease in leases}
    result = {}
    for gpu in snapshot.gpus:
        lease = by_gpu.get(gpu.index)
        ci: list[GpuProcess] = []
        foreign: list[GpuProcess] = []
        for proc in gpu.processes:
            (ci if lease is not None and belongs_to(proc.pid, lease) else foreign).append(proc)
        result[gpu.index] = GpuUse(gpu.index, lease, tuple(ci), tuple(foreign))
    return result


@dataclasses.dataclass(frozen=True)
class Unusable:
    """A GPU of the slot no job may start on, whatever it waits for (found by a review as
    an NVML expert: the gate saw no process on a lost GPU, or one whose processes NVML
    cannot list, and let the job start; a missing index was a KeyError)."""

    gpu: int
    why: str

    def describe(self) -> str:
        return f"GPU {self.gpu} {self.why}"


def unusable(snapshot: GpuSnapshot, gpus: Iterable[int]) -> list[Unusable]:
    """The slot's GPUs that cannot be told free or cannot run a job: not on the host, lost,
    in MIG mode (runnerctl gives such a GPU no slot), processes NVML cannot list."""
    present = {gpu.index: gpu for gpu in snapshot.gpus}
    found = []
    for index in gpus:
        gpu = present.get(index)
        if gpu is None:
            listed = ", ".join(map(str, sorted(present)))
            found.append(Unusable(index, f"is not on this host (NVML lists GPUs {listed})"))
        elif gpu.lost:
            found.append(Unusable(index, "fell off the bus (NVML: GPU is lost)"))
        elif gpu.mig_enabled:
            found.append(Unusable(index, "is in MIG mode (it has no slot; turn MIG off or re-run "
                                         "`runnerctl init`)"))
        elif not gpu.processes_known:
            found.append(Unusable(index, "has processes NVML cannot list, so it cannot be told free"))
    return found


def foreign_processes(snapshot: GpuSnapshot, gpus: Iterable[int],
                      leases: Iterable[Lease]) -> list[Foreign]:
    uses = classify(snapshot, leases)
    return [Foreign(gpu, proc) for gpu in gpus for proc in uses[gpu].foreign]


def wait_until_free(source: GpuSource, gpus: tuple[int, ...], leases: Callable[[], list[Lease]],
                    *, wait_s: float, poll_s: float = 2.0,
                    sleep: Callable[[float], None] = time.sleep,
                    clock: Callable[[], float] = time.monotonic) -> list[Foreign] | list[Unusable]:
    """[] once the GPUs hold no foreign process; the foreign ones when wait_s runs out; at
    once, the unusable ones (waiting would not change them)."""
    deadline = clock() + wait_s
    while True:
        snapshot = source.snapshot()
        broken = unusable(snapshot, gpus)
        if broken:
            return broken
        foreign = foreign_processes(snapshot, gpus, leases())
        if not foreign or clock() >= deadline:
            return foreign
        sleep(min(poll_s, max(deadline - clock(), 0.05)))
