"""Click parameter types the built-in ones lack (numbers and durations that must be
finite), and the options every command shares (`--config`).

`click.FloatRange` lets `nan` through (every comparison with it is false) and `inf` when
there is no upper bound; a NaN interval makes a loop spin, an infinite one overflows
`time.sleep`.
"""

from __future__ import annotations

import math
from pathlib import Path

import click

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
