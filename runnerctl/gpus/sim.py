"""Simulated GPUs for the demo, the simulator and tests: `sim:8` or `sim:PATH`.

`sim:N` is N idle 80 GiB GPUs with the topology of a typical 8-GPU server (pairs on
one PCIe switch, quads on one host bridge, halves on one NUMA node). `sim:PATH` names
a YAML file that is read again for every snapshot, so a test or a person can add a
"foreign" process by editing it:

    host: gpu-a                  # optional, default: this machine's host name
    gpus: 8                      # a count, or a list of GPU mappings (see below); 0 to 64
    processes:                   # optional, processes by GPU index
      - {gpu: 3, pid: 4242, user: alice, memory: 2GiB, command: python train.py}
    topology:                    # optional, overrides the default levels
      - [0, 1, SINGLE]

A GPU mapping may set `index` (0-63, each once; default: its position), `uuid`, `name`,
`memory_total`, `memory_used`, `utilization` (0-1 or null for unknown), `mig`,
`ecc_uncorrected`, `xid`, `lost`, `processes`, `processes_known` (false: NVML cannot list
them, as on a driver that answers NOT_SUPPORTED). A process without `user` is looked up
like a real one (its owner, if the pid exists). Any other key, or a value out of its
range, is an error naming the entry and the field (`gpus[2].utilization`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import reprlib
import time
from collections.abc import Container
from pathlib import Path
from typing import Any

import yaml

from runnerctl.errors import GpuError
from runnerctl.gpus.nvml import owner_of
from runnerctl.model import Gpu, GpuProcess, GpuSnapshot, ProcessKind, TopologyLevel
from runnerctl.tags import host_name_problem

GIB = 1024**3
MAX_GPUS = 64  # as `sim:N` (gpus.sim_count)
MAX_BYTES = 1024**5  # 1 PiB: no GPU holds more
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
    """The GPUs a YAML file describes. Anything malformed is one GpuError naming the file,
    the entry and the field: the exporter and the controller log it and read again."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise GpuError(f"cannot read simulated GPU file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise GpuError(f"simulated GPU file {path} is not UTF-8 text") from None
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: an integer of over 4300 digits
        raise GpuError(f"simulated GPU file {path} is not valid YAML: {exc}") from None
    except RecursionError:
        raise GpuError(f"simulated GPU file {path} is not valid YAML: nested too deeply") from None
    if not isinstance(data, dict):
        raise GpuError(f"simulated GPU file {path} must be a mapping with a `gpus` key")
    try:
        return _parse(data, default_host, source=f"sim:{path}")
    except _Invalid as exc:
        raise GpuError(f"simulated GPU file {path}: {exc}") from None


class _Invalid(ValueError):
    """A malformed entry or field, named as in the file (`gpus[1].utilization`)."""

    def __init__(self, where: str, value: Any, wanted: str) -> None:
        super().__init__(f"{where} is missing ({wanted})" if value is None else
                         f"{where} is {reprlib.repr(value)}, not {wanted}")


_FILE_KEYS = ("host", "gpus", "processes", "topology")
_GPU_KEYS = ("index", "uuid", "name", "memory_total", "memory_used", "utilization", "mig",
             "ecc_uncorrected", "xid", "lost", "processes", "processes_known")
_PROCESS_KEYS = ("gpu", "pid", "user", "memory", "command", "kind")  # gpu: in the file's list
MAX_PID = 2**31 - 1
MAX_COUNT = 2**63 - 1  # NVML's error counters are unsigned long long


def _parse(data: dict[str, Any], default_host: str, *, source: str) -> GpuSnapshot:
    _known(data, _FILE_KEYS, "the file")
    host = _text(data, "host", "") or default_host
    if host != default_host and host_name_problem(host):  # it names the host's runners and metrics
        raise _Invalid("host", host, "a host name (1 to 63 letters, digits, '-', '_' or '.')")
    raw = data.get("gpus")
    if isinstance(raw, list) and len(raw) <= MAX_GPUS:
        entries = [_mapping(entry, f"gpus[{pos}]") for pos, entry in enumerate(raw)]
    else:
        entries = [{} for _ in range(_whole(data, "gpus", "", 0, MAX_GPUS,
                                            or_else=f"or a list of at most {MAX_GPUS} GPU mappings") or 0)]
    gpus = [_gpu(host, f"gpus[{pos}]", pos, entry) for pos, entry in enumerate(entries)]
    listed: dict[int, int] = {}  # GPU index -> its position in `gpus`
    for pos, gpu in enumerate(gpus):
        if gpu.index in listed:
            raise _Invalid(f"gpus[{pos}].index", gpu.index, f"unique (gpus[{listed[gpu.index]}] has it too)")
        listed[gpu.index] = pos
    extra: dict[int, list[GpuProcess]] = {}
    for pos, proc in enumerate(_list(data, "processes", "")):
        where = f"processes[{pos}]"
        proc = _mapping(proc, where)
        index = _whole(proc, "gpu", where, 0, MAX_GPUS - 1)
        if index not in listed:
            raise _Invalid(f"{where}.gpu", index, "the index of a GPU in `gpus`")
        extra.setdefault(index, []).append(_process(proc, where))
    gpus = [
        Gpu(**{**_fields(gpu), "processes": gpu.processes + tuple(extra.get(gpu.index, []))})
        for gpu in gpus
    ]
    topology = default_topology(len(gpus))
    for pos, row in enumerate(_list(data, "topology", "")):
        a, b, level = _topology_row(row, f"topology[{pos}]", listed)
        topology[(min(a, b), max(a, b))] = level
    return GpuSnapshot(
        host=host, taken_at=time.time(), gpus=tuple(gpus), topology=topology,
        driver_version="sim", source=source,
    )


