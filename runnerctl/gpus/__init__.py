"""GPU inventory: `open_gpu_source("nvml" | "sim:N" | "sim:PATH")` -> a snapshot reader.

This package is the only place that reads GPUs; callers get frozen `GpuSnapshot`s.
NVML delivers an Xid only to a session that registered for it before it happened, so
only a long-lived reader (the controller, the exporter) opens its source with
`watch_xid=True`; a one-shot reader (`runnerctl status`, the executors' stages) reports
the Xid count, and with it the GPU's health, as unknown rather than as zero.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Protocol

from runnerctl.errors import ConfigError
from runnerctl.model import GpuSnapshot
from runnerctl.tags import host_name_problem


class GpuSource(Protocol):
    spec: str

    def snapshot(self) -> GpuSnapshot: ...


class NvmlSource:
    """NVML. Watching: opened on the first snapshot and kept open (Xid events between
    snapshots are counted only while a session lives). Not watching: opened and closed
    for every snapshot, Xid counts unknown."""

    def __init__(self, host: str, *, watch_xid: bool) -> None:
        self.spec = "nvml"
        self.host = host
        self.watch_xid = watch_xid
        self._live: Any = None

    def snapshot(self) -> GpuSnapshot:
        from runnerctl.gpus.nvml import LiveNvml, read_snapshot

        if not self.watch_xid:
            return read_snapshot(self.host)
        if self._live is None:
            self._live = LiveNvml(self.host)
        snapshot: GpuSnapshot = self._live.snapshot()
        return snapshot


class SimSource:
    """Simulated GPUs; like NVML, a reader that does not watch cannot know the Xid count."""

    def __init__(self, spec: str, host: str, *, watch_xid: bool) -> None:
        self.spec = spec
        self.host = host
        self.watch_xid = watch_xid
        self._arg = spec.removeprefix("sim:")

    def snapshot(self) -> GpuSnapshot:
        from runnerctl.gpus import sim

        if self._arg.isdigit():
            snapshot = sim.count_snapshot(self.host, int(self._arg))
        else:
            snapshot = sim.file_snapshot(Path(self._arg), self.host)
        return snapshot if self.watch_xid else sim.unwatched(snapshot)


def sim_count(spec: str) -> int | None:
    """N of a `sim:N` GPU source with 1 to 64 GPUs; None for anything else."""
    arg = spec.removeprefix("sim:")
    if arg == spec or not (arg.isascii() and arg.isdigit()) or not 1 <= int(arg) <= 64:
        return None
    return int(arg)


def open_gpu_source(spec: str, *, host: str | None = None, watch_xid: bool = False) -> GpuSource:
    """Parse a `--gpu-source` value. `watch_xid` for a reader that lives across snapshots."""
    host = host or socket.gethostname()
    if problem := host_name_problem(host):
        raise ConfigError(problem, hint="--host NAME, or [host] name in runnerctl.toml")
    if spec == "nvml":
        return NvmlSource(host, watch_xid=watch_xid)
    arg = spec.removeprefix("sim:")
    if arg and arg != spec:
        if arg.isdigit() and sim_count(spec) is None:
            raise ConfigError(f"--gpu-source {spec}: a simulated host has 1 to 64 GPUs")
        return SimSource(spec, host, watch_xid=watch_xid)
    raise ConfigError(
        f"unknown GPU source {spec!r}", hint="use `nvml`, `sim:N` (N GPUs) or `sim:PATH` (YAML)"
    )
