"""Plain data shared by every layer: GPUs as observed in one tick, and runner slots.

Everything here is frozen. One `GpuSnapshot` is taken per tick by the one module that
reads GPUs; the controller, exporter, web page and CLI all read that snapshot.
Unknown values are `None`, never 0.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Mapping


class ProcessKind(enum.StrEnum):
    COMPUTE = "compute"
    GRAPHICS = "graphics"


class TopologyLevel(enum.IntEnum):
    """How close two GPUs are (values of NVML's nvmlGpuTopologyLevel_t; lower is closer)."""

    INTERNAL = 0  # same board (multi-GPU card)
    SINGLE = 10  # one PCIe switch between them
    MULTIPLE = 20  # several PCIe switches, no host bridge
    HOSTBRIDGE = 30  # same host bridge
    NODE = 40  # same NUMA node
    SYSTEM = 50  # across NUMA nodes (SMP interconnect)


@dataclasses.dataclass(frozen=True)
class GpuProcess:
    """A process using a GPU, as NVML reports it (host PID, also inside containers)."""

    pid: int
    kind: ProcessKind
    used_memory_bytes: int | None
    user: str | None  # None when the process is gone or its owner cannot be read
    command: str | None = None


@dataclasses.dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    utilization: float | None  # ratio 0-1 over NVML's last sample period; None when unsupported
    processes: tuple[GpuProcess, ...] = ()
    pci_bus_id: str | None = None
    mig_enabled: bool | None = None
    ecc_uncorrected_errors: int | None = None
    xid_errors: int | None = None
    lost: bool = False  # NVML reported the GPU as fallen off the bus
    processes_known: bool = True
    """False when NVML could not list the GPU's processes (not supported, no permission):
    `processes` is then empty without meaning that no one uses the GPU."""

    @property
    def healthy(self) -> bool | None:
        """False on any sign of trouble; True only when every counter was read and is
        clean; None otherwise (a counter unsupported, or Xids not watched)."""
        if self.lost or (self.ecc_uncorrected_errors or 0) > 0 or (self.xid_errors or 0) > 0:
            return False
        if self.ecc_uncorrected_errors is None or self.xid_errors is None:
            return None
        return True


@dataclasses.dataclass(frozen=True)
class GpuSnapshot:
    """All GPUs of one host at one instant."""

    host: str
    taken_at: float  # seconds since the epoch
    gpus: tuple[Gpu, ...]
    topology: Mapping[tuple[int, int], TopologyLevel] = dataclasses.field(default_factory=dict)
    driver_version: str | None = None
    source: str = "nvml"
    host_problem: str = ""
    """Why no job may start on any GPU of the host now, whatever each GPU reads (a driver
    upgraded without a reboot: `gpus.nvml.library_mismatch`); "" when nothing stops them."""

    def gpu(self, index: int) -> Gpu:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise KeyError(f"no GPU {index} on {self.host}")

    def level(self, a: int, b: int) -> TopologyLevel | None:
        if a == b:
            return TopologyLevel.INTERNAL
        return self.topology.get((min(a, b), max(a, b)))


def slot_key(name: str) -> str:
    """The key of a slot's full name (`runnerctl/gpu-a/gpu0-3` -> `gpu0-3`); a key stays itself."""
    return name.rpartition("/")[2]


@dataclasses.dataclass(frozen=True)
class Slot:
    """A set of GPUs that one GitLab runner serves: a single GPU or an aligned block.
    `name` is its full name (`runnerctl/HOST/KEY`), `key` its name on the host (`gpu0-3`);
    `slot_key` turns the one into the other."""

    host: str
    gpus: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.gpus)

    @functools.cached_property
    def key(self) -> str:
        """Stable short name, e.g. `gpu3` or `gpu4-7` (blocks are contiguous in slot order)."""
        if self.size == 1:
            return f"gpu{self.gpus[0]}"
        if list(self.gpus) == list(range(self.gpus[0], self.gpus[0] + self.size)):
            return f"gpu{self.gpus[0]}-{self.gpus[-1]}"
        return "gpu" + "+".join(str(g) for g in self.gpus)

    @functools.cached_property
    def name(self) -> str:
        """The runner's name in config.toml and its description in GitLab (computed once:
        the planner and the simulator read it many times a tick)."""
        return f"runnerctl/{self.host}/{self.key}"

    def overlaps(self, other: Slot) -> bool:
        return self.host == other.host and not set(self.gpus).isdisjoint(other.gpus)
