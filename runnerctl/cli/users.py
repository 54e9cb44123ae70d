"""`runnerctl user add|list|remove|forget`: local accounts of the web page, and erasing a person.

Accounts live in the controller's store (SQLite in the state dir, or the shared
PostgreSQL), so every `serve` on that store knows them. Passwords are read without
echo (or from stdin for scripts) and stored only as an Argon2id hash.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from runnerctl.cli.host import _settings
from runnerctl.cli.params import config_option
from runnerctl.columns import pad
from runnerctl.controller.forget import STAND_IN, forget
from runnerctl.controller.store import Store
from runnerctl.errors import ConfigError
from runnerctl.web.auth import ROLES, add_user

state_dir_option = click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
                                help="Store of the controller [default: from settings].")


def _open(config_path: Path | None, state_dir: Path | None) -> Store:
    settings, _ = _settings(config_path)
    return Store.open(url=settings.controller.store_url, state_dir=state_dir or settings.state_dir,
                      upgrade=False)  # serve upgrades the store: controllers still older would refuse it


@click.group("user")
def user() -> None:
    """Local accounts that may sign in to the web page."""


@user.command("add")
@click.argument("name")
@click.option("--role", type=click.Choice(ROLES), default="viewer", show_default=True,
              help="viewer reads the page; operator may also pause, drain and resume.")
@click.option("--password-stdin", is_flag=True, help="Read the password from stdin (for scripts).")
@state_dir_option
@config_option
def add(name: str, role: str, password_stdin: bool, state_dir: Path | None, config_path: Path | None) -> None:
    """Add an account (or set a new password and role for an existing one)."""
    if password_stdin:  # bytes: a password that is no UTF-8 was "unexpected UnicodeEncodeError"
        line = sys.stdin.buffer.readline().rstrip(b"\r\n")  # a CRLF file's \r is no part of it
        try:
            password = line.decode()
        except UnicodeDecodeError:
            raise ConfigError("the password on stdin is not UTF-8 text") from None
    elif not sys.stdin.isatty():  # getpass would warn that it may echo, then read nothing useful
        raise ConfigError("no terminal to ask the password on", hint="pipe it in with --password-stdin")
    else:
        password = click.prompt("password", hide_input=True, confirmation_prompt=True)
    store = _open(config_path, state_dir)
    try:
        add_user(store, name, password, role)
    finally:
        store.close()
    click.echo(f"user {name}: {role}")


@user.command("list")
@state_dir_option
@config_option
def list_users(state_dir: Path | None, config_path: Path | None) -> None:
    """Names and roles (never the password hashes)."""
    store = _open(config_path, state_dir)
    try:
        for name, role, _created in store.users():
            click.echo(f"{pad(name, 24)} {role}")
    finally:
        store.close()


@user.command("remove")
@click.argument("name")
@state_dir_option
@config_option
def remove(name: str, state_dir: Path | None, config_path: Path | None) -> None:
    """Remove an account; its open sessions stop working at their next request."""
    store = _open(config_path, state_dir)
    try:
        if not store.remove_user(name):
            raise ConfigError(f"no user {name!r}", hint="see `runnerctl user list`")
    finally:
        store.close()
    click.echo(f"user {name}: removed")


@user.command("forget")
@click.argument("name")
@click.option("--dry-run", is_flag=True, help="Only count what would be erased.")
@state_dir_option
@config_option
def forget_command(name: str, dry_run: bool, state_dir: Path | None, config_path: Path | None) -> None:
    """Erase what the store keeps of NAME (a GitLab user or a local account): job history,
    the events naming them, sessions and account; their pauses and drains stay, by
    "someone". For a person who asks, or leaves the lab."""
    store = _open(config_path, state_dir)
    try:
        gone = forget(store, name, dry_run=dry_run)
    finally:
        store.close()
    verb = "would erase" if dry_run else "erased"
    many = gone.toggles != 1
    holds = "" if not gone.toggles else (
        f"; their {f'{gone.toggles} pauses or drains' if many else 'pause or drain'} "
        f"{'would stay' if dry_run else 'stay' if many else 'stays'}, by {STAND_IN}")
    click.echo(f"{name}: {verb} {gone.jobs} job history rows, {gone.events} events, {gone.sessions} web "
               f"sessions{', the account' if gone.account else ''}{holds}")
    if gone.running:
        click.echo(f"{gone.running} of their jobs still run: serve writes their rows until they end; run "
                   "this again then")
    click.echo("not in the store, so not erased here: the system journal (serve's log), backups, "
               "Prometheus, GitLab")
