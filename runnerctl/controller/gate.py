"""The controller's GPU gate: which GPUs no runner may serve now, and why.

Per GPU, from one snapshot per tick: a process that is not CI (not under a runnerctl
lease) closes the GPU at once; so does memory or utilization above the thresholds with
no visible owner (a user in another PID namespace). A closed GPU reopens only after
`cooldown_s` without such use, and a GPU closed for memory/utilization counts as clean
only below `reopen_ratio` of the thresholds (hysteresis: no flapping). A GPU with ECC
or Xid errors, or lost, is unhealthy and stays closed until an admin reopens it; the
error counts seen then become the baseline. A GPU in MIG mode stays closed while MIG is
on (runnerctl leaves MIG GPUs alone, layout.py): this keeps the runners of a GPU that
was switched to MIG after `init` paused. A GPU whose lease file cannot be read is
closed while it cannot (fail closed, as the executors' gate). Unknown values are never
read as zero.

Pure: `step(state, gpu, ...) -> state`; the loop keeps the states in the store.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from runnerctl.model import Gpu, GpuProcess
from runnerctl.settings import ControllerSettings

MIB = 1024**2
MIG_REASON = "MIG mode on: runnerctl leaves MIG GPUs alone (run runnerctl init again to retire its runners)"
UNLISTED_REASON = ("NVML cannot list its processes (not supported or no permission): it cannot be told free, "
                   "so it stays closed")
IsCi = Callable[[int, GpuProcess], bool]


@dataclasses.dataclass(frozen=True)
class GateThresholds:
    """The gate's limits, as `[controller]` sets them (`ControllerSettings`: their units and
    why of each default are there, the one place they are written)."""

    memory_mib: int
    utilization: float
    reopen_ratio: float
    cooldown_s: float

    @classmethod
    def from_settings(cls, settings: ControllerSettings | None = None) -> GateThresholds:
        c = settings or ControllerSettings()
        return cls(c.foreign_memory_mib, c.foreign_utilization, c.reopen_ratio, c.cooldown_s)


@dataclasses.dataclass(frozen=True)
class GateState:
    closed: bool = False
    reason: str = ""
    last_dirty: float | None = None  # last time foreign use was seen
    unhealthy: bool = False
    ecc_baseline: int = 0
    xid_baseline: int = 0

    def to_row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> GateState:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in row.items() if k in known})

    def shifted(self, step: float) -> GateState:
        """The same state after the wall clock stepped by `step` seconds."""
        if self.last_dirty is None:
            return self
        return dataclasses.replace(self, last_dirty=self.last_dirty + step)


def step(state: GateState, gpu: Gpu, *, now: float, is_ci: IsCi, owned: bool,
         limits: GateThresholds, lease_problem: str = "", host_problem: str = "") -> GateState:
    """The GPU's next state. `owned`: a CI lease holds this GPU (its memory is expected).
    `lease_problem`: why its lease file cannot be read; such a lease holds the GPU (the
    executors' prepare waits on it too) until an admin removes the file. `host_problem`:
    why no job may start on the host (`GpuSnapshot.host_problem`): closed while it lasts,
    open again a cool-down after, with no admin reopen (a reboot mends it)."""
    state = _rebase(state, gpu)
    sick = _sickness(gpu, state)
    if sick or state.unhealthy:
        return dataclasses.replace(state, closed=True, unhealthy=True,
                                   reason=sick or state.reason, last_dirty=now)
    if host_problem:
        return dataclasses.replace(state, closed=True, reason=host_problem, last_dirty=now)
    if gpu.mig_enabled:
        return dataclasses.replace(state, closed=True, reason=MIG_REASON, last_dirty=now)
    if not gpu.processes_known and not owned:  # no list: memory alone cannot say who uses it
        return dataclasses.replace(state, closed=True, reason=UNLISTED_REASON, last_dirty=now)
    dirty = (f"unreadable lease ({lease_problem}): held until an admin removes the file"
             if lease_problem else
             _foreign_use(gpu, is_ci=is_ci, owned=owned, limits=limits, was_closed=state.closed))
    if dirty:
        return dataclasses.replace(state, closed=True, reason=dirty, last_dirty=now)
    if state.closed and (state.last_dirty is None or now - state.last_dirty >= limits.cooldown_s):
        return dataclasses.replace(state, closed=False, reason="")
    if state.closed:
        left = limits.cooldown_s - (now - (state.last_dirty or now))
        return dataclasses.replace(state, reason=_cooling(state.reason, left))
    return state


def reopen(state: GateState, gpu: Gpu | None) -> GateState:
    """An admin's reopen of an unhealthy GPU: today's error counts become the baseline."""
    if gpu is None:
        return GateState()
    return GateState(ecc_baseline=gpu.ecc_uncorrected_errors or 0, xid_baseline=gpu.xid_errors or 0)


def _rebase(state: GateState, gpu: Gpu) -> GateState:
    """A count below its baseline was reset (the Xid count lives as long as the
    controller's NVML session, ECC volatile counts as long as the driver): count from 0,
    so the next error after a restart still closes the GPU."""
    if gpu.xid_errors is not None and gpu.xid_errors < state.xid_baseline:
        state = dataclasses.replace(state, xid_baseline=0)
    if gpu.ecc_uncorrected_errors is not None and gpu.ecc_uncorrected_errors < state.ecc_baseline:
        state = dataclasses.replace(state, ecc_baseline=0)
    return state


def _sickness(gpu: Gpu, state: GateState) -> str:
    if gpu.lost:
        return "unhealthy: the GPU fell off the bus (admin reopen needed)"
    if (gpu.ecc_uncorrected_errors or 0) > state.ecc_baseline:
        return f"unhealthy: {gpu.ecc_uncorrected_errors} uncorrected ECC errors (admin reopen needed)"
    if (gpu.xid_errors or 0) > state.xid_baseline:
        return f"unhealthy: {gpu.xid_errors} Xid errors (admin reopen needed)"
    return ""


def _foreign_use(gpu: Gpu, *, is_ci: IsCi, owned: bool, limits: GateThresholds,
                 was_closed: bool) -> str:
    foreign = [p for p in gpu.processes if not is_ci(gpu.index, p)]
    if foreign:
        p = foreign[0]
        return f"foreign process {p.pid} ({p.user or 'unknown user'}{_command(p)})"
    if owned or gpu.processes:
        return ""  # every visible process is CI: its memory and load are expected
    scale = limits.reopen_ratio if was_closed else 1.0
    memory = gpu.memory_used_bytes
    if memory is not None and memory > limits.memory_mib * MIB * scale:
        return f"{memory // MIB} MiB in use with no visible process"
    if gpu.utilization is not None and gpu.utilization > limits.utilization * scale:
        return f"{gpu.utilization:.0%} utilization with no visible process"
    return ""


def _command(process: GpuProcess) -> str:
    return f", {process.command}" if process.command else ""


def _cooling(reason: str, left: float) -> str:
    base = reason.split(" (cool-down", 1)[0]
    return f"{base} (cool-down, {max(0.0, left):.0f} s left)"
