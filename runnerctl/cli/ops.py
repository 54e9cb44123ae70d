"""`runnerctl install`: the host's services (serve, postgres, exporter) as systemd units."""

from __future__ import annotations

from pathlib import Path

import click

from runnerctl.cli.host import _settings, config_option
from runnerctl.errors import ConfigError
from runnerctl.install import ENV_FILE, SERVICES, InstallOptions, render, write


@click.command()
@click.option("--gitlab-url", help="GitLab base URL for `serve` (needed when serve is installed).")
@click.option("--listen", default="127.0.0.1:8080", show_default=True,
              help="HOST:PORT of serve's web page and /metrics.")
@click.option("--service", "services", type=click.Choice(SERVICES), multiple=True,
              help="Install only these (repeat the option) [default: all three].")
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=Path("/"),
              show_default=True, help="Write below this directory instead of / (packaging, tests).")
@click.option("--dry-run", is_flag=True, help="Print the files instead of writing them.")
@config_option
def install(gitlab_url: str | None, listen: str, services: tuple[str, ...], root: Path, dry_run: bool,
            config_path: Path | None) -> None:
    """Install systemd units for `runnerctl serve`, `postgres` and `exporter`.

    Units restart their service after a crash and start at boot once enabled. The GitLab
    token goes into /etc/runnerctl/serve.env (0600, kept when it exists), never onto a
    command line. Then: `systemctl daemon-reload && systemctl enable --now runnerctl-serve`.
    """
    chosen = tuple(s for s in SERVICES if s in services) if services else SERVICES
    if "serve" in chosen and not gitlab_url:
        raise ConfigError("--gitlab-url is needed to install runnerctl-serve",
                          hint="give the GitLab base URL, or --service postgres --service exporter")
    settings, settings_path = _settings(config_path)
    options = InstallOptions(settings=settings, settings_path=settings_path.resolve(),
                             gitlab_url=(gitlab_url or "").rstrip("/"), services=chosen, listen=listen)
    files = render(options)
    if dry_run:
        for unit in files:
            click.echo(f"# {unit.path} (mode {unit.mode:o})\n{unit.text}")
        return
    try:
        written = write(files, root, state_dir=settings.state_dir.resolve())
    except OSError as exc:
        raise ConfigError(f"cannot write below {root}: {exc.strerror or exc}",
                          hint="run as root, or pass --root DIR") from None
    for path in written:
        click.echo(f"wrote {path}")
    units = " ".join(f"runnerctl-{s}" for s in chosen)
    if "serve" in chosen:
        click.echo(f"next: put the GitLab token (scope api) into {root / ENV_FILE.relative_to('/')}")
    click.echo(f"then: systemctl daemon-reload && systemctl enable --now {units}")
