"""The one door to NVML: every NVML call in runnerctl goes through `NvmlSession.query`.

NVML is reached through nvidia-ml-py (import name `pynvml`). Functions a driver does
not support raise `NVMLError_NotSupported`; older drivers lack some functions
(`NVMLError_FunctionNotFound`). Both mean "unknown" and become `None` here, and each
missing function is logged once. Nothing else in runnerctl imports pynvml.

Xid errors arrive as NVML events (`nvmlDeviceRegisterEvents` with
`nvmlEventTypeXidCriticalError`, read with `nvmlEventSetWait_v2`, whose `eventData` is
the Xid). Only Xids that NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors)
resolves with a GPU reset, a node reboot or support (`HARDWARE_XIDS`) count against a
GPU; application faults such as 13, 31, 43 or 45 are logged and ignored, since a user's
bad kernel must not close a GPU for everyone. Counts are kept for as long as the
session lives, so a long-lived source (the controller's) sees every event.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pynvml

from runnerctl.errors import GpuError
from runnerctl.model import Gpu, GpuProcess, GpuSnapshot, ProcessKind, TopologyLevel

log = logging.getLogger(__name__)

_UNKNOWN_ERRORS: tuple[type[Exception], ...] = (
    pynvml.NVMLError_NotSupported,
    pynvml.NVMLError_FunctionNotFound,
    pynvml.NVMLError_NoData,
)
_HINTS = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "libnvidia-ml.so.1 was not found: install the NVIDIA "
    "driver, or use --gpu-source sim:N to simulate GPUs",
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded: check "
    "`nvidia-smi`, or use --gpu-source sim:N to simulate GPUs",
    pynvml.NVML_ERROR_NO_PERMISSION: "no permission to open the NVIDIA devices: run as a user "
    "that can read /dev/nvidia*",
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "the NVIDIA library and kernel driver differ (a "
    "driver upgrade without a reboot): reboot, or reload the nvidia kernel modules",
}
_PROCESS_LISTS = {kind: (f"nvmlDeviceGet{kind.title()}RunningProcesses_v3",
                         f"nvmlDeviceGet{kind.title()}RunningProcesses_v2") for kind in ProcessKind}
"""The versioned calls, newest first: pynvml's unversioned ones call only _v3 and raise
NVMLLibraryMismatchError (no NVMLError) on a driver before R510, which has only _v2."""
_UNLISTED: tuple[type[Exception], ...] = (*_UNKNOWN_ERRORS, pynvml.NVMLError_NoPermission)
"""A process list NVML cannot give: the GPU's use is unknown (nvml.h lists NOT_SUPPORTED and
NO_PERMISSION for these calls)."""
_NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF  # NVML_VALUE_NOT_AVAILABLE for unsigned long long
# Double-bit ECC (48), micro-controller faults (61, 62), row remapping (63, 64), NVLink
# (74), fallen off the bus (79), uncontained ECC (95), GSP errors (119, 120),
# unrecovered ECC (140): the catalog's "reset GPU" / "reboot" / "contact support" Xids.
HARDWARE_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 95, 119, 120, 140})
_MAX_EVENTS_PER_SNAPSHOT = 1000  # a storm of events must not stall a tick


class NvmlSession:
    """An initialised NVML library; `query` maps "unknown" to None."""

    def __init__(self) -> None:
        self._missing_logged: set[str] = set()
        self._unlisted_logged: set[tuple[int, ProcessKind]] = set()
        self._events: Any | None = None  # the Xid event set, once created
        self._xid_watched: dict[int, int] = {}  # device handle address -> GPU index
        self._xid_counts: dict[int, int] = {}  # GPU index -> hardware Xids seen
        self._xid_unwatchable: set[int] = set()
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            hint = _HINTS.get(code, "check the NVIDIA driver with `nvidia-smi`")
            raise GpuError(f"cannot initialise NVML: {exc}", hint=hint) from None

    def close(self) -> None:
        if self._events is not None:
            try:
                pynvml.nvmlEventSetFree(self._events)
            except pynvml.NVMLError as exc:  # a dead session frees nothing; shut down anyway
                log.debug("nvmlEventSetFree failed: %s", exc)
            self._events = None
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            log.debug("nvmlShutdown failed: %s", exc)

    def query(self, func: Callable[..., Any], *args: Any) -> Any | None:
        """Call one pynvml function; None when the GPU or driver cannot say."""
        return self._call(func, *args)[1]

    def _call(self, func: Callable[..., Any], *args: Any) -> tuple[bool, Any | None]:
        """(supported, result): for functions whose success returns None."""
        try:
            return True, func(*args)
        except _UNKNOWN_ERRORS as exc:
            name = getattr(func, "__name__", repr(func))
            if name not in self._missing_logged:
                self._missing_logged.add(name)
                log.info("NVML %s: %s; treating as unknown", name, exc)
            return False, None

    def _watch_xid(self, handles: dict[int, Any]) -> None:
        """Register every GPU not yet watched for Xid events (once per session)."""
        if self._events is None:
            supported, events = self._call(pynvml.nvmlEventSetCreate)
            if not supported:
                self._xid_unwatchable.update(handles)
                return
            self._events = events
        for index, handle in handles.items():
            address = _address(handle)
            if address in self._xid_watched or index in self._xid_unwatchable:
                continue
            supported, _ = self._call(pynvml.nvmlDeviceRegisterEvents, handle,
                                      pynvml.nvmlEventTypeXidCriticalError, self._events)
            if supported:
                self._xid_watched[address] = index
                self._xid_counts.setdefault(index, 0)
            else:
                self._xid_unwatchable.add(index)

    def _drain_xid(self) -> bool:
        """Count the hardware Xids waiting in the event set, without blocking; False when
        a watched GPU fell off the bus: the wait then answers GPU_IS_LOST for ever (nvml.h),
        so the set is dropped, with the events it still held, to be made again without it."""
        if self._events is None:
            return True
        for _ in range(_MAX_EVENTS_PER_SNAPSHOT):
            try:
                data = pynvml.nvmlEventSetWait_v2(self._events, 0)
            except pynvml.NVMLError_Timeout:
                return True
            except pynvml.NVMLError_GpuIsLost:
                try:
                    pynvml.nvmlEventSetFree(self._events)
                except pynvml.NVMLError as exc:
                    log.debug("nvmlEventSetFree failed: %s", exc)
                self._events = None
                self._xid_watched.clear()  # the counts stay; the GPUs still here are watched again
                return False
            index = self._xid_watched.get(_address(data.device))
            if index is None or not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                continue
            xid = int(data.eventData)
            if xid in HARDWARE_XIDS:
                self._xid_counts[index] += 1
                log.warning("GPU %d: Xid %d (hardware; the GPU is closed until an admin reopens it)",
                            index, xid)
            else:
                log.info("GPU %d: Xid %d (application fault; the GPU stays open)", index, xid)
        return True

    def snapshot(self, host: str, *, watch_xid: bool = False) -> GpuSnapshot:
        """Every GPU once; with `watch_xid`, Xid counts since this session first watched
        (a one-shot read leaves them unknown: it could not have seen any)."""
        count = pynvml.nvmlDeviceGetCount()
        gpus: list[Gpu] = []
        handles: dict[int, Any] = {}
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            except (pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_Unknown):
                # a GPU off the bus is counted but its handle is "Unknown Error" (as nvidia-smi
                # shows it, NVIDIA/open-gpu-kernel-modules#387): lost, the others still read
                gpus.append(_lost_gpu(index))
                continue
            try:
                gpus.append(self._read_gpu(index, handle))
                handles[index] = handle
            except pynvml.NVMLError_GpuIsLost:
                gpus.append(_lost_gpu(index))
        if watch_xid:
            self._watch_xid(handles)
            drained = self._drain_xid()
            if not drained:  # a GPU was lost: what the old set held is unknown this once
                self._watch_xid(handles)
            gpus = [g if g.lost else dataclasses.replace(
                        g, xid_errors=self._xid_counts.get(g.index) if drained else None)
                    for g in gpus]
        driver = self.query(pynvml.nvmlSystemGetDriverVersion)
        return GpuSnapshot(
            host=host,
            taken_at=time.time(),
            gpus=tuple(gpus),
            topology=self._topology(handles),
            driver_version=_text(driver) if driver is not None else None,
            source="nvml",
        )

    def _read_gpu(self, index: int, handle: Any) -> Gpu:
        memory = self.query(pynvml.nvmlDeviceGetMemoryInfo, handle)
        rates = self.query(pynvml.nvmlDeviceGetUtilizationRates, handle)
        mig = self.query(pynvml.nvmlDeviceGetMigMode, handle)
        ecc = self.query(
            pynvml.nvmlDeviceGetTotalEccErrors,
            handle,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )
        pci = self.query(pynvml.nvmlDeviceGetPciInfo, handle)
        compute, compute_known = self._processes(index, handle, ProcessKind.COMPUTE)
        graphics, graphics_known = self._processes(index, handle, ProcessKind.GRAPHICS)
        processes = [*compute, *graphics]
        return Gpu(
            index=index,
            uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
            name=_text(pynvml.nvmlDeviceGetName(handle)),
            memory_total_bytes=int(memory.total) if memory is not None else None,
            memory_used_bytes=int(memory.used) if memory is not None else None,
            utilization=rates.gpu / 100.0 if rates is not None else None,
            processes=tuple(_dedupe(processes)),
            pci_bus_id=_text(pci.busId) if pci is not None else None,
            mig_enabled=bool(mig[0]) if mig is not None else None,
            ecc_uncorrected_errors=int(ecc) if ecc is not None else None,
            processes_known=compute_known and graphics_known,
        )

    def _processes(self, index: int, handle: Any, kind: ProcessKind) -> tuple[list[GpuProcess], bool]:
        """The GPU's processes of one kind, and whether NVML could list them at all."""
        found, problem = None, "this driver has neither call for it"
        for name in _PROCESS_LISTS[kind]:
            try:
                found = getattr(pynvml, name)(handle)
                break
            except pynvml.NVMLError_FunctionNotFound:
                continue  # an older driver: the older call
            except _UNLISTED as exc:
                problem = str(exc)
                break
        if found is None:
            if (index, kind) not in self._unlisted_logged:  # it keeps the GPU closed: say so, once
                self._unlisted_logged.add((index, kind))
                log.warning("NVML cannot list GPU %d's %s processes (%s): it is treated as in use",
                            index, kind.value, problem)
            return [], False
        result = []
        for proc in found:
            used = getattr(proc, "usedGpuMemory", None)
            user, command = owner_of(int(proc.pid))
            result.append(
                GpuProcess(
                    pid=int(proc.pid),
                    kind=kind,
                    used_memory_bytes=_known_bytes(used),
                    user=user,
                    command=command,
                )
            )
        return result, True

    def _topology(self, handles: dict[int, Any]) -> dict[tuple[int, int], TopologyLevel]:
        levels: dict[tuple[int, int], TopologyLevel] = {}
        indexes = sorted(handles)
        for pos, a in enumerate(indexes):
            for b in indexes[pos + 1 :]:
                level = self.query(
                    pynvml.nvmlDeviceGetTopologyCommonAncestor, handles[a], handles[b]
                )
                if level is not None and int(level) in TopologyLevel._value2member_map_:
                    levels[(a, b)] = TopologyLevel(int(level))
        return levels


