"""Monitoring commands and wiring: `runnerctl exporter`, and /metrics plus dcgm job mapping for `serve`."""

from __future__ import annotations

import dataclasses
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import click

from runnerctl.cli.host import _settings, gpu_source_option, host_option
from runnerctl.cli.params import Seconds, config_option
from runnerctl.controller.loop import Controller
from runnerctl.settings import Settings


def attach(controller: Controller, settings: Settings) -> Callable[[], tuple[bytes, str]]:
    """Hang the dcgm job mapping on the controller's ticks (if configured); return /metrics."""
    from runnerctl.exporter import endpoint
    from runnerctl.exporter.dcgm import JobMappingWriter

    if settings.monitoring.dcgm_job_mapping_dir:
        controller.on_tick.append(JobMappingWriter(Path(settings.monitoring.dcgm_job_mapping_dir)))
    return endpoint(lambda: controller.stats.view, liveness=controller.liveness)


@click.command()
@click.option("--listen", help="HOST:PORT for /metrics [default: [monitoring] exporter_listen, "
              "127.0.0.1:9835].")
@gpu_source_option
@host_option
@config_option
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where the executor's leases are [default: from settings].")
@click.option("--interval", type=Seconds(0.05, 3600), help="Seconds between GPU reads [default: 5].")
def exporter(listen: str | None, gpu_source: str | None, host_name: str | None, config_path: Path | None,
             state_dir: Path | None, interval: float | None) -> None:
    """Serve GPU occupancy metrics without a controller (observe-only: GPUs, leases, gate)."""
    from runnerctl.controller.gate import GateThresholds
    from runnerctl.controller.observe import LeaseJobs
    from runnerctl.exporter.dcgm import JobMappingWriter
    from runnerctl.exporter.standalone import Observer, lease_holders, serve_exporter
    from runnerctl.gpus import open_gpu_source
    from runnerctl.private import serve_pid
    from runnerctl.settings import parse_listen

    settings, _ = _settings(config_path)
    if state_dir is not None:
        settings = dataclasses.replace(settings, paths=dataclasses.replace(settings.paths,
                                                                            state_dir=str(state_dir)))
    addr, port = parse_listen(listen or settings.monitoring.exporter_listen)
    host = host_name or settings.host.name
    c = settings.controller
    jobs = LeaseJobs(settings.state_dir)
    hooks = [JobMappingWriter(Path(settings.monitoring.dcgm_job_mapping_dir))] \
        if settings.monitoring.dcgm_job_mapping_dir else []
    observer = Observer(host=host, gpus=open_gpu_source(gpu_source or settings.host.gpu_source, host=host,
                                                          watch_xid=True),
                        held=lease_holders(jobs), unreadable=jobs.unreadable, is_ci=jobs.is_ci,
                        on_tick=list(hooks), serve=lambda: serve_pid(settings.state_dir),
                        limits=GateThresholds.from_settings(c))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        serve_exporter(observer, host=addr, port=port, interval_s=interval or c.interval_s, stop=stop)
    except OSError as exc:
        raise click.ClickException(f"cannot serve on {addr}:{port}: {exc.strerror or exc}") from None
