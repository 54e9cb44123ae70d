"""The bash script gitlab-runner writes for each build stage, for `runnerctl sim runner`.

What each stage script holds, and when a stage has nothing to do and is skipped (no
run_exec call at all), follows gitlab-org/gitlab-runner shells/abstract.go
(`writeScript` and the `write*Script` functions); the wrapping follows shells/bash.go
`BashWriter.Finish`:

    #!/usr/bin/env bash
    trap 'exit 1' TERM
    case "$(set -o)" in *"pipefail"*) set -o pipefail;; esac; set -o errexit
    set +o noclobber
    (trap 'exit 1' TERM; eval '<stage body>') < /dev/null
    exit 0

so a SIGTERM ends the stage with exit 1, the user's script reads no stdin and runs in a
subshell. Every stage but prepare_script exports the job's variables first (file
variables written under `<project dir>.tmp`, `GITLAB_ENV` sourced) and, except
get_sources and cleanup_file_variables, `cd`s into the project directory.

There is no git here: get_sources creates the project directory instead of cloning,
and the cache and artifact stages only say what they would move. Stage names and
order stay gitlab-runner's.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence
from typing import Any

TERM_TRAP = "trap 'exit 1' TERM"
GITLAB_ENV_FILE = "gitlab_runner_env"
_GREEN, _RESET = "\x1b[32;1m", "\x1b[0;m"

DESCRIPTIONS = {
    "prepare_script": "Preparing environment",
    "get_sources": "Getting source from Git repository",
    "clear_worktree": "Deleting all tracked and untracked files due to source fetch failure",
    "restore_cache": "Restoring cache",
    "download_artifacts": "Downloading artifacts",
    "after_script": "Running after_script",
    "archive_cache": "Saving cache for successful job",
    "archive_cache_on_failure": "Saving cache for failed job",
    "upload_artifacts_on_success": "Uploading artifacts for successful job",
    "upload_artifacts_on_failure": "Uploading artifacts for failed job",
    "cleanup_file_variables": "Cleaning up project directory and file based variables",
}
"""common/build.go GetStageDescription; a step stage reads 'Executing "step_x" stage of the job script'."""


@dataclasses.dataclass(frozen=True)
class Variable:
    key: str
    value: str
    file: bool = False


@dataclasses.dataclass(frozen=True)
class ScriptInfo:
    """What the scripts are written from: the job JSON and the build's directories."""

    variables: tuple[Variable, ...]
    project_dir: str
    hostname: str
    steps: tuple[dict[str, Any], ...]
    cache: tuple[dict[str, Any], ...] = ()
    artifacts: tuple[dict[str, Any], ...] = ()
    dependencies: tuple[dict[str, Any], ...] = ()
    runner_url: str = ""
    pre_build_script: str = ""  # config.toml [[runners]], around every step's own commands
    post_build_script: str = ""

    @property
    def tmp_dir(self) -> str:
        return self.project_dir + ".tmp"  # common/build.go TmpProjectDir

    def value(self, key: str) -> str:
        found = [v.value for v in self.variables if v.key == key]
        return found[-1] if found else ""


def description(stage: str) -> str:
    return DESCRIPTIONS.get(stage, f'Executing "{stage}" stage of the job script')


def generate(stage: str, info: ScriptInfo) -> str | None:
    """The whole script for `stage`, or None when gitlab-runner skips the stage."""
    writer = _Writer()
    if stage == "prepare_script":
        via = f" via {info.hostname}" if info.hostname else ""
        writer.line('echo "Running on $(hostname)"' + shlex.quote(f"{via}..."))
        writer.line(f"rm -f {shlex.quote(info.tmp_dir + '/' + GITLAB_ENV_FILE)} "
                    f"{shlex.quote(info.tmp_dir + '/masking.db')}")
    elif stage == "get_sources":
        _exports(writer, info)
        writer.line("export GIT_TERMINAL_PROMPT=0 GCM_INTERACTIVE=Never")
        writer.notice(f"Fetching changes into {info.project_dir} (simulated: no git here)...")
        writer.line(f"mkdir -p {shlex.quote(info.project_dir)}")
    elif stage == "clear_worktree":
        writer.line(f"rm -rf {shlex.quote(info.project_dir)}")
    elif stage in ("restore_cache", "archive_cache", "archive_cache_on_failure"):
        keys = _caches(info, stage)
        if not keys:
            return None
        _exports(writer, info, cd=True)
        verb = "Checking cache for" if stage == "restore_cache" else "Creating cache"
        for key in keys:
            writer.notice(f"{verb} {key}... (simulated)")
    elif stage == "download_artifacts":
        deps = [d for d in info.dependencies if (d.get("artifacts_file") or {}).get("filename")]
        if not deps:
            return None
        _exports(writer, info, cd=True)
        for dep in deps:
            writer.notice(f"Downloading artifacts for {dep.get('name')} ({dep.get('id')})... (simulated)")
    elif stage in ("upload_artifacts_on_success", "upload_artifacts_on_failure"):
        names = _artifacts(info, on_success=stage.endswith("success"))
        if not info.runner_url or not names:
            return None
        _exports(writer, info, cd=True)
        for name in names:
            writer.notice(f"Uploading artifacts {name}... (simulated)")
    elif stage == "after_script":
        step = _step(info, "after_script")
        if step is None or not step.get("script"):
            return None
        _exports(writer, info, cd=True)
        writer.notice("Running after script...")
        _commands(writer, step["script"])
    elif stage == "cleanup_file_variables":
        _exports(writer, info, env_only=True)
        tmp = [info.tmp_dir + "/" + name for name in (GITLAB_ENV_FILE, "masking.db")]
        tmp += [info.tmp_dir + "/" + v.key for v in info.variables if v.file]
        writer.line("rm -f " + " ".join(shlex.quote(p) for p in tmp))
    elif stage.startswith("step_"):
        step = next((s for s in info.steps if "step_" + str(s.get("name", "")).lower() == stage), None)
        if step is None:
            return None
        _exports(writer, info, cd=True)
        _commands(writer, [info.pre_build_script] if info.pre_build_script else [])
        _commands(writer, step.get("script") or [])
        _commands(writer, [info.post_build_script] if info.post_build_script else [])
    else:
        return None
    return finish(writer.text(), trace=info.value("CI_DEBUG_TRACE") == "true")


