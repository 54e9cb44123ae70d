"""The `runnerctl` command: `main(argv) -> exit code`.

Commands live in one module per area and are registered in `COMMANDS`. Every
`RunnerctlError` becomes one line on stderr and its exit code; so do usage errors and
a file the system refuses (`OSError`: permissions, an immutable file, a full disk); no
traceback for anything a user can fix. A missing optional dependency (Optuna and its
kin) names the extra that installs it. An error no check foresaw is one line too (a
URL's password masked), with the traceback under `-vv`.
"""

from __future__ import annotations

import errno
import locale
import logging
import sys
from collections.abc import Sequence

import click

from runnerctl import __version__
from runnerctl.cli import controller, experiments, host, monitoring, ops, report, sim, users
from runnerctl.errors import LOCALE_HINT, ExitCode, RunnerctlError, redact
from runnerctl.logline import configure, to_journal

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
    sim.sim,
    ops.install,
    ops.uninstall,
    report.report,
]

OPTIONAL_MODULES = {  # top-level module -> the extra (pyproject.toml) that installs it
    "optuna": "optuna",
    "optuna_dashboard": "optuna",
    "plotly": "optuna",
    "sqlalchemy": "optuna",  # Optuna's RDB storage; installed with optuna
}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="runnerctl")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def cli(verbose: int) -> None:
    """Turn shared multi-GPU servers and a GitLab instance into a fair, safe GPU cluster."""
    level = logging.WARNING - 10 * min(verbose, 2)
    configure(level, "runnerctl: %(levelname)s %(name)s: %(message)s")  # control chars escaped


for _command in COMMANDS:
    cli.add_command(_command)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        result = cli.main(args=list(argv) if argv is not None else None, prog_name="runnerctl",
                          standalone_mode=False)
    except RunnerctlError as exc:
        error(str(exc))
        return int(exc.exit_code)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.Abort as exc:
        if isinstance(exc.__context__, KeyboardInterrupt):  # click's own for Ctrl-C: 130, as a shell's
            return 130
        click.echo("runnerctl: aborted", err=True)
        return int(ExitCode.ERROR)
    except click.exceptions.NoArgsIsHelpError as exc:  # a bare `runnerctl` (or group): its help
        click.echo(exc.ctx.get_help() if exc.ctx is not None else exc.format_message())
        return int(ExitCode.USAGE)
    except click.UsageError as exc:  # one line, naming where to read the usage
        see = f" (see `{exc.ctx.command_path} -h`)" if exc.ctx is not None else ""
        error(f"{exc.format_message()}{see}")
        return int(ExitCode.USAGE)
    except click.ClickException as exc:
        error(exc.format_message())
        return int(ExitCode.USAGE)
    except OSError as exc:  # a file or directory refused us (permissions, immutable, full disk)
        error(os_error(exc))
        return int(ExitCode.ERROR)
    except KeyboardInterrupt:
        return 130
    except UnicodeEncodeError as exc:  # Japanese typed under LANG=C (`pause --why`), or shown in latin-1
        error(f"text that is not valid {exc.encoding} cannot be stored or shown (the locale's encoding is "
              f"{locale.getpreferredencoding(False)}): {LOCALE_HINT}")
        return int(ExitCode.USAGE)
    except Exception as exc:  # a case no check foresaw: still one line, the traceback in -vv
        logging.getLogger("runnerctl").debug("unexpected error", exc_info=True)
        missing = missing_extra(exc)
        if missing is not None:  # an optional dependency: name the extra that installs it
            error(missing)
            return int(ExitCode.ERROR)
        error(f"unexpected {type(exc).__name__}: {redact(str(exc))} (run with -vv for the "
              "traceback, and please report it)")
        return int(ExitCode.ERROR)
    # click returns a command's exit code (from ctx.exit / Exit) when not standalone
    return result if isinstance(result, int) else int(ExitCode.OK)


def missing_extra(exc: Exception) -> str | None:
    """`MODULE is not installed (pip install ...)` when `exc` is an optional module's import
    failing; None for anything else."""
    if not isinstance(exc, ModuleNotFoundError) or exc.name is None:
        return None
    module = exc.name.partition(".")[0]
    extra = OPTIONAL_MODULES.get(module)
    return None if extra is None else f"{module} is not installed (pip install 'runnerctl[{extra}]')"


def error(message: str) -> None:
    """One line on stderr, whatever the message holds (input echoed in it may carry a
    newline or other control characters: they are shown escaped)."""
    shown = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in message)
    priority = "<3>" if to_journal() else ""  # under systemd: an error, so `journalctl -p err` finds
    # why serve would not start (it was filed as info; found by a review as an on-call engineer)
    click.echo(f"{priority}runnerctl: error: {shown}", err=True)


def os_error(exc: OSError) -> str:
    """`PATH: reason (what to check)` for a failed file operation."""
    where = ": ".join(str(p) for p in (exc.filename, exc.filename2) if p is not None)
    reason = exc.strerror or str(exc) or type(exc).__name__
    text = f"{where}: {reason}" if where else reason
    if exc.errno in (errno.EPERM, errno.EACCES, errno.EROFS):
        text += " (check its owner, mode and attributes: ls -l, lsattr)"
    return text


def entry() -> None:
    sys.exit(main())
