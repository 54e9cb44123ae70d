"""Errors that carry what went wrong, what to do about it, and their retry policy.

Every error a user can cause or fix is a `RunnerctlError`: the CLI turns it into one
line on stderr and an exit code, never a traceback.
"""

from __future__ import annotations

import enum
import re

_URL_PASSWORD = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)[^/\s\"']*@")


_KEYWORD_PASSWORD = re.compile(r"((?:^|[?&\s])password=)('[^']*'|[^&\s\"']*)")
"""A password given as `?password=` in a URL or `password=` in a libpq keyword string."""
_QUOTED_TOKEN = re.compile(r"(percent-encoded (?:token|value): )\"[^\"]*\"")
"""libpq quotes the part of a URL it cannot decode, which may be the password."""


def redact(text: str) -> str:
    """`text` with the password of any URL in it masked (`scheme://user:***@host`, and the
    `password=` forms): an error from a database driver or one no check foresaw may quote
    the URL it was given (found again by a secrets audit: a `?password=` URL in a dry run,
    libpq quoting an undecodable password)."""
    text = _URL_PASSWORD.sub(r"\1***@", text)
    text = _KEYWORD_PASSWORD.sub(r"\1***", text)
    return _QUOTED_TOKEN.sub(r'\1"***"', text)


def undecodable(text: str) -> bool:
    """Does `text` hold bytes this process's locale could not decode? Python hands them
    over as lone surrogates (PEP 383): Japanese typed on a command line under LANG=C."""
    return any(0xDC80 <= ord(c) <= 0xDCFF for c in text)


LOCALE_HINT = "run runnerctl with a UTF-8 locale, such as LANG=C.UTF-8"


def first_line(exc: BaseException) -> str:
    """An error's first line, any URL's password in it masked (libpq quotes the connection
    string it could not parse)."""
    lines = redact(str(exc)).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


class ExitCode(enum.IntEnum):
    """Process exit codes of the `runnerctl` command."""

    OK = 0
    ERROR = 1
    USAGE = 2
    CONFIG = 3
    GITLAB = 4
    GPU = 5
    UNAVAILABLE = 6


class RunnerctlError(Exception):
    """A failure to report as one line: what is wrong and what to do."""

    exit_code: ExitCode = ExitCode.ERROR

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class ConfigError(RunnerctlError):
    """A configuration file or input is malformed; nothing was changed."""

    exit_code = ExitCode.CONFIG


class GpuError(RunnerctlError):
    """The GPU inventory cannot be read (no driver, bad simulation file)."""

    exit_code = ExitCode.GPU


class GitLabError(RunnerctlError):
    """GitLab refused or failed a request."""

    exit_code = ExitCode.GITLAB


class TemporaryError(GitLabError):
    """Worth retrying after `delay` seconds (rate limit, 5xx, connection failure)."""

    def __init__(self, message: str, *, delay: float, hint: str | None = None, told: bool = False) -> None:
        super().__init__(message, hint=hint)
        self.delay = delay
        self.told = told
        """GitLab said when (`Retry-After`): wait that long, not longer for each failure."""


class PermanentError(GitLabError):
    """Retrying will not help until someone changes something (token, permissions)."""


class NotFoundError(PermanentError):
    """404: the runner, project or job does not exist, or the token cannot see it."""