def _gpu(host: str, where: str, pos: int, entry: dict[str, Any]) -> Gpu:
    _known(entry, _GPU_KEYS, where)
    index = _whole(entry, "index", where, 0, MAX_GPUS - 1)
    index = pos if index is None else index
    base = idle_gpu(host, index)
    util = entry.get("utilization", base.utilization)
    if util is not None and (isinstance(util, bool) or not isinstance(util, int | float)
                             or not 0 <= util <= 1):
        raise _Invalid(f"{where}.utilization", util, "a ratio from 0 to 1 (or null: unknown)")
    return Gpu(
        index=index,
        uuid=_text(entry, "uuid", where) or base.uuid,
        name=_text(entry, "name", where) or base.name,
        memory_total_bytes=_bytes(entry, "memory_total", where, base.memory_total_bytes),
        memory_used_bytes=_bytes(entry, "memory_used", where, base.memory_used_bytes),
        utilization=None if util is None else float(util),
        processes=tuple(_process(_mapping(p, f"{where}.processes[{i}]"), f"{where}.processes[{i}]")
                        for i, p in enumerate(_list(entry, "processes", where))),
        pci_bus_id=base.pci_bus_id,
        mig_enabled=_flag(entry, "mig", where, base.mig_enabled),
        ecc_uncorrected_errors=_whole(entry, "ecc_uncorrected", where, 0, MAX_COUNT,
                                      default=base.ecc_uncorrected_errors),
        xid_errors=_whole(entry, "xid", where, 0, MAX_COUNT, default=base.xid_errors),
        lost=bool(_flag(entry, "lost", where, False)),
        processes_known=bool(_flag(entry, "processes_known", where, True)),
    )


def _process(entry: dict[str, Any], where: str) -> GpuProcess:
    _known(entry, _PROCESS_KEYS, where)
    pid = _whole(entry, "pid", where, 1, MAX_PID)
    if pid is None:
        raise _Invalid(f"{where}.pid", pid, f"a process id from 1 to {MAX_PID}")
    user, command = _text(entry, "user", where), _text(entry, "command", where)
    if user is None:
        user, found_command = owner_of(pid)
        command = command or found_command
    kind = entry.get("kind", "compute")
    if kind not in tuple(ProcessKind):
        raise _Invalid(f"{where}.kind", kind, " or ".join(ProcessKind))
    return GpuProcess(pid=pid, kind=ProcessKind(kind), used_memory_bytes=_bytes(entry, "memory", where, None),
                      user=user, command=command)


def _topology_row(row: Any, where: str, gpus: Container[int]) -> tuple[int, int, TopologyLevel]:
    if not (isinstance(row, list) and len(row) == 3):
        raise _Invalid(where, row, "[GPU, GPU, LEVEL]")
    a, b, level = row
    for index in (a, b):
        if isinstance(index, bool) or not isinstance(index, int) or index not in gpus:
            raise _Invalid(where, row, "[GPU, GPU, LEVEL] with the indexes of two GPUs in `gpus`")
    name = str(level).upper()
    if a == b or name not in TopologyLevel.__members__:
        raise _Invalid(where, row, f"[GPU, GPU, LEVEL] of two GPUs, LEVEL one of "
                                   f"{', '.join(TopologyLevel.__members__)}")
    return a, b, TopologyLevel[name]


def _known(entry: dict[str, Any], keys: tuple[str, ...], where: str) -> None:
    """Refuse a key this reader does not know (a typo would otherwise be ignored)."""
    unknown = [key for key in entry if key not in keys]
    if unknown:
        raise _Invalid(f"a key of {where}", unknown[0], f"one of {', '.join(keys)}")


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Invalid(where, value, "a mapping")
    return value


def _list(entry: dict[str, Any], key: str, where: str) -> list[Any]:
    value = entry.get(key)
    if value is not None and not isinstance(value, list):
        raise _Invalid(_at(where, key), value, "a list")
    return value or []


def _whole(entry: dict[str, Any], key: str, where: str, low: int, high: int, *,
           default: int | None = None, or_else: str = "") -> int | None:
    """A whole number from `low` to `high`; null or absent: `default`."""
    value = entry.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _Invalid(_at(where, key), value, f"a whole number from {low} to {high} {or_else}".strip())
    return int(value)


def _flag(entry: dict[str, Any], key: str, where: str, default: bool | None) -> bool | None:
    value = entry.get(key, default)
    if value is not None and not isinstance(value, bool):
        raise _Invalid(_at(where, key), value, "true or false")
    return value


def _text(entry: dict[str, Any], key: str, where: str) -> str | None:
    value = entry.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, str | int | float)):
        raise _Invalid(_at(where, key), value, "text")
    return None if value is None else str(value)


def _bytes(entry: dict[str, Any], key: str, where: str, default: int | None) -> int | None:
    """A size: bytes, or a number and a unit (2GiB, 512MiB, 1.5GB), at most MAX_BYTES."""
    value = entry.get(key, default)
    if value is None:
        return None
    match = _SIZE.match(str(value)) if isinstance(value, str | float) else None
    size = (float(match.group(1)) * _UNITS[(match.group(2) or "B").lower()] if match
            else value if isinstance(value, int) and not isinstance(value, bool) else -1)
    if not 0 <= size <= MAX_BYTES:
        raise _Invalid(_at(where, key), value, "a size such as 2GiB or 512MiB (at most 1 PiB)")
    return int(size)


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _fields(gpu: Gpu) -> dict[str, Any]:
    return {f: getattr(gpu, f) for f in gpu.__dataclass_fields__}
