"""`runnerctl sim runner` on a config.toml whose `runners` is no array of tables: one
line naming the file (it was a TypeError), at start and on a reload."""

from __future__ import annotations

from pathlib import Path

import pytest

from runnerctl.cli import main
from runnerctl.errors import ConfigError
from runnerctl.sim.runner_toml import load
from tests.test_cli_validation import one_line


@pytest.mark.parametrize(("line", "shown"), [("runners = 5", "5"), ('runners = "x"', "'x'"),
                                             ("runners = {a = 1}", "{'a': 1}")])
def test_runners_that_are_not_an_array_of_tables_are_one_line(tmp_path: Path, line: str, shown: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f"concurrent = 1\n{line}\n")
    code = main(["sim", "runner", "--runner-config", str(config)])
    one_line(capsys, code, 3, f"{config}: runners = {shown} is not an array of tables ([[runners]])")


def test_an_empty_runners_array_is_still_read(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("concurrent = 1\nrunners = []\n")
    assert load(config).runners == ()
    config.write_text("concurrent = 1\nrunners = [1]\n")
    with pytest.raises(ConfigError, match=r"\[\[runners\]\] #1 is not a table"):
        load(config)


def test_prepare_timeout_is_a_go_duration(tmp_path: Path) -> None:
    """common/config.go: `PrepareTimeout *time.Duration`, written "30s" or "1h30m"; the
    simulated runner read it as whole seconds and refused a real config.toml's value."""
    config = tmp_path / "config.toml"
    runner = '[[runners]]\nname = "r"\nexecutor = "custom"\n'
    config.write_text(f'concurrent = 1\n{runner}prepare_timeout = "1h30m"\n')
    assert load(config).runners[0].prepare_timeout_s == 5400
    config.write_text(f"concurrent = 1\n{runner}")
    assert load(config).runners[0].prepare_timeout_s is None
    config.write_text(f"concurrent = 1\n{runner}prepare_timeout = 30\n")
    with pytest.raises(ConfigError, match=r'prepare_timeout must be a Go duration such as "30s"'):
        load(config)
