"""`runnerctl install`: the host's services (serve, postgres, exporter) as systemd units;
`runnerctl uninstall`: runnerctl's runners, config.toml entries and units taken back."""

from __future__ import annotations

import os
import time
from pathlib import Path

import click

from runnerctl.cli.host import (
    NO_TOKEN_HINT,
    _runner_config,
    _settings,
    runner_config_option,
    token_option,
)
from runnerctl.cli.params import GitLabUrl, config_option
from runnerctl.controller.store import Store, StoreError
from runnerctl.errors import ConfigError, first_line
from runnerctl.gitlab import PythonGitLab
from runnerctl.install import (
    ENV_FILE,
    SERVICES,
    InstallOptions,
    installed,
    mapping_dir,
    render,
    write,
)
from runnerctl.private import serve_pid
from runnerctl.uninstall import apply_uninstall, plan_uninstall


@click.command()
@click.option("--gitlab-url", type=GitLabUrl(),
              help="GitLab base URL for `serve` (needed when serve is installed) [default: the installed "
                   "serve unit's].")
@click.option("--listen", help="HOST:PORT of serve's web page and /metrics [default: the installed "
              "serve unit's, else 127.0.0.1:8080].")
@click.option("--service", "services", type=click.Choice(SERVICES), multiple=True,
              help="Install only these (repeat the option) [default: the ones installed before, "
                   "else all three].")
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=Path("/"),
              show_default=True, help="Write below this directory instead of / (packaging, tests).")
@click.option("--dry-run", is_flag=True, help="Print the files instead of writing them.")
@config_option
def install(gitlab_url: str | None, listen: str | None, services: tuple[str, ...], root: Path, dry_run: bool,
            config_path: Path | None) -> None:
    """Install systemd units for `runnerctl serve`, `postgres` and `exporter`.

    Units restart their service after a crash and start at boot once enabled. The GitLab
    token goes into /etc/runnerctl/serve.env (0600, kept when it exists), never onto a
    command line. Then: `systemctl daemon-reload && systemctl enable --now runnerctl-serve`.
    Run again after an upgrade, it rewrites the services installed before with the
    GitLab URL, listen address and settings file they had, unless given.
    """
    from runnerctl.settings import SERVE_LISTEN, parse_listen

    before = installed(root)
    chosen = tuple(s for s in SERVICES if s in services) if services else (before.services or SERVICES)
    kept = []
    if "serve" in chosen and gitlab_url is None and before.gitlab_url:
        gitlab_url = GitLabUrl().convert(before.gitlab_url, None, None)  # the option's own is checked as read
        kept.append(f"--gitlab-url {gitlab_url}")
    if "serve" in chosen and listen is None and before.listen:
        listen = before.listen
        kept.append(f"--listen {listen}")
    if config_path is None and not os.environ.get("RUNNERCTL_CONFIG") and before.settings_path is not None:
        config_path = before.settings_path  # not the default path: the host's settings are there
        kept.append(f"--config {config_path}")
    listen = listen or SERVE_LISTEN
    if "serve" in chosen and not gitlab_url:
        raise ConfigError("--gitlab-url is needed to install runnerctl-serve",
                          hint="give the GitLab base URL, or --service postgres --service exporter")
    if parse_listen(listen)[1] == 0:  # serve's own check: HOST:PORT
        raise ConfigError(f"--listen {listen!r}: port 0 is any free port, a new one at each start",
                          hint="give a port from 1 to 65535")
    settings, settings_path = _settings(config_path)
    options = InstallOptions(settings=settings, settings_path=settings_path.resolve(),
                             gitlab_url=(gitlab_url or "").rstrip("/"), services=chosen, listen=listen)
    files = render(options)
    if kept:
        click.echo(f"kept from the installed units: {', '.join(kept)}", err=True)
    if dry_run:
        for unit in files:
            click.echo(f"# {unit.path} (mode {unit.mode:o})\n{unit.text}")
        return
    try:
        written = write(files, root, state_dir=settings.state_dir.resolve(), mapping=mapping_dir(options))
    except OSError as exc:
        raise ConfigError(f"cannot write below {root}: {exc.strerror or exc}",
                          hint="run as root, or pass --root DIR") from None
    for path in written:
        click.echo(f"wrote {path}")
    units = " ".join(f"runnerctl-{s}" for s in chosen)
    if "serve" in chosen:
        click.echo(f"next: put the GitLab token (scope api) into {root / ENV_FILE.relative_to('/')}")
    click.echo(f"then: systemctl daemon-reload && systemctl enable --now {units}")


