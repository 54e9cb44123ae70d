"""Controller commands: serve, demo, simulate, and the admin toggles pause/drain/resume."""

from __future__ import annotations

import dataclasses
import getpass
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from runnerctl.cli.host import (
    NO_TOKEN_HINT,
    TOKEN_ENV,
    _runner_config,
    _settings,
    gpu_source_option,
    runner_config_option,
    token_option,
)
from runnerctl.cli.monitoring import attach
from runnerctl.cli.params import Finite, GitLabUrl, Seconds, config_option
from runnerctl.controller.fairshare import FairPolicy
from runnerctl.controller.store import Store
from runnerctl.controller.toggles import request as toggle_request
from runnerctl.controller.toggles import target_of
from runnerctl.errors import ConfigError
from runnerctl.settings import SERVE_LISTEN, PathSettings, Settings, claim_ttl_problem, parse_planner
from runnerctl.sim.fair import RUNNER_TYPES
from runnerctl.sim.hosts import slot_sizes
from runnerctl.sim.simulator import POLICIES, SimConfig, Simulator
from runnerctl.sim.timeouts import PENDING_TIMEOUTS, parse_runner_timeouts, uncapped_sizes
from runnerctl.sim.trace import read_foreign, read_jobs

if TYPE_CHECKING:
    from fastapi import FastAPI

    from runnerctl.controller.loop import Controller
    from runnerctl.controller.serve import StateDirHold
    from runnerctl.sim.world import World
    from runnerctl.web.oauth import GitLabOAuth

listen_option = click.option("--listen", default=SERVE_LISTEN, show_default=True,
                             help="HOST:PORT of the web API (/api/state, /webhooks/gitlab, /metrics).")


@click.command()
@listen_option
@gpu_source_option
@click.option("--gitlab", "gitlab_url", required=True, type=GitLabUrl(allow_sim=True),
              help="GitLab base URL, or `sim` (simulated GitLab).")
@token_option
@runner_config_option
@config_option
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Store and leases [default: from settings].")
@click.option("--webhook-secret", envvar="RUNNERCTL_WEBHOOK_SECRET", show_envvar=True, default="",
              help="Secret GitLab sends in X-Gitlab-Token (webhooks are refused without one).")
@click.option("--interval", type=Seconds(0.05, 3600),
              help="Reconcile interval in seconds [default: [controller] interval_s, 5].")
@click.option("--sim-workload", type=click.Choice(["none", "busy"]), default="none", show_default=True,
              help="With --gitlab sim: `busy` starts a 4-GPU job, 1-GPU jobs and a colleague's process.")
def serve(listen: str, gpu_source: str | None, gitlab_url: str, token: str | None,
          runner_config: Path | None, config_path: Path | None, state_dir: Path | None,
          webhook_secret: str, interval: float | None, sim_workload: str) -> None:
    """Run the reconcile loop, the web page and its API until interrupted."""
    from runnerctl.controller import serve as serving

    oauth_secret = _withhold_secrets()  # the token and webhook secret are read already
    settings, _ = _settings(config_path)
    read = settings  # as the file says: serve notices when the file says otherwise
    if state_dir is not None:
        settings = dataclasses.replace(settings, paths=dataclasses.replace(settings.paths,
                                                                            state_dir=str(state_dir)))
    if interval is not None:
        settings = dataclasses.replace(settings, controller=dataclasses.replace(settings.controller,
                                                                                interval_s=interval))
        ttl = settings.controller.claim_ttl_s  # unset, it follows the interval
        if ttl is not None and (problem := claim_ttl_problem(ttl, interval)):
            raise ConfigError(f"--interval {interval:g}: {problem}")
    serving.check_listen(listen)  # a bad or taken --listen fails before anything starts
    if gitlab_url != "sim" and not token:
        raise ConfigError("no GitLab token", hint=NO_TOKEN_HINT)
    hold = serving.hold_state_dir(settings.state_dir)
    try:
        _serve(settings, listen, gpu_source, gitlab_url, token or "", runner_config, webhook_secret,
               sim_workload, hold, read, oauth_secret)
    finally:
        os.close(hold.fd)


