"""The `runnerctl` command: `main(argv) -> exit code`.

Commands live in one module per area and are registered in `COMMANDS`. Every
`RunnerctlError` becomes one line on stderr and its exit code; no traceback for
anything a user can fix.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import click

from runnerctl import __version__
from runnerctl.cli import controller, experiments, host, monitoring, ops, users
from runnerctl.errors import ExitCode, RunnerctlError

COMMANDS: list[click.Command] = [
    host.init,
    host.status,
    host.doctor,
    experiments.render_command,
    experiments.postgres,
    controller.simulate,
    controller.serve,
    controller.demo,
    controller.pause,
    controller.drain,
    controller.resume,
    monitoring.exporter,
    users.user,
    ops.install,
]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="runnerctl")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def cli(verbose: int) -> None:
    """Turn shared multi-GPU servers and a GitLab instance into a fair, safe GPU cluster."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="runnerctl: %(levelname)s %(name)s: %(message)s")


for _command in COMMANDS:
    cli.add_command(_command)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        result = cli.main(args=list(argv) if argv is not None else None, prog_name="runnerctl",
                          standalone_mode=False)
    except RunnerctlError as exc:
        click.echo(f"runnerctl: error: {exc}", err=True)
        return int(exc.exit_code)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.Abort:
        click.echo("runnerctl: aborted", err=True)
        return int(ExitCode.ERROR)
    except click.ClickException as exc:
        exc.show()
        return int(ExitCode.USAGE)
    except KeyboardInterrupt:
        return 130
    # click returns a command's exit code (from ctx.exit / Exit) when not standalone
    return result if isinstance(result, int) else int(ExitCode.OK)


def entry() -> None:
    sys.exit(main())
