"""Simulated GPUs for the demo, the simulator and tests: `sim:8` or `sim:PATH`.

`sim:N` is N idle 80 GiB GPUs with the topology of a typical 8-GPU server (pairs on
one PCIe switch, quads on one host bridge, halves on one NUMA node). `sim:PATH` names
a YAML file that is read again for every snapshot, so a test or a person can add a
"foreign" process by editing it:

    host: gpu-a                  # optional, default: this machine's host name
    gpus: 8                      # a count, or a list of GPU mappings (see below)
    processes:                   # optional, processes by GPU index
      - {gpu: 3, pid: 4242, user: alice, memory: 2GiB, command: python train.py}
    topology:                    # optional, overrides the default levels
      - [0, 1, SINGLE]

A GPU mapping may set `uuid`, `name`, `memory_total`, `memory_used`, `utilization`
(0-1 or null for unknown), `mig`, `ecc_uncorrected`, `xid`, `lost`, `processes`.
A process without `user` is looked up like a real one (its owner, if the pid exists).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import time
from pathlib import Path
from typing import Any

import yaml

from runnerctl.errors import GpuError
from runnerctl.gpus.nvml import owner_of
from runnerctl.model import Gpu, GpuProcess, GpuSnapshot, ProcessKind, TopologyLevel

GIB = 1024**3
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kib": 1024, "mib": 1024**2, "gib": GIB, "tib": 1024**4,
          "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}


def sim_uuid(host: str, index: int) -> str:
    digest = hashlib.sha256(f"{host}/{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def default_topology(count: int) -> dict[tuple[int, int], TopologyLevel]:
    """Levels of a typical server: pairs share a switch, quads a bridge, halves a node."""
    levels: dict[tuple[int, int], TopologyLevel] = {}
    for a in range(count):
        for b in range(a + 1, count):
            if a // 2 == b // 2:
                levels[(a, b)] = TopologyLevel.SINGLE
            elif a // 4 == b // 4:
                levels[(a, b)] = TopologyLevel.HOSTBRIDGE
            elif a // 8 == b // 8:
                levels[(a, b)] = TopologyLevel.NODE
            else:
                levels[(a, b)] = TopologyLevel.SYSTEM
    return levels


def idle_gpu(host: str, index: int) -> Gpu:
    return Gpu(
        index=index,
        uuid=sim_uuid(host, index),
        name="Simulated GPU 80GB",
        memory_total_bytes=80 * GIB,
        memory_used_bytes=0,
        utilization=0.0,
        pci_bus_id=f"00000000:{0x10 + index:02X}:00.0",
        mig_enabled=False,
        ecc_uncorrected_errors=0,
        xid_errors=0,
    )


def count_snapshot(host: str, count: int) -> GpuSnapshot:
    return GpuSnapshot(
        host=host,
        taken_at=time.time(),
        gpus=tuple(idle_gpu(host, i) for i in range(count)),
        topology=default_topology(count),
        driver_version="sim",
        source=f"sim:{count}",
    )


def unwatched(snapshot: GpuSnapshot) -> GpuSnapshot:
    """What a one-shot reader sees: NVML delivers Xid events only to a session registered
    before they happened (nvmlEventSetWait), so the count is unknown, never zero."""
    return dataclasses.replace(snapshot, gpus=tuple(
        g if g.lost else dataclasses.replace(g, xid_errors=None) for g in snapshot.gpus))


def file_snapshot(path: Path, default_host: str) -> GpuSnapshot:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise GpuError(f"cannot read simulated GPU file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise GpuError(f"simulated GPU file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise GpuError(f"simulated GPU file {path} must be a mapping with a `gpus` key")
    try:
        return _parse(data, default_host, source=f"sim:{path}")
    except (TypeError, ValueError, KeyError) as exc:
        raise GpuError(f"simulated GPU file {path}: {exc}") from None


def _parse(data: dict[str, Any], default_host: str, *, source: str) -> GpuSnapshot:
    host = str(data.get("host") or default_host)
    raw = data.get("gpus", 0)
    entries: list[dict[str, Any]] = [{} for _ in range(raw)] if isinstance(raw, int) else list(raw)
    gpus = [_gpu(host, pos, entry) for pos, entry in enumerate(entries)]
    by_index = {gpu.index: gpu for gpu in gpus}
    extra: dict[int, list[GpuProcess]] = {}
    for proc in data.get("processes") or []:
        index = int(proc["gpu"])
        if index not in by_index:
            raise ValueError(f"process {proc.get('pid')} names GPU {index}, which is not listed")
        extra.setdefault(index, []).append(_process(proc))
    gpus = [
        Gpu(**{**_fields(gpu), "processes": gpu.processes + tuple(extra.get(gpu.index, []))})
        for gpu in gpus
    ]
    topology = default_topology(len(gpus))
    for a, b, level in data.get("topology") or []:
        topology[(min(a, b), max(a, b))] = TopologyLevel[str(level).upper()]
    return GpuSnapshot(
        host=host, taken_at=time.time(), gpus=tuple(gpus), topology=topology,
        driver_version="sim", source=source,
    )


def _gpu(host: str, pos: int, entry: dict[str, Any]) -> Gpu:
    index = int(entry.get("index", pos))
    base = idle_gpu(host, index)
    util = entry.get("utilization", base.utilization)
    return Gpu(
        index=index,
        uuid=str(entry.get("uuid", base.uuid)),
        name=str(entry.get("name", base.name)),
        memory_total_bytes=_bytes(entry.get("memory_total", base.memory_total_bytes)),
        memory_used_bytes=_bytes(entry.get("memory_used", base.memory_used_bytes)),
        utilization=None if util is None else float(util),
        processes=tuple(_process(p) for p in entry.get("processes") or []),
        pci_bus_id=base.pci_bus_id,
        mig_enabled=entry.get("mig", base.mig_enabled),
        ecc_uncorrected_errors=entry.get("ecc_uncorrected", base.ecc_uncorrected_errors),
        xid_errors=entry.get("xid", base.xid_errors),
        lost=bool(entry.get("lost", False)),
    )


def _process(entry: dict[str, Any]) -> GpuProcess:
    pid = int(entry["pid"])
    user, command = entry.get("user"), entry.get("command")
    if user is None:
        user, found_command = owner_of(pid)
        command = command or found_command
    return GpuProcess(
        pid=pid,
        kind=ProcessKind(entry.get("kind", "compute")),
        used_memory_bytes=_bytes(entry.get("memory")),
        user=None if user is None else str(user),
        command=None if command is None else str(command),
    )


def _bytes(value: Any) -> int | None:
    if value is None or isinstance(value, int):
        return value
    match = _SIZE.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a size such as 2GiB or 512MiB")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "B").lower()])


def _fields(gpu: Gpu) -> dict[str, Any]:
    return {f: getattr(gpu, f) for f in gpu.__dataclass_fields__}
