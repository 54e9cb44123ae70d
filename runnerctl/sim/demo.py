"""`runnerctl demo`: the controller on a simulated 8-GPU host, narrated.

A scripted workload in accelerated time against the real controller, python-gitlab and
an HTTP GitLab: 1-GPU jobs keep arriving, a 4-GPU and then an 8-GPU job are composed
(singles drained, block opened), run and released, and a colleague's process closes a
GPU and, after the cool-down, reopens it. The web API (`/api/state`) is served while it
runs. Ends by itself and prints a summary. Jobs come from three users in turn, so
`runnerctl report --state-dir DIR` after `runnerctl demo --state-dir DIR` shows per-user
GPU-hours; without `--state-dir` the store lives in a temporary directory and is
deleted at the end (the demo never writes into a host's real store).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from runnerctl.controller.store import Event
from runnerctl.model import slot_key
from runnerctl.settings import ControllerSettings
from runnerctl.sim.fleet import RunningJob
from runnerctl.sim.world import PROJECT, World, build_world

SCRIPT_S = 900.0
"""Virtual length of the scripted workload (s)."""
Echo = Callable[[str], None]
USERS = ("bob", "carol", "dave")
"""Who submits the scripted jobs, in turn."""

# (virtual time, action, argument): jobs as (GPUs, duration)
SCRIPT: list[tuple[float, str, tuple[int, float]]] = [
    *[(0.0, "job", (1, 150.0 + 30 * i)) for i in range(6)],
    (30.0, "job", (4, 180.0)),
    *[(60.0 + 45 * i, "job", (1, 120.0)) for i in range(16)],
    (150.0, "foreign+", (6, 0)),
    (330.0, "foreign-", (6, 0)),
    (360.0, "job", (8, 150.0)),
]


def run_demo(*, duration_s: float, echo: Echo, serve: Callable[[World], None] | None = None,
             state_dir: Path | None = None) -> int:
    """Run the script so that it takes about `duration_s` of wall time; exit code 0 if sound.
    The controller's store (events, job history) goes to `state_dir`, else to a temporary
    directory removed at the end."""
    with tempfile.TemporaryDirectory(prefix="runnerctl-demo-") as tmp:
        settings = ControllerSettings(projects=(PROJECT,), cooldown_s=60.0)
        # virtual time runs ahead of the wall clock: the script (at most 4 x SCRIPT_S, see
        # _play) is dated to end by now, so `runnerctl report` counts all of it
        world = build_world(state_dir or Path(tmp), settings=settings, start=time.time() - 4 * SCRIPT_S,
                            on_event=lambda e: echo(_event_line(world, e)),
                            on_job=lambda kind, job, now: echo(_job_line(world, kind, job)))
        try:
            if serve is not None:
                serve(world)
            echo(f"runnerctl demo: host {world.controller.host}, 8 simulated GPUs, simulated GitLab at "
                 f"{world.server.url}; {SCRIPT_S:.0f} s of work in about {duration_s:.0f} s")
            _play(world, duration_s, echo)
            return _summary(world, echo)
        finally:
            world.close()


def _play(world: World, duration_s: float, echo: Echo) -> None:
    step_wall = max(0.0, duration_s / SCRIPT_S)
    started = time.monotonic()
    script = sorted(SCRIPT, key=lambda item: item[0])
    while world.clock.elapsed < SCRIPT_S or (world.fleet.jobs or world.state.pending_jobs()):
        while script and script[0][0] <= world.clock.elapsed:
            _act(world, *script.pop(0)[1:], echo=echo)
        world.advance(1.0)
        lag = started + world.clock.elapsed * step_wall - time.monotonic()
        if lag > 0:
            time.sleep(lag)
        if world.clock.elapsed > 4 * SCRIPT_S:
            break


def _act(world: World, action: str, arg: tuple[int, float], *, echo: Echo) -> None:
    stamp = f"[{world.clock.elapsed:5.0f}s]"
    if action == "job":
        job = world.submit(arg[0], arg[1], user=USERS[len(world.submitted) % len(USERS)])
        if arg[0] > 1:
            echo(f"{stamp} submit  job {job} asks for {arg[0]} GPUs (tag gpus:{arg[0]})")
    elif action == "foreign+":
        world.gpus.foreign[arg[0]] = (4242, "alice")
        echo(f"{stamp} alice starts `python train.py` by hand on GPU {arg[0]}")
    else:
        world.gpus.foreign.pop(arg[0], None)
        echo(f"{stamp} alice's process on GPU {arg[0]} ends")


def _event_line(world: World, event: Event) -> str:
    return f"[{world.clock.elapsed:5.0f}s] {event.kind:7} {slot_key(event.subject):7} {event.detail}"


def _job_line(world: World, kind: str, job: RunningJob) -> str:
    size = len(job.slot.gpus)
    return (f"[{world.clock.elapsed:5.0f}s] {'start' if kind == 'start' else 'done':7} "
            f"{job.slot.key:7} job {job.job_id} ({size} GPU{'s' if size > 1 else ''})")


def _summary(world: World, echo: Echo) -> int:
    fleet = world.fleet
    waits: dict[int, list[float]] = {}
    for job_id, (submitted, gpus) in world.submitted.items():
        if job_id in fleet.started:
            waits.setdefault(gpus, []).append(fleet.started[job_id] - submitted)
    echo("summary:")
    echo(f"  jobs finished        {len(fleet.finished)} of {len(world.submitted)}")
    for gpus, values in sorted(waits.items()):
        echo(f"  wait of {gpus}-GPU jobs  median {statistics.median(values):.0f} s, max {max(values):.0f} s")
    echo(f"  double allocations   {fleet.double_allocations}")
    echo(f"  foreign collisions   {fleet.foreign_collisions}")
    echo(f"  GitLab API requests  {len(world.server.requests)} in {world.clock.elapsed:.0f} s "
         f"(budget {world.controller.settings.api_budget_per_min}/min at steady state)")
    sound = fleet.double_allocations == 0 and fleet.foreign_collisions == 0
    return 0 if sound and len(fleet.finished) == len(world.submitted) else 1


def busy_workload(world: World) -> None:
    """`serve --gitlab sim --sim-workload busy`, called every virtual second: a long 4-GPU
    job first, then 1-GPU jobs, and alice's own process on the last GPU."""
    at = world.clock.elapsed
    if at == 0:
        world.submit(4, 86400.0, user="carol")
    elif at == 15:
        for _ in range(2):
            world.submit(1, 86400.0, user="bob")
        world.gpus.foreign[world.gpus.count - 1] = (4242, "alice")
