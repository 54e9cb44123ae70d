"""Simulated GPU sources: `sim:N` and the YAML file that tests and the demo edit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runnerctl.errors import ConfigError, GpuError
from runnerctl.gpus import open_gpu_source
from runnerctl.model import TopologyLevel


def test_sim_count_is_idle_with_stable_uuids() -> None:
    first = open_gpu_source("sim:4", host="h").snapshot()
    second = open_gpu_source("sim:4", host="h").snapshot()
    assert [g.uuid for g in first.gpus] == [g.uuid for g in second.gpus]
    assert len({g.uuid for g in first.gpus}) == 4
    assert all(g.processes == () and g.utilization == 0.0 for g in first.gpus)
    assert first.level(0, 1) == TopologyLevel.SINGLE
    assert first.level(0, 3) == TopologyLevel.HOSTBRIDGE
    other_host = open_gpu_source("sim:4", host="h2").snapshot()
    assert other_host.gpus[0].uuid != first.gpus[0].uuid


def test_sim_file_is_reread_for_each_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text("host: gpu-a\ngpus: 2\n")
    source = open_gpu_source(f"sim:{path}", host="ignored")
    assert source.snapshot().gpus[1].processes == ()
    path.write_text(
        "host: gpu-a\ngpus: 2\nprocesses:\n"
        "  - {gpu: 1, pid: 4242, user: alice, memory: 2GiB, command: python train.py}\n"
    )
    snap = source.snapshot()
    assert snap.host == "gpu-a"
    (proc,) = snap.gpus[1].processes
    assert (proc.pid, proc.user, proc.used_memory_bytes) == (4242, "alice", 2 * 1024**3)


def test_sim_file_process_without_user_is_looked_up(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(f"gpus:\n  - processes: [{{pid: {os.getpid()}}}]\n")
    (proc,) = open_gpu_source(f"sim:{path}").snapshot().gpus[0].processes
    assert proc.user is not None and proc.command


def test_sim_file_fields_and_unknown_utilization(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(
        "gpus:\n  - {utilization: null, mig: true, ecc_uncorrected: 2, memory_used: 1.5GiB}\n"
        "  - {lost: true}\n"
    )
    first, second = open_gpu_source(f"sim:{path}").snapshot().gpus
    assert first.utilization is None and first.mig_enabled is True
    assert first.memory_used_bytes == int(1.5 * 1024**3)
    assert first.healthy is False and second.lost and second.healthy is False


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("gpus: [\n", "not valid YAML"),
        ("- 1\n- 2\n", "must be a mapping"),
        ("gpus: 2\nprocesses: [{gpu: 5, pid: 1}]\n", "GPU 5"),
        ("gpus: [{memory_used: lots}]\n", "not a size"),
    ],
)
def test_bad_sim_files_are_clear_errors(tmp_path: Path, content: str, needle: str) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(content)
    with pytest.raises(GpuError, match=needle):
        open_gpu_source(f"sim:{path}").snapshot()


def test_missing_sim_file(tmp_path: Path) -> None:
    with pytest.raises(GpuError, match="cannot read"):
        open_gpu_source(f"sim:{tmp_path / 'nope.yaml'}").snapshot()


@pytest.mark.parametrize("spec", ["", "sim:", "sim:0", "sim:999", "cuda", "nvml:x"])
def test_bad_source_specs(spec: str) -> None:
    with pytest.raises(ConfigError):
        open_gpu_source(spec)


def test_only_a_watching_reader_knows_the_xid_count(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text("gpus:\n  - {xid: 3}\n  - {}\n")
    watched = open_gpu_source(f"sim:{path}", watch_xid=True).snapshot().gpus
    once = open_gpu_source(f"sim:{path}").snapshot().gpus
    assert [g.xid_errors for g in watched] == [3, 0] and [g.healthy for g in watched] == [False, True]
    assert [g.xid_errors for g in once] == [None, None] and [g.healthy for g in once] == [None, None]
