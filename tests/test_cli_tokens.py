"""GitLab tokens are never printed and never on the command line (issue 14): `--token`
is refused with the way to do it instead, `--token-file` and `$RUNNERCTL_GITLAB_TOKEN`
work, and `init --dry-run` masks the runner tokens of an existing config.toml."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runnerctl.cli import main
from runnerctl.errors import ExitCode
from runnerctl.sim.gitlab_server import GitLabServer
from tests.conftest import ADMIN_TOKEN, defaults_toml, token_file


def _init(server: GitLabServer, config: Path, *extra: str) -> int:
    return main(["init", "--gitlab-url", server.url, "--gpu-source", "sim:2", "--host", "gpu-a",
                 "--runner-config", str(config), "--config", str(defaults_toml(config.parent)), *extra])


@pytest.mark.parametrize("command", [["init", "--gitlab-url", "http://127.0.0.1:1"],
                                     ["serve", "--gitlab", "http://127.0.0.1:1"],
                                     ["doctor", "--gitlab-url", "http://127.0.0.1:1"]])
def test_a_token_on_the_command_line_is_refused_with_the_way_out(command: list[str],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*command, "--token", "glpat-on-argv-1234"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "RUNNERCTL_GITLAB_TOKEN" in err and "--token-file" in err and "ps" in err
    assert "glpat-on-argv-1234" not in err and "Traceback" not in err


def test_token_file_and_environment_both_work(gitlab_server: GitLabServer, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    assert _init(gitlab_server, tmp_path / "a.toml", "--token-file", token_file(tmp_path)) == 0
    monkeypatch.setenv("RUNNERCTL_GITLAB_TOKEN", ADMIN_TOKEN)
    assert _init(gitlab_server, tmp_path / "b.toml") == 0
    assert (tmp_path / "b.toml").read_text().count("glrt-") == 3  # registered with the variable's token


@pytest.mark.parametrize(("content", "mode", "says"), [("", 0o600, "on one line"),
                                                       ("glpat-x\nglpat-y\n", 0o600, "on one line"),
                                                       (ADMIN_TOKEN, 0o644, "chmod 600")])
def test_a_bad_token_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str,
                                      mode: int, says: str, gitlab_server: GitLabServer) -> None:
    path = tmp_path / "token"
    path.write_text(content)
    path.chmod(mode)
    assert _init(gitlab_server, tmp_path / "c.toml", "--token-file", str(path)) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and ADMIN_TOKEN not in err
    assert gitlab_server.state.runners == {}


def test_dry_run_masks_the_tokens_of_an_existing_config(gitlab_server: GitLabServer, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.toml"
    assert _init(gitlab_server, config, "--token-file", token_file(tmp_path)) == 0
    real = re.findall(r"glrt-[0-9A-Za-z_.\-]+", config.read_text())
    assert len(real) == 3
    capsys.readouterr()
    assert main(["init", "--gitlab-url", gitlab_server.url, "--gpu-source", "sim:4", "--host", "gpu-a",
                 "--runner-config", str(config), "--config", str(defaults_toml(tmp_path)), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count('token = "<masked>"') == 3 and "<token from GitLab" in out  # kept, and new slots
    for token in real:
        assert token not in out and token[5:] not in out


def test_dry_run_masks_the_optuna_storage_password(gitlab_server: GitLabServer, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The storage URL goes into every runner's environment; a dry run prints no password."""
    for url, shown in (("journal+postgresql://optuna:RXe-p_Rb4s3cret@db.lab:5432/optuna",
                        "journal+postgresql://optuna:***@db.lab:5432/optuna"),
                       ("journal+postgresql://optuna@db.lab:5432/optuna?password=RXe-p_Rb4s3cret",
                        "journal+postgresql://optuna@db.lab:5432/optuna?password=***")):  # libpq's form too
        assert main(["init", "--gitlab-url", gitlab_server.url, "--gpu-source", "sim:2", "--host", "gpu-a",
                     "--runner-config", str(tmp_path / "config.toml"),
                     "--config", str(defaults_toml(tmp_path)), "--token-file", token_file(tmp_path),
                     "--optuna-storage", url, "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert "RXe-p_Rb4s3cret" not in out and out.count(shown) >= 2, out
