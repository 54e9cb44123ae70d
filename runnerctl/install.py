"""systemd units for a GPU host: `runnerctl serve`, `postgres` and `exporter` as services.

A lab's hosts reboot (kernel and driver updates); the controller, the team's PostgreSQL
and the observe-only exporter must come back without anyone logging in. This module
renders one unit per service (pure: settings in, text out) and writes them under a root
directory, so `--dry-run` and a test's temporary root see exactly what a host gets.

Who runs what, and why:
- `serve` runs as root: it edits gitlab-runner's config.toml (root's, 0600, in a service
  install), reads /proc/<pid>/environ of other users' processes for the gate, and shares
  the state directory with the executor's stages, which gitlab-runner runs as root.
  Hardening keeps the rest of the system read-only (ProtectSystem=strict with the state
  directory, gitlab-runner's directory and dcgm-exporter's job mapping directory
  writable, NoNewPrivileges, PrivateTmp).
- `postgres` runs `runnerctl postgres start/stop` as root, which starts the server as the
  `postgres` user itself (no PAM: pam_systemd would move the postmaster out of the unit's
  cgroup) exactly as by hand; systemd follows the postmaster's pid file. The unit is
  skipped, not failed, on a host whose cluster was never made (ConditionPathExists), and
  waits out a crash recovery (TimeoutStartSec above `POSTGRES_START_WAIT_S`).
- `exporter` only reads (NVML, leases): the state directory is read-only for it; it
  writes only dcgm-exporter's job mapping, when `[monitoring] dcgm_job_mapping_dir` is set.
The GitLab token reaches `serve` from an EnvironmentFile (0600), never from its command
line (which `ps` shows to every user). `serve` and `exporter` may hold 65536 files
(LimitNOFILE): at the default 1024, a thousand half-open connections took `serve` offline.

Every value written into a unit (paths, the GitLab URL, --listen) is escaped as
systemd reads it back (`_word`): a control character is refused, since a newline would
start a directive of its own.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import sys
from pathlib import Path

from runnerctl.errors import ConfigError
from runnerctl.private import write_atomic
from runnerctl.settings import (
    POSTGRES_START_WAIT_S,
    POSTGRES_STOP_WAIT_S,
    SERVE_LISTEN,
    Settings,
    relative_paths,
)

UNIT_DIR = Path("/etc/systemd/system")
ENV_FILE = Path("/etc/runnerctl/serve.env")
TMPFILES = Path("/etc/tmpfiles.d/runnerctl.conf")
TMPFILES_HEADER = "# runnerctl install: dcgm-exporter's job mapping directory, made again at every boot\n"
SERVICES = ("serve", "postgres", "exporter")
MAX_FILES = 65536
"""LimitNOFILE of serve and exporter: each connection is a file."""


@dataclasses.dataclass(frozen=True)
class InstallOptions:
    settings: Settings
    settings_path: Path
    gitlab_url: str
    python: str = sys.executable
    services: tuple[str, ...] = SERVICES
    listen: str = SERVE_LISTEN


@dataclasses.dataclass(frozen=True)
class UnitFile:
    path: Path  # absolute, as on the host
    text: str
    mode: int = 0o644


@dataclasses.dataclass(frozen=True)
class Installed:
    """What an earlier `runnerctl install` left below a root: the services whose units it
    wrote, serve's `--gitlab` and `--listen` (None where it wrote no serve unit), and the
    settings file its units name (`RUNNERCTL_CONFIG`; None where none does)."""
    services: tuple[str, ...] = ()
    gitlab_url: str | None = None
    listen: str | None = None
    settings_path: Path | None = None


def unit_path(root: Path, service: str) -> Path:
    return root / UNIT_DIR.relative_to("/") / f"runnerctl-{service}.service"


def written_by_runnerctl(path: Path) -> bool:
    """A file of `install`'s: a unit whose ExecStart runs `-m runnerctl`, or the tmpfiles.d
    entry that starts with its header line."""
    if path.name == TMPFILES.name:
        return (_text(path) or "").startswith(TMPFILES_HEADER)
    return _exec_start(path) is not None


def installed(root: Path) -> Installed:
    """What `install` wrote below `root` before, so that running it again (an upgrade)
    keeps the services, GitLab URL and listen address chosen then."""
    services = tuple(s for s in SERVICES if written_by_runnerctl(unit_path(root, s)))
    words = _exec_start(unit_path(root, "serve")) or []
    given = dict(zip(words, words[1:], strict=False))
    paths = (_settings_path(unit_path(root, s)) for s in services)
    return Installed(services, given.get("--gitlab"), given.get("--listen"),
                     next((p for p in paths if p is not None), None))


def _settings_path(path: Path) -> Path | None:
    """The `RUNNERCTL_CONFIG` a unit's `Environment=` line gives (`_env_lines`), or None."""
    for line in (_text(path) or "").splitlines():
        if line.startswith("Environment="):
            try:
                words = shlex.split(line.removeprefix("Environment="))
            except ValueError:
                continue
            for word in words:
                if word.startswith("RUNNERCTL_CONFIG="):
                    return Path(word.removeprefix("RUNNERCTL_CONFIG="))
    return None


