"""`runnerctl sim runner`: the gitlab-runner stand-in (runnerctl/sim/runner.py) as a command.

Signals as gitlab-runner takes them (gitlab-org/gitlab-runner commands/multi.go):
SIGQUIT stops asking for jobs and waits for the running ones (a SIGQUIT again goes on
waiting); SIGTERM and SIGINT, also after a SIGQUIT, stop asking, abort the running jobs
(their stage is killed, cleanup_exec runs, the result goes to GitLab as
runner_interrupted) and exit within `shutdown_timeout`; a signal after that exits at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

import click

from runnerctl.errors import ExitCode


@click.command("runner")
@click.option("--runner-config", "config_path", required=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="gitlab-runner's config.toml (its [[runners]] must use the custom executor).")
def runner(config_path: Path) -> int:
    """Play gitlab-runner: take jobs from GitLab and run them through the custom executor.

    Reads config.toml as gitlab-runner does (concurrent, check_interval, limit,
    request_concurrency, [runners.custom]) and reloads it within 3 s of a change; polls
    POST /api/v4/jobs/request with each runner's token; runs every stage of a job
    through config_exec, prepare_exec, run_exec and cleanup_exec as gitlab-runner does;
    reports the trace and the result. One line per job start and end on stderr.
    SIGQUIT: finish running jobs, then exit. SIGTERM/SIGINT: abort running jobs, exit.
    """
    from runnerctl.sim.runner import MultiRunner, _stderr

    multi = MultiRunner(config_path)
    forceful: list[float] = []  # when the running jobs were aborted

    def on_signal(signum: int, frame: FrameType | None) -> None:
        """multi.go: SIGQUIT waits for the running jobs, and a SIGQUIT again goes on
        waiting (handleGracefulShutdown); any other signal aborts them and waits up to
        shutdown_timeout (handleForcefulShutdown), during which a signal exits at once."""
        name = signal.Signals(signum).name
        if forceful:
            _stderr(f"forced exit on a second signal ({name})")
            sys.stderr.flush()
            os._exit(int(ExitCode.ERROR))
        if signum == signal.SIGQUIT:
            _stderr(f"{name}: graceful shutdown, waiting for running jobs")
            multi.stop(abort=False)
            return
        forceful.append(time.monotonic())
        _stderr(f"{name}: aborting running jobs")
        multi.stop(abort=True)

    for signum in (signal.SIGQUIT, signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    loop = threading.Thread(target=multi.run, name="multi-runner", daemon=True)
    loop.start()
    while loop.is_alive():
        loop.join(0.5)
    if not multi.stopping.is_set():  # the loop ended by itself (a bug): wait as for a SIGTERM
        forceful.append(time.monotonic())
    while not multi.wait(0.5):
        if forceful and time.monotonic() - forceful[0] >= multi.config.shutdown_timeout_s:
            break
    else:
        _stderr("all workers stopped; exiting")
        return int(ExitCode.OK)
    _stderr(f"shutdown timed out after {multi.config.shutdown_timeout_s:.0f}s; "
            f"jobs still running: {multi.running_jobs()}")
    return int(ExitCode.ERROR)
