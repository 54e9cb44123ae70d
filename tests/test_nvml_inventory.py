"""The NVML door (runnerctl.gpus.nvml) over real pynvml code, NVML faked below it."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from runnerctl.controller.store import Event, Store
from runnerctl.errors import GpuError
from runnerctl.gpus import nvml, open_gpu_source
from runnerctl.gpus.nvml import read_snapshot
from runnerctl.model import ProcessKind, TopologyLevel
from tests.fakes.nvml import (
    DRIVER_NOT_LOADED,
    GPU_IS_LOST,
    LIB_RM_VERSION_MISMATCH,
    NO_PERMISSION,
    NOT_SUPPORTED,
    UNKNOWN,
    FakeGpu,
    FakeNvmlState,
    FakeProcess,
    installed,
)

GIB = 1024**3


@pytest.fixture
def nobody_process() -> Iterator[int]:
    """A real process of another user, as a colleague's training run would be."""
    proc = subprocess.Popen(["sleep", "60"], user="nobody")
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def _state(**gpu0: object) -> FakeNvmlState:
    return FakeNvmlState(gpus=[FakeGpu(uuid="GPU-0000", **gpu0), FakeGpu(uuid="GPU-1111")])  # type: ignore[arg-type]


def test_snapshot_reads_every_field() -> None:
    state = _state(name="NVIDIA A100-SXM4-40GB", memory_total=40 * GIB, memory_used=3 * GIB,
                   util_gpu=37, bus_id="00000000:07:00.0", ecc_uncorrected=0)
    state.topology = {(0, 1): int(TopologyLevel.SINGLE)}
    with installed(state):
        snap = read_snapshot("gpu-a")
    first, second = snap.gpus
    assert (snap.host, snap.driver_version, snap.source) == ("gpu-a", "550.54.15", "nvml")
    assert (first.index, first.uuid, first.name) == (0, "GPU-0000", "NVIDIA A100-SXM4-40GB")
    assert (first.memory_total_bytes, first.memory_used_bytes) == (40 * GIB, 3 * GIB)
    assert first.utilization == pytest.approx(0.37)
    assert first.pci_bus_id == "00000000:07:00.0"
    assert first.mig_enabled is False
    assert first.healthy is None  # ECC read clean, but a one-shot read cannot know the Xids (issue 15)
    assert second.uuid == "GPU-1111"
    assert snap.level(0, 1) == TopologyLevel.SINGLE


def test_not_supported_is_none_never_zero(caplog: pytest.LogCaptureFixture) -> None:
    state = _state(util_gpu=None, mig=None, ecc_uncorrected=None)
    with installed(state), caplog.at_level(logging.INFO):
        first = read_snapshot("h").gpus[0]
        read_snapshot("h")
    assert first.utilization is None and first.mig_enabled is None
    assert first.ecc_uncorrected_errors is None and first.healthy is None
    assert first.memory_used_bytes == 0  # supported values are still read


def test_missing_function_is_unknown_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    state = _state()
    state.missing = {"nvmlDeviceGetTopologyCommonAncestor", "nvmlDeviceGetMigMode"}
    with installed(state), caplog.at_level(logging.INFO, logger="runnerctl.gpus.nvml"):
        from runnerctl.gpus.nvml import NvmlSession

        session = NvmlSession()
        snap = session.snapshot("h")
        session.snapshot("h")
        session.close()
    assert snap.topology == {} and snap.gpus[0].mig_enabled is None
    mig_lines = [r for r in caplog.records if "nvmlDeviceGetMigMode" in r.getMessage()]
    assert len(mig_lines) == 1


def test_processes_with_host_pid_owner_and_memory(nobody_process: int) -> None:
    state = _state(processes=[
        FakeProcess(pid=nobody_process, used_memory=5 * GIB),
        FakeProcess(pid=os.getpid(), used_memory=None, kind="graphics"),
        FakeProcess(pid=nobody_process, used_memory=5 * GIB, kind="graphics"),  # both lists
    ])
    with installed(state):
        procs = read_snapshot("h").gpus[0].processes
    assert [p.pid for p in procs] == [nobody_process, os.getpid()]
    foreign, mine = procs
    assert (foreign.user, foreign.used_memory_bytes, foreign.kind) == ("nobody", 5 * GIB, ProcessKind.COMPUTE)
    assert foreign.command == "sleep"  # its program, never its arguments
    assert mine.used_memory_bytes is None and mine.kind == ProcessKind.GRAPHICS