def _exec_start(path: Path) -> list[str] | None:
    """The words of a runnerctl unit's ExecStart (systemd's `$$` and `%%` read back), None
    for a file that is missing, unreadable or not runnerctl's."""
    for line in (_text(path) or "").splitlines():
        if line.startswith("ExecStart=") and " -m runnerctl " in line:
            try:
                words = shlex.split(line.removeprefix("ExecStart="))
            except ValueError:
                return []
            return [w.replace("$$", "$").replace("%%", "%") for w in words]
    return None


def _text(path: Path) -> str | None:
    """A file's text, None when it is missing or unreadable."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


_NAMED_BY = {"[paths] runner_config": ("serve",), "[postgres] dir": ("postgres",),
             "[monitoring] dcgm_job_mapping_dir": ("serve", "exporter")}
"""The path settings each unit names (ReadWritePaths=, PIDFile=, ConditionPathExists=)."""


def render(options: InstallOptions) -> list[UnitFile]:
    """Every file `runnerctl install` writes, in order. A relative path the units would
    name is refused: systemd takes none in ReadWritePaths=, PIDFile= or ConditionPathExists=
    (a review of the day's changes; the settings load it, `settings.doubtful` names it)."""
    for key, value in relative_paths(options.settings).items():
        if set(_NAMED_BY.get(key, ())) & set(options.services):
            raise ConfigError(f"{key} {value!r} is not an absolute path",
                              hint="a service runs in /; give one from the root")
    files: list[UnitFile] = []
    for service in options.services:
        files.append(UnitFile(UNIT_DIR / f"runnerctl-{service}.service", _UNITS[service](options)))
    if "serve" in options.services:
        files.append(UnitFile(ENV_FILE, _env_file(), mode=0o600))
    mapping = mapping_dir(options)
    if mapping is not None:
        files.append(UnitFile(TMPFILES, f"{TMPFILES_HEADER}d {_word(str(mapping))} 0755 root root -\n"))
    return files


def mapping_dir(options: InstallOptions) -> Path | None:
    """`[monitoring] dcgm_job_mapping_dir` where an installed unit writes it (serve and
    exporter both do), else None. ProtectSystem=strict makes /run read-only too, so the
    units name it in ReadWritePaths=, which needs it to exist when the unit starts: a
    tmpfiles.d entry makes it at every boot (/run is empty then), before any service
    (systemd-tmpfiles-setup.service runs in sysinit.target), and `write` makes it now."""
    value = options.settings.monitoring.dcgm_job_mapping_dir
    if not value or not {"serve", "exporter"} & set(options.services):
        return None
    return Path(value)  # absolute: `render` refused it otherwise


def write(files: list[UnitFile], root: Path, *, state_dir: Path, mapping: Path | None = None) -> list[Path]:
    """Write `files` below `root` ("/" on a host); an existing env file is kept (it holds
    the token an admin filled in). The state directory is made too (0711: other users may
    pass, not list), since ProtectSystem=strict lets serve write only where it exists, and
    so is dcgm-exporter's job mapping directory `mapping` (0755, as its tmpfiles.d line
    makes it at boot). Returns the paths written."""
    state = root / state_dir.relative_to("/")
    state.mkdir(parents=True, exist_ok=True, mode=0o711)
    if mapping is not None:
        (root / mapping.relative_to("/")).mkdir(parents=True, exist_ok=True, mode=0o755)
    written = []
    for unit in files:
        target = root / unit.path.relative_to("/")
        if unit.path == ENV_FILE and target.exists():  # the admin's token stays; no one else reads it
            os.chmod(target, unit.mode)
            if os.geteuid() == 0:
                os.chown(target, 0, 0)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(target, unit.text, mode=unit.mode)
        written.append(target)
    return written


_STRICT = """NoNewPrivileges=yes
PrivateTmp=yes
ProtectSystem=strict
ProtectHome=read-only
ProtectKernelTunables=yes
ProtectControlGroups=yes
"""
"""Hardening of the long-running services: the whole file system read-only but for the
paths each unit names, no privilege gained through exec, no other user's /home."""


_PLAIN = re.compile(r"[\w@%+=:,./-]+", re.ASCII)
"""Words systemd reads back unchanged without quotes."""


def _checked(value: str) -> str:
    """`value` with systemd's specifiers escaped (`%h` is the home directory: `%%h`);
    ConfigError for a control character (a newline would end the setting and start a
    directive of its own)."""
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ConfigError(f"a systemd unit cannot hold the control character in {value!r}")
    return value.replace("%", "%%")


def _word(value: str) -> str:
    """`value` as one word of a setting that takes a list (ExecStart=, Environment=,
    ReadWritePaths=): as it is when plain, else in double quotes with `\\` and `"` escaped."""
    value = _checked(value)
    if _PLAIN.fullmatch(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _command(options: InstallOptions, *args: str) -> str:
    """A command line of ExecStart= (systemd.service(5)): `$` in an argument is systemd's
    variable (`$$`); the program's path may hold no quote or backslash."""
    if any(c in options.python for c in "'\"\\"):
        raise ConfigError(f"systemd cannot start a program whose path has a quote or backslash: "
                          f"{options.python!r}")
    arguments = (_word(arg).replace("$", "$$") for arg in ("-m", "runnerctl", *args))
    return " ".join([_word(options.python), *arguments])


def _env_lines(options: InstallOptions) -> str:
    return (f"Environment={_word(f'RUNNERCTL_CONFIG={options.settings_path}')}\n"
            "Environment=PYTHONUNBUFFERED=1\n"
            "Environment=PYTHONUTF8=1\n")  # UTF-8 files and log lines whatever the system's locale


def _serve(options: InstallOptions) -> str:
    """serve's unit. Its state directory is made before each start, outside the sandbox
    (`+`): ProtectSystem=strict cannot set up a ReadWritePaths= that does not exist, so a
    directory deleted under serve (which then stops) kept it from starting again."""
    state = options.settings.state_dir
    runner_dir = Path(options.settings.paths.runner_config or "/etc/gitlab-runner/config.toml").parent
    writable = [_word(str(state)), _word(f"-{runner_dir}"), *_mapping_words(options)]
    return f"""[Unit]
Description=runnerctl controller: GPU runners on demand, gate, web page
After=network-online.target runnerctl-postgres.service docker.service
Wants=network-online.target

[Service]
Type=simple
User=root
{_env_lines(options)}EnvironmentFile={ENV_FILE}
ExecStartPre=+/bin/mkdir -p {_word(str(state)).replace("$", "$$")}
ExecStart={_command(options, "serve", "--gitlab", options.gitlab_url, "--listen", options.listen)}
Restart=always
RestartSec=5
TimeoutStopSec=30
{_STRICT}ReadWritePaths={" ".join(writable)}
UMask=0077
LimitNOFILE={MAX_FILES}

[Install]
WantedBy=multi-user.target
"""


def _postgres(options: InstallOptions) -> str:
    pg = options.settings.postgres
    base = Path(pg.dir or options.settings.state_dir / "postgres")
    return f"""[Unit]
Description=runnerctl's PostgreSQL for the team's Optuna studies
After=network-online.target
Wants=network-online.target
ConditionPathExists={_checked(str(base / "data" / "PG_VERSION"))}

[Service]
Type=forking
User=root
{_env_lines(options)}PIDFile={_checked(str(base / "data" / "postmaster.pid"))}
ExecStart={_command(options, "postgres", "start")}
ExecStop={_command(options, "postgres", "stop")}
Restart=on-failure
RestartSec=10
TimeoutStartSec={POSTGRES_START_WAIT_S + 60}
TimeoutStopSec={POSTGRES_STOP_WAIT_S + 30}
NoNewPrivileges=yes
PrivateTmp=yes
ProtectSystem=full
ProtectHome=read-only

[Install]
WantedBy=multi-user.target
"""


def _exporter(options: InstallOptions) -> str:
    writable = "".join(f"ReadWritePaths={word}\n" for word in _mapping_words(options))
    return f"""[Unit]
Description=runnerctl exporter: observe-only GPU, lease and gate metrics
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
User=root
{_env_lines(options)}ExecStart={_command(options, "exporter")}
Restart=always
RestartSec=5
{_STRICT}ReadOnlyPaths={_word(str(options.settings.state_dir))}
{writable}UMask=0077
LimitNOFILE={MAX_FILES}

[Install]
WantedBy=multi-user.target
"""


def _mapping_words(options: InstallOptions) -> list[str]:
    """The job mapping directory as a ReadWritePaths= word ('-': a unit still starts
    without it, and the writer logs that it cannot write), if a unit writes it."""
    mapping = mapping_dir(options)
    return [] if mapping is None else [_word(f"-{mapping}")]


def _env_file() -> str:
    return ("# runnerctl serve's secrets (0600, root). Fill in the GitLab token (scope api):\n"
            "RUNNERCTL_GITLAB_TOKEN=\n"
            "# RUNNERCTL_WEBHOOK_SECRET=\n"
            "# RUNNERCTL_GITLAB_OAUTH_SECRET=\n")


_UNITS = {"serve": _serve, "postgres": _postgres, "exporter": _exporter}
