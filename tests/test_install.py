"""`runnerctl install`: systemd units that systemd itself accepts, written below a root; values
that would change what a unit says (a newline, `%`, a space) are escaped or refused."""

from __future__ import annotations

import dataclasses
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from runnerctl.cli import main
from runnerctl.errors import ConfigError, ExitCode
from runnerctl.install import Installed, InstallOptions, installed, render
from runnerctl.settings import POSTGRES_START_WAIT_S, load_settings

UNITS = ("runnerctl-serve.service", "runnerctl-postgres.service", "runnerctl-exporter.service")


@pytest.fixture
def settings(tmp_path: Path) -> Path:
    path = tmp_path / "runnerctl.toml"
    path.write_text(f'[paths]\nstate_dir = "{tmp_path / "state"}"\n'
                    f'runner_config = "{tmp_path / "gitlab-runner" / "config.toml"}"\n')
    return path


def _verify(directory: Path) -> subprocess.CompletedProcess[str]:
    """systemd's own parser; it exits 0 on unknown values but warns on stderr."""
    return subprocess.run(["systemd-analyze", "verify", *(f"./{u}" for u in UNITS)], cwd=directory,
                          capture_output=True, text=True, timeout=60, check=False)


def test_dry_run_prints_units_that_systemd_analyze_verify_accepts(
        settings: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["install", "--config", str(settings), "--gitlab-url", "https://gitlab.example/",
                 "--dry-run"]) == 0
    out = capsys.readouterr().out
    parts = re.split(r"^# (/\S+) \(mode (\d+)\)\n", out, flags=re.M)[1:]
    files = {Path(parts[i]).name: (parts[i + 1], parts[i + 2]) for i in range(0, len(parts), 3)}
    assert set(files) == {*UNITS, "serve.env"}
    assert files["serve.env"][0] == "600"
    written = tmp_path / "units"
    written.mkdir()
    for name in UNITS:
        (written / name).write_text(files[name][1])
    result = _verify(written)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    serve = files["runnerctl-serve.service"][1]
    assert "--gitlab https://gitlab.example --listen 127.0.0.1:8080" in serve
    assert "TOKEN" not in serve.split("EnvironmentFile=")[0] and "--token" not in serve
    for key in ("Restart=always", "NoNewPrivileges=yes", "ProtectSystem=strict", "User=root",
                f"ReadWritePaths={tmp_path / 'state'} -{tmp_path / 'gitlab-runner'}"):
        assert key in serve
    postgres = files["runnerctl-postgres.service"][1]
    assert "Type=forking" in postgres
    # found by a review as a systemd expert: a host without a cluster restarted the unit
    # every 10 s for ever; a crash recovery over 60 s was killed and began again; serve's
    # reaps of containers at shutdown found Docker already stopped
    assert f"ConditionPathExists={tmp_path / 'state' / 'postgres' / 'data' / 'PG_VERSION'}" in postgres
    assert f"TimeoutStartSec={POSTGRES_START_WAIT_S + 60}" in postgres and POSTGRES_START_WAIT_S >= 600
    assert "After=network-online.target runnerctl-postgres.service docker.service" in serve
    assert f"ReadOnlyPaths={tmp_path / 'state'}" in files["runnerctl-exporter.service"][1]