def owner_of(pid: int) -> tuple[str | None, str | None]:
    """The user and program name of a host process; (None, None) once it is gone.

    The name, never the command line: a colleague's arguments may carry a secret
    (`--hf-token ...`), which serve, running as root, published on the pages anyone on
    its port reads, kept in events for 90 days, shared through the store with every
    host, and logged (found by a privacy review). Bytes that are not UTF-8 (a program
    named in Shift_JIS, which psutil hands over as lone surrogates) become U+FFFD:
    stored as they were, they failed every tick's write of the gate event, and the
    controller stood still while the process ran (found by a review as an
    internationalisation reviewer)."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            return _utf8(proc.username()), _utf8(proc.name())
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError):
        return None, None


def _utf8(text: str) -> str:
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _dedupe(processes: list[GpuProcess]) -> list[GpuProcess]:
    """A process that is both compute and graphics is listed once, as compute."""
    seen: set[int] = set()
    unique = []
    for proc in processes:
        if proc.pid not in seen:
            seen.add(proc.pid)
            unique.append(proc)
    return unique


def _known_bytes(value: int | None) -> int | None:
    return None if value is None or value == _NOT_AVAILABLE else int(value)


def _lost_gpu(index: int) -> Gpu:
    return Gpu(
        index=index,
        uuid=f"lost-{index}",
        name="unknown (GPU is lost)",
        memory_total_bytes=None,
        memory_used_bytes=None,
        utilization=None,
        lost=True,
    )


def _address(handle: Any) -> int:
    """A device handle's pointer value: the key that ties an event to its GPU."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