SECRET_ENV = (TOKEN_ENV, "RUNNERCTL_WEBHOOK_SECRET", "RUNNERCTL_GITLAB_OAUTH_SECRET")
"""serve's secrets in its environment (install's serve.env)."""


def _withhold_secrets() -> str:
    """Take serve's secrets out of its environment once read; returns the OAuth client
    secret. Every process serve starts inherits it: the batch drivers' scancel or qdel,
    run as the job's user when a lease is freed, showed the GitLab token to that user in
    /proc/PID/environ (found by a secrets audit)."""
    oauth_secret = os.environ.get("RUNNERCTL_GITLAB_OAUTH_SECRET", "")
    for name in SECRET_ENV:
        os.environ.pop(name, None)
    return oauth_secret


def _serve(settings: Settings, listen: str, gpu_source: str | None, gitlab_url: str, token: str,
           runner_config: Path | None, webhook_secret: str, sim_workload: str, hold: StateDirHold,
           read: Settings, oauth_secret: str) -> None:
    from runnerctl.controller import serve as serving

    if gitlab_url == "sim":
        _serve_sim(settings, listen, gpu_source, webhook_secret, sim_workload, hold)
        return
    controller = serving.production_controller(
        settings, gitlab_url=gitlab_url, token=token, gpu_source=gpu_source or settings.host.gpu_source,
        runner_config=_runner_config(settings, runner_config).path, webhook_secret=webhook_secret, read=read)
    oauth = None
    if settings.web.gitlab_oauth_client_id:
        from runnerctl.web.oauth import GitLabOAuth

        oauth = GitLabOAuth(gitlab_url.rstrip("/"), settings.web.gitlab_oauth_client_id,
                            oauth_secret,
                            settings.web.gitlab_oauth_group, api_token=token)
        if not oauth.secret or not oauth.group:
            raise ConfigError("[web] gitlab_oauth_client_id is set, but the secret or the group is missing",
                              hint="set $RUNNERCTL_GITLAB_OAUTH_SECRET and [web] gitlab_oauth_group")
    serving.serve(controller, listen, metrics=attach(controller, settings),
                  extend=_web(controller, settings, oauth), web=settings.web,
                  sign_in=_can_sign_in(controller, oauth), hold=hold)


def _can_sign_in(controller: Controller, oauth: GitLabOAuth | None, *, simulated: bool = False) -> bool:
    """A local user exists, or GitLab OAuth against a real GitLab (the simulated GitLab lets
    anyone approve as anyone, so its sign-in does not count)."""
    return bool(controller.wiring.store.users()) or (oauth is not None and not simulated)


def _web(controller: Controller, settings: Settings, oauth: GitLabOAuth | None = None, *,
         simulated: bool = False) -> list[Callable[[FastAPI], None]]:
    """The page's routes, and the fleet view published after each good tick."""
    from runnerctl.web.fleet import publisher
    from runnerctl.web.routes import install

    store = controller.wiring.store
    # the fleet page: this host's GPUs and queue after each good tick (a simulated world
    # ticks at least once per virtual second)
    interval = max(settings.controller.interval_s, 1.0) if simulated else settings.controller.interval_s
    controller.on_tick.append(publisher(store, interval_s=interval, clock=controller.wiring.clock))
    return [lambda app: install(app, view=lambda: controller.view, store=store, settings=settings.web,
                                state_dir=settings.state_dir, oauth=oauth, clock=controller.wiring.clock)]