@click.command()
@runner_config_option
@click.option("--gitlab-url", type=GitLabUrl(),
              help="GitLab that holds the runners [default: the url of runnerctl's entries in config.toml].")
@token_option
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=Path("/"),
              show_default=True, help="Look for the systemd units below this directory instead of /.")
@click.option("--dry-run", is_flag=True, help="Contact nothing, change nothing: list what would be done.")
@config_option
def uninstall(runner_config: Path | None, gitlab_url: str | None, token: str | None, root: Path,
              dry_run: bool, config_path: Path | None) -> None:
    """Delete runnerctl's runners in GitLab, their config.toml entries and its systemd units.

    Only what runnerctl made: the runners of its own `[[runners]]` entries (named
    `runnerctl/...`) and the host's stand-by runner, those entries (every other entry is
    kept byte for byte), and the units `runnerctl install` wrote. Stop the services
    first (`systemctl disable --now runnerctl-serve runnerctl-postgres runnerctl-exporter`).
    The state directory, PostgreSQL data and /etc/runnerctl are left to you.
    """
    settings, _ = _settings(config_path)
    config = _runner_config(settings, runner_config)
    urls = {str(e["url"]).rstrip("/") for e in config.owned_entries().values() if e.get("url")}
    if gitlab_url is None and len(urls) > 1:
        raise ConfigError(f"runnerctl's entries in {config.path} name {len(urls)} GitLab URLs",
                          hint="pass --gitlab-url for the one to uninstall from")
    url = gitlab_url.rstrip("/") if gitlab_url else next(iter(urls), None)
    plan = plan_uninstall(config, root=root, gitlab_url=url)
    shared = settings.controller.store_url  # a SQLite store is this host's alone: nothing to retire
    named = {name.split("/")[1] for name, _ in plan.runners if name.count("/") >= 2}  # runnerctl/HOST/KEY
    host = named.pop() if len(named) == 1 else settings.host.name  # init --host may have named them
    retire = f"host {host} in the shared store (off its fleet page; its job history stays)"
    if dry_run:
        for line in plan.describe(config.path):
            click.echo(f"# {line}")
        if shared:
            click.echo(f"# retire {retire}")
        return
    running = serve_pid(settings.state_dir)
    if running is not None:  # it would go on pausing and resuming the runners being deleted
        raise ConfigError(f"runnerctl serve runs on {settings.state_dir} (pid {running})",
                          hint="stop it first: systemctl disable --now runnerctl-serve")
    gitlab: PythonGitLab | None = None
    if plan.runners or plan.standby is not None:
        if not token:
            raise ConfigError("no GitLab token", hint=NO_TOKEN_HINT)
        if url is None:
            url = plan.standby.gitlab_url if plan.standby is not None and plan.standby.gitlab_url else None
        if url is None:
            raise ConfigError(f"no GitLab URL in {config.path}", hint="pass --gitlab-url")
        gitlab = PythonGitLab(url, token)
    result = apply_uninstall(plan, config=config, gitlab=gitlab)
    for label, items in (("deleted", result.deleted), ("left", result.not_ours), ("removed", result.removed),
                         ("changed", result.changed)):
        for item in items:
            click.echo(f"{label:8} {item}")
    for unit in plan.foreign_units:
        click.echo(f"kept     {unit} (not written by runnerctl install)")
    for left in plan.leftovers:
        click.echo(f"left     {left} (yours or systemctl's: remove it, then systemctl daemon-reload)")
    if shared:
        try:
            store = Store.open(url=shared, upgrade=False)  # other hosts' controllers may be older
            try:
                store.retire_host(host, time.time(), "by runnerctl uninstall")
            finally:
                store.close()
        except StoreError as exc:
            click.echo(f"left     {retire.split(' (', 1)[0]}: {first_line(exc)}")
        else:
            click.echo(f"retired  {retire}")
    if plan.units:
        click.echo("then: systemctl daemon-reload")
