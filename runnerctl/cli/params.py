"""Click parameter types the built-in ones lack (numbers and durations that must be
finite), and the options every command shares (`--config`).

`click.FloatRange` lets `nan` through (every comparison with it is false) and `inf` when
there is no upper bound; a NaN interval makes a loop spin, an infinite one overflows
`time.sleep`.
"""

from __future__ import annotations

import math
from pathlib import Path
from urllib.parse import urlsplit

import click

from runnerctl.errors import ConfigError

config_option = click.option(
    "--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="runnerctl settings file; it must exist (a misspelt path would otherwise mean the defaults, "
         "their state directory included) [default: $RUNNERCTL_CONFIG, else "
         "/etc/runnerctl/runnerctl.toml as root or ~/.config/runnerctl/runnerctl.toml; absent there: "
         "the defaults]")


class Finite(click.ParamType[float]):
    """A finite number of `unit` (hours, minutes) from `low` to `high`."""

    def __init__(self, low: float, high: float, unit: str) -> None:
        self.low, self.high, self.name = low, high, unit

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of {self.name}", param, ctx)
        if not (math.isfinite(number) and self.low <= number <= self.high):
            self.fail(f"{value!r} is not from {self.low:g} to {self.high:g} {self.name}", param, ctx)
        return number


class Seconds(Finite):
    """A finite number of seconds from `low` to `high`."""

    def __init__(self, low: float, high: float) -> None:
        super().__init__(low, high, "seconds")


class GitLabUrl(click.ParamType[str]):
    """An http(s) URL naming a host (`sim` too where `allow_sim`), without a trailing slash:
    serve, doctor and init took `notaurl` or `http://[::1` and retried it for ever, or
    failed with "unexpected ValueError" (found by a review fuzzing the CLI)."""

    name = "URL"

    def __init__(self, *, allow_sim: bool = False) -> None:
        self.allow_sim = allow_sim

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> str:
        url = str(value)
        if self.allow_sim and url == "sim":
            return url
        try:
            parts = urlsplit(url)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
        except ValueError:  # an unclosed [ of an IPv6 address, a port that is no number
            ok = False
        if not ok or any(ord(c) <= 32 or ord(c) == 127 for c in url):  # no space or control character
            option = param.opts[0] if param is not None and param.opts else "the GitLab URL"
            raise ConfigError(f"{option} {url!r} is not an http(s) URL with a host"
                              + (", nor sim" if self.allow_sim else ""),
                              hint="for example https://gitlab.example.org")
        return url.rstrip("/")