def _serve_sim(settings: Settings, listen: str, gpu_source: str | None, secret: str, workload: str,
               hold: StateDirHold) -> None:
    from runnerctl.controller import serve as serving
    from runnerctl.gpus import sim_count
    from runnerctl.sim.demo import busy_workload
    from runnerctl.sim.world import build_world

    count = 8
    if gpu_source is not None:
        found = sim_count(gpu_source)
        if found is None:
            raise ConfigError(f"--gpu-source {gpu_source}: with --gitlab sim it is sim:N, N from 1 to 64")
        count = found
    world = build_world(settings.state_dir, gpu_count=count, webhook_secret=secret,
                        settings=dataclasses.replace(settings.controller, projects=(1,)),
                        on_event=lambda e: click.echo(f"{e.kind:10} {e.subject:28} {e.detail}"),
                        store_url=settings.controller.store_url, start=time.time())
    click.echo(f"simulated GitLab at {world.server.url} (project 1)")
    oauth = _sim_oauth(world, listen)

    def step() -> None:
        if workload == "busy":
            busy_workload(world)
        world.advance(1.0)

    def loop(stop: threading.Event) -> None:  # the controller's own loop: failures retried, watched
        world.controller.run(stop, step=step, every_s=min(1.0, settings.controller.interval_s))

    try:
        serving.serve(world.controller, listen, loop=loop, metrics=attach(world.controller, settings),
                      extend=_web(world.controller, settings, oauth, simulated=True),
                      web=settings.web, sign_in=_can_sign_in(world.controller, oauth, simulated=True),
                      hold=hold)
    finally:
        world.close()


def _sim_oauth(world: World, listen: str) -> GitLabOAuth:
    """An OAuth application in the simulated GitLab, group `ml` with Maintainer `mia` and
    Developer `dev`: "Sign in with GitLab" works out of the box."""
    import secrets

    from runnerctl.sim.gitlab_oauth import OAuthApp
    from runnerctl.sim.world import TOKEN
    from runnerctl.web.oauth import GitLabOAuth

    provider = world.server.oauth
    app = OAuthApp("runnerctl-sim", secrets.token_urlsafe(24), f"http://{listen}/oauth/gitlab/callback")
    provider.apps[app.client_id] = app
    provider.users.update({"mia": 11, "dev": 12})
    provider.groups["ml"] = {"mia": 40, "dev": 30}
    return GitLabOAuth(world.server.url, app.client_id, app.secret, "ml", api_token=TOKEN)


@click.command()
@click.option("--duration", type=Seconds(0, 86400), default=60.0, show_default=True,
              help="Wall-clock seconds the scripted 15 minutes take.")
@click.option("--listen", default=SERVE_LISTEN, show_default=True,
              help="HOST:PORT for the web page, /metrics, /healthz and the API while the demo runs "
                   "('' for none).")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Keep the demo's store (events, job history) in this directory, for `runnerctl "
              "report --state-dir`: a new or empty directory [default: a temporary one].")
@click.pass_context
def demo(ctx: click.Context, duration: float, listen: str, state_dir: Path | None) -> None:
    """Watch runnerctl compose 4- and 8-GPU runners on a simulated host, no GPU or GitLab needed."""
    from runnerctl.controller.serve import bound_address, serve_in_background
    from runnerctl.settings import parse_listen
    from runnerctl.sim.demo import run_demo

    if state_dir is not None and state_dir.is_dir() and any(state_dir.iterdir()):
        # the demo's job ids start at 1 again: it would overwrite a history kept there
        raise click.BadParameter(f"{state_dir} is not empty; give a new or empty directory (the demo "
                                 "would overwrite the job history of a store kept there)",
                                 param_hint="'--state-dir'")
    with tempfile.TemporaryDirectory(prefix="runnerctl-demo-web-") as web_dir:
        settings = Settings(paths=PathSettings(state_dir=web_dir))

        def web(world: World) -> None:
            if not listen:
                return
            server = serve_in_background(world.controller, listen, attach(world.controller, settings),
                                         extend=_web(world.controller, settings, simulated=True),
                                         sign_in=_can_sign_in(world.controller, None))
            if server is None:
                click.echo(f"(web page off: {listen} is taken)")
                return
            sockets = [s for listening in server.servers for s in listening.sockets]
            address = bound_address(parse_listen(listen)[0], sockets)  # port 0 picks one
            click.echo(f"web page: http://{address}/ (metrics at /metrics)")

        ctx.exit(run_demo(duration_s=duration, echo=click.echo, serve=web, state_dir=state_dir))


