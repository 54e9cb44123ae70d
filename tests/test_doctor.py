"""`runnerctl doctor` says what is wrong and what to fix, and exits non-zero then."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from runnerctl.cli import main
from runnerctl.sim.gitlab_server import GitLabServer
from tests.conftest import defaults_toml, token_file


def _doctor(tmp_path: Path, config: Path, *extra: str) -> int:
    return main(["doctor", "--gpu-source", "sim:2", "--host", "gpu-a", "--runner-config",
                 str(config), "--config", str(defaults_toml(tmp_path)), *extra])


def test_healthy_host_passes(gitlab_server: GitLabServer, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake_runner = bindir / "gitlab-runner"
    fake_runner.write_text("#!/bin/sh\nexit 0\n")
    fake_runner.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    config = tmp_path / "config.toml"
    assert main(["init", "--gitlab-url", gitlab_server.url, "--token-file", token_file(tmp_path),
                 "--gpu-source", "sim:2", "--host", "gpu-a", "--runner-config", str(config),
                 "--config", str(defaults_toml(tmp_path))]) == 0
    capsys.readouterr()
    (tmp_path / ".runner_system_id").write_text("s_0a1b2c3d4e5f\n")  # gitlab-runner's, beside config.toml
    assert _doctor(tmp_path, config, "--token-file", token_file(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out
    assert "3/3 runners known" in out
    assert "runner tokens valid (3/3), verified as gitlab-runner's own manager s_0a1b2c3d4e5f" in out


def test_without_gitlab_runners_system_id_tokens_are_not_verified(gitlab_server: GitLabServer, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """POST /runners/verify records a runner manager under the system_id it is given
    (gitlabhq lib/api/ci/helpers/runner.rb): doctor never invents one."""
    config = tmp_path / "config.toml"
    assert main(["init", "--gitlab-url", gitlab_server.url, "--token-file", token_file(tmp_path),
                 "--gpu-source", "sim:2", "--host", "gpu-a", "--runner-config", str(config),
                 "--config", str(defaults_toml(tmp_path))]) == 0
    (tmp_path / ".runner_system_id").write_text("runnerctl-doctor")  # malformed: gitlab-runner ignores it
    capsys.readouterr()
    _doctor(tmp_path, config, "--token-file", token_file(tmp_path))
    out = capsys.readouterr().out
    assert "[skip] runner tokens not verified: gitlab-runner's .runner_system_id" in out
    assert not [r for r in gitlab_server.requests if r.path == "/runners/verify"]


def test_problems_are_named_with_a_fix(gitlab_server: GitLabServer, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.toml"
    main(["init", "--gitlab-url", gitlab_server.url, "--token-file", token_file(tmp_path), "--gpu-source",
          "sim:2", "--host", "gpu-a", "--runner-config", str(config),
          "--config", str(defaults_toml(tmp_path))])
    config.chmod(0o644)
    deleted = next(iter(gitlab_server.state.runners))
    gitlab_server.state.delete_runner(deleted)
    capsys.readouterr()
    code = _doctor(tmp_path, config, "--token-file", token_file(tmp_path))
    out = capsys.readouterr().out
    assert code == 1
    assert "[FAIL] config.toml mode 644" in out and "chmod 600" in out
    assert "2/3 runners known" in out and "runnerctl init" in out
    if shutil.which("gitlab-runner") is None:
        assert "[FAIL] gitlab-runner on PATH" in out
    assert stat.S_IMODE(config.stat().st_mode) == 0o644  # doctor changes nothing


def test_doctor_without_gpus_or_config(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "runnerctl", "doctor", "--gpu-source", "nvml", "--runner-config",
         str(tmp_path / "none.toml")],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "LD_LIBRARY_PATH": str(tmp_path),
             "RUNNERCTL_CONFIG": str(tmp_path / "absent.toml")})
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "[FAIL] GPUs: cannot initialise NVML" in result.stdout
    assert "--gpu-source sim:N" in result.stdout
    assert "run `runnerctl init` to create it" in result.stdout
    assert f"settings: {tmp_path / 'absent.toml'} (absent: defaults)" in result.stdout


def test_runners_that_no_longer_follow_the_settings_are_named(gitlab_server: GitLabServer, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A driver changed in runnerctl.toml reached no job until init ran again, while doctor
    said all was well (found by a review as a lab admin)."""
    config = tmp_path / "config.toml"
    assert main(["init", "--gitlab-url", gitlab_server.url, "--token-file", token_file(tmp_path),
                 "--gpu-source", "sim:2", "--host", "gpu-a", "--runner-config", str(config),
                 "--config", str(defaults_toml(tmp_path))]) == 0
    capsys.readouterr()
    _doctor(tmp_path, config)
    assert "[ok] config.toml's runners follow the settings" in capsys.readouterr().out
    defaults_toml(tmp_path).write_text('[executor]\ndriver = "shell"\ngate_wait_s = 3600\n')
    assert _doctor(tmp_path, config) == 1
    out = capsys.readouterr().out
    assert ("[FAIL] config.toml's runners follow the settings: runnerctl/gpu-a/gpu0 runs with --driver "
            "docker, the settings say shell") in out
    assert "run `runnerctl init` again" in out
    assert "[FAIL] settings: [executor] gate_wait_s 3600 is over 600 s" in out  # loads, but named
    config.write_text(config.read_text().replace('"prepare", "--slot", "runnerctl/gpu-a/gpu0"',
                                                 '"prepare", "--slots", "runnerctl/gpu-a/gpu0"'))  # by hand
    assert _doctor(tmp_path, config) == 1
    out = capsys.readouterr().out
    assert "runnerctl/gpu-a/gpu0's prepare_args are no stage command the drivers read (" in out