PROC_MAPS = Path("/proc/self/maps")
_LIBRARY = "libnvidia-ml.so"


def library_mismatch(driver_version: str | None, maps: Path = PROC_MAPS) -> str:
    """Why a process started now fails `nvmlInit` with LIB_RM_VERSION_MISMATCH while this
    one, which loaded the old library, reads NVML as before; "" when nothing says so.

    A driver package upgraded without a reboot (unattended upgrades) replaces
    `libnvidia-ml.so.1` on disk, now a link to `libnvidia-ml.so.<new version>`, while the
    kernel keeps the old module: every CUDA job and every stage's gate then fails with
    "Driver/library version mismatch", and the controller, still reading NVML through the
    library it loaded at its start, kept the runners open to them. Compared: the version
    in the name the link beside the loaded library (its line in `maps`) points to now,
    and `driver_version`, the kernel driver's (`nvmlSystemGetDriverVersion`, which this
    session still reads). Either unknown (no library loaded: NVML faked): ""."""
    try:
        lines = maps.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    loaded = next((line.split(maxsplit=5)[5] for line in lines
                   if _LIBRARY in line and len(line.split(maxsplit=5)) == 6), "")
    loaded, running = loaded.removesuffix(" (deleted)"), driver_version or ""
    if not loaded or not running:
        return ""
    try:
        target = os.path.realpath(Path(loaded).parent / f"{_LIBRARY}.1")
    except OSError:
        return ""
    on_disk = Path(target).name.partition(f"{_LIBRARY}.")[2]
    if not on_disk[:1].isdigit() or "." not in on_disk or on_disk == running:
        return ""  # a library file not named by its version (".so.1" itself) tells nothing
    return (f"the NVIDIA library on disk is {on_disk} but the kernel driver is {running} (a driver "
            "upgrade without a reboot): every job started now fails with 'Driver/library version mismatch'")


