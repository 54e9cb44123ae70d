"""Numbers `simulate` and `sim gitlab` take from the command line are finite and within
their bounds (click.FloatRange let `nan` through, and `inf` where unbounded), and
`--runner-max-timeout-s` names every runner size once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runnerctl.cli import main
from tests.test_cli_validation import HEADER, one_line


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "jobs.csv"
    path.write_text(HEADER + "1,0,1,10\n")
    return path


@pytest.mark.parametrize(("option", "value", "needle"), [
    ("--fair-weight-h", "nan", "'nan' is not from 0 to 10000 hours"),
    ("--fair-weight-h", "inf", "'inf' is not from 0 to 10000 hours"),
    ("--fair-half-life-h", "nan", "'nan' is not from 0.01 to 100000 hours"),
    ("--fair-queue-step-min", "nan", "'nan' is not from 0 to 100000 minutes"),
    ("--fair-queue-step-min", "many", "'many' is not a number of minutes"),
])
def test_fair_share_numbers_must_be_finite(trace: Path, capsys: pytest.CaptureFixture[str], option: str,
                                           value: str, needle: str) -> None:
    one_line(capsys, main(["simulate", "--trace", str(trace), option, value]), 2,
             f"Invalid value for '{option}': {needle} (see `runnerctl simulate -h`)")


@pytest.mark.parametrize(("value", "needle"), [
    ("1=700,1=800",
     "--runner-max-timeout-s '1=700,1=800': the 1-GPU runners' maximum timeout is given twice"),
    ("01=700,1=800", "the 1-GPU runners' maximum timeout is given twice"),
    ("7200,1=700,9000",
     "--runner-max-timeout-s '7200,1=700,9000': every runner's maximum timeout is given twice"),
    ("2147483648", "runner maximum timeout '2147483648': more than 2147483647 seconds"),
    ("1=1e300", "runner maximum timeout '1=1e300': more than 2147483647 seconds"),
    ("inf", "runner maximum timeout 'inf': more than 2147483647 seconds"),
    ("nan", "runner maximum timeout nan s: GitLab needs a number of seconds, at least 600"),
    ("1=x", "runner maximum timeout '1=x': give SECONDS or GPUS=SECONDS"),
])
def test_runner_max_timeouts_are_given_once_and_bounded(trace: Path, capsys: pytest.CaptureFixture[str],
                                                        value: str, needle: str) -> None:
    one_line(capsys, main(["simulate", "--trace", str(trace), "--runner-max-timeout-s", value]), 3, needle)


def test_good_runner_max_timeouts_still_simulate(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for value in ("1=700,2=800", "2147483647", "86400,1=7200"):
        assert main(["simulate", "--trace", str(trace), "--runner-max-timeout-s", value, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["jobs_completed"] == 1


@pytest.mark.parametrize("value", ["inf", "1e308", "nan", "604801", "0"])
def test_sim_gitlab_drop_interval_is_finite_and_at_most_a_week(capsys: pytest.CaptureFixture[str],
                                                               value: str) -> None:
    """`inf` and 1e308 were an OverflowError in the drop thread, `nan` a spinning one."""
    one_line(capsys, main(["sim", "gitlab", "--drop-interval", value]), 2,
             f"Invalid value for '--drop-interval': '{value}' is not from 0.01 to 604800 seconds")
