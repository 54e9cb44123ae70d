"""Experiment commands: `render` pipelines from components, and the shared `postgres`."""

from __future__ import annotations

from pathlib import Path

import click

from runnerctl.errors import ConfigError
from runnerctl.pipelines import components, parse_inputs, render
from runnerctl.postgres import PostgresConfig, PostgresServer, check_name
from runnerctl.settings import Settings, default_settings_path, load_settings

config_option = click.option(
    "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
    help="runnerctl settings file [default: $RUNNERCTL_CONFIG or /etc/runnerctl/runnerctl.toml]")


@click.command("render")
@click.argument("component")
@click.option("--input", "-i", "inputs", multiple=True, metavar="KEY=VALUE",
              help="A component input; repeat for several.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path),
              help="Write here instead of standard output.")
def render_command(component: str, inputs: tuple[str, ...], output: Path | None) -> None:
    """Print a complete .gitlab-ci.yml that uses COMPONENT (gpu-job, optuna-sweep, python-cache).

    For GitLab versions without CI/CD components, and to check inputs before a push.
    """
    text = render(component, parse_inputs(list(inputs)))
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text)
        click.echo(f"wrote {output}")


render_command.help = (render_command.help or "") + f"\n\nComponents: {', '.join(components())}."


@click.group()
@config_option
@click.option("--dir", "base_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Server files [default: [postgres] dir, else <state_dir>/postgres].")
@click.option("--listen", help="listen_addresses [default: [postgres] listen, 127.0.0.1].")
@click.option("--port", type=int, help="TCP port [default: [postgres] port, 5432].")
@click.pass_context
def postgres(ctx: click.Context, config_path: Path | None, base_dir: Path | None,
             listen: str | None, port: int | None) -> None:
    """Run the team's shared PostgreSQL for Optuna studies (no node spent on it)."""
    settings = load_settings(config_path or default_settings_path())
    ctx.obj = (settings, _config(settings, base_dir, listen, port))


def _config(settings: Settings, base_dir: Path | None, listen: str | None,
            port: int | None) -> PostgresConfig:
    pg = settings.postgres
    return PostgresConfig(base_dir=base_dir or Path(pg.dir or settings.state_dir / "postgres"),
                          listen=listen or pg.listen, port=port or pg.port)


def _server(ctx: click.Context) -> PostgresServer:
    settings, config = ctx.obj
    if settings.postgres.url:
        raise ConfigError("an external PostgreSQL is configured ([postgres] url); runnerctl runs "
                          "no server of its own", hint="use `runnerctl postgres url`")
    return PostgresServer(config)


@postgres.command("init")
@click.pass_context
def pg_init(ctx: click.Context) -> None:
    """Create the server's data directory (once; a second init changes nothing)."""
    server = _server(ctx)
    created = server.init()
    click.echo(f"{'initialised' if created else 'already initialised'}: {server.config.data_dir}")


@postgres.command("start")
@click.pass_context
def pg_start(ctx: click.Context) -> None:
    """Start the server (harmless when it already runs; run it again after a reboot)."""
    server = _server(ctx)
    started = server.start()
    click.echo(f"{'started' if started else 'already running'} on "
               f"{server.config.listen}:{server.config.port}")


@postgres.command("stop")
@click.pass_context
def pg_stop(ctx: click.Context) -> None:
    """Stop the server: a fast shutdown that keeps every committed transaction."""
    click.echo("stopped" if _server(ctx).stop() else "not running")


@postgres.command("status")
@click.pass_context
def pg_status(ctx: click.Context) -> None:
    """Say whether the server is initialised and running; exit 1 when it is not running."""
    server = _server(ctx)
    running = server.running()
    click.echo(f"data dir {server.config.data_dir}: "
               f"{'initialised' if server.initialised() else 'not initialised'}, "
               f"{'running' if running else 'stopped'} ({server.config.listen}:{server.config.port})")
    if not running:
        raise click.exceptions.Exit(1)


@postgres.command("url")
@click.option("--study", help="The URL of this study's own database and role.")
@click.pass_context
def pg_url(ctx: click.Context, study: str | None) -> None:
    """Print an Optuna storage URL (it holds a password: treat it as a secret)."""
    settings, _ = ctx.obj
    if settings.postgres.url:
        click.echo(settings.postgres.url)
        return
    server = _server(ctx)
    click.echo(server.url(check_name(study), study) if study else server.url())


@postgres.command("create-study")
@click.argument("name")
@click.option("--direction", type=click.Choice(["minimize", "maximize"]), default="minimize",
              show_default=True)
@click.pass_context
def pg_create_study(ctx: click.Context, name: str, direction: str) -> None:
    """Create database, role and Optuna study NAME (idempotent); print its storage URL."""
    import optuna

    settings, _ = ctx.obj
    check_name(name)
    url = settings.postgres.url or _server(ctx).create_database(name)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(study_name=name, storage=url, load_if_exists=True,
                        direction=optuna.study.StudyDirection[direction.upper()])
    click.echo(url)
