"""GPU inventory: `open_gpu_source("nvml" | "sim:N" | "sim:PATH")` -> a snapshot reader.

This package is the only place that reads GPUs; callers get frozen `GpuSnapshot`s.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Protocol

from runnerctl.errors import ConfigError
from runnerctl.model import GpuSnapshot


class GpuSource(Protocol):
    spec: str

    def snapshot(self) -> GpuSnapshot: ...


class NvmlSource:
    """NVML, opened on the first snapshot and kept open (Xid events between snapshots
    are counted only while a session lives)."""

    def __init__(self, host: str) -> None:
        self.spec = "nvml"
        self.host = host
        self._live: Any = None

    def snapshot(self) -> GpuSnapshot:
        from runnerctl.gpus.nvml import LiveNvml

        if self._live is None:
            self._live = LiveNvml(self.host)
        snapshot: GpuSnapshot = self._live.snapshot()
        return snapshot


class SimSource:
    def __init__(self, spec: str, host: str) -> None:
        self.spec = spec
        self.host = host
        self._arg = spec.removeprefix("sim:")

    def snapshot(self) -> GpuSnapshot:
        from runnerctl.gpus import sim

        if self._arg.isdigit():
            return sim.count_snapshot(self.host, int(self._arg))
        return sim.file_snapshot(Path(self._arg), self.host)


def open_gpu_source(spec: str, *, host: str | None = None) -> GpuSource:
    """Parse a `--gpu-source` value."""
    host = host or socket.gethostname()
    if spec == "nvml":
        return NvmlSource(host)
    if spec.startswith("sim:") and len(spec) > 4:
        arg = spec[4:]
        if arg.isdigit() and not 1 <= int(arg) <= 64:
            raise ConfigError(f"--gpu-source {spec}: a simulated host has 1 to 64 GPUs")
        return SimSource(spec, host)
    raise ConfigError(
        f"unknown GPU source {spec!r}", hint="use `nvml`, `sim:N` (N GPUs) or `sim:PATH` (YAML)"
    )