def _toggle_options(func: click.decorators.FC) -> click.decorators.FC:
    for option in reversed([
        click.option("--gpu", type=click.IntRange(0), help="One GPU (its index): every runner over it."),
        click.option("--slot", help="One runner, by slot key (gpu0-3) or runner name."),
        click.option("--host", "whole_host", is_flag=True, help="Every runner of this host."),
        click.option("--why", default="", help="Reason, stored and shown with the toggle (one line; "
                     "pause and drain need one)."),
        click.option("--who", default=getpass.getuser, help="Who asks [default: $USER]."),
        click.option("--host-name", help="Host whose runners to toggle [default: from settings]."),
        click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path)),
        config_option,
    ]):
        func = option(func)
    return func


def _toggle(action: str, gpu: int | None, slot: str | None, whole_host: bool, why: str, who: str,
            host_name: str | None, state_dir: Path | None, config_path: Path | None) -> None:
    settings, _ = _settings(config_path)
    host = host_name or settings.host.name
    target = target_of(gpu=gpu, slot=slot, host=whole_host, on_host=host)
    store = Store.open(url=settings.controller.store_url, state_dir=state_dir or settings.state_dir,
                       upgrade=False)  # serve upgrades the store: controllers still older would refuse it
    try:
        click.echo(toggle_request(store, action=action, host=host, target=target, who=who, why=why,
                                  now=time.time()))
    finally:
        store.close()


@click.command()
@_toggle_options
def pause(**kwargs: object) -> None:
    """Close runners now (running jobs finish; no new job starts) until `resume`."""
    _toggle("pause", **kwargs)  # type: ignore[arg-type]


@click.command()
@_toggle_options
def drain(**kwargs: object) -> None:
    """Let running jobs finish and start no new one (shown as draining, then drained)."""
    _toggle("drain", **kwargs)  # type: ignore[arg-type]


@click.command()
@_toggle_options
def resume(**kwargs: object) -> None:
    """Remove a pause or drain (with --gpu, also reopen an unhealthy GPU); the controller decides again."""
    _toggle("resume", **kwargs)  # type: ignore[arg-type]


@click.command()
@click.option("--trace", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="JOBS.csv: job_id,submit_time,gpus,duration[,project,priority,user,timeout,name].")
@click.option("--foreign", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="FOREIGN.csv: start,duration,host,gpu (hosts gpu-a, gpu-b, ..., gpu-z, gpu-aa, ...).")
@click.option("--hosts", type=click.IntRange(1, 1000), default=1, show_default=True)
@click.option("--gpus-per-host", type=click.IntRange(1, 64), default=8, show_default=True)
@click.option("--policy", type=click.Choice(POLICIES), default="dynamic", show_default=True)
@click.option("--runner-type", type=click.Choice(RUNNER_TYPES), default="group", show_default=True,
              help="group: GitLab hands a runner the oldest job; instance: fair by project "
                   "(fewest jobs running first), as GitLab does for instance runners. For the "
                   "runnerctl policies; greedy, fifo and easy-oracle always take the oldest first.")
@click.option("--fair-weight-h", type=Finite(0, 10_000, "hours"), default=0.0, show_default=True,
              help="dynamic: fair share, the most hours a heavy user's job counts younger (0: off).")
@click.option("--fair-half-life-h", type=Finite(0.01, 100_000, "hours"), default=168.0, show_default=True,
              help="dynamic: GPU use this many hours ago counts half in fair share.")
@click.option("--fair-queue-step-min", type=Finite(0, 100_000, "minutes"), default=5.0, show_default=True,
              help="dynamic: fair share's queue share, minutes younger per GPU a job's user runs "
                   "or waits for in older jobs.")
@click.option("--pending-timeouts", type=click.Choice(PENDING_TIMEOUTS), default="trace", show_default=True,
              help="dynamic: what the planner knows of a waiting job's timeout. trace: the trace's "
                   "(more than a real controller knows: GitLab's jobs API has none); cap: its "
                   "runners' --runner-max-timeout-s (runnerctl with [controller] runner_max_timeout_s); "
                   "none: nothing (runnerctl without it).")
