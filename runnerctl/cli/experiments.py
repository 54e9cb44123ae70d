"""Experiment commands: `render` pipelines from components, and the shared `postgres`.

`postgres` manages runnerctl's own server (init, start, stop, status) or, when
`[postgres] url` names an external server's admin URL, uses that one; `url` and
`create-study` work the same way on both: a database and a least-privilege role per
project or study, and its storage URL on stdout (a secret: it holds the password).
"""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import click

from runnerctl.cli.params import config_option
from runnerctl.errors import ConfigError
from runnerctl.pipelines import components, parse_inputs, render
from runnerctl.postgres import (
    DEFAULT_DATABASE,
    KINDS,
    PostgresConfig,
    PostgresError,
    PostgresServer,
    Secrets,
    check_name,
    create_database,
    database_exists,
    ping,
    storage_url,
    with_host,
)
from runnerctl.private import write_atomic
from runnerctl.settings import default_settings_path, load_settings


@click.command("render")
@click.argument("component")
@click.option("--input", "-i", "inputs", multiple=True, metavar="KEY=VALUE",
              help="A component input; repeat for several (arrays as JSON: '[\"a\", \"b\"]').")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path),
              help="Write here instead of standard output.")
def render_command(component: str, inputs: tuple[str, ...], output: Path | None) -> None:
    """Print a complete .gitlab-ci.yml that uses COMPONENT.

    For GitLab versions without CI/CD components, and to check inputs before a push.
    """
    text = render(component, parse_inputs(list(inputs)))
    if output is None:
        click.echo(text, nl=False)
    else:
        try:
            # GitLab reads .gitlab-ci.yml as UTF-8; the file is the old one or the whole new one: a
            # full disk had the user's own file cut to what fitted (a review of a host out of space)
            _write_output(output, text)
        except OSError as exc:
            raise ConfigError(f"cannot write {output}: {exc.strerror or exc}") from None
        click.echo(f"wrote {output}")


def _write_output(output: Path, text: str) -> None:
    """A regular file (through a link: its target) gets the whole text or keeps its old
    one, with its mode; a new one the umask's; anything else (/dev/stdout, a pipe) is
    written as it is."""
    try:
        found = output.stat()  # through links: what a write would reach
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        write_atomic(Path(os.path.realpath(output)), text, mode=0o666 & ~umask)
        return
    if not stat.S_ISREG(found.st_mode):
        with output.open("w", encoding="utf-8") as handle:
            handle.write(text)
        return
    write_atomic(Path(os.path.realpath(output)), text, mode=stat.S_IMODE(found.st_mode))


render_command.help = (render_command.help or "") + f"\n\nComponents: {', '.join(components())}."


@dataclasses.dataclass(frozen=True)
class _Target:
    """Where `postgres` commands act: runnerctl's own server, or an external admin URL."""

    config: PostgresConfig
    external_url: str

    def server(self) -> PostgresServer:
        if self.external_url:
            raise ConfigError("an external PostgreSQL is configured ([postgres] url); runnerctl "
                              "runs no server of its own", hint="`url` and `create-study` use it")
        return PostgresServer(self.config)

    def checked_server(self) -> PostgresServer:
        """The server, refused when the settings name another port or listen address than
        the cluster has (start, status, url: they would report or name a port nothing
        answers on). Not for stop: the unit's ExecStop must stop it whatever the settings."""
        server = self.server()
        server.check_made_with()
        return server

    def admin_url(self) -> str:
        return self.external_url or self.checked_server().admin_url()

    def database(self, name: str, host: str | None) -> str:
        """Create (or find) database+role NAME; its URL, naming `host` if given."""
        if not self.external_url:
            host = host or self.checked_server().host()
        return create_database(self.admin_url(), name, Secrets(self.config.secrets_dir), host=host)

    def local(self, url: str) -> str:
        """The URL this host connects with: loopback when the server is ours and listens there."""
        listen = {e.strip() for e in self.config.listen.split(",")}
        if not self.external_url and listen & {"*", "0.0.0.0", "127.0.0.1", "localhost"}:
            return with_host(url, "127.0.0.1")
        return url


@click.group()
@config_option
@click.option("--dir", "base_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Server files [default: [postgres] dir, else <state_dir>/postgres].")
@click.option("--listen", help="listen_addresses, set at init [default: [postgres] listen, 127.0.0.1].")
@click.option("--port", type=click.IntRange(1, 65535), help="TCP port [default: [postgres] port, 5432].")
@click.pass_context
def postgres(ctx: click.Context, config_path: Path | None, base_dir: Path | None,
             listen: str | None, port: int | None) -> None:
    """The team's shared PostgreSQL for Optuna studies (no node or GPU slot spent on it)."""
    settings = load_settings(config_path or default_settings_path())
    pg = settings.postgres
    config = PostgresConfig(base_dir=base_dir or Path(pg.dir or settings.state_dir / "postgres"),
                            listen=listen or pg.listen, port=port or pg.port)
    ctx.obj = _Target(config, pg.url)


