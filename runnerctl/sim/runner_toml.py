"""config.toml as gitlab-runner reads it, for `runnerctl sim runner`.

Only the keys the stand-in acts on are read; the rest of the file is ignored as
gitlab-runner ignores keys it does not know. Defaults and their sources, all in
gitlab-org/gitlab-runner:

- `concurrent` (< 1 refused), `check_interval` (<= 0 means 3 s), `shutdown_timeout`
  (30 s): common/config.go `Config`, `GetCheckInterval`, `GetShutdownTimeout`;
  common/consts.go `CheckInterval`, `DefaultShutdownTimeout`.
- `[[runners]]` `limit` (0 = no limit), `request_concurrency` (`max(1, n)`),
  `builds_dir`, `cache_dir`, `environment`, `pre_build_script`, `post_build_script`,
  `prepare_timeout` (a Go duration string),
  `unhealthy_requests_limit` (3), `strict_check_interval`: common/config.go
  `RunnerSettings`, `RunnerConfig`, `GetRequestConcurrency`, `GetUnhealthyRequestsLimit`.
- `[runners.custom]` `*_exec`, `*_args`, `*_exec_timeout` (1 h each when unset or
  <= 0), `graceful_kill_timeout` (10 min), `force_kill_timeout` (10 s):
  common/config.go `CustomConfig`, executors/custom/config.go, executors/custom/consts.go,
  helpers/process/killer.go `GracefulTimeout`, `KillTimeout`.
- The system id: one per config file, kept in `.runner_system_id` beside it,
  `s_` + 12 hex of HMAC-SHA256(machine id, "gitlab-runner"), else `r_` + 12 random
  characters; a file holding a well-formed id is reused
  (commands/internal/configfile/configfile.go, system_id_state.go).

The stand-in drives only the custom executor: a runner with any other executor is
refused with a one-line error (gitlab-runner would mark it unhealthy and log
"Executor ... is not known", commands/multi.go `processRunner`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import re
import secrets
import string
import tomllib
from pathlib import Path
from typing import Any

from runnerctl.errors import ConfigError
from runnerctl.executors.contract import parse_duration

CHECK_INTERVAL_S = 3.0
SHUTDOWN_TIMEOUT_S = 30.0
EXEC_TIMEOUT_S = 3600.0  # executors/custom/consts.go: config, prepare and cleanup
GRACEFUL_KILL_TIMEOUT_S = 600.0  # helpers/process/killer.go GracefulTimeout
FORCE_KILL_TIMEOUT_S = 10.0  # helpers/process/killer.go KillTimeout
UNHEALTHY_REQUESTS_LIMIT = 3  # common/consts.go DefaultUnhealthyRequestsLimit
UNHEALTHY_INTERVAL_S = 3600.0  # common/consts.go DefaultUnhealthyInterval
SYSTEM_ID_FILE = ".runner_system_id"
log = logging.getLogger(__name__)
_SYSTEM_ID = re.compile(r"^[sr]_[0-9a-zA-Z]{12}$")


@dataclasses.dataclass(frozen=True)
class CustomConfig:
    """`[runners.custom]`: the four executables, their arguments and timeouts (seconds)."""

    config_exec: str = ""
    config_args: tuple[str, ...] = ()
    config_exec_timeout_s: float = EXEC_TIMEOUT_S
    prepare_exec: str = ""
    prepare_args: tuple[str, ...] = ()
    prepare_exec_timeout_s: float = EXEC_TIMEOUT_S
    run_exec: str = ""
    run_args: tuple[str, ...] = ()
    cleanup_exec: str = ""
    cleanup_args: tuple[str, ...] = ()
    cleanup_exec_timeout_s: float = EXEC_TIMEOUT_S
    graceful_kill_timeout_s: float = GRACEFUL_KILL_TIMEOUT_S
    force_kill_timeout_s: float = FORCE_KILL_TIMEOUT_S


@dataclasses.dataclass(frozen=True)
class RunnerEntry:
    """One `[[runners]]` table."""

    name: str
    url: str
    token: str
    executor: str
    limit: int = 0
    request_concurrency: int = 1
    builds_dir: str = ""
    cache_dir: str = ""
    environment: tuple[str, ...] = ()
    pre_build_script: str = ""
    post_build_script: str = ""
    prepare_timeout_s: float | None = None
    unhealthy_requests_limit: int = UNHEALTHY_REQUESTS_LIMIT
    strict_check_interval: bool = False
    custom: CustomConfig | None = None
    system_id: str = ""

    @property
    def short_token(self) -> str:
        """helpers/shorten_token.go: known prefixes stripped, first 9 characters."""
        token = self.token
        for prefix in ("glrtr-", "glrt-", "GR1348941"):
            token = token.removeprefix(prefix)
        return token[:9]

    @property
    def api_url(self) -> str:
        return self.url.rstrip("/").removesuffix("/ci") + "/api/v4"


@dataclasses.dataclass(frozen=True)
class RunnerToml:
    """The whole file, as loaded at `mtime`."""

    concurrent: int
    check_interval_s: float
    shutdown_timeout_s: float
    runners: tuple[RunnerEntry, ...]
    mtime: float


def load(path: Path) -> RunnerToml:
    """Parse config.toml; a malformed file or a non-custom runner is a ConfigError."""
    try:
        raw = path.read_bytes()
        mtime = path.stat().st_mtime
        data = tomllib.loads(raw.decode())
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    concurrent = _int(data, "concurrent", 1, path)
    if concurrent < 1:
        raise ConfigError(f"{path}: concurrent = {concurrent} means that no jobs will be processed")
    entries = data.get("runners", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: runners = {entries!r} is not an array of tables ([[runners]])")
    system_id = load_system_id(path.parent)
    runners = tuple(_runner(entry, i, path, system_id) for i, entry in enumerate(entries))
    check = _int(data, "check_interval", 0, path)
    shutdown = _int(data, "shutdown_timeout", 0, path)
    return RunnerToml(concurrent=concurrent,
                      check_interval_s=float(check) if check > 0 else CHECK_INTERVAL_S,
                      shutdown_timeout_s=float(shutdown) if shutdown > 0 else SHUTDOWN_TIMEOUT_S,
                      runners=runners, mtime=mtime)


def _runner(entry: Any, index: int, path: Path, system_id: str) -> RunnerEntry:
    where = f"{path}: [[runners]] #{index + 1}"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} is not a table")
    name = str(entry.get("name", f"runner-{index + 1}"))
    where = f"{path}: runner {name!r}"
    executor = str(entry.get("executor", ""))
    if executor != "custom":
        raise ConfigError(f"{where} uses executor {executor!r}; runnerctl sim runner drives only "
                          "the custom executor")
    custom = entry.get("custom")
    environment = entry.get("environment", [])
    if not isinstance(environment, list):
        raise ConfigError(f"{where}: environment must be a list of KEY=VALUE strings")
    prepare = _duration(entry, "prepare_timeout", where)
    return RunnerEntry(
        name=name, url=str(entry.get("url", "")), token=str(entry.get("token", "")), executor=executor,
        limit=_int(entry, "limit", 0, where),
        request_concurrency=max(1, _int(entry, "request_concurrency", 1, where)),
        builds_dir=str(entry.get("builds_dir", "")), cache_dir=str(entry.get("cache_dir", "")),
        environment=tuple(str(e) for e in environment),
        pre_build_script=str(entry.get("pre_build_script", "")),
        post_build_script=str(entry.get("post_build_script", "")),
        prepare_timeout_s=prepare if prepare > 0 else None,
        unhealthy_requests_limit=max(1, _int(entry, "unhealthy_requests_limit", 0, where) or
                                     UNHEALTHY_REQUESTS_LIMIT),
        strict_check_interval=bool(entry.get("strict_check_interval", False)),
        custom=_custom(custom, where) if isinstance(custom, dict) else None,
        system_id=system_id)


def _custom(table: dict[str, Any], where: str) -> CustomConfig:
    def args(key: str) -> tuple[str, ...]:
        value = table.get(key, [])
        if not isinstance(value, list):
            raise ConfigError(f"{where}: custom.{key} must be a list of strings")
        return tuple(str(v) for v in value)

    def timeout(key: str, default: float) -> float:
        value = _int(table, key, 0, where)
        return float(value) if value > 0 else default

    return CustomConfig(
        config_exec=str(table.get("config_exec", "")), config_args=args("config_args"),
        config_exec_timeout_s=timeout("config_exec_timeout", EXEC_TIMEOUT_S),
        prepare_exec=str(table.get("prepare_exec", "")), prepare_args=args("prepare_args"),
        prepare_exec_timeout_s=timeout("prepare_exec_timeout", EXEC_TIMEOUT_S),
        run_exec=str(table.get("run_exec", "")), run_args=args("run_args"),
        cleanup_exec=str(table.get("cleanup_exec", "")), cleanup_args=args("cleanup_args"),
        cleanup_exec_timeout_s=timeout("cleanup_exec_timeout", EXEC_TIMEOUT_S),
        graceful_kill_timeout_s=timeout("graceful_kill_timeout", GRACEFUL_KILL_TIMEOUT_S),
        force_kill_timeout_s=timeout("force_kill_timeout", FORCE_KILL_TIMEOUT_S))


def _duration(table: dict[str, Any], key: str, where: object) -> float:
    """A `*time.Duration` setting (common/config.go: `prepare_timeout = "1h30m"`) in seconds;
    0 when unset."""
    value = table.get(key, "")
    seconds = parse_duration(value) if isinstance(value, str) else None
    if value != "" and seconds is None:
        raise ConfigError(f"{where}: {key} must be a Go duration such as \"30s\" or \"1h30m\", not {value!r}")
    return max(seconds or 0.0, 0.0)


def _int(table: dict[str, Any], key: str, default: int, where: object) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: {key} must be an integer, not {value!r}")
    return int(value)


def load_system_id(config_dir: Path) -> str:
    """The id in `.runner_system_id` beside config.toml, made and saved once if missing."""
    path = config_dir / SYSTEM_ID_FILE
    try:
        found = path.read_text().strip()
    except FileNotFoundError:
        found = ""
    except OSError as exc:
        raise ConfigError(f"reading the runner system ID file {path}: {exc.strerror or exc}") from None
    if _SYSTEM_ID.match(found):
        return found
    system_id = _new_system_id()
    try:
        path.write_text(system_id)
        path.chmod(0o600)
    except OSError as exc:  # gitlab-runner warns and goes on with the id for this process only
        log.warning("could not save the new system ID %s in %s: %s", system_id, path, exc)
    return system_id


def _new_system_id() -> str:
    for machine_id in (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id")):
        try:
            key = machine_id.read_text().strip()
        except OSError:
            continue
        if key:
            return "s_" + hmac.new(key.encode(), b"gitlab-runner", hashlib.sha256).hexdigest()[:12]
    alphabet = string.ascii_letters + string.digits
    return "r_" + "".join(secrets.choice(alphabet) for _ in range(12))