@click.option("--runner-max-timeout-s", metavar="[N=]SECONDS,...",
              help="The runners' maximum job timeout in seconds (GitLab: at least 600), for every "
                   "runner, or N=SECONDS for the N-GPU ones (86400,1=7200, as [controller] "
                   "runner_max_timeout_s): a job is killed at min(its timeout, its runner's). "
                   "[default: none]")
@click.option("--history/--no-history", default=True, show_default=True,
              help="dynamic: read how long a waiting job may run from the jobs of its project "
                   "and name (column `name`) that ended, as the controller does from its job "
                   "history: a multi-GPU job one of whose latest runs took over 30 minutes gets "
                   "no size credit. --no-history: a controller's first day.")
@click.option("--planner", metavar="KEY=VALUE,...",
              help="dynamic: the planner's settings, as [controller.planner] in runnerctl.toml "
                   "(drain_after_s=600,max_draining=2,backfill_estimated=true; docs/controller.md). "
                   "[default: its defaults]")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def simulate(trace: Path, foreign: Path | None, hosts: int, gpus_per_host: int, policy: str,
             runner_type: str, fair_weight_h: float, fair_half_life_h: float, fair_queue_step_min: float,
             pending_timeouts: str, runner_max_timeout_s: str | None, history: bool, planner: str | None,
             as_json: bool) -> None:
    """Replay a job trace on simulated hosts under a scheduling policy; print the outcome.

    GitLab's hourly cron runs too: `jobs_dropped` counts, by failure reason, the jobs it
    fails (pending over an hour with no online unpaused runner covering them, or over a
    day); `dynamic` hosts have runnerctl's stand-by runner. `easy-oracle` is EASY
    backfilling that knows every job's duration: a limit, not a policy to deploy.
    `users` gives per user (column `user`, else `project`) GPU-hours, waits and mean
    slowdown; `jain_slowdown` is Jain's fairness index over those slowdowns. A job runs at
    most its `timeout`, capped by --runner-max-timeout-s (GitLab fails it then); `dynamic`
    backfills draining blocks with 1-GPU jobs whose timeouts it knows (--pending-timeouts)
    to end before the drain does. See docs/fairshare.md for `--runner-type` and the
    fair-share options, docs/controller.md for what the planner knows of timeouts."""
    jobs = read_jobs(trace, sizes=slot_sizes(gpus_per_host))
    uses = read_foreign(foreign, hosts=hosts, gpus_per_host=gpus_per_host) if foreign else []
    try:
        fair = FairPolicy(weight_s=fair_weight_h * 3600, half_life_s=fair_half_life_h * 3600,
                          queue_step_s=fair_queue_step_min * 60)
        cap, caps = parse_runner_timeouts(runner_max_timeout_s) if runner_max_timeout_s else (None, ())
        config = SimConfig(hosts=hosts, gpus_per_host=gpus_per_host, policy=policy,
                           runner_type=runner_type, fair=fair, pending_timeouts=pending_timeouts,
                           history=history, plan_policy=parse_planner(planner or ""),
                           runner_max_timeout_s=cap, runner_max_timeout_by_gpus=caps)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    uncapped = uncapped_sizes(config)
    if uncapped:  # what the controller logs (Controller._timed), said before the run
        click.echo(f"runnerctl: --pending-timeouts cap: the {', '.join(map(str, uncapped))}-GPU runners have "
                   "no maximum timeout, so the planner knows no pending job's timeout (all sizes or "
                   "none, as the controller); give every size one", err=True)
    try:
        simulator = Simulator(jobs, config, uses)
    except ValueError as exc:
        raise ConfigError(str(exc), hint="check --hosts and --gpus-per-host against FOREIGN.csv") from None
    result = simulator.run()
    if as_json:
        click.echo(json.dumps(result))
        return
    for key, value in result.items():
        click.echo(f"{key:20} {value}")