@postgres.command("init")
@click.pass_obj
def pg_init(target: _Target) -> None:
    """Create the server's data directory (once; a second init changes nothing)."""
    server = target.server()
    created = server.init()
    click.echo(f"{'initialised' if created else 'already initialised'}: {server.config.data_dir}")


@postgres.command("start")
@click.pass_obj
def pg_start(target: _Target) -> None:
    """Start the server (harmless when it runs; run it again after a reboot)."""
    server = target.checked_server()
    started = server.start()
    if not started and os.environ.get("INVOCATION_ID"):  # systemd's ExecStart (systemd.exec(5))
        # a server started by hand is no child of the unit: systemd refuses its postgres-owned
        # pid file ("does not belong to service") and would restart the unit every 10 s
        raise PostgresError(f"PostgreSQL already runs from {server.config.data_dir}, started outside "
                            "this unit", hint="run `runnerctl postgres stop`, then `systemctl start "
                            "runnerctl-postgres`")
    click.echo(f"{'started' if started else 'already running'} on "
               f"{server.config.listen} port {server.config.port}")


@postgres.command("stop")
@click.pass_obj
def pg_stop(target: _Target) -> None:
    """Stop the server: a fast shutdown that keeps every committed transaction."""
    click.echo("stopped" if target.server().stop() else "not running")


@postgres.command("status")
@click.pass_obj
def pg_status(target: _Target) -> None:
    """Say whether the server runs; exit 1 when it does not (or cannot be reached)."""
    if target.external_url:
        click.echo(f"external PostgreSQL {ping(target.external_url)}: reachable")
        return
    server = target.checked_server()
    running = server.running()
    click.echo(f"{server.config.data_dir}: "
               f"{'initialised' if server.initialised() else 'not initialised'}, "
               f"{'running' if running else 'stopped'} "
               f"(listen {server.config.listen}, port {server.config.port})")
    if not running:
        raise click.exceptions.Exit(1)


host_option = click.option("--host", help="Host name in the URL [default: the listen address, or "
                           "this host's name when listening on all].")
kind_option = click.option(
    "--kind", type=click.Choice(KINDS), default="journal", show_default=True,
    help="journal: runnerctl's journal on PostgreSQL (journal+postgresql://; workers read only "
         "what is new, a few ms CPU per trial); rdb: Optuna's RDB tables (postgresql+psycopg://, "
         "what plain Optuna and its command line open).")


@postgres.command("url")
@click.argument("database", default=DEFAULT_DATABASE)
@click.option("--admin", is_flag=True, help="The superuser's URL instead (local socket only).")
@kind_option
@host_option
@click.pass_obj
def pg_url(target: _Target, database: str, admin: bool, kind: str, host: str | None) -> None:
    """Print the storage URL of DATABASE (default: optuna), creating it and its role if needed.

    The URL holds a password: treat it as a secret. `runnerctl init --optuna-storage URL`
    puts it into the runners' environment, where the optuna-sweep template finds it.
    Both kinds live in the same database: `--kind rdb` gives the URL of studies made by
    plain Optuna (or by runnerctl before the journal), `migrate-study` moves one over.
    """
    if admin:
        click.echo(target.admin_url())
        return
    click.echo(storage_url(target.database(check_name(database, "database"), host), kind))


@postgres.command("create-study")
@click.argument("name")
@click.option("--database", help="Put the study into this (project) database [default: its own, NAME].")
@click.option("--direction", type=click.Choice(["minimize", "maximize"]), default="minimize",
              show_default=True)
@kind_option
@host_option
@click.pass_obj
def pg_create_study(target: _Target, name: str, database: str | None, direction: str, kind: str,
                    host: str | None) -> None:
    """Create the Optuna study NAME (idempotent in one direction) and print its storage URL.

    Its database and role come first when missing. Creating the study here, before any
    worker starts, also creates the storage's tables once: workers racing to do it fail.
    """
    from runnerctl.optuna_tools import create_study

    check_name(name, "study")
    url = storage_url(target.database(check_name(database or name, "database"), host), kind)
    create_study(target.local(url), name, direction=direction)
    click.echo(url)


@postgres.command("migrate-study")
@click.argument("name")
@click.option("--database", help="The study's database [default: its own, NAME].")
@host_option
@click.pass_obj
def pg_migrate_study(target: _Target, name: str, database: str | None, host: str | None) -> None:
    """Copy study NAME from Optuna's RDB tables into the journal of the same database.

    Prints the journal URL for the workers. The RDB study stays as it was (plain Optuna
    and `--kind rdb` URLs still open it); run it between sweeps, not while workers run:
    trials added to the RDB study afterwards are not copied.
    """
    from runnerctl.optuna_tools import copy_to_journal

    check_name(name, "study")
    where = check_name(database or name, "database")
    if not database_exists(target.admin_url(), where):  # before making one: nothing to move
        raise ConfigError(f"no database {where!r}: no study {name!r} to move",
                          hint="--database names the project database the study is in")
    url = target.database(where, host)
    trials = copy_to_journal(storage_url(target.local(url), "rdb"),
                             storage_url(target.local(url), "journal"), name)
    click.echo(f"copied study {name} ({trials} trials) into the journal", err=True)
    click.echo(storage_url(url, "journal"))
