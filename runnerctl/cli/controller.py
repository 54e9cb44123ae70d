"""Controller commands. `simulate` runs the planner against simulated GPUs and GitLab."""

from __future__ import annotations

import json
from pathlib import Path

import click

from runnerctl.sim.simulator import POLICIES, SimConfig, Simulator
from runnerctl.sim.trace import read_foreign, read_jobs


@click.command()
@click.option("--trace", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="JOBS.csv: job_id,submit_time,gpus,duration[,project,priority].")
@click.option("--foreign", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="FOREIGN.csv: start,duration,host,gpu (hosts gpu-a, gpu-b, ...).")
@click.option("--hosts", type=click.IntRange(1, 26), default=1, show_default=True)
@click.option("--gpus-per-host", type=click.IntRange(1, 64), default=8, show_default=True)
@click.option("--policy", type=click.Choice(POLICIES), default="dynamic", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def simulate(trace: Path, foreign: Path | None, hosts: int, gpus_per_host: int, policy: str,
             as_json: bool) -> None:
    """Replay a job trace on simulated hosts under a scheduling policy; print the outcome."""
    jobs = read_jobs(trace)
    uses = read_foreign(foreign) if foreign else []
    result = Simulator(jobs, SimConfig(hosts=hosts, gpus_per_host=gpus_per_host, policy=policy),
                       uses).run()
    if as_json:
        click.echo(json.dumps(result))
        return
    for key, value in result.items():
        click.echo(f"{key:20} {value}")
