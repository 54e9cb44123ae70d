"""Host commands: `init` registers this host's runners, `status` shows GPUs and slots,
`doctor` says what is wrong and how to fix it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import click

from runnerctl.errors import ConfigError, ExitCode, RunnerctlError
from runnerctl.gitlab import PythonGitLab, RunnerScope
from runnerctl.gpus import open_gpu_source
from runnerctl.layout import plan_slots, slot_tags
from runnerctl.model import GpuSnapshot
from runnerctl.registration import (
    EXECUTORS,
    RegistrationOptions,
    apply_registration,
    plan_registration,
    render_dry_run,
)
from runnerctl.runner_config import RunnerConfigFile, default_runner_config_path
from runnerctl.settings import Settings, default_settings_path, load_settings

config_option = click.option(
    "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
    help="runnerctl settings file [default: $RUNNERCTL_CONFIG or /etc/runnerctl/runnerctl.toml]")
gpu_source_option = click.option(
    "--gpu-source", help="nvml (real GPUs), sim:N (N simulated GPUs) or sim:PATH (YAML) "
    "[default: from settings, else nvml]")
host_option = click.option("--host", "host_name", help="Host name for runner names and tags.")
runner_config_option = click.option(
    "--runner-config", type=click.Path(dir_okay=False, path_type=Path),
    help="gitlab-runner's config.toml [default: gitlab-runner's own location]")
token_option = click.option(
    "--token", envvar="RUNNERCTL_GITLAB_TOKEN", show_envvar=True,
    help="GitLab access token with create_runner/manage_runner scope (never printed).")


def _settings(config_path: Path | None) -> tuple[Settings, Path]:
    path = config_path or default_settings_path()
    return load_settings(path), path


def _snapshot(settings: Settings, gpu_source: str | None, host_name: str | None) -> tuple[GpuSnapshot, str]:
    spec = gpu_source or settings.host.gpu_source
    return open_gpu_source(spec, host=host_name or settings.host.name).snapshot(), spec


def _runner_config(settings: Settings, path: Path | None) -> RunnerConfigFile:
    chosen = path or (Path(settings.paths.runner_config) if settings.paths.runner_config
                      else default_runner_config_path())
    return RunnerConfigFile(chosen)


@click.command()
@click.option("--gitlab-url", required=True, help="Base URL of the GitLab instance.")
@token_option
@click.option("--group", "group_id", type=int, help="Register group runners in this group.")
@click.option("--project", "project_id", type=int, help="Register project runners in this project.")
@click.option("--executor", type=click.Choice(EXECUTORS), default="custom", show_default=True,
              help="custom: runnerctl's drivers (GPU leases, NVML gate; [executor] driver "
              "docker, shell, or slurm/sge/pbs/pjm batch jobs); docker/shell: gitlab-runner's "
              "own executors with the GPU set in config.toml (no lease, no gate).")
@runner_config_option
@gpu_source_option
@host_option
@config_option
@click.option("--optuna-storage", metavar="URL", help="Shared Optuna storage (e.g. from "
              "`runnerctl postgres url`) put into every runner's environment as "
              "RUNNERCTL_OPTUNA_STORAGE, the optuna-sweep template's default.")
@click.option("--dry-run", is_flag=True, help="Contact nothing; print the plan and the "
              "config.toml that would be written, tokens as placeholders.")
def init(gitlab_url: str, token: str | None, group_id: int | None, project_id: int | None,
         executor: str, runner_config: Path | None, gpu_source: str | None,
         host_name: str | None, config_path: Path | None, optuna_storage: str | None,
         dry_run: bool) -> None:
    """Register one GitLab runner per GPU and per aligned GPU block, and write config.toml.

    Block runners are created paused; the controller (`runnerctl serve`) opens them on
    demand. Running init again changes nothing; after a GPU is added or removed it adds
    or retires exactly those slots.
    """
    if group_id is not None and project_id is not None:
        raise click.UsageError("give --group or --project, not both")
    settings, settings_path = _settings(config_path)
    config = _runner_config(settings, runner_config)
    config.read()  # refuse a malformed file before anything else happens
    snapshot, spec = _snapshot(settings, gpu_source, host_name)
    scope = (RunnerScope("group_type", group_id=group_id) if group_id is not None else
             RunnerScope("project_type", project_id=project_id) if project_id is not None else
             RunnerScope("instance_type"))
    options = RegistrationOptions(gitlab_url=gitlab_url.rstrip("/"), executor=executor,  # type: ignore[arg-type]
                                  scope=scope, gpu_source=spec, settings=settings,
                                  settings_path=str(settings_path), optuna_storage=optuna_storage)
    plan = plan_registration(snapshot, config.owned_entries())
    if dry_run:
        click.echo("\n".join(f"# {line}" for line in plan.describe()))
        click.echo(f"# config.toml for {config.path}:")
        click.echo(render_dry_run(plan, snapshot, options, config))
        return
    if not token:
        raise ConfigError("no GitLab token", hint="pass --token or set RUNNERCTL_GITLAB_TOKEN")
    gitlab = PythonGitLab(options.gitlab_url, token)
    result = apply_registration(plan, snapshot, options, gitlab, config)
    for label, names in (("created", result.created), ("retagged", result.retagged),
                         ("retired", result.retired), ("unchanged", result.unchanged),
                         ("orphans", result.orphans)):
        if names:
            click.echo(f"{label:9} {len(names):3}  " + ", ".join(n.rsplit('/', 1)[-1] for n in names))
    click.echo(f"wrote {config.path}" if (result.created or result.retired) else
               f"{config.path} already up to date")


@click.command()
@gpu_source_option
@host_option
@config_option
@runner_config_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object for scripts.")
def status(gpu_source: str | None, host_name: str | None, config_path: Path | None,
           runner_config: Path | None, as_json: bool) -> None:
    """Show this host's GPUs (state, utilization, memory, processes) and runner slots."""
    settings, _ = _settings(config_path)
    snapshot, _spec = _snapshot(settings, gpu_source, host_name)
    entries = _runner_config(settings, runner_config).owned_entries()
    report = status_report(snapshot, entries)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(format_status(report))


