"""Controller commands: serve, demo, simulate, and the admin toggles pause/drain/resume."""

from __future__ import annotations

import dataclasses
import getpass
import json
import threading
import time
from pathlib import Path

import click

from runnerctl.cli.host import (
    _runner_config,
    _settings,
    config_option,
    gpu_source_option,
    runner_config_option,
    token_option,
)
from runnerctl.controller.store import Store, Toggle
from runnerctl.controller.toggles import resume as resume_toggle
from runnerctl.controller.toggles import set_toggle, target_of
from runnerctl.errors import ConfigError
from runnerctl.sim.simulator import POLICIES, SimConfig, Simulator
from runnerctl.sim.trace import read_foreign, read_jobs

listen_option = click.option("--listen", default="127.0.0.1:8080", show_default=True,
                             help="HOST:PORT of the web API (/api/state, /webhooks/gitlab).")


@click.command()
@listen_option
@gpu_source_option
@click.option("--gitlab", "gitlab_url", required=True, help="GitLab base URL, or `sim` (simulated GitLab).")
@token_option
@runner_config_option
@config_option
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Store and leases [default: from settings].")
@click.option("--webhook-secret", envvar="RUNNERCTL_WEBHOOK_SECRET", show_envvar=True, default="",
              help="Secret GitLab sends in X-Gitlab-Token (webhooks are refused without one).")
@click.option("--interval", type=click.FloatRange(0.05), help="Reconcile interval in seconds [default: 5].")
def serve(listen: str, gpu_source: str | None, gitlab_url: str, token: str | None,
          runner_config: Path | None, config_path: Path | None, state_dir: Path | None,
          webhook_secret: str, interval: float | None) -> None:
    """Run the reconcile loop and the web API until interrupted."""
    from runnerctl.controller import serve as serving

    settings, _ = _settings(config_path)
    if state_dir is not None:
        settings = dataclasses.replace(settings, paths=dataclasses.replace(settings.paths,
                                                                            state_dir=str(state_dir)))
    if interval is not None:
        settings = dataclasses.replace(settings, controller=dataclasses.replace(settings.controller,
                                                                                interval_s=interval))
    if gitlab_url == "sim":
        _serve_sim(settings.state_dir, listen, gpu_source, webhook_secret)
        return
    if not token:
        raise ConfigError("no GitLab token", hint="pass --token or set RUNNERCTL_GITLAB_TOKEN")
    controller = serving.production_controller(
        settings, gitlab_url=gitlab_url, token=token, gpu_source=gpu_source or settings.host.gpu_source,
        runner_config=_runner_config(settings, runner_config).path, webhook_secret=webhook_secret)
    serving.serve(controller, listen)


def _serve_sim(state_dir: Path, listen: str, gpu_source: str | None, secret: str) -> None:
    from runnerctl.controller import serve as serving
    from runnerctl.sim.world import build_world

    count = int(gpu_source[4:]) if gpu_source and gpu_source[4:].isdigit() else 8
    world = build_world(state_dir, gpu_count=count, webhook_secret=secret,
                        on_event=lambda e: click.echo(f"{e.kind:10} {e.subject:28} {e.detail}"))
    click.echo(f"simulated GitLab at {world.server.url} (token glpat-runnerctl-sim, project 1)")

    def loop(stop: threading.Event) -> None:
        while not stop.is_set():
            world.advance(1.0)
            stop.wait(1.0)

    try:
        serving.serve(world.controller, listen, loop=loop)
    finally:
        world.close()


@click.command()
@click.option("--duration", type=click.FloatRange(0), default=60.0, show_default=True,
              help="Wall-clock seconds the scripted 15 minutes take.")
@click.option("--listen", default="127.0.0.1:8080", show_default=True,
              help="HOST:PORT for /api/state while the demo runs ('' for none).")
