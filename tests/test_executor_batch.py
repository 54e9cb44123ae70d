"""Issue 18's acceptance for every batch driver, driven as gitlab-runner drives the stages.

slurm and sge run against the real Slurm and Grid Engine that .ci/setup/slurm.sh and
gridengine.sh start (a missing one fails the test, no skip); pbs and pjm against the
stand-ins in tests/fakes (OpenPBS and Fujitsu PJM do not install here), put first on
PATH with their own job table per test.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import batch_acceptance
from tests.batch_acceptance import Cluster
from tests.harness_custom_executor import make_host

FAKES = Path(__file__).parent / "fakes"


def _out(*command: str) -> str:
    return subprocess.run(list(command), capture_output=True, text=True, check=False, timeout=60).stdout


def _delete(*command: str) -> None:
    subprocess.run(list(command), check=True, capture_output=True, timeout=60)


def _sge_jobs(label: str) -> list[str]:
    return [line.split()[1] for line in _out("qstat", "-j", label).splitlines()
            if line.startswith("job_number:")]


def _pjm_jobs(label: str) -> list[str]:
    return [row.split()[0] for row in _out("pjstat").splitlines()[1:] if row.split()[1:2] == [label]]


CLUSTERS = {
    "slurm": Cluster(driver="slurm", title="Slurm", jobs=lambda label: _out("squeue", "-h", "-n", label,
                                                                             "-o", "%i").split(),
                     admin_delete=lambda job: _delete("scancel", job),
                     limit_probe='scontrol show job "$SLURM_JOB_ID" | grep -o "TimeLimit=[^ ]*"',
                     limit_seen="TimeLimit=00:02:00"),
    "sge": Cluster(driver="sge", title="Grid Engine", jobs=_sge_jobs,
                   admin_delete=lambda job: _delete("qdel", job),
                   limit_probe='qstat -j "$JOB_ID" | grep -o "h_rt=[0-9]*"', limit_seen="h_rt=120"),
    "pbs": Cluster(driver="pbs", title="PBS", jobs=lambda label: _out("qselect", "-N", label).split(),
                   admin_delete=lambda job: _delete("qdel", job),
                   limit_probe='qstat -f "$PBS_JOBID" | grep -o "walltime = .*"',
                   limit_seen="walltime = 0:02:00"),
    "pjm": Cluster(driver="pjm", title="PJM", jobs=_pjm_jobs,
                   admin_delete=lambda job: _delete("pjdel", job),
                   limit_probe='pjstat "$PJM_JOBID" | tail -n 1 | awk \'{print "elapse=" $8}\'',
                   limit_seen="elapse=0000:02:00"),
}


@pytest.fixture(params=sorted(CLUSTERS))
def cluster(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
            ) -> Iterator[Cluster]:
    name = str(request.param)
    if name in ("pbs", "pjm"):
        monkeypatch.setenv("PATH", f"{FAKES / 'bin' / name}:{os.environ['PATH']}")
        monkeypatch.setenv("RUNNERCTL_FAKE_BATCH", str(tmp_path / f"fake-{name}"))
    elif name == "slurm":
        assert "gpu:8" in _out("sinfo", "-h", "-o", "%G"), "Slurm is not running: bash .ci/setup/slurm.sh"
    else:
        assert "gpu=8" in _out("qhost", "-F", "gpu"), "Grid Engine is not running: .ci/setup/gridengine.sh"
    yield CLUSTERS[name]
    if name in ("pbs", "pjm"):  # end what a failed test left running in the stand-in
        from tests.fakes import batch_engine

        for job in batch_engine.all_jobs():
            batch_engine.delete(job["id"], by="test teardown")


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return make_host(tmp_path)


def test_exit_3_is_a_build_failure_with_3_recorded_and_the_timeout_as_limit(host: Path, cluster: Cluster
                                                                            ) -> None:
    batch_acceptance.exit_code_is_a_build_failure(host, cluster)


def test_sigterm_cancels_the_batch_job_and_the_lease_names_its_gpus(host: Path, cluster: Cluster) -> None:
    batch_acceptance.sigterm_cancels_and_lease_holds_the_gpus(host, cluster)


def test_batch_job_deleted_by_an_admin_is_a_system_failure(host: Path, cluster: Cluster) -> None:
    batch_acceptance.admin_delete_is_a_system_failure(host, cluster)


def test_more_gpus_than_any_node_has_fail_at_once(host: Path, cluster: Cluster) -> None:
    batch_acceptance.too_many_gpus_fail_at_once(host, cluster)


def test_killed_drivers_batch_job_is_reaped_by_the_next_prepare(host: Path, cluster: Cluster) -> None:
    batch_acceptance.killed_driver_is_reaped_by_next_prepare(host, cluster)


def test_pbs_and_pjm_parameters_keep_all_but_gpus_nodes_and_bookkeeping() -> None:
    from runnerctl.executors import pbs, pjm

    kept, dropped = pbs.scheduler_parameters("-q gpu -l select=2:ngpus=4 -l walltime=1:00:00 -N x "
                                             "-W block=true -A proj -V")
    assert kept == ["-q", "gpu", "-l", "walltime=1:00:00", "-A", "proj"]
    assert dropped == ["-l", "select=2:ngpus=4", "-N", "x", "-W", "block=true", "-V"]
    kept, dropped = pjm.scheduler_parameters('-L rscgrp=small -L node=4,gpu=8 --mpi "proc=8" -j '
                                             "-L elapse=1:00:00 -N x")
    assert kept == ["-L", "rscgrp=small", "--mpi", "proc=8", "-L", "elapse=1:00:00"]
    assert dropped == ["-L", "node=4,gpu=8", "-j", "-N", "x"]
    assert pbs.scheduler_parameters("-lselect=1:ngpus=8 -J 0-63 -- exe -q gpu") == (
        ["-q", "gpu"], ["-lselect=1:ngpus=8", "-J", "0-63", "--", "exe"])
    assert pjm.scheduler_parameters("-Lgpu=8 --bulk --sparam 0-63 -g lab") == (
        ["-g", "lab"], ["-Lgpu=8", "--bulk", "--sparam", "0-63"])
