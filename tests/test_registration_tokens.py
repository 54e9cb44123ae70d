"""A GitLab token that no HTTP header can carry (a newline, a non-ASCII character) is one
line before anything is sent, from `$RUNNERCTL_GITLAB_TOKEN` as from `--token-file`
(one check, `host.clean_token`), never `ValueError: Invalid header value`."""

from __future__ import annotations

from pathlib import Path

import pytest

from runnerctl.cli import main
from runnerctl.sim.gitlab_server import GitLabServer
from tests.conftest import defaults_toml
from tests.test_cli_validation import one_line

BAD_TOKENS = ["glpat-a\nglpat-b", "glpat-\U0001f600", "glpat-a b", "glpat-\x7f", "   "]
SHAPE = "must hold the token alone on one line (printable ASCII, no spaces)"


def _args(command: str, server: GitLabServer, tmp_path: Path) -> list[str]:
    common = ["--gpu-source", "sim:2", "--host", "gpu-a", "--runner-config", str(tmp_path / "config.toml"),
              "--config", str(defaults_toml(tmp_path))]
    return [command, "--gitlab-url", server.url, *common]


@pytest.mark.parametrize("token", BAD_TOKENS)
@pytest.mark.parametrize("command", ["init", "doctor", "uninstall"])
def test_a_bad_token_in_the_environment_is_one_line(gitlab_server: GitLabServer, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str],
                                                   token: str, command: str) -> None:
    monkeypatch.setenv("RUNNERCTL_GITLAB_TOKEN", token)
    args = _args(command, gitlab_server, tmp_path)
    if command == "uninstall":
        args = [a for a in args if a not in ("--gpu-source", "sim:2", "--host", "gpu-a")]
    err = one_line(capsys, main(args), 3, f"$RUNNERCTL_GITLAB_TOKEN {SHAPE} (fix it, or unset it and pass "
                                          "--token-file PATH)")
    assert token.strip() == "" or token not in err
    assert gitlab_server.state.runners == {} and not (tmp_path / "config.toml").exists()


@pytest.mark.parametrize("token", BAD_TOKENS)
def test_a_bad_token_in_the_file_is_one_line(gitlab_server: GitLabServer, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str], token: str) -> None:
    path = tmp_path / "token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    code = main([*_args("init", gitlab_server, tmp_path), "--token-file", str(path)])
    one_line(capsys, code, 2, f"Invalid value for '--token-file': {path} {SHAPE}")
    assert gitlab_server.state.runners == {}