def finish(body: str, *, trace: bool = False) -> str:
    """shells/bash.go BashWriter.Finish: the trap, errexit, the subshell, stdin closed, exit 0."""
    xtrace = "set -o xtrace\n" if trace else ""
    return ("#!/usr/bin/env bash\n\n" + TERM_TRAP + "\n\n" + xtrace
            + 'case "$(set -o)" in *"pipefail"*) set -o pipefail;; esac; set -o errexit\n'
            + "set +o noclobber\n"
            + "(" + TERM_TRAP + "; eval " + shlex.quote(body) + ") < /dev/null\n"
            + "exit 0\n")


class _Writer:
    def __init__(self) -> None:
        self._lines: list[str] = []

    def line(self, text: str) -> None:
        self._lines.append(text)

    def notice(self, text: str) -> None:
        self.line("echo " + shlex.quote(f"{_GREEN}{text}{_RESET}"))

    def text(self) -> str:
        return "".join(line + "\n" for line in self._lines)


def _exports(writer: _Writer, info: ScriptInfo, *, cd: bool = False, env_only: bool = False) -> None:
    """shells/abstract.go exportVariables (+ writeCdBuildDir)."""
    for var in info.variables:
        if var.file:
            path = info.tmp_dir + "/" + var.key
            if not env_only:
                writer.line(f"mkdir -p {shlex.quote(info.tmp_dir)}")
                writer.line(f"printf '%s' {shlex.quote(var.value)} > {shlex.quote(path)}")
            writer.line(f"export {var.key}={shlex.quote(path)}")
        else:
            writer.line(f"export {var.key}={shlex.quote(var.value)}")
    env_file = shlex.quote(info.tmp_dir + "/" + GITLAB_ENV_FILE)
    writer.line(f"export GITLAB_ENV={env_file}")
    writer.line(f"mkdir -p {shlex.quote(info.tmp_dir)}")
    writer.line(f"touch {env_file}")
    writer.line(f'while read -r line; do export "$line"; done < {env_file}')
    if cd:
        writer.line(f"cd {shlex.quote(info.project_dir)}")


def _commands(writer: _Writer, commands: Sequence[str]) -> None:
    """shells/abstract.go writeCommands: echo `$ command` in green, then the command."""
    for command in commands:
        command = str(command).strip()
        if not command:
            writer.line("echo")
            continue
        first, _, rest = command.partition("\n")
        writer.notice(f"$ {first}" + (" # collapsed multi-line command" if rest else ""))
        writer.line(command)


def _step(info: ScriptInfo, name: str) -> dict[str, Any] | None:
    return next((s for s in info.steps if s.get("name") == name), None)


def _caches(info: ScriptInfo, stage: str) -> list[str]:
    """Cache keys with paths (or untracked) whose policy and `when` fit the stage."""
    keys = []
    for cache in info.cache:
        if not (cache.get("paths") or cache.get("untracked")):
            continue
        policy = str(cache.get("policy") or "pull-push")
        when = str(cache.get("when") or "on_success")
        if stage == "restore_cache":
            fits = policy in ("pull", "pull-push")
        else:
            fits = policy in ("push", "pull-push") and (
                when == "always" or when == ("on_success" if stage == "archive_cache" else "on_failure"))
        if fits:
            keys.append(str(cache.get("key") or "default"))
    return keys


def _artifacts(info: ScriptInfo, *, on_success: bool) -> list[str]:
    names = []
    for artifact in info.artifacts:
        when = str(artifact.get("when") or "on_success")
        if when != "always" and when != ("on_success" if on_success else "on_failure"):
            continue
        kind = artifact.get("artifact_type")
        if artifact.get("paths") or artifact.get("untracked") or kind not in (None, "archive"):
            names.append(str(artifact.get("name") or artifact.get("artifact_type") or "archive"))
    return names
