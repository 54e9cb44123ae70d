"""The custom executor wire contract (gitlab-runner docs/executors/custom.md).

gitlab-runner runs, for every job: config_exec, prepare_exec (once), run_exec once per
stage with `<run_args...> <script path> <stage name>` appended, and cleanup_exec
(always). Jobs cannot change a stage's arguments, so the GPU set travels there; job
variables arrive as `CUSTOM_ENV_<NAME>` and are untrusted.

This module is the one place that says how config.toml invokes the drivers: `runnerctl
init` writes `custom_section(...)`, and the drivers parse the same arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import typing
from collections.abc import Mapping

# the one list and the prepare timeout, re-exported for the drivers (GATE_WAIT_MAX_S leaves 5 min of it)
from runnerctl.settings import DRIVERS as DRIVERS
from runnerctl.settings import PREPARE_EXEC_TIMEOUT_S as PREPARE_EXEC_TIMEOUT_S

STAGES = ("config", "prepare", "run", "cleanup")

# Environment that gitlab-runner sets for every stage.
ENV_BUILD_FAILURE = "BUILD_FAILURE_EXIT_CODE"
ENV_SYSTEM_FAILURE = "SYSTEM_FAILURE_EXIT_CODE"
ENV_BUILD_EXIT_CODE_FILE = "BUILD_EXIT_CODE_FILE"
ENV_JOB_RESPONSE_FILE = "JOB_RESPONSE_FILE"
CUSTOM_ENV_PREFIX = "CUSTOM_ENV_"

# Run stage names, in the order gitlab-runner uses them.
RUN_STAGES = (
    "prepare_script",
    "get_sources",
    "clear_worktree",  # before a second try of get_sources (common/build.go)
    "restore_cache",
    "download_artifacts",
    "build_script",  # also step_<name> stages
    "after_script",
    "archive_cache",  # or archive_cache_on_failure
    "upload_artifacts_on_success",  # or upload_artifacts_on_failure
    "cleanup_file_variables",
)
USER_SCRIPT_STAGES = ("build_script", "after_script")
"""Stages that run the user's own script (plus any `step_*`); the rest are runner helpers."""

# Stage timeouts written into config.toml, in seconds. prepare waits for the GPU gate
# (`[executor] gate_wait_s`, default 600 s), so it gets that plus slack.
CONFIG_EXEC_TIMEOUT_S = 60
CLEANUP_EXEC_TIMEOUT_S = 300
GRACEFUL_KILL_TIMEOUT_S = 30  # SIGTERM to the stage, then this long before SIGKILL
FORCE_KILL_TIMEOUT_S = 30

AFTER_SCRIPT_TIMEOUT_S = 300.0
"""gitlab-runner's `common.AfterScriptTimeout`: the after_script stage's own limit, unless
the job's `RUNNER_AFTER_SCRIPT_TIMEOUT` sets another (gitlab-runner 16.4 and later)."""

_DURATION_PART = r"([0-9]+\.?[0-9]*|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)"  # ASCII digits, as Go reads them
_DURATION = re.compile(f"(?:{_DURATION_PART})+")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
                   "h": 3600.0}


def parse_duration(text: str) -> float | None:
    """Go's `time.ParseDuration` for the non-negative forms (`90s`, `1h30m`, `1.5h`, `0`),
    as gitlab-runner reads `RUNNER_SCRIPT_TIMEOUT` and `RUNNER_AFTER_SCRIPT_TIMEOUT`
    (build.go `getStageTimeoutContexts`); None for anything else."""
    text = text.removeprefix("+")
    if text == "0":
        return 0.0
    if len(text) > 64 or not _DURATION.fullmatch(text):
        return None
    return sum(float(n) * _DURATION_UNITS[u] for n, u in re.findall(_DURATION_PART, text))


@dataclasses.dataclass(frozen=True)
class DriverArgs:
    """What every stage is told by config.toml: enough to work with no other set-up."""

    slot: str  # runner name, e.g. runnerctl/gpu-a/gpu0-3
    gpus: tuple[int, ...]
    gpu_source: str  # nvml, sim:N or sim:PATH
    config: str  # runnerctl's own settings file (may not exist: defaults apply)
    driver: str  # shell, docker, slurm, sge, pbs or pjm

    def to_argv(self) -> list[str]:
        return [
            "--slot", self.slot,
            "--gpus", ",".join(str(g) for g in self.gpus),
            "--gpu-source", self.gpu_source,
            "--config", self.config,
            "--driver", self.driver,
        ]


class BadArguments(ValueError):
    """Stage arguments the drivers cannot read (config.toml's `*_args`, edited by hand)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:  # a message for the caller, not exit 2 and a usage
        raise BadArguments(message)


def parse_stage_argv(argv: list[str]) -> tuple[str, DriverArgs, list[str]]:
    """(stage, its DriverArgs, what gitlab-runner appended) from a stage's command line:
    the inverse of `stage_command`, and the one reader of it (the drivers, `runnerctl
    doctor`). BadArguments names what is wrong."""
    parser = _Parser(prog="python -m runnerctl.executors", add_help=False)
    parser.add_argument("stage", choices=STAGES)
    parser.add_argument("--slot", required=True)
    parser.add_argument("--gpus", required=True)
    parser.add_argument("--gpu-source", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--driver", required=True, choices=DRIVERS)
    parser.add_argument("rest", nargs="*")
    ns = parser.parse_intermixed_args(argv)
    words = ns.gpus.split(",")
    if not all(w.isascii() and w.isdigit() for w in words):
        raise BadArguments(f"--gpus {ns.gpus!r} is not a list of GPU indexes such as 0,1")
    return ns.stage, DriverArgs(ns.slot, tuple(map(int, words)), ns.gpu_source, ns.config, ns.driver), ns.rest


def exit_code(env: Mapping[str, str], name: str, default: int) -> int:
    """An exit code gitlab-runner gives every stage (ENV_BUILD_FAILURE, ENV_SYSTEM_FAILURE),
    `default` where it is missing or no number."""
    value = env.get(name, "")
    return int(value) if value.isascii() and value.isdigit() else default


def stage_command(stage: str, args: DriverArgs) -> tuple[str, list[str]]:
    """(`*_exec`, `*_args`) for one stage: this interpreter running `runnerctl.executors`."""
    if stage not in STAGES:
        raise ValueError(f"unknown custom executor stage {stage!r}")
    return sys.executable, ["-m", "runnerctl.executors", stage, *args.to_argv()]


def custom_section(args: DriverArgs) -> dict[str, object]:
    """The `[runners.custom]` table for one slot."""
    section: dict[str, object] = {}
    for stage in STAGES:
        exe, argv = stage_command(stage, args)
        section[f"{stage}_exec"] = exe
        section[f"{stage}_args"] = argv
    section["config_exec_timeout"] = CONFIG_EXEC_TIMEOUT_S
    section["prepare_exec_timeout"] = PREPARE_EXEC_TIMEOUT_S
    section["cleanup_exec_timeout"] = CLEANUP_EXEC_TIMEOUT_S
    section["graceful_kill_timeout"] = GRACEFUL_KILL_TIMEOUT_S
    section["force_kill_timeout"] = FORCE_KILL_TIMEOUT_S
    return section
