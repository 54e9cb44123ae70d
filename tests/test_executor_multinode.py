"""Multi-node batch jobs (executors/rendezvous.py): MPI allreduce and a torchrun-style
rendezvous on the real two-node Slurm partition `multi` and on the real Grid Engine, and
the rendezvous variables under the PBS and PJM stand-ins."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from runnerctl.executors.pbs import Pbs
from runnerctl.executors.pjm import Pjm
from runnerctl.executors.rendezvous import setup_bash
from runnerctl.executors.sge import GridEngine
from runnerctl.pipelines import render
from tests.harness_custom_executor import FakeJob, harness_for, make_host

RENDEZVOUS = Path(__file__).parent / "data" / "rendezvous.py"
FAKES = Path(__file__).parent / "fakes"
MPI_ENV = ("export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,tcp "
           "OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_plm_rsh_agent=false")
# Rank 0 alone prints: every rank's sum is 1 + 2 = 3 only if both took part, and two
# ranks printing at once may interleave their lines in mpirun's forwarded output.
ALLREDUCE = ("/usr/bin/python3 -c 'from mpi4py import MPI; c = MPI.COMM_WORLD; "
             "total = c.allreduce(c.Get_rank() + 1); "
             "c.Get_rank() == 0 and print(\"allreduce\", c.Get_size(), total, flush=True)'")


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return make_host(tmp_path)


def test_two_slurm_nodes_run_one_job_with_mpi_and_a_rendezvous(host: Path) -> None:
    harness = harness_for(host, (0, 1), "slurm")
    job = FakeJob(id=950, variables={"RUNNERCTL_NODES": "2", "SCHEDULER_PARAMETERS": "--partition=multi"})
    body = (f"{MPI_ENV}\n"
            'echo "world=$WORLD_SIZE master=$MASTER_ADDR port=$MASTER_PORT rank=$NODE_RANK '
            'nodes=$(paste -sd, "$RUNNERCTL_NODEFILE")"\n'
            f"srun --mpi=pmix --ntasks-per-node=1 {ALLREDUCE}\n"
            f'"$RUNNERCTL_EACH_NODE" /usr/bin/python3 {RENDEZVOUS}\n')
    results = harness.run_job(job, body, timeout=120)
    build = results["build_script"]
    assert build.code == 0, build.output
    assert "world=2 master=127.0.0.1 " in build.output and "nodes=node1,node2" in build.output
    port = int(build.output.split("port=")[1].split()[0])
    assert 20000 <= port < 40000
    assert build.output.count("allreduce 2 3") == 1, build.output  # 1 + 2: both ranks took part
    assert "rendezvous world=2 met=0:node1,1:node2 sum=1" in build.output, build.output
    assert "rank 1 got sum=1" in build.output


def test_grid_engine_parallel_job_runs_an_mpi_allreduce(host: Path) -> None:
    harness = harness_for(host, (3,), "sge")
    job = FakeJob(id=951, variables={"SCHEDULER_PARAMETERS": "-pe smp 2"})
    body = (f"{MPI_ENV}\n"
            'echo "world=$WORLD_SIZE slots=$NSLOTS master=$MASTER_ADDR rank=$NODE_RANK"\n'
            f'mpirun -np "$NSLOTS" {ALLREDUCE}\n')
    results = harness.run_job(job, body, timeout=120)
    build = results["build_script"]
    assert build.code == 0, build.output
    assert "world=1 slots=2 master=" in build.output and "rank=0" in build.output
    assert build.output.count("allreduce 2 3") == 1, build.output


def test_grid_engine_refuses_runnerctl_nodes_with_a_pointer_to_pe(host: Path) -> None:
    harness = harness_for(host, (3,), "sge")
    results = harness.run_job(FakeJob(id=952, variables={"RUNNERCTL_NODES": "2"}), "echo never")
    build = results["build_script"]
    assert build.code != 0 and "-pe mpi 2" in build.output and "never" not in build.output.split("-pe")[0]


@pytest.mark.parametrize("driver", ["pbs", "pjm"])
def test_stand_ins_give_the_same_rendezvous_variables(host: Path, driver: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{FAKES / 'bin' / driver}:{os.environ['PATH']}")
    monkeypatch.setenv("RUNNERCTL_FAKE_BATCH", str(tmp_path / "fake"))
    harness = harness_for(host, (0, 1), driver)
    results = harness.run_job(FakeJob(id=953, variables={"RUNNERCTL_NODES": "2"}),
                              'echo "world=$WORLD_SIZE master=$MASTER_ADDR rank=$NODE_RANK '
                              'nodes=$(paste -sd, "$RUNNERCTL_NODEFILE") each=${RUNNERCTL_EACH_NODE:+set}"')
    build = results["build_script"]
    assert build.code == 0, build.output
    assert "world=2 master=node1 rank=0 nodes=node1,node2 each=set" in build.output


def test_a_bad_node_count_fails_with_one_clear_line(host: Path) -> None:
    harness = harness_for(host, (0,), "slurm")
    results = harness.run_job(FakeJob(id=954, variables={"RUNNERCTL_NODES": "two"}), "echo never")
    build = results["build_script"]
    assert build.code != 0
    assert "RUNNERCTL_NODES='two' is not a number of nodes" in build.output
    assert "Traceback" not in build.output


def test_optuna_sweep_with_its_database_inside_a_two_node_slurm_job(host: Path, tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[1]
    dump = tmp_path / "artifacts"
    harness = harness_for(host, (0, 1), "slurm")
    job = FakeJob(id=955, variables={"RUNNERCTL_NODES": "2", "SCHEDULER_PARAMETERS": "--partition=multi",
                                     "OPTUNA_DUMP_DIR": str(dump), "SEARCH_SLEEP_S": "0.05"})
    bindir = Path(sys.executable).parent
    body = (f'export PATH={bindir}:"$PATH"\n'
            f"{repo / 'examples/hpc/optuna-in-job.sh'} sweep 12 {sys.executable} "
            f"{repo / 'examples/optuna-sweep/search.py'}\n")
    results = harness.run_job(job, body, timeout=240)
    build = results["build_script"]
    assert build.code == 0, build.output
    assert "12 trials over 2 nodes" in build.output
    workers = [line for line in build.output.splitlines() if line.startswith("worker ")]
    assert len(workers) == 2, build.output  # one per node, both joined the study
    ran = sum(int(line.split(" ran ")[1].split()[0]) for line in workers)
    assert ran >= 12
    sql = (dump / "optuna-sweep.sql").read_text()
    copy = sql.split("COPY public.trials ")[1].split("\n\\.\n")[0].splitlines()[1:]
    first = sum("COMPLETE" in row for row in copy)
    assert first >= 12  # the artifacts hold the study
    # the next job finds the dump and goes on with the study, as seed 000 kept its database
    again = FakeJob(id=957, variables=job.variables)
    results = harness.run_job(again, body.replace(" sweep 12 ", " sweep 20 "), timeout=240)
    build = results["build_script"]
    assert build.code == 0, build.output
    assert f"study sweep resumed from {dump / 'optuna-sweep.sql'}" in build.output
    more = sum(int(line.split(" ran ")[1].split()[0]) for line in build.output.splitlines()
               if line.startswith("worker "))
    assert 0 < more <= 20 - first + 2, build.output  # only the trials still to do (2 workers may overshoot)
    sql = (dump / "optuna-sweep.sql").read_text()
    copy = sql.split("COPY public.trials ")[1].split("\n\\.\n")[0].splitlines()[1:]
    assert sum("COMPLETE" in row for row in copy) >= 20


def test_the_hpc_batch_job_component_runs_across_two_slurm_nodes(host: Path) -> None:
    pipeline = yaml.safe_load(render("hpc-batch-job", {
        "command": 'echo "world=$WORLD_SIZE"; srun printenv SLURMD_NODENAME | sort | paste -sd, -',
        "nodes": "2", "scheduler_parameters": "--partition=multi"}))
    job = pipeline["hpc-batch-job"]
    harness = harness_for(host, (0,), "slurm")
    fake = FakeJob(id=956, variables={k: str(v) for k, v in job["variables"].items()})
    results = harness.run_job(fake, "\n".join(job["script"]), timeout=120)
    build = results["build_script"]
    assert build.code == 0, build.output
    assert "world=2" in build.output and "node1,node2" in build.output, build.output


CLEAN_LOGIN = """#!/bin/bash
# ssh as Open MPI's rsh launcher uses it: options, the host, the command; the command runs
# as sshd runs a non-interactive one, in a fresh login environment. Every "node" is this
# host, with a /tmp of its own as a node has (the daemons' session directories collided)
while [ "${1#-}" != "$1" ]; do shift; done
node_tmp="$(dirname "$0")/tmp-$1"
mkdir -p "$node_tmp"
shift
exec env -i PATH="$PATH" HOME="$HOME" TMPDIR="$node_tmp" bash -c "$*"
"""


@pytest.mark.parametrize("driver", ["pbs", "pjm", "sge"])
def test_every_node_gets_the_rendezvous_variables_under_real_mpirun(driver: str, tmp_path: Path) -> None:
    """Open MPI passes the other nodes only OMPI_ variables and those named with -x
    (mpirun(1)); without them every rank's torchrun got an empty MASTER_ADDR (found by a
    review as an HPC user). As srun does, it passes the job's own variables too, but not
    those of one node. Real mpirun, two node names it reaches through a clean login."""

    agent = tmp_path / "ssh"
    agent.write_text(CLEAN_LOGIN)
    agent.chmod(0o755)
    hosts = tmp_path / "hosts"
    hosts.write_text({"pbs": "nodeA\nnodeA\nnodeB\n", "pjm": "nodeA\nnodeB\n",
                      "sge": "nodeA 2 all.q@nodeA UNDEFINED\nnodeB 2 all.q@nodeB UNDEFINED\n"}[driver])
    launch = {"pbs": Pbs, "pjm": Pjm, "sge": GridEngine}[driver].node_launch
    scheduler_env = {"pbs": f"PBS_NODEFILE={hosts} PBS_JOBID=4242.server",
                     "pjm": f"PJM_O_NODEINF={hosts} PJM_JOBID=4242",
                     "sge": f"PE_HOSTFILE={hosts} JOB_ID=4242"}[driver]
    script = (f"{MPI_ENV.replace('OMPI_MCA_plm_rsh_agent=false', f'OMPI_MCA_plm_rsh_agent={agent}')} "
              # both "nodes" are this host: their daemons' hwloc shared-memory topologies
              # (rtc hwloc) would collide, and one crashed now and then
              f"OMPI_MCA_oob_tcp_if_include=lo OMPI_MCA_rtc_hwloc_vmhole=none {scheduler_env}\n"
              + setup_bash(launch, nodefile=tmp_path / "nodes", each_node=tmp_path / "each")
              + "export HF_HOME='/scratch/a b' CUDA_VISIBLE_DEVICES=GPU-first-node\n"
              + '"$RUNNERCTL_EACH_NODE" sh -c \'echo "rank=$NODE_RANK world=$WORLD_SIZE '
                'master=$MASTER_ADDR port=$MASTER_PORT nodes=$(paste -sd, "$RUNNERCTL_NODEFILE") '
                'hf=$HF_HOME cvd=${CUDA_VISIBLE_DEVICES-unset}"\'\n')
    ran = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 0, ran.stderr
    assert sorted(ran.stdout.splitlines()) == [
        f"rank={rank} world=2 master=nodeA port=24242 nodes=nodeA,nodeB hf=/scratch/a b cvd=unset"
        for rank in (0, 1)], ran.stdout
