"""`runnerctl report`: GPU-hours, jobs, waits, run times, idle GPUs per user, project, host or GPU count."""

from __future__ import annotations

import time
from pathlib import Path

import click

from runnerctl import report as reports
from runnerctl.cli.host import _settings
from runnerctl.cli.params import config_option
from runnerctl.controller import jobs_store
from runnerctl.controller.store import Store
from runnerctl.errors import ConfigError


@click.command("report")
@click.option("--since", help="Start of the period: YYYY-MM-DD or YYYY-MM-DDTHH:MM (UTC unless an "
              "offset is given) [default: the whole history].")
@click.option("--by", type=click.Choice(reports.BY), default="user", show_default=True,
              help="Sum per user, project, host or GPUs per job (its run times help choose "
                   "[controller] runner_max_timeout_s).")
@click.option("--json", "as_json", is_flag=True, help="JSON: the rows and the unused jobs.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV: one row per user/project/host/GPU count.")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Read the SQLite store in this directory [default: the settings' store].")
@config_option
def report(since: str | None, by: str, as_json: bool, as_csv: bool, state_dir: Path | None,
           config_path: Path | None) -> None:
    """Per-user (or project, host, GPUs per job) GPU-hours, jobs, waits (queued ->
    started), run times (p95 and longest of the jobs that ended on their own), idle
    GPU-hours (GPUs held below `unused_utilization`) and the jobs flagged "requested but
    unused", from the job history the controller keeps. Reads every host of a shared store."""
    if as_json and as_csv:
        raise click.UsageError("choose one of --json and --csv")
    start = reports.parse_since(since) if since is not None else None
    store = _existing_store(state_dir, config_path)
    try:
        records = jobs_store.jobs(store, since=start)
    finally:
        store.close()
    result = reports.build(records, by=by, since=start, until=time.time())
    if as_json:
        click.echo(reports.to_json_text(result))
    elif as_csv:
        click.echo(reports.to_csv(result), nl=False)
    else:
        click.echo(reports.to_text(result))


def _existing_store(state_dir: Path | None, config_path: Path | None) -> Store:
    """The store of --state-dir, else the settings' (PostgreSQL, or SQLite in their state
    directory); a report only reads, so a missing SQLite store is refused, never made, and
    an older one is refused, never upgraded."""
    url = ""
    if state_dir is None:
        settings, _ = _settings(config_path)
        url, state_dir = settings.controller.store_url, settings.state_dir
    if not url and not (state_dir / "controller.sqlite").is_file():
        raise ConfigError(f"no controller store in {state_dir} (controller.sqlite is missing)",
                          hint="pass the state directory of `serve` or `demo --state-dir`")
    return Store.open(url=url, state_dir=state_dir, upgrade=False)  # other hosts' controllers may be older
