"""`runnerctl sim ...`: stand-ins for the outside world, run as their own processes.

`runnerctl sim gitlab` serves the simulated GitLab (runnerctl.sim.gitlab_server) so that
runnerctl, gitlab-runner's stand-in and tests talk to it over HTTP as to a real GitLab.
"""

from __future__ import annotations

import json
import signal
import threading

import click

from runnerctl.cli.params import Seconds
from runnerctl.cli.sim_runner import runner

WEEK_S = 7 * 86400


@click.group()
def sim() -> None:
    """Simulated outside world (GitLab, gitlab-runner) for trying runnerctl and for tests."""


@sim.command()
@click.option("--listen", default="127.0.0.1:0", show_default=True,
              help="HOST:PORT to serve on (port 0: any free port; the JSON line says which).")
@click.option("--drop-interval", "drop_interval_s", type=Seconds(0.01, WEEK_S), default=3600.0,
              show_default=True, help="Seconds between runs of GitLab's stuck-jobs rules (GitLab: hourly; "
                                      "at most a week).")
@click.option("--legacy-failure-reasons", is_flag=True,
              help="Drop stuck jobs with stuck_or_timeout_failure, as GitLab before 19.1 did.")
@click.option("--drop-silent-running", is_flag=True,
              help="Also fail running jobs with no update for an hour, as GitLab does (for runners that "
                   "send trace updates as gitlab-runner does; not with POST /-/sim/clock jumps).")
@click.option("--verify-skips-contact", is_flag=True,
              help="POST /runners/verify does not mark a glrt- runner contacted, as in GitLab 16 and 17.")
def gitlab(listen: str, drop_interval_s: float, legacy_failure_reasons: bool,
           drop_silent_running: bool, verify_skips_contact: bool) -> None:
    """Serve a simulated GitLab until SIGTERM or Ctrl-C.

    Prints one JSON line on stdout: url, admin_token (administrator `root`, scope api),
    group_id (a group with two projects), project_ids and more. Other tokens come from
    GitLab's own POST /api/v4/users/:id/personal_access_tokens. Test hooks outside
    GitLab's API: POST /-/sim/jobs {project_id, tags, duration_s, user} enqueues a job
    whose script is `sleep duration_s`; POST /-/sim/clock {advance_s} moves the clock;
    POST /-/sim/drop runs the stuck-jobs rules now.
    """
    from runnerctl.settings import parse_listen
    from runnerctl.sim.gitlab_standalone import standalone

    host, port = parse_listen(listen)
    try:
        server, info = standalone(host, port, drop_interval_s=drop_interval_s,
                                  legacy_failure_reasons=legacy_failure_reasons,
                                  drop_silent_running=drop_silent_running,
                                  verify_skips_contact=verify_skips_contact)
    except OSError as exc:
        raise click.ClickException(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    click.echo(json.dumps(info), nl=True)
    try:
        while not stop.wait(1.0):
            if not server.sim.alive() or not server.hooks.alive():
                raise click.ClickException("a simulated GitLab thread died; see the log above")
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


sim.add_command(runner)  # `runnerctl sim runner`: gitlab-runner's stand-in (runnerctl/sim/runner.py)