@click.pass_context
def demo(ctx: click.Context, duration: float, listen: str) -> None:
    """Watch runnerctl compose 4- and 8-GPU runners on a simulated host, no GPU or GitLab needed."""
    from runnerctl.controller.serve import serve_in_background
    from runnerctl.sim.demo import run_demo
    from runnerctl.sim.world import World

    def web(world: World) -> None:
        if not listen:
            return
        server = serve_in_background(world.controller, listen)
        click.echo(f"web API: http://{listen}/api/state" if server else f"(web API off: {listen} is taken)")

    ctx.exit(run_demo(duration_s=duration, echo=click.echo, serve=web))


def _toggle_options(func: click.decorators.FC) -> click.decorators.FC:
    for option in reversed([
        click.option("--gpu", type=int, help="One GPU: every runner over it."),
        click.option("--slot", help="One runner, by slot key (gpu0-3) or runner name."),
        click.option("--host", "whole_host", is_flag=True, help="Every runner of this host."),
        click.option("--why", default="", help="Reason, stored and shown with the toggle."),
        click.option("--who", default=getpass.getuser, help="Who asks [default: $USER]."),
        click.option("--host-name", help="Host whose runners to toggle [default: from settings]."),
        click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path)),
        config_option,
    ]):
        func = option(func)
    return func


def _store(config_path: Path | None, state_dir: Path | None, host_name: str | None) -> tuple[Store, str]:
    settings, _ = _settings(config_path)
    return (Store.open(url=settings.controller.store_url, state_dir=state_dir or settings.state_dir),
            host_name or settings.host.name)


def _toggle(action: str, gpu: int | None, slot: str | None, whole_host: bool, why: str, who: str,
            host_name: str | None, state_dir: Path | None, config_path: Path | None) -> None:
    target = target_of(gpu=gpu, slot=slot, host=whole_host)
    store, host = _store(config_path, state_dir, host_name)
    try:
        if action == "resume":
            removed = resume_toggle(store, host=host, target=target, who=who, why=why, now=time.time())
            if gpu is not None:  # also acknowledges an unhealthy GPU
                store.set_toggle(Toggle(host, target, "reopen", who, time.time(), why))
            click.echo(f"{host} {target}: resumed ({removed} toggle{'s' if removed != 1 else ''} removed)")
        else:
            set_toggle(store, Toggle(host, target, action, who, time.time(), why))
            click.echo(f"{host} {target}: {action} by {who}" + (f" ({why})" if why else ""))
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
    """Remove a pause or drain (and reopen an unhealthy GPU); the controller decides again."""
    _toggle("resume", **kwargs)  # type: ignore[arg-type]


@click.command()
@click.option("--trace", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="JOBS.csv: job_id,submit_time,gpus,duration[,project,priority].")
@click.option("--foreign", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="FOREIGN.csv: start,duration,host,gpu (hosts gpu-a, gpu-b, ..., gpu-z, gpu-aa, ...).")
@click.option("--hosts", type=click.IntRange(1), default=1, show_default=True)
@click.option("--gpus-per-host", type=click.IntRange(1, 64), default=8, show_default=True)
@click.option("--policy", type=click.Choice(POLICIES), default="dynamic", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def simulate(trace: Path, foreign: Path | None, hosts: int, gpus_per_host: int, policy: str,
             as_json: bool) -> None:
    """Replay a job trace on simulated hosts under a scheduling policy; print the outcome."""
    jobs = read_jobs(trace)
    uses = read_foreign(foreign) if foreign else []
    try:
        simulator = Simulator(jobs, SimConfig(hosts=hosts, gpus_per_host=gpus_per_host, policy=policy), uses)
    except ValueError as exc:
        raise ConfigError(str(exc), hint="check --hosts and --gpus-per-host against FOREIGN.csv") from None
    result = simulator.run()
    if as_json:
        click.echo(json.dumps(result))
        return
    for key, value in result.items():
        click.echo(f"{key:20} {value}")