class LiveNvml:
    """A session kept open across snapshots (the controller's), so Xid events between
    ticks are counted; reopened after an NVML failure. While a process started now could
    not use NVML (`library_mismatch` of the library mapped as `maps` says), a snapshot
    says so as its `host_problem`: the controller closes every runner, which it would
    otherwise keep open to jobs that all fail, and its metrics and page stay."""

    def __init__(self, host: str, *, maps: Path = PROC_MAPS) -> None:
        self.host = host
        self.maps = maps
        self._session: NvmlSession | None = None

    def snapshot(self) -> GpuSnapshot:
        if self._session is None:
            self._session = NvmlSession()
        try:
            snapshot = self._session.snapshot(self.host, watch_xid=True)
        except pynvml.NVMLError as exc:
            self.close()
            raise GpuError(f"NVML query failed: {exc}", hint="check `nvidia-smi`") from None
        mismatch = library_mismatch(snapshot.driver_version, self.maps)
        if mismatch:
            mismatch = f"{mismatch}: {_HINTS[pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH]}"
        return dataclasses.replace(snapshot, host_problem=mismatch)

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None


def read_snapshot(host: str | None = None) -> GpuSnapshot:
    """Open NVML, read every GPU once, close it."""
    session = NvmlSession()
    try:
        return session.snapshot(host or socket.gethostname())
    except pynvml.NVMLError as exc:
        raise GpuError(f"NVML query failed: {exc}", hint="check `nvidia-smi`") from None
    finally:
        session.close()