def test_a_program_name_that_is_not_utf8_is_read_and_stored_with_replacement_marks(tmp_path: Path) -> None:
    """A colleague's program named in Shift_JIS: psutil hands its name over as lone
    surrogates, and the gate event that named it failed every tick's write to the store
    (found by a review as an internationalisation reviewer)."""
    program = Path(os.fsdecode(bytes(tmp_path) + b"/\x8e\xc0\x8c\xb1"))
    shutil.copy("/bin/sleep", program)
    proc = subprocess.Popen([program, "60"])
    try:
        with installed(_state(processes=[FakeProcess(pid=proc.pid, used_memory=GIB)])):
            [seen] = read_snapshot("h").gpus[0].processes
    finally:
        proc.kill()
        proc.wait()
    assert seen.command == "\ufffd" * 4  # each byte that is no UTF-8
    store = Store.open(state_dir=tmp_path)
    try:
        store.record(Event(1.0, "h", "gate", "gpu0", f"closed: foreign process {seen.pid} ({seen.command})"))
        assert seen.command in store.events("h")[0].detail
    finally:
        store.close()


def test_a_secret_on_a_colleagues_command_line_is_never_read(tmp_path: Path) -> None:
    """serve runs as root and published each process's whole command line, a token on
    it included, on pages anyone on its port reads (found by a privacy review)."""
    secret = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                               "--hf-token", "hf_SECRET"])
    try:
        with installed(_state(processes=[FakeProcess(pid=secret.pid, used_memory=GIB)])):
            [seen] = read_snapshot("h").gpus[0].processes
    finally:
        secret.kill()
        secret.wait()
    assert seen.command is not None and seen.command.startswith("python") and "hf_SECRET" not in seen.command


