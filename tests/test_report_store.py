"""`runnerctl report` only reads: a missing store is one line, the same with --state-dir
as with the settings' state directory, and nothing is created (it used to make the
directory and an empty store, then print "(no jobs in this period)")."""

from __future__ import annotations

from pathlib import Path

import pytest

from runnerctl.cli import main
from tests.test_cli_validation import one_line

MISSING = "no controller store in {} (controller.sqlite is missing) (pass the state directory of `serve`"


@pytest.mark.parametrize("exists", [False, True])
def test_report_refuses_a_missing_store_from_the_settings_too(tmp_path: Path, exists: bool,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    if exists:
        state.mkdir()
    config = tmp_path / "runnerctl.toml"
    config.write_text(f'[paths]\nstate_dir = "{state}"\n')
    one_line(capsys, main(["report", "--config", str(config)]), 3, MISSING.format(state))
    assert sorted(p.name for p in tmp_path.rglob("*")) == (["runnerctl.toml", "state"] if exists
                                                           else ["runnerctl.toml"])
    one_line(capsys, main(["report", "--state-dir", str(state)]), 3, MISSING.format(state))


def test_report_reads_an_existing_store_from_the_settings(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--duration", "0", "--listen", "", "--state-dir", str(tmp_path / "state")]) == 0
    capsys.readouterr()
    config = tmp_path / "runnerctl.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp_path / "state"}"\n')
    assert main(["report", "--config", str(config), "--csv"]) == 0
    assert capsys.readouterr().out.startswith("user,jobs,gpu_hours")
