"""`runnerctl` itself: a bare command shows its help; an error no check foresaw is still
one line on stderr (a URL's password masked), its traceback only under -vv."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

import runnerctl.cli.host
from runnerctl.cli import main
from runnerctl.settings import parse_listen


@pytest.mark.parametrize("argv", [[], ["sim"], ["user"], ["postgres"]])
def test_a_bare_command_prints_its_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out.startswith(f"Usage: runnerctl {' '.join(argv)}".rstrip() + " [OPTIONS] COMMAND")
    assert "\n\nCommands:\n" in out and "\\n" not in out and err == ""


def _boom(config_path: Path | None) -> None:
    raise ValueError("cannot use postgresql://ann:s3cr@t@db.lab/runnerctl")


def test_an_unforeseen_error_is_one_line_without_the_password(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(runnerctl.cli.host, "_settings", _boom)
    assert main(["status", "--gpu-source", "sim:2"]) == 1
    out, err = capsys.readouterr()
    assert err == ("runnerctl: error: unexpected ValueError: cannot use "
                   "postgresql://ann:***@db.lab/runnerctl (run with -vv for the traceback, "
                   "and please report it)\n")
    assert "s3cr" not in out + err and "Traceback" not in err


def test_its_traceback_is_in_the_debug_log(monkeypatch: pytest.MonkeyPatch,
                                           caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(runnerctl.cli.host, "_settings", _boom)
    with caplog.at_level("DEBUG", logger="runnerctl"):
        assert main(["-vv", "status", "--gpu-source", "sim:2"]) == 1
    assert any(r.exc_info and r.exc_info[0] is ValueError for r in caplog.records)


@pytest.mark.parametrize("name", ["x,gpus:8", "a/b", "two words", "-x", "x" * 64])
def test_a_host_name_that_would_break_runner_names_or_tags_is_refused(
        name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """GitLab splits a tag list on commas: host `x,gpus:8` would give a 1-GPU runner the
    tag `gpus:8`; a `/` would break the runner's name `runnerctl/HOST/KEY`."""
    assert main(["status", "--gpu-source", "sim:2", "--host", name]) == 3
    err = capsys.readouterr().err
    assert err.startswith(f"runnerctl: error: host name {name!r} must be 1 to 63 letters")
    assert err.count("\n") == 1


def test_user_add_without_a_terminal_says_to_pipe_the_password(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("secret\n"))  # not a terminal, no --password-stdin
    assert main(["user", "add", "bob", "--state-dir", str(tmp_path)]) == 3
    assert capsys.readouterr().err == ("runnerctl: error: no terminal to ask the password on "
                                       "(pipe it in with --password-stdin)\n")
    assert not (tmp_path / "controller.sqlite").exists()  # nothing written


@pytest.mark.parametrize(("listen", "parsed"), [
    ("[::1]:8080", ("::1", 8080)), ("127.0.0.1:0", ("127.0.0.1", 0)), ("gpu-a.lab:80", ("gpu-a.lab", 80))])
def test_listen_addresses_parse_ipv6_without_brackets(listen: str, parsed: tuple[str, int]) -> None:
    assert parse_listen(listen) == parsed


@pytest.mark.parametrize("argv", [
    ["serve", "--gitlab", "http://[::1", "--gpu-source", "sim:2", "--listen", "127.0.0.1:0"],
    ["serve", "--gitlab", "notaurl", "--gpu-source", "sim:2", "--listen", "127.0.0.1:0"],
    ["doctor", "--gitlab-url", "http://[::1", "--gpu-source", "sim:2"],
    ["init", "--gitlab-url", "ftp://gitlab.example", "--group", "1", "--dry-run", "--gpu-source", "sim:2"],
    ["uninstall", "--gitlab-url", "", "--dry-run"],
])
def test_a_gitlab_url_that_is_none_is_refused_in_one_line_before_anything_runs(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """serve started on `notaurl` and retried it for ever (`http://[::1` with a traceback
    each tick); doctor and init failed with "unexpected ValueError" (found by a review
    fuzzing the CLI). install already refused them; every command now does."""
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert "is not an http(s) URL with a host" in err and len(err.strip().splitlines()) == 1, err


def test_ctrl_c_ends_a_command_with_130_and_no_error_line(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """click turns Ctrl-C into its Abort, which said `runnerctl: aborted` and exited 1, not
    a shell's 130 (found by a review fuzzing the CLI)."""
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("runnerctl.cli.report._existing_store", interrupted)
    assert main(["report", "--state-dir", "/nonexistent-runnerctl"]) == 130
    assert "aborted" not in capsys.readouterr().err


def test_serve_takes_its_secrets_out_of_the_environment_its_children_inherit(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every process serve starts inherits its environment: the batch drivers' scancel or
    qdel, run as the job's user when serve frees a lease, showed the GitLab token to that
    user in /proc/PID/environ (found by a secrets audit)."""
    import subprocess

    secrets = {"RUNNERCTL_GITLAB_TOKEN": "glpat-serve-secret-0123", "RUNNERCTL_WEBHOOK_SECRET": "hook-secret",
               "RUNNERCTL_GITLAB_OAUTH_SECRET": "oauth-secret"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RUNNERCTL_CONFIG", str(tmp_path / "none.toml"))
    assert main(["serve", "--gitlab", "sim", "--listen", "127.0.0.1:99999"]) != 0  # read, then refused
    child = subprocess.run(["env"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert not any(value in child for value in secrets.values())