@pytest.mark.parametrize("error", [NOT_SUPPORTED, NO_PERMISSION])
def test_a_process_list_nvml_cannot_give_is_unknown_not_empty(error: int,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """It was read as "no process" (and NO_PERMISSION failed the whole host): the gates then
    saw a free GPU (found by a review as an NVML expert)."""
    state = _state(process_list_error=error, memory_used=30 * GIB)
    with installed(state), caplog.at_level(logging.WARNING, logger="runnerctl.gpus.nvml"):
        first, second = read_snapshot("h").gpus
    assert first.processes == () and first.processes_known is False
    assert second.processes_known is True
    assert any("NVML cannot list GPU 0's compute processes" in r.getMessage() for r in caplog.records)


def test_a_driver_before_r510_lists_processes_with_the_v2_calls() -> None:
    """pynvml's unversioned calls use only _v3 and raise NVMLLibraryMismatchError, no
    NVMLError, where the driver lacks it (nvml.h: _v3 since NVML 11.6, driver R510)."""
    state = _state(processes=[FakeProcess(pid=4242, used_memory=GIB)])
    state.missing = {"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3"}
    with installed(state) as library:
        first = read_snapshot("h").gpus[0]
    assert [p.pid for p in first.processes] == [4242] and first.processes_known
    assert "nvmlDeviceGetComputeRunningProcesses_v2" in library.calls


def test_a_library_and_driver_mismatch_says_to_reboot() -> None:
    state = _state()
    state.init_error = LIB_RM_VERSION_MISMATCH
    with installed(state), pytest.raises(GpuError) as caught:
        read_snapshot("h")
    assert "driver upgrade without a reboot" in str(caught.value)


def test_many_processes_use_the_two_call_protocol() -> None:
    state = _state(processes=[FakeProcess(pid=100000 + i, used_memory=i) for i in range(40)])
    with installed(state) as library:
        procs = read_snapshot("h").gpus[0].processes
    assert [p.used_memory_bytes for p in procs] == list(range(40))
    assert all(p.user is None for p in procs)  # pids that do not exist here: owner unknown
    # GPU 0: size query + fill; GPU 1 (no process): one call answered SUCCESS with count 0
    assert library.calls.count("nvmlDeviceGetComputeRunningProcesses_v3") == 3


@pytest.mark.parametrize("error", [GPU_IS_LOST, UNKNOWN])
def test_vanished_gpu_is_marked_lost_and_others_still_read(error: int) -> None:
    state = _state()
    with installed(state):
        assert not read_snapshot("h").gpus[1].lost
        state.gpus[1].lost, state.gpus[1].lost_error = True, error
        first, second = read_snapshot("h").gpus
    assert second.lost and second.healthy is False and second.utilization is None
    assert not first.lost and first.uuid == "GPU-0000"


def test_mig_on_and_ecc_errors_mark_health() -> None:
    state = _state(mig=True, util_gpu=None, ecc_uncorrected=3)
    with installed(state):
        first = read_snapshot("h").gpus[0]
    assert first.mig_enabled is True and first.utilization is None
    assert first.ecc_uncorrected_errors == 3 and first.healthy is False


def test_driver_not_loaded_is_a_clear_gpu_error() -> None:
    state = _state()
    state.init_error = DRIVER_NOT_LOADED
    with installed(state), pytest.raises(GpuError) as caught:
        read_snapshot("h")
    assert "Driver Not Loaded" in str(caught.value) and "nvidia-smi" in str(caught.value)


def test_fake_refuses_calls_before_init() -> None:
    with installed(_state()), pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_gpu_source_nvml_uses_the_door() -> None:
    with installed(_state()):
        snap = open_gpu_source("nvml", host="gpu-z").snapshot()
    assert [g.uuid for g in snap.gpus] == ["GPU-0000", "GPU-1111"] and snap.host == "gpu-z"


def test_live_source_counts_hardware_xids_between_snapshots(caplog: pytest.LogCaptureFixture) -> None:
    state = _state()
    with installed(state):
        source = open_gpu_source("nvml", host="h", watch_xid=True)
        first = source.snapshot()
        assert [g.xid_errors for g in first.gpus] == [0, 0]  # watched from now on, none yet
        state.raise_xid(1, 79)  # fallen off the bus: hardware
        state.raise_xid(1, 13)  # graphics engine exception: the application's own fault
        state.raise_xid(0, 31)  # MMU fault: the application's
        with caplog.at_level(logging.INFO, logger="runnerctl.gpus.nvml"):
            second = source.snapshot()
        state.raise_xid(1, 48)
        third = source.snapshot()
    assert [g.xid_errors for g in second.gpus] == [0, 1]
    assert second.gpus[1].healthy is False and second.gpus[0].healthy is True
    assert [g.xid_errors for g in third.gpus] == [0, 2]
    messages = [r.getMessage() for r in caplog.records]
    assert any("Xid 79 (hardware" in m for m in messages)
    assert any("Xid 13 (application fault" in m for m in messages)


def test_a_gpu_lost_while_watched_leaves_the_others_readable() -> None:
    """The event wait answers GPU_IS_LOST once a watched GPU fell off the bus: that failed
    every snapshot of the whole host (found by a review as an NVML expert), and the other
    GPUs' Xids must still be counted afterwards."""
    state = _state()
    with installed(state):
        source = open_gpu_source("nvml", host="h", watch_xid=True)
        source.snapshot()
        state.gpus[1].lost = True
        first, second = source.snapshot().gpus
        state.raise_xid(0, 48)  # after the loss, on a GPU still here
        again = source.snapshot()
    assert second.lost and not first.lost
    assert first.xid_errors is None  # the dropped set's events are unknown, not none
    assert [g.lost for g in again.gpus] == [False, True]
    assert again.gpus[0].xid_errors == 1 and again.gpus[0].healthy is False


def test_xid_events_unsupported_stay_unknown() -> None:
    state = _state(events_supported=False)
    with installed(state):
        source = open_gpu_source("nvml", host="h", watch_xid=True)
        source.snapshot()
        state.raise_xid(0, 79)  # nobody registered: NVML does not deliver it
        snap = source.snapshot()
    assert snap.gpus[0].xid_errors is None and snap.gpus[1].xid_errors == 0


def test_one_shot_read_does_not_claim_zero_xids() -> None:
    with installed(_state()) as library:
        snap = read_snapshot("h")
    assert [g.xid_errors for g in snap.gpus] == [None, None]
    assert "nvmlEventSetCreate" not in library.calls


def test_live_source_reopens_after_an_nvml_failure() -> None:
    state = _state()
    with installed(state) as library:
        source = open_gpu_source("nvml", host="h", watch_xid=True)
        source.snapshot()
        library.initialised = False  # the driver was reloaded under us
        with pytest.raises(GpuError):
            source.snapshot()
        assert len(source.snapshot().gpus) == 2
    assert library.calls.count("nvmlInitWithFlags") + library.calls.count("nvmlInit_v2") == 2


def test_a_driver_upgraded_without_a_reboot_says_so_in_the_live_snapshot(tmp_path: Path) -> None:
    """Unattended upgrades replaced libnvidia-ml.so.1 while the kernel kept the old module:
    every job's nvmlInit failed with 'Driver/library version mismatch', while serve, still
    on the library it loaded at its start, read NVML as before and kept every runner open
    (found by a review as an NVML expert, left for later, taken up now). The snapshot
    keeps every reading and names the problem."""
    lib = tmp_path / "lib"
    lib.mkdir()
    for version in ("550.54.15", "570.86.10"):
        (lib / f"libnvidia-ml.so.{version}").write_bytes(b"")
    (lib / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.550.54.15")
    maps = tmp_path / "maps"
    maps.write_text("55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 42   /usr/bin/python3.11\n"
                    f"7f12a4000000-7f12a4100000 r-xp 00000000 08:01 4242 {lib}/libnvidia-ml.so.550.54.15\n")
    state = _state()
    with installed(state):  # the fake's kernel driver: 550.54.15
        source = nvml.LiveNvml("h", maps=maps)
        first = source.snapshot()
        assert first.host_problem == "" and len(first.gpus) == 2
        (lib / "libnvidia-ml.so.1").unlink()  # the upgrade: a new library, the old module still loaded
        (lib / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.570.86.10")
        maps.write_text(maps.read_text().replace(".550.54.15\n", ".550.54.15 (deleted)\n"))
        upgraded = source.snapshot()
        assert upgraded.host_problem.startswith("the NVIDIA library on disk is 570.86.10 but the kernel "
                                                "driver is 550.54.15 (a driver upgrade without a reboot)")
        assert "reboot, or reload the nvidia kernel modules" in upgraded.host_problem
        assert [g.uuid for g in upgraded.gpus] == [g.uuid for g in first.gpus]  # its readings stay
        state.driver_version = "570.86.10"  # rebooted into the new module
        assert source.snapshot().host_problem == ""


def test_a_library_not_named_by_its_version_or_none_loaded_says_nothing(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text("55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 42   /usr/bin/python3.11\n")
    assert nvml.library_mismatch("550.54.15", maps) == ""  # NVML faked, or no driver: no library mapped
    assert nvml.library_mismatch("550.54.15", tmp_path / "no-maps") == ""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libnvidia-ml.so.1").write_bytes(b"")  # a distribution's file with no version in its name
    maps.write_text(f"7f12a4000000-7f12a4100000 r-xp 00000000 08:01 4242 {lib}/libnvidia-ml.so.1\n")
    assert nvml.library_mismatch("550.54.15", maps) == ""
    (lib / "libnvidia-ml.so.1").unlink()
    (lib / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.570.86.10")
    assert nvml.library_mismatch(None, maps) == ""  # the driver's version unknown
    assert nvml.library_mismatch("550.54.15", maps).startswith("the NVIDIA library on disk is 570.86.10")


def _real_nvml_present() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.real_gpu
@pytest.mark.skipif(not _real_nvml_present(), reason="needs the NVIDIA driver and a GPU")
def test_real_gpu_inventory() -> None:
    snap = read_snapshot()
    assert snap.gpus, "the driver is present but NVML lists no GPU"
    for gpu in snap.gpus:
        assert gpu.uuid.startswith(("GPU-", "MIG-"))
        assert gpu.memory_total_bytes and gpu.memory_total_bytes > 0
        assert gpu.utilization is None or 0.0 <= gpu.utilization <= 1.0
    assert snap.driver_version


@pytest.mark.real_gpu
@pytest.mark.skipif(not _real_nvml_present(), reason="needs the NVIDIA driver and a GPU")
def test_real_gpu_live_source_watches_xid() -> None:
    source = open_gpu_source("nvml", watch_xid=True)
    first, second = source.snapshot(), source.snapshot()
    assert [g.uuid for g in first.gpus] == [g.uuid for g in second.gpus]
    for gpu in second.gpus:  # a healthy machine: watched and clean, or not supported
        assert gpu.xid_errors in (0, None)
