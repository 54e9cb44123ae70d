"""A fake NVML library, installed where pynvml looks its functions up.

pynvml (nvidia-ml-py) loads `libnvidia-ml.so.1` into its module global `nvmlLib` and
fetches every C function with `getattr(nvmlLib, name)`. This fake puts an object there
whose attributes are real ctypes C function pointers (CFUNCTYPE thunks), so pynvml's
own code runs unchanged: its structs, byref arguments, two-call buffer protocol and
error classes. Functions the fake does not define raise AttributeError, which pynvml
turns into NVMLError_FunctionNotFound, as with an old driver.

Behaviour follows the NVML API reference (docs.nvidia.com/deploy/nvml-api/):
return codes NVML_SUCCESS=0, ERROR_UNINITIALIZED=1, INVALID_ARGUMENT=2,
NOT_SUPPORTED=3, INSUFFICIENT_SIZE=7, DRIVER_NOT_LOADED=9, GPU_IS_LOST=15; process
lists use the two-call size protocol (infoCount in/out, INSUFFICIENT_SIZE when the
buffer is too small); usedGpuMemory is NVML_VALUE_NOT_AVAILABLE (ULLONG_MAX) when
unknown; handles are opaque pointers; calls before nvmlInit fail with UNINITIALIZED.
Events (nvmlEventSetCreate, nvmlDeviceRegisterEvents, nvmlEventSetWait_v2,
nvmlEventSetFree): a device registered for a type mask gets the events of those types
raised after it registered; a wait with nothing pending returns ERROR_TIMEOUT (10);
nvmlEventData_t carries the device handle, the event type and, for Xid events, the Xid.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from ctypes import c_int, c_uint, c_ulonglong, c_void_p
from typing import Any

import pynvml

SUCCESS, UNINITIALIZED, INVALID_ARGUMENT, NOT_SUPPORTED, NO_PERMISSION = 0, 1, 2, 3, 4
INSUFFICIENT_SIZE, DRIVER_NOT_LOADED, TIMEOUT, GPU_IS_LOST, LIB_RM_VERSION_MISMATCH = 7, 9, 10, 15, 18
UNKNOWN = 999
XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
_EVENT_SET_BASE = 0x9000
NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF
_HANDLE_BASE = 0x5000


@dataclasses.dataclass
class FakeProcess:
    pid: int
    used_memory: int | None = None
    kind: str = "compute"


@dataclasses.dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total: int = 80 * 1024**3
    memory_used: int = 0
    util_gpu: int | None = 0  # None: NOT_SUPPORTED (as on MIG devices)
    util_mem: int = 0
    mig: bool | None = False  # None: NOT_SUPPORTED
    ecc_uncorrected: int | None = 0  # None: NOT_SUPPORTED
    bus_id: str = "00000000:01:00.0"
    lost: bool = False
    lost_error: int = GPU_IS_LOST
    """What the handle lookup answers for a lost GPU: GPU_IS_LOST, or UNKNOWN (999), which
    nvidia-smi shows for a GPU off the bus ("Unable to determine the device handle ...:
    Unknown Error", NVIDIA/open-gpu-kernel-modules#387)."""
    events_supported: bool = True  # False: RegisterEvents says NOT_SUPPORTED
    processes: list[FakeProcess] = dataclasses.field(default_factory=list)
    process_list_error: int = SUCCESS
    """What both process-list calls answer instead of the list: nvml.h lists NOT_SUPPORTED
    and NO_PERMISSION for nvmlDeviceGetComputeRunningProcesses (a vGPU guest, a driver
    that cannot say, a MIG parent)."""


@dataclasses.dataclass
class FakeNvmlState:
    gpus: list[FakeGpu]
    topology: dict[tuple[int, int], int] = dataclasses.field(default_factory=dict)
    driver_version: str = "550.54.15"
    init_error: int = SUCCESS  # e.g. DRIVER_NOT_LOADED
    missing: set[str] = dataclasses.field(default_factory=set)  # functions the driver lacks
    # set id -> {gpu index: registered event type mask}; pending (gpu index, type, data)
    event_sets: dict[int, dict[int, int]] = dataclasses.field(default_factory=dict)
    pending_events: dict[int, list[tuple[int, int, int]]] = dataclasses.field(default_factory=dict)

    def raise_xid(self, gpu: int, xid: int) -> None:
        """The driver reports an Xid on a GPU: queued for every set watching it."""
        for set_id, masks in self.event_sets.items():
            if masks.get(gpu, 0) & XID_EVENT:
                self.pending_events[set_id].append((gpu, XID_EVENT, xid))


_ERRORS = {UNINITIALIZED: b"Uninitialized", INVALID_ARGUMENT: b"Invalid Argument",
           NOT_SUPPORTED: b"Not Supported", NO_PERMISSION: b"Insufficient Permissions",
           INSUFFICIENT_SIZE: b"Insufficient Size", TIMEOUT: b"Timeout",
           DRIVER_NOT_LOADED: b"Driver Not Loaded", GPU_IS_LOST: b"GPU is lost",
           LIB_RM_VERSION_MISMATCH: b"RM has detected an NVML/RM version mismatch."}


class FakeNvmlLibrary:
    """Stands in for the CDLL of libnvidia-ml.so.1."""

    def __init__(self, state: FakeNvmlState) -> None:
        self.state = state
        self.initialised = False
        self.calls: list[str] = []
        self._strings = {code: ctypes.create_string_buffer(text) for code, text in _ERRORS.items()}
        self._unknown = ctypes.create_string_buffer(b"Unknown Error")
        self._functions: dict[str, Any] = {}
        for name, (argtypes, impl) in self._table().items():
            self._functions[name] = ctypes.CFUNCTYPE(c_int, *argtypes)(self._guard(name, impl))
        self._functions["nvmlErrorString"] = ctypes.CFUNCTYPE(c_void_p, c_int)(self._error_string)

    def __getattr__(self, name: str) -> Any:
        functions = self.__dict__.get("_functions", {})
        if name in functions and name not in self.__dict__["state"].missing:
            return functions[name]
        raise AttributeError(name)

    def _guard(self, name: str, impl: Callable[..., int]) -> Callable[..., int]:
        def call(*args: Any) -> int:
            self.calls.append(name)
            if not name.startswith("nvmlInit") and not self.initialised:
                return UNINITIALIZED
            return impl(*args)
        return call

    def _error_string(self, code: int) -> int:
        return ctypes.addressof(self._strings.get(code, self._unknown))

    def _table(self) -> dict[str, tuple[tuple[Any, ...], Callable[..., int]]]:
        h, p = c_void_p, c_void_p
        return {
            "nvmlInitWithFlags": ((c_uint,), self._init),
            "nvmlInit_v2": ((), lambda: self._init(0)),
            "nvmlShutdown": ((), self._shutdown),
            "nvmlSystemGetDriverVersion": ((p, c_uint), self._driver_version),
            "nvmlDeviceGetCount_v2": ((p,), self._count),
            "nvmlDeviceGetHandleByIndex_v2": ((c_uint, p), self._handle),
            "nvmlDeviceGetName": ((h, p, c_uint), self._device(lambda g, buf, n: _put(buf, n, g.name))),
            "nvmlDeviceGetUUID": ((h, p, c_uint), self._device(lambda g, buf, n: _put(buf, n, g.uuid))),
            "nvmlDeviceGetMemoryInfo": ((h, p), self._device(self._memory)),
            "nvmlDeviceGetUtilizationRates": ((h, p), self._device(self._utilization)),
            "nvmlDeviceGetMigMode": ((h, p, p), self._device(self._mig)),
            "nvmlDeviceGetTotalEccErrors": ((h, c_uint, c_uint, p), self._device(self._ecc)),
            "nvmlDeviceGetPciInfo_v3": ((h, p), self._device(self._pci)),
            # _v2 and _v3 take the same struct (pynvml: c_nvmlProcessInfo_v3_t is the v2 one);
            # a driver before R510 has only _v2 (put the _v3 names into `missing`)
            "nvmlDeviceGetComputeRunningProcesses_v3": ((h, p, p), self._device(self._procs("compute"))),
            "nvmlDeviceGetGraphicsRunningProcesses_v3": ((h, p, p), self._device(self._procs("graphics"))),
            "nvmlDeviceGetComputeRunningProcesses_v2": ((h, p, p), self._device(self._procs("compute"))),
            "nvmlDeviceGetGraphicsRunningProcesses_v2": ((h, p, p), self._device(self._procs("graphics"))),
            "nvmlDeviceGetTopologyCommonAncestor": ((h, h, p), self._topology),
            "nvmlEventSetCreate": ((p,), self._event_set_create),
            "nvmlDeviceRegisterEvents": ((h, c_ulonglong, p), self._register_events),
            "nvmlEventSetWait_v2": ((p, p, c_uint), self._event_wait),
            "nvmlEventSetFree": ((p,), self._event_set_free),
        }

    # -- implementations ---------------------------------------------------------------
    def _init(self, flags: int) -> int:
        if self.state.init_error:
            return self.state.init_error
        self.initialised = True
        return SUCCESS

    def _shutdown(self) -> int:
        self.initialised = False
        return SUCCESS

    def _driver_version(self, buf: int, size: int) -> int:
        return _put(buf, size, self.state.driver_version)

    def _count(self, out: int) -> int:
        c_uint.from_address(out).value = len(self.state.gpus)
        return SUCCESS

    def _handle(self, index: int, out: int) -> int:
        if index >= len(self.state.gpus):
            return INVALID_ARGUMENT
        if self.state.gpus[index].lost:
            return self.state.gpus[index].lost_error
        c_void_p.from_address(out).value = _HANDLE_BASE + index
        return SUCCESS

    def _gpu(self, handle: int | None) -> FakeGpu | None:
        index = (handle or 0) - _HANDLE_BASE
        return self.state.gpus[index] if 0 <= index < len(self.state.gpus) else None

    def _device(self, impl: Callable[..., int]) -> Callable[..., int]:
        def call(handle: int | None, *args: Any) -> int:
            gpu = self._gpu(handle)
            if gpu is None:
                return INVALID_ARGUMENT
            if gpu.lost:
                return GPU_IS_LOST
            return impl(gpu, *args)
        return call

    def _memory(self, gpu: FakeGpu, out: int) -> int:
        mem = pynvml.c_nvmlMemory_t.from_address(out)
        mem.total, mem.used, mem.free = gpu.memory_total, gpu.memory_used, gpu.memory_total - gpu.memory_used
        return SUCCESS

    def _utilization(self, gpu: FakeGpu, out: int) -> int:
        if gpu.util_gpu is None:
            return NOT_SUPPORTED
        util = pynvml.c_nvmlUtilization_t.from_address(out)
        util.gpu, util.memory = gpu.util_gpu, gpu.util_mem
        return SUCCESS

    def _mig(self, gpu: FakeGpu, current: int, pending: int) -> int:
        if gpu.mig is None:
            return NOT_SUPPORTED
        c_uint.from_address(current).value = int(gpu.mig)
        c_uint.from_address(pending).value = int(gpu.mig)
        return SUCCESS

    def _ecc(self, gpu: FakeGpu, error_type: int, counter: int, out: int) -> int:
        if gpu.ecc_uncorrected is None:
            return NOT_SUPPORTED
        c_ulonglong.from_address(out).value = gpu.ecc_uncorrected if error_type == 1 else 0
        return SUCCESS

    def _pci(self, gpu: FakeGpu, out: int) -> int:
        info = pynvml.nvmlPciInfo_t.from_address(out)
        info.busId = gpu.bus_id.encode()
        return SUCCESS

    def _procs(self, kind: str) -> Callable[..., int]:
        def call(gpu: FakeGpu, count_ptr: int, buf: int | None) -> int:
            if gpu.process_list_error != SUCCESS:
                return gpu.process_list_error
            procs = [p for p in gpu.processes if p.kind == kind]
            count = c_uint.from_address(count_ptr)
            if count.value < len(procs) or (not buf and procs):
                count.value = len(procs)
                return INSUFFICIENT_SIZE
            count.value = len(procs)
            array = (pynvml.c_nvmlProcessInfo_v3_t * max(len(procs), 1)).from_address(buf) if buf else []
            for slot, proc in zip(array, procs, strict=False):
                slot.pid = proc.pid
                slot.usedGpuMemory = NOT_AVAILABLE if proc.used_memory is None else proc.used_memory
                slot.gpuInstanceId = slot.computeInstanceId = 0xFFFFFFFF
            return SUCCESS
        return call

    def _topology(self, a: int | None, b: int | None, out: int) -> int:
        ga, gb = self._gpu(a), self._gpu(b)
        if ga is None or gb is None:
            return INVALID_ARGUMENT
        ia, ib = sorted(((a or 0) - _HANDLE_BASE, (b or 0) - _HANDLE_BASE))
        level = self.state.topology.get((ia, ib))
        if level is None:
            return NOT_SUPPORTED
        c_uint.from_address(out).value = level
        return SUCCESS


    def _event_set_create(self, out: int) -> int:
        set_id = _EVENT_SET_BASE + len(self.state.event_sets) + 1
        self.state.event_sets[set_id] = {}
        self.state.pending_events[set_id] = []
        c_void_p.from_address(out).value = set_id
        return SUCCESS

    def _register_events(self, handle: int | None, types: int, set_id: int | None) -> int:
        gpu = self._gpu(handle)
        if gpu is None or set_id not in self.state.event_sets:
            return INVALID_ARGUMENT
        if gpu.lost:
            return GPU_IS_LOST
        if not gpu.events_supported:
            return NOT_SUPPORTED
        masks = self.state.event_sets[set_id]
        index = (handle or 0) - _HANDLE_BASE
        masks[index] = masks.get(index, 0) | types
        return SUCCESS

    def _event_wait(self, set_id: int | None, out: int, timeout_ms: int) -> int:
        if set_id not in self.state.event_sets:
            return INVALID_ARGUMENT
        if any(self.state.gpus[g].lost for g in self.state.event_sets[set_id]):
            return GPU_IS_LOST  # nvml.h lists it for nvmlEventSetWait_v2: a watched GPU fell off the bus
        pending = self.state.pending_events[set_id]
        if not pending:
            return TIMEOUT  # the fake never blocks: nothing can arrive while it waits
        gpu, kind, data = pending.pop(0)
        event = pynvml.c_nvmlEventData_t.from_address(out)
        ctypes.cast(ctypes.pointer(event), ctypes.POINTER(c_void_p))[0] = _HANDLE_BASE + gpu
        event.eventType, event.eventData = kind, data
        event.gpuInstanceId = event.computeInstanceId = 0xFFFFFFFF
        return SUCCESS

    def _event_set_free(self, set_id: int | None) -> int:
        if set_id not in self.state.event_sets:
            return INVALID_ARGUMENT
        del self.state.event_sets[set_id]
        del self.state.pending_events[set_id]
        return SUCCESS


def _put(buf: int, size: int, text: str) -> int:
    data = text.encode()
    if len(data) + 1 > size:
        return INSUFFICIENT_SIZE
    ctypes.memmove(buf, data + b"\0", len(data) + 1)
    return SUCCESS


@contextmanager
def installed(state: FakeNvmlState) -> Iterator[FakeNvmlLibrary]:
    """Put the fake where pynvml looks for the library; restore the old one after."""
    library = FakeNvmlLibrary(state)
    saved = pynvml.nvmlLib, dict(pynvml._nvmlGetFunctionPointer_cache)
    pynvml.nvmlLib = library
    pynvml._nvmlGetFunctionPointer_cache.clear()
    try:
        yield library
    finally:
        pynvml.nvmlLib = saved[0]
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlGetFunctionPointer_cache.update(saved[1])


__all__ = ["FakeGpu", "FakeNvmlLibrary", "FakeNvmlState", "FakeProcess", "installed"]
