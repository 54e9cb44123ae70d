"""A runnerctl entry of gitlab-runner's config.toml whose `id` is no GitLab runner id is
one line naming the entry, for every command that reads it (init, uninstall, doctor),
never a ValueError, an OverflowError, or a plan to delete runner -4."""

from __future__ import annotations

from pathlib import Path

import pytest

from runnerctl.cli import main
from runnerctl.runner_config import RunnerConfigFile
from tests.conftest import defaults_toml
from tests.test_cli_validation import one_line

ENTRY = 'concurrent = 1\n\n[[runners]]\nname = "runnerctl/gpu-a/gpu0"\nurl = "http://127.0.0.1:9"\n' \
        'token = "glrt-x"\nexecutor = "custom"\nid = {}\n'


def _config(tmp_path: Path, runner_id: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(ENTRY.format(runner_id))
    path.chmod(0o600)
    return path


def _commands(tmp_path: Path, config: Path) -> dict[str, list[str]]:
    common = ["--runner-config", str(config), "--config", str(defaults_toml(tmp_path))]
    return {"init": ["init", "--gitlab-url", "http://127.0.0.1:9", "--gpu-source", "sim:1", "--host", "gpu-a",
                     "--dry-run", *common],
            "uninstall": ["uninstall", "--dry-run", "--root", str(tmp_path), *common]}


@pytest.mark.parametrize(("runner_id", "shown"), [('"abc"', "'abc'"), ("inf", "inf"), ("nan", "nan"),
                                                   ("-4", "-4"), ("1.5e300", "1.5e+300"), ("12.0", "12.0"),
                                                   ("true", "True"), ('"12"', "'12'"),
                                                   ("9223372036854775808", "9223372036854775808")])
@pytest.mark.parametrize("command", ["init", "uninstall"])
def test_a_bad_runner_id_is_one_line_naming_the_entry(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      runner_id: str, shown: str, command: str) -> None:
    config = _config(tmp_path, runner_id)
    before = config.read_text()
    code = main(_commands(tmp_path, config)[command])
    one_line(capsys, code, 3, f"{config}: runner 'runnerctl/gpu-a/gpu0' has id = {shown}, not a GitLab "
                              "runner id (a positive whole number) (fix or remove that entry by hand")
    assert config.read_text() == before


def test_doctor_reports_a_bad_runner_id_as_one_failed_check(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, '"abc"')
    code = main(["doctor", "--gpu-source", "sim:1", "--runner-config", str(config),
                 "--config", str(defaults_toml(tmp_path))])
    out = capsys.readouterr()
    assert code == 1 and "Traceback" not in out.err
    assert f"[FAIL] config.toml: {config}: runner 'runnerctl/gpu-a/gpu0' has id = 'abc'" in out.out


@pytest.mark.parametrize(("runner_id", "read"), [("7", 7), ("0", None)])
def test_a_good_runner_id_is_read_and_0_is_none(tmp_path: Path, runner_id: str, read: int | None,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, runner_id)
    assert RunnerConfigFile(config).owned_entries()["runnerctl/gpu-a/gpu0"]["id"] == read
    assert main(_commands(tmp_path, config)["uninstall"]) == 0
    expected = "# delete runner 7 (runnerctl/gpu-a/gpu0) in GitLab" if read else \
        "# no runner id for runnerctl/gpu-a/gpu0"
    assert expected in capsys.readouterr().out.splitlines()
