"""The sge driver against the real single-node Grid Engine that .ci/setup/gridengine.sh starts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from runnerctl.executors.sge import scheduler_parameters
from tests.harness_custom_executor import FakeJob, harness_for, make_host


@pytest.fixture(scope="module", autouse=True)
def gridengine() -> None:
    result = subprocess.run(["qhost", "-F", "gpu"], capture_output=True, text=True, timeout=30,
                            check=False)
    assert result.returncode == 0 and "gpu=8" in result.stdout, result.stdout + result.stderr  # no skip


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return make_host(tmp_path)



def test_scheduler_parameters_that_slipped_past_a_list_of_dangers_are_dropped() -> None:
    kept, dropped = scheduler_parameters("-lgpu=8 -t 1-64 -@ opts -q gpu.q -pe mpi 2 -l")
    assert kept == ["-q", "gpu.q", "-pe", "mpi", "2"]
    assert dropped == ["-lgpu=8", "-t", "1-64", "-@", "opts", "-l"]  # a trailing -l would take the script


def test_scheduler_parameters_keep_all_but_gpus_and_bookkeeping() -> None:
    kept, dropped = scheduler_parameters("-pe smp 4 -l gpu=2 -q all.q -N mine -l h_rt=60 -cwd "
                                         "-o /x -l mem_free=1G,gpu=1 -sync y")
    assert kept == ["-pe", "smp", "4", "-q", "all.q", "-l", "h_rt=60"]
    assert dropped == ["-l", "gpu=2", "-N", "mine", "-cwd", "-o", "/x", "-l", "mem_free=1G,gpu=1",
                       "-sync", "y"]


def test_job_runs_with_the_gpus_the_driver_picked(host: Path) -> None:
    harness = harness_for(host, (5, 6), "sge")
    job = FakeJob(id=910, variables={"CUDA_VISIBLE_DEVICES": "0", "SCHEDULER_PARAMETERS": "-l gpu=8 -N x"})
    results = harness.run_job(job, 'echo "cuda=$CUDA_VISIBLE_DEVICES job=$JOB_ID"; '
                                   'qstat -j "$JOB_ID" | grep -o "gpu=[0-9]*"')
    build = results["build_script"]
    assert build.code == 0, build.output
    assert "cuda=5,6 job=" in build.output and "gpu=2" in build.output
    assert "ignoring SCHEDULER_PARAMETERS -l gpu=8 -N x" in build.output