def test_install_writes_below_a_root_and_keeps_the_filled_in_token(settings: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    args = ["install", "--config", str(settings), "--gitlab-url", "https://gitlab.example",
            "--root", str(root)]
    assert main(args) == 0
    units = root / "etc" / "systemd" / "system"
    assert sorted(p.name for p in units.iterdir()) == sorted(UNITS)
    assert _verify(units).stderr == ""
    env = root / "etc" / "runnerctl" / "serve.env"
    assert stat.S_IMODE(env.stat().st_mode) == 0o600
    state = root / str(tmp_path / "state").lstrip("/")
    assert stat.S_IMODE(state.stat().st_mode) == 0o711
    env.write_text("RUNNERCTL_GITLAB_TOKEN=glpat-filled-in\n")
    env.chmod(0o644)  # made readable by hand: the token would be every user's
    assert main(args) == 0  # again, e.g. after an upgrade
    assert env.read_text() == "RUNNERCTL_GITLAB_TOKEN=glpat-filled-in\n"
    assert stat.S_IMODE(env.stat().st_mode) == 0o600


def test_only_chosen_services_and_clear_errors(settings: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    assert main(["install", "--config", str(settings), "--service", "exporter", "--root", str(root)]) == 0
    assert [p.name for p in (root / "etc" / "systemd" / "system").iterdir()] == ["runnerctl-exporter.service"]
    assert not (root / "etc" / "runnerctl").exists()
    capsys.readouterr()
    assert main(["install", "--config", str(settings), "--root", str(tmp_path / "new-root")]) != 0
    err = capsys.readouterr().err
    assert "--gitlab-url" in err and len(err.strip().splitlines()) <= 2
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["install", "--config", str(settings), "--service", "exporter",
                 "--root", str(blocker / "sub")]) != 0
    err = capsys.readouterr().err
    assert "cannot write below" in err and "Traceback" not in err


def test_values_reach_systemd_as_given(tmp_path: Path) -> None:
    """A space, `%` (a specifier: %h is the home directory), `$`, a quote and a backslash in
    the paths and the URL: systemd's own parser finds the Python they name (a `%h` expanded
    or a path split at its space would not be found) and reads one assignment per line."""
    odd = tmp_path / "100%h $HOME"
    python = odd / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    config = odd / "it's \\ \"a\"" / "runner ctl.toml"
    config.parent.mkdir()
    config.write_text(f"[paths]\nstate_dir = '{odd / 'state'}'\n")
    options = InstallOptions(settings=load_settings(config), settings_path=config, python=str(python),
                             gitlab_url='https://gitlab.example/a$b%h"c')
    files = render(options)
    units = tmp_path / "units"
    units.mkdir()
    for unit in files[:3]:
        (units / unit.path.name).write_text(unit.text)
    result = _verify(units)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    serve = files[0].text
    assert 'Environment="RUNNERCTL_CONFIG=' in serve and "%%h" in serve
    assert '--gitlab "https://gitlab.example/a$$b%%h\\"c"' in serve
    # made before each start: a state directory deleted under serve kept it from starting again
    state = str(odd / "state").replace("%", "%%").replace("$", "$$")
    assert f'ExecStartPre=+/bin/mkdir -p "{state}"' in serve
    assert "LimitNOFILE=65536" in serve and "LimitNOFILE=65536" in files[2].text
    # a system locale that is not UTF-8 (ja_JP.eucJP) would make files and journald lines of it
    assert all("Environment=PYTHONUTF8=1" in unit.text for unit in files if "ExecStart=" in unit.text)


@pytest.mark.parametrize(("option", "value", "says"), [
    ("--listen", "127.0.0.1:8080\nExecStartPre=/bin/touch /tmp/pwned", "is not HOST:PORT"),
    ("--listen", "ExecStartPre=/bin/touch /tmp/pwned\n127.0.0.1:8080", "control character"),
    ("--listen", "127.0.0.1:0", "port from 1 to 65535"),
    ("--listen", "127.0.0.1:65536", "not from"),
    ("--listen", "8080", "is not HOST:PORT"),
    ("--gitlab-url", "not a url", "not an http(s) URL"),
    ("--gitlab-url", "ftp://gitlab.example", "not an http(s) URL"),
    ("--gitlab-url", "https://", "not an http(s) URL"),
    ("--gitlab-url", "http://[::1", "not an http(s) URL"),
    ("--gitlab-url", "https://gitlab.example\nExecStartPre=/bin/true", "not an http(s) URL"),
])
def test_bad_values_are_refused_and_nothing_is_written(settings: Path, tmp_path: Path, option: str,
                                                       value: str, says: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    args = {"--gitlab-url": "https://gitlab.example", "--listen": "127.0.0.1:8080", option: value}
    root = tmp_path / "root"
    code = main(["install", "--config", str(settings), "--root", str(root),
                 *(part for pair in args.items() for part in pair)])
    err = capsys.readouterr().err
    assert code == ExitCode.CONFIG, err
    assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not root.exists()


def test_a_control_character_in_a_path_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "runnerctl.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp_path}/state\\nExecStartPre=/bin/true"\n')
    options = InstallOptions(settings=load_settings(config), settings_path=config, gitlab_url="https://g.example")
    with pytest.raises(ConfigError, match="control character"):
        render(options)
    with pytest.raises(ConfigError, match="quote or backslash"):
        render(dataclasses.replace(options, settings=load_settings(tmp_path / "none.toml"),
                                   python="/opt/it's/python"))


@pytest.mark.parametrize(("setting", "said"), [
    ("[paths]\nrunner_config = 'gr/config.toml'\n", r"\[paths\] runner_config 'gr/config.toml'"),
    ("[postgres]\ndir = 'pg'\n", r"\[postgres\] dir 'pg'")])
def test_a_relative_path_the_units_would_name_is_refused(tmp_path: Path, setting: str, said: str) -> None:
    """systemd takes no relative path in ReadWritePaths=, PIDFile= or ConditionPathExists=;
    the settings load one (an older runnerctl took it), install writes none (found by a
    review of the day's changes)."""
    config = tmp_path / "runnerctl.toml"
    config.write_text(setting)
    options = InstallOptions(settings=load_settings(config), settings_path=config, gitlab_url="https://g.example")
    with pytest.raises(ConfigError, match=f"{said}.* is not an absolute path"):
        render(options)
    other = "postgres" if "runner_config" in said else "serve"  # a unit that names neither is written
    assert render(dataclasses.replace(options, services=(other, "exporter")))


def test_the_dcgm_job_mapping_directory_is_writable_made_at_boot_and_uninstalled(tmp_path: Path) -> None:
    """ProtectSystem=strict makes /run read-only too: with `dcgm_job_mapping_dir` set, serve
    and the exporter name it in ReadWritePaths=, a tmpfiles.d line (read by the real
    systemd-tmpfiles) makes it at every boot, install makes it now, uninstall removes the
    line; a relative directory is refused in one line."""
    mapping = "/run/dcgm job-map"  # a space: one quoted word for systemd and tmpfiles.d
    settings = tmp_path / "runnerctl.toml"
    settings.write_text(f'[paths]\nstate_dir = "{tmp_path / "state"}"\n'
                        f'runner_config = "{tmp_path / "cfg.toml"}"\n'
                        f'[monitoring]\ndcgm_job_mapping_dir = "{mapping}"\n')
    root = tmp_path / "root"
    assert main(["install", "--config", str(settings), "--gitlab-url", "https://gitlab.example",
                 "--root", str(root)]) == 0
    units = root / "etc" / "systemd" / "system"
    assert _verify(units).stderr == ""
    serve = (units / "runnerctl-serve.service").read_text()
    exporter = (units / "runnerctl-exporter.service").read_text()
    assert f'ReadWritePaths={tmp_path / "state"} -{tmp_path} "-/run/dcgm job-map"\n' in serve
    assert 'ReadWritePaths="-/run/dcgm job-map"\n' in exporter
    made = root / "run" / "dcgm job-map"
    assert made.is_dir() and stat.S_IMODE(made.stat().st_mode) == 0o755
    conf = root / "etc" / "tmpfiles.d" / "runnerctl.conf"
    made.rmdir()  # a reboot empties /run
    result = subprocess.run(["systemd-tmpfiles", "--create", f"--root={root}", str(conf)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert made.is_dir() and stat.S_IMODE(made.stat().st_mode) == 0o755
    runner_config = tmp_path / "cfg.toml"
    runner_config.write_text("concurrent = 1\n")
    assert main(["uninstall", "--runner-config", str(runner_config), "--root", str(root),
                 "--config", str(settings)]) == 0
    assert not conf.exists() and not list(units.iterdir())
    settings.write_text(settings.read_text().replace(mapping, "dcgm-map"))
    with pytest.raises(ConfigError, match="dcgm_job_mapping_dir 'dcgm-map' is not an absolute path"):
        render(InstallOptions(settings=load_settings(settings), settings_path=settings, gitlab_url="",
                              services=("exporter",)))
    only_postgres = InstallOptions(settings=load_settings(settings), settings_path=settings, gitlab_url="",
                                   services=("postgres",))
    assert [f.path.name for f in render(only_postgres)] == ["runnerctl-postgres.service"]  # writes no mapping


def test_install_again_keeps_the_services_url_and_listen_installed_before(
        settings: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An upgrade's `runnerctl install` with no options rewrites what was installed as it
    was: serve's page stays on the address the admin chose (it went back to 127.0.0.1),
    and an exporter-only host stays exporter-only (it asked for --gitlab-url)."""
    root = tmp_path / "root"
    url = "https://gitlab.example/a%2Fb$x"  # systemd's %% and $$ read back
    assert main(["install", "--config", str(settings), "--gitlab-url", url, "--listen", "0.0.0.0:9000",
                 "--root", str(root)]) == 0
    units = root / "etc" / "systemd" / "system"
    first = {p.name: p.read_text() for p in units.iterdir()}
    capsys.readouterr()
    assert main(["install", "--config", str(settings), "--root", str(root)]) == 0
    assert {p.name: p.read_text() for p in units.iterdir()} == first
    assert f"kept from the installed units: --gitlab-url {url}, --listen 0.0.0.0:9000" \
        in capsys.readouterr().err
    args = ["install", "--config", str(settings), "--root"]
    assert main([*args, str(root), "--listen", "127.0.0.1:8081"]) == 0
    assert installed(root) == Installed(("serve", "postgres", "exporter"), url, "127.0.0.1:8081",
                                        settings.resolve())
    assert '"https://gitlab.example/a%%2Fb$$x"' in (units / "runnerctl-serve.service").read_text()
    exporter_only = tmp_path / "exporter-host"
    assert main([*args, str(exporter_only), "--service", "exporter"]) == 0
    assert main([*args, str(exporter_only)]) == 0
    assert [p.name for p in (exporter_only / "etc" / "systemd" / "system").iterdir()] == \
        ["runnerctl-exporter.service"]


def test_install_again_without_config_keeps_the_settings_file_installed_before(
        settings: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The upgrade's plain `runnerctl install` pointed the units back at the default
    settings path: serve came up under another host name with an empty state dir (found
    by a review as a lab admin upgrading)."""
    monkeypatch.delenv("RUNNERCTL_CONFIG", raising=False)
    root = tmp_path / "root"
    assert main(["install", "--config", str(settings), "--gitlab-url", "https://gitlab.example",
                 "--root", str(root)]) == 0
    units = root / "etc" / "systemd" / "system"
    first = {p.name: p.read_text() for p in units.iterdir()}
    capsys.readouterr()
    assert main(["install", "--root", str(root)]) == 0
    assert {p.name: p.read_text() for p in units.iterdir()} == first
    assert f"--config {settings.resolve()}" in capsys.readouterr().err
