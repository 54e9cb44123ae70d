"""Simulated GPU sources: `sim:N` and the YAML file that tests and the demo edit."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from runnerctl.cli import main
from runnerctl.controller.gate import GateThresholds
from runnerctl.errors import ConfigError, GpuError
from runnerctl.exporter.standalone import Observer
from runnerctl.gpus import open_gpu_source
from runnerctl.model import TopologyLevel
from tests.conftest import defaults_toml
from tests.test_cli_validation import one_line


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
        ("gpus: 2\nprocesses: [{gpu: 5, pid: 1}]\n", "processes[0].gpu is 5, not the index of a GPU"),
        ("gpus: [{memory_used: lots}]\n", "not a size"),
    ],
)
def test_bad_sim_files_are_clear_errors(tmp_path: Path, content: str, needle: str) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(content)
    with pytest.raises(GpuError, match=re.escape(needle)):
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


@pytest.mark.parametrize(("content", "needle"), [
    ('gpus: "abc"\n', "gpus is 'abc', not a whole number from 0 to 64 or a list of at most 64 GPU mappings"),
    ("gpus: -3\n", "gpus is -3, not a whole number from 0 to 64"),
    ("gpus: 1000\n", "gpus is 1000, not a whole number from 0 to 64"),
    ("gpus: 100000000\n", "gpus is 100000000, not a whole number from 0 to 64"),
    ("gpus: {a: 1}\n", "gpus is {'a': 1}, not a whole number"),
    ("gpus: [1, 2]\n", "gpus[0] is 1, not a mapping"),
    ("gpus: 1\nprocesses: [{gpu: 0, pid: .inf}]\n", "processes[0].pid is inf, not a whole number from 1 to"),
    ("gpus: 1\nprocesses: [{gpu: 0}]\n", "processes[0].pid is missing (a process id from 1 to"),
    ("gpus: 1\nprocesses: [{pid: 7}]\n", "processes[0].gpu is missing (the index of a GPU in `gpus`)"),
    ('gpus: [{xid: "lots"}]\n', "gpus[0].xid is 'lots', not a whole number from 0 to"),
    ("gpus: [{utilization: 7}]\n", "gpus[0].utilization is 7, not a ratio from 0 to 1 (or null: unknown)"),
    ("gpus: [{index: 1}, {}]\n", "gpus[1].index is 1, not unique (gpus[0] has it too)"),
    ("gpus: [{index: -1}]\n", "gpus[0].index is -1, not a whole number from 0 to 63"),
    ("gpus: [{mig: 2}]\n", "gpus[0].mig is 2, not true or false"),
    ("gpus: [{utilisation: 0.5}]\n", "a key of gpus[0] is 'utilisation', not one of index, uuid"),
    ("gpus: [{processes: [{pid: 1, kind: x}]}]\n",
     "gpus[0].processes[0].kind is 'x', not compute or graphics"),
    ("gpus: [{memory_used: 99999999999999999999TiB}]\n", "gpus[0].memory_used is '9999"),
    ("gpus: 2\ntopology: [[0, 1, FOO]]\n", "topology[0] is [0, 1, 'FOO'], not [GPU, GPU, LEVEL] of two GPUs"),
    ("gpus: 2\ntopology: [5]\n", "topology[0] is 5, not [GPU, GPU, LEVEL]"),
    ("gpus: " + "9" * 5000 + "\n", "is not valid YAML: Exceeds the limit"),
    ('host: "gpu-a,gpus:8"\ngpus: 1\n', "host is 'gpu-a,gpus:8', not a host name (1 to 63 letters"),
    ('host: "a/b"\ngpus: 1\n', "host is 'a/b', not a host name"),
])
def test_every_bad_sim_file_is_one_line_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         content: str, needle: str) -> None:
    """Each of these was a traceback, a MemoryError, or silently taken (`gpus: 1000`,
    a 700 % utilization): now one line naming the file, the entry and the field."""
    path = tmp_path / "gpus.yaml"
    path.write_text(content)
    code = main(["status", "--gpu-source", f"sim:{path}", "--config", str(defaults_toml(tmp_path)),
                 "--runner-config", str(tmp_path / "config.toml")])
    err = one_line(capsys, code, 5, f"simulated GPU file {path}")
    assert needle in err, err


def test_a_sim_file_that_is_not_utf8_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_bytes(b"host: \xff\xfe\ngpus: 1\n")
    code = main(["status", "--gpu-source", f"sim:{path}", "--config", str(defaults_toml(tmp_path))])
    one_line(capsys, code, 5, f"simulated GPU file {path} is not UTF-8 text")


def test_a_bad_sim_file_is_a_warning_per_tick_for_the_exporter(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """The exporter reads the file every tick: a bad one is a logged line, no traceback,
    and the next good read is used again."""
    path = tmp_path / "gpus.yaml"
    path.write_text("gpus: [{utilization: 7}]\n")
    observer = Observer(host="gpu-a", gpus=open_gpu_source(f"sim:{path}", watch_xid=True), held=dict,
                        is_ci=lambda proc: False, limits=GateThresholds.from_settings())
    observer.tick()
    (record,) = [r for r in caplog.records if "cannot read GPUs" in r.getMessage()]
    assert record.exc_info is None and "gpus[0].utilization is 7" in record.getMessage()
    path.write_text("gpus: 2\n")
    assert observer.tick() is not None and len(observer.gate) == 2