def status_report(snapshot: GpuSnapshot, entries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    gpus = []
    for gpu in snapshot.gpus:
        gpus.append({
            "index": gpu.index, "uuid": gpu.uuid, "name": gpu.name,
            "state": "lost" if gpu.lost else ("busy" if gpu.processes else "idle"),
            "utilization": gpu.utilization, "memory_used_bytes": gpu.memory_used_bytes,
            "memory_total_bytes": gpu.memory_total_bytes, "healthy": gpu.healthy,
            "processes": [{"pid": p.pid, "user": p.user, "memory_bytes": p.used_memory_bytes,
                           "command": p.command} for p in gpu.processes],
        })
    slots = []
    for slot in plan_slots(snapshot):
        entry = entries.get(slot.name, {})
        slots.append({"name": slot.name, "gpus": list(slot.gpus), "tags": slot_tags(slot),
                      "runner_id": entry.get("id"), "registered": bool(entry.get("token"))})
    return {"host": snapshot.host, "source": snapshot.source, "gpus": gpus, "slots": slots}


def format_status(report: dict[str, Any]) -> str:
    lines = [f"host {report['host']} ({report['source']})", "",
             f"{'GPU':>3}  {'STATE':6} {'UTIL':>5} {'MEMORY':>17}  PROCESSES"]
    for gpu in report["gpus"]:
        util = "?" if gpu["utilization"] is None else f"{gpu['utilization']:.0%}"
        mem = _mem(gpu["memory_used_bytes"], gpu["memory_total_bytes"])
        procs = ", ".join(f"{p['pid']} ({p['user'] or '?'})" for p in gpu["processes"]) or "-"
        lines.append(f"{gpu['index']:>3}  {gpu['state']:6} {util:>5} {mem:>17}  {procs}")
    lines += ["", f"{'SLOT':22} {'RUNNER':>7}  TAGS"]
    for slot in report["slots"]:
        runner = str(slot["runner_id"]) if slot["registered"] else "-"
        tags = ",".join(t for t in slot["tags"] if not t.startswith("priority:"))
        lines.append(f"{slot['name'].split('/', 2)[-1]:22} {runner:>7}  {tags}")
    return "\n".join(lines)


def _mem(used: int | None, total: int | None) -> str:
    gib = 1024**3
    used_s = "?" if used is None else f"{used / gib:.1f}"
    total_s = "?" if total is None else f"{total / gib:.0f}"
    return f"{used_s}/{total_s} GiB"


@click.command()
@gpu_source_option
@host_option
@config_option
@runner_config_option
@click.option("--gitlab-url", help="GitLab to check against [default: the url in config.toml].")
@token_option
def doctor(gpu_source: str | None, host_name: str | None, config_path: Path | None,
           runner_config: Path | None, gitlab_url: str | None, token: str | None) -> None:
    """Check NVML, gitlab-runner, config.toml and GitLab, and say what to fix."""
    problems = 0

    def report(ok: bool, what: str, fix: str = "") -> None:
        nonlocal problems
        problems += 0 if ok else 1
        click.echo(f"[{'ok' if ok else 'FAIL'}] {what}" + ("" if ok or not fix else f"\n       fix: {fix}"))

    settings, settings_path = _settings(config_path)
    report(True, f"settings: {settings_path}" + ("" if settings_path.exists() else " (absent: defaults)"))
    snapshot = None
    try:
        snapshot, spec = _snapshot(settings, gpu_source, host_name)
        report(True, f"GPUs: {len(snapshot.gpus)} via {spec}")
    except RunnerctlError as exc:
        report(False, f"GPUs: {exc.message}", exc.hint or "")
    found = shutil.which("gitlab-runner")
    report(found is not None, f"gitlab-runner on PATH: {found or 'not found'}",
           "install gitlab-runner (it runs the jobs; runnerctl only manages it)")
    config = _runner_config(settings, runner_config)
    entries: dict[str, dict[str, Any]] = {}
    try:
        entries = config.owned_entries()
        report(config.path.exists(), f"config.toml: {config.path} ({len(entries)} runnerctl runners)",
               "run `runnerctl init` to create it")
        if config.path.exists():
            mode = config.path.stat().st_mode & 0o777
            report(mode & 0o077 == 0, f"config.toml mode {mode:o}", f"chmod 600 {config.path}")
    except RunnerctlError as exc:
        report(False, f"config.toml: {exc.message}", exc.hint or "")
    if snapshot is not None and entries:
        wanted = {s.name for s in plan_slots(snapshot)}
        missing, extra = wanted - set(entries), set(entries) - wanted
        report(not missing and not extra,
               f"slots match GPUs ({len(missing)} missing, {len(extra)} retired GPUs)",
               "run `runnerctl init` again")
    url = gitlab_url or next((str(e["url"]) for e in entries.values() if e.get("url")), None)
    if url and token:
        _check_gitlab(PythonGitLab(url, token), entries, report)
    elif url:
        report(False, f"GitLab {url}: not checked (no token)", "pass --token or set RUNNERCTL_GITLAB_TOKEN")
    if problems:
        raise click.exceptions.Exit(int(ExitCode.ERROR))


def _check_gitlab(gitlab: PythonGitLab, entries: dict[str, dict[str, Any]], report: Any) -> None:
    try:
        known = sum(gitlab.get_runner(int(e["id"])) is not None for e in entries.values() if e.get("id"))
        report(known == len(entries), f"GitLab {gitlab.url}: {known}/{len(entries)} runners known",
               "run `runnerctl init` again to re-register the missing ones")
        bad = [name for name, entry in entries.items()
               if entry.get("token") and not gitlab.verify_runner_token(str(entry["token"]))]
        report(not bad, f"runner tokens valid ({len(entries) - len(bad)}/{len(entries)})",
               "re-register: remove those entries from config.toml and run `runnerctl init`")
    except RunnerctlError as exc:
        report(False, f"GitLab {gitlab.url}: {exc.message}", exc.hint or "")


