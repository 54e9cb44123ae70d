"""Multi-node batch jobs: one batch job across nodes, with rendezvous variables of one name.

A job sets `RUNNERCTL_NODES=N` (default 1) to run its script stage as one batch job over
N nodes, each with the slot's GPU count. Whatever the scheduler, the batch script (it
runs on the first node) then has:

- `RUNNERCTL_NODEFILE`: the job's nodes, one name a line; `WORLD_SIZE`: how many;
- `MASTER_ADDR`: the first node's address; `MASTER_PORT`: a port derived from the batch
  job id (20000-39999), so two jobs sharing a node do not collide; `NODE_RANK=0`;
- `RUNNERCTL_EACH_NODE CMD...`: runs CMD once on every node with that node's `NODE_RANK`
  (Slurm: `srun --ntasks-per-node=1`, `SLURM_NODEID`; elsewhere Open MPI's `mpirun
  --map-by node` over the node file, `OMPI_COMM_WORLD_RANK`), the torchrun pattern:
  `"$RUNNERCTL_EACH_NODE" torchrun --nnodes=$WORLD_SIZE --node_rank='$NODE_RANK' ...`.
MPI programs use the scheduler's own launcher (`srun --mpi=pmix`, `mpirun`) as usual.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping
from pathlib import Path

NODES_VARIABLE = "RUNNERCTL_NODES"
MAX_NODES = 10_000
"""More nodes than any cluster runnerctl drives has (as `render` checks the input)."""
PORT_BASE, PORT_SPAN = 20000, 20000
NODE_LOCAL = ("HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_", "TMPDIR", "CUDA_VISIBLE_DEVICES",
              "NVIDIA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES", "OMPI_*", "PMIX_*",
              "PMI_*")
"""What mpirun does not copy from the first node: the node's own names, directories and GPUs
(a scheduler's cgroup hook sets each node's), and Open MPI's and PMIx's own."""


class BadNodes(ValueError):
    """The job's RUNNERCTL_NODES is not a whole number of nodes."""


@dataclasses.dataclass(frozen=True)
class NodeLaunch:
    """How one scheduler names its nodes and starts a task on each."""

    names: str  # bash printing the job's node names, one a line
    address: str  # bash printing the address of node "$1"
    job_id: str  # the variable holding the scheduler's job id
    launch: str  # command prefix that starts one task per node
    rank: str  # the variable that holds the node's rank inside such a task
    prelude: str = ""  # bash the per-node launcher runs first


def mpirun_launch(*, names: str, job_id: str) -> NodeLaunch:
    """For schedulers whose own per-node launcher is Open MPI's mpirun (sge, pbs, pjm).

    mpirun gives the other nodes' tasks only the OMPI_ variables and those named with `-x`
    (mpirun(1), "Exported Environment Variables"): every rank's torchrun got an empty
    MASTER_ADDR. The launcher names every exported variable, as srun passes the whole
    environment (`--export=ALL`), but those that belong to one node (NODE_LOCAL); names
    only, so no value shows in `ps`."""
    local = "|".join(NODE_LOCAL)
    prelude = ("runnerctl_pass=()\n"
               "for runnerctl_name in $(compgen -e); do\n"
               f'  case $runnerctl_name in {local}) ;; *) runnerctl_pass+=(-x "$runnerctl_name") ;; esac\n'
               "done\n")
    return NodeLaunch(names=names, address='echo "$1"', job_id=job_id, prelude=prelude,
                      launch='mpirun -np "$WORLD_SIZE" --hostfile "$RUNNERCTL_NODEFILE" --map-by node '
                             '"${runnerctl_pass[@]}"',
                      rank="OMPI_COMM_WORLD_RANK")


def nodes_requested(env: Mapping[str, str]) -> int:
    raw = env.get(f"CUSTOM_ENV_{NODES_VARIABLE}", "").strip() or "1"
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 5 and 1 <= int(raw) <= MAX_NODES):
        raise BadNodes(f"{NODES_VARIABLE}={raw!r} is not a number of nodes (a whole number from 1 "
                       f"to {MAX_NODES})")
    return int(raw)


def setup_bash(launch: NodeLaunch, *, nodefile: Path, each_node: Path) -> str:
    """Bash for the batch script: the node file, the rendezvous variables, the per-node launcher."""
    q = shlex.quote
    each = (f"#!/bin/bash\n{launch.prelude}exec {launch.launch} bash -c "
            + q(f'export NODE_RANK=${launch.rank}; exec "$@"') + ' runnerctl "$@"\n')
    return (f"runnerctl_address() {{ {launch.address}; }}\n"
            f"( {launch.names} ) > {q(str(nodefile))}\n"
            f"export RUNNERCTL_NODEFILE={q(str(nodefile))}\n"
            f'export WORLD_SIZE=$(grep -c . "$RUNNERCTL_NODEFILE")\n'
            f'export MASTER_ADDR=$(runnerctl_address "$(head -n 1 "$RUNNERCTL_NODEFILE")")\n'
            f'runnerctl_id=${{{launch.job_id}//[^0-9]/}}\n'
            f"export MASTER_PORT=$(( {PORT_BASE} + ${{runnerctl_id:-0}} % {PORT_SPAN} ))\n"
            "export NODE_RANK=0\n"
            f"printf '%s' {q(each)} > {q(str(each_node))} && chmod +x {q(str(each_node))}\n"
            f"export RUNNERCTL_EACH_NODE={q(str(each_node))}\n")
