"""Simulated GPUs listing real processes, for the tests that compare the executors' gate
with the controller's (test_executor_gate, test_observe)."""

from __future__ import annotations

from pathlib import Path

from runnerctl.gpus import open_gpu_source
from runnerctl.model import GpuSnapshot


def sim_snapshot(tmp_path: Path, placed: dict[int, list[int]]) -> GpuSnapshot:
    """Eight simulated GPUs on gpu-a, GPU -> the pids listed on it (a sim:PATH source)."""
    rows = "".join(f"  - {{gpu: {gpu}, pid: {pid}}}\n" for gpu, pids in placed.items() for pid in pids)
    (tmp_path / "gpus.yaml").write_text(f"host: gpu-a\ngpus: 8\nprocesses:\n{rows}")
    return open_gpu_source(f"sim:{tmp_path / 'gpus.yaml'}", host="gpu-a").snapshot()
