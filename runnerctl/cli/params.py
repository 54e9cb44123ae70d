"""Click parameter types the built-in ones lack (numbers and durations that must be
finite, `simulate --runner-max-timeout-s`), and the options every command shares
(`--config`).

`click.FloatRange` lets `nan` through (every comparison with it is false) and `inf` when
there is no upper bound; a NaN interval makes a loop spin, an infinite one overflows
`time.sleep`.
"""

from __future__ import annotations

import math
from pathlib import Path

import click

from runnerctl.errors import ConfigError
from runnerctl.settings import MAX_RUNNER_TIMEOUT_S
from runnerctl.sim.timeouts import parse_runner_timeouts

config_option = click.option(
    "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
    help="runnerctl settings file [default: $RUNNERCTL_CONFIG, else /etc/runnerctl/runnerctl.toml "
         "as root or ~/.config/runnerctl/runnerctl.toml]")


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


def runner_timeouts(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """`simulate --runner-max-timeout-s`, checked part by part with `parse_runner_timeouts`:
    every runner's and each size's timeout given once, none over what runnerctl.toml
    takes (MAX_RUNNER_TIMEOUT_S); the value is passed on as it is."""
    if value is None:
        return None
    given: set[int | None] = set()
    for part in value.split(","):
        try:
            default, by_gpus = parse_runner_timeouts(part)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        size, seconds = by_gpus[0] if by_gpus else (None, default)
        if size in given:
            whose = "every runner's" if size is None else f"the {size}-GPU runners'"
            raise ConfigError(f"--runner-max-timeout-s {value!r}: {whose} maximum timeout is given twice")
        if seconds is not None and seconds > MAX_RUNNER_TIMEOUT_S:
            raise ConfigError(f"runner maximum timeout {part.strip()!r}: more than {MAX_RUNNER_TIMEOUT_S} "
                              "seconds (the most [controller] runner_max_timeout_s takes)")
        given.add(size)
    return value
