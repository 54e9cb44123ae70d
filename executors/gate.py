"""The NVML gate (invariant S3): no job starts on a GPU with a foreign process.

A process on a GPU is CI when its environment carries RUNNERCTL_LEASE naming the live
lease of that GPU (/proc/<pid>/environ; PIDs from NVML are host PIDs, also inside
containers). Anything else is foreign: a colleague's `python train.py`, a process we
cannot read, a process another job left behind. The gate only reads; it never signals
anything (S4).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable

import psutil

from runnerctl.executors.lease import LEASE_ENV, Lease
from runnerctl.gpus import GpuSource
from runnerctl.model import GpuProcess, GpuSnapshot


@dataclasses.dataclass(frozen=True)
class Foreign:
    gpu: int
    process: GpuProcess

    def describe(self) -> str:
        memory = self.process.used_memory_bytes
        size = "" if memory is None else f", {memory / 1024**3:.1f} GiB"
        return (f"GPU {self.gpu} is used by pid {self.process.pid} of user "
                f"{self.process.user or 'unknown'}{size}")


def lease_token(pid: int) -> str | None:
    try:
        return psutil.Process(pid).environ().get(LEASE_ENV)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def foreign_processes(snapshot: GpuSnapshot, gpus: Iterable[int],
                      leases: Iterable[Lease]) -> list[Foreign]:
    tokens = {lease.gpu: lease.token for lease in leases}
    found = []
    for gpu in gpus:
        for proc in snapshot.gpu(gpu).processes:
            if lease_token(proc.pid) != tokens.get(gpu) or gpu not in tokens:
                found.append(Foreign(gpu, proc))
    return found


def wait_until_free(source: GpuSource, gpus: tuple[int, ...], leases: Callable[[], list[Lease]],
                    *, wait_s: float, poll_s: float = 2.0,
                    sleep: Callable[[float], None] = time.sleep,
                    clock: Callable[[], float] = time.monotonic) -> list[Foreign]:
    """[] once the GPUs hold no foreign process; the foreign ones when wait_s runs out."""
    deadline = clock() + wait_s
    while True:
        foreign = foreign_processes(source.snapshot(), gpus, leases())
        if not foreign or clock() >= deadline:
            return foreign
        sleep(poll_s)
