"""Host commands: `init` registers this host's runners, `status` shows GPUs and slots,
`doctor` says what is wrong and how to fix it."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from runnerctl import access
from runnerctl.cli.params import GitLabUrl, config_option
from runnerctl.errors import ConfigError, ExitCode, RunnerctlError
from runnerctl.executors.contract import BadArguments, parse_stage_argv
from runnerctl.gitlab import REQUIRED_SCOPE, PythonGitLab, RunnerScope
from runnerctl.gpus import open_gpu_source
from runnerctl.layout import MIG_HINT, mig_gpus, plan_slots, slot_tags
from runnerctl.model import GpuSnapshot, Slot, slot_key
from runnerctl.registration import (
    EXECUTORS,
    RegistrationOptions,
    apply_registration,
    plan_registration,
    render_dry_run,
)
from runnerctl.runner_config import RunnerConfigFile, default_runner_config_path
from runnerctl.settings import Settings, default_settings_path, doubtful, load_settings
from runnerctl.tags import without_priorities

gpu_source_option = click.option(
    "--gpu-source", help="nvml (real GPUs), sim:N (N simulated GPUs) or sim:PATH (YAML) "
    "[default: from settings, else nvml]")
host_option = click.option("--host", "host_name", help="Host name for runner names and tags.")
runner_config_option = click.option(
    "--runner-config", type=click.Path(dir_okay=False, path_type=Path),
    help="gitlab-runner's config.toml [default: gitlab-runner's own location]")
TOKEN_ENV = "RUNNERCTL_GITLAB_TOKEN"
NO_TOKEN_HINT = f"set ${TOKEN_ENV} or pass --token-file PATH"
TOKEN_SHAPE = "the token alone on one line (printable ASCII, no spaces)"


def clean_token(text: str) -> str | None:
    """A token read from --token-file or $RUNNERCTL_GITLAB_TOKEN, stripped; None unless it
    has the shape of GitLab's tokens (TOKEN_SHAPE), the only one an HTTP header carries."""
    token = text.strip()
    return token if token and token.isascii() and token.isprintable() and " " not in token else None


def _read_token_file(ctx: click.Context, param: click.Parameter, value: Path | None) -> None:
    if value is None:
        return
    try:
        if value.stat().st_mode & 0o004:
            raise click.BadParameter(f"{value} is readable by every user: chmod 600 it", ctx, param)
        token = clean_token(value.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"cannot read {value}: {getattr(exc, 'strerror', None) or exc}", ctx,
                                 param) from None
    if token is None:
        raise click.BadParameter(f"{value} must hold {TOKEN_SHAPE}", ctx, param)
    ctx.meta["runnerctl.token"] = token


def _token(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """The token from --token-file, else the environment; never from the command line."""
    if value is not None:
        raise click.BadParameter(f"a token on the command line is visible to every user of this host "
                                 f"(ps, /proc); {NO_TOKEN_HINT}", ctx, param)
    if "runnerctl.token" in ctx.meta:
        return str(ctx.meta["runnerctl.token"])
    found = os.environ.get(TOKEN_ENV, "")
    token = clean_token(found)
    if found and token is None:
        raise ConfigError(f"${TOKEN_ENV} must hold {TOKEN_SHAPE}",
                          hint="fix it, or unset it and pass --token-file PATH")
    return token


def token_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """The GitLab token: `$RUNNERCTL_GITLAB_TOKEN` or `--token-file PATH` (a hidden `--token`
    only says to use those: argv is readable by every user of the host)."""
    func = click.option("--token", callback=_token, hidden=True,
                        help="Refused: use the file or the variable.")(func)
    return click.option(
        "--token-file", type=click.Path(dir_okay=False, path_type=Path), is_eager=True, expose_value=False,
        callback=_read_token_file,
        help=f"File holding the GitLab access token (0600; scope `{REQUIRED_SCOPE}`, a user who is Owner "
             f"of the "
             f"group, Maintainer of the project or an administrator) "
             f"[default: ${TOKEN_ENV}]; the token is never printed.")(func)


def _settings(config_path: Path | None) -> tuple[Settings, Path]:
    path = (config_path or default_settings_path()).absolute()  # init writes it into config.toml
    return load_settings(path), path


def _snapshot(settings: Settings, gpu_source: str | None, host_name: str | None) -> tuple[GpuSnapshot, str]:
    spec = gpu_source or settings.host.gpu_source
    return open_gpu_source(spec, host=host_name or settings.host.name).snapshot(), spec


def _runner_config(settings: Settings, path: Path | None) -> RunnerConfigFile:
    chosen = path or (Path(settings.paths.runner_config) if settings.paths.runner_config
                      else default_runner_config_path())
    return RunnerConfigFile(chosen)


@click.command()
@click.option("--gitlab-url", required=True, type=GitLabUrl(), help="Base URL of the GitLab instance.")
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
@click.option("--take-over", is_flag=True, help="Also delete and replace runners named like this "
              "host's that config.toml does not know while GitLab shows them online (init refuses "
              "them otherwise: another machine with the same [host] name?). For a host whose "
              "config.toml was lost.")
def init(gitlab_url: str, token: str | None, group_id: int | None, project_id: int | None,
         executor: str, runner_config: Path | None, gpu_source: str | None,
         host_name: str | None, config_path: Path | None, optuna_storage: str | None,
         dry_run: bool, take_over: bool) -> None:
    """Register one GitLab runner per GPU and per aligned GPU block, and write config.toml.

    Block runners are created paused; the controller (`runnerctl serve`) opens them on
    demand. A stand-by runner per host (unpaused, every slot's tags, never in
    config.toml, token in runnerctl-standby.json beside it) is kept online by `serve`, so
    GitLab does not fail jobs that wait over an hour for a drain. Running init again
    changes nothing; after a GPU is added or removed it adds or retires exactly those
    slots. The token's scope and role are checked first: a token lacking them changes
    nothing and the message names what is missing.
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
                                  settings_path=str(settings_path), optuna_storage=optuna_storage,
                                  take_over=take_over)
    plan = plan_registration(snapshot, config.owned_entries())
    left_alone = [*mig_note(snapshot), *_timeout_note(plan.slots, settings)]
    if dry_run:
        click.echo("\n".join(f"# {line}" for line in [*plan.describe(), *left_alone]))
        click.echo(f"# config.toml for {config.path}:")
        click.echo(render_dry_run(plan, snapshot, options, config))
        return
    if not token:
        raise ConfigError("no GitLab token", hint=NO_TOKEN_HINT)
    gitlab = PythonGitLab(options.gitlab_url, token)
    access.require(gitlab, scope)  # before anything is created or deleted
    before = _text(config.path)
    result = apply_registration(plan, snapshot, options, gitlab, config)
    for line in left_alone:
        click.echo(line)
    for label, names in (("created", result.created), ("retagged", result.retagged),
                         ("retimed", result.retimed), ("retired", result.retired),
                         ("unchanged", result.unchanged), ("orphans", result.orphans)):
        if names:
            click.echo(f"{label:9} {len(names):3}  " + ", ".join(slot_key(n) for n in names))
    for line in result.reset:
        click.echo(f"set again  {line} (keys runnerctl sets; hand edits belong in keys it does not set, "
                   "docs/operations.md)")
    changed = _text(config.path) != before
    click.echo(f"wrote {config.path}" if changed else f"{config.path} already up to date")
    if result.replaced:
        click.echo(f"then: restart runnerctl serve (systemctl restart runnerctl-serve): it drives the "
                   f"{len(result.replaced)} runner(s) made now by their new ids (it knows only those it "
                   f"read at its start), paused until then")


def _text(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


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
            "state": ("lost" if gpu.lost else "mig" if gpu.mig_enabled else
                      "busy" if gpu.processes else "idle" if gpu.processes_known else "unknown"),
            "mig_enabled": gpu.mig_enabled,
            "utilization": gpu.utilization, "memory_used_bytes": gpu.memory_used_bytes,
            "memory_total_bytes": gpu.memory_total_bytes, "healthy": gpu.healthy,
            "xid_errors": gpu.xid_errors, "ecc_uncorrected_errors": gpu.ecc_uncorrected_errors,
            "processes": [{"pid": p.pid, "user": p.user, "memory_bytes": p.used_memory_bytes,
                           "command": p.command} for p in gpu.processes],
        })
    slots = []
    for slot in plan_slots(snapshot):
        entry = entries.get(slot.name, {})
        slots.append({"name": slot.name, "gpus": list(slot.gpus), "tags": slot_tags(slot),
                      "runner_id": entry.get("id"), "registered": bool(entry.get("token"))})
    return {"host": snapshot.host, "source": snapshot.source, "gpus": gpus, "slots": slots,
            "left_alone": mig_note(snapshot)}


def mig_note(snapshot: GpuSnapshot) -> list[str]:
    """A line naming the MIG GPUs runnerctl leaves alone, and what to do (none without)."""
    mig = mig_gpus(snapshot)
    if not mig:
        return []
    return [f"GPU {', '.join(map(str, mig))} in MIG mode: {MIG_HINT}"]


def format_status(report: dict[str, Any]) -> str:
    lines = [f"host {report['host']} ({report['source']})", "",
             f"{'GPU':>3}  {'STATE':6} {'HEALTH':9} {'UTIL':>5} {'MEMORY':>17}  PROCESSES"]
    for gpu in report["gpus"]:
        util = "?" if gpu["utilization"] is None else f"{gpu['utilization']:.0%}"
        mem = _mem(gpu["memory_used_bytes"], gpu["memory_total_bytes"])
        procs = ", ".join(f"{p['pid']} ({p['user'] or '?'})" for p in gpu["processes"]) or "-"
        health = {True: "ok", False: "unhealthy", None: "unknown"}[gpu["healthy"]]
        lines.append(f"{gpu['index']:>3}  {gpu['state']:6} {health:9} {util:>5} {mem:>17}  {procs}")
    lines += ["", *report["left_alone"]] if report["left_alone"] else []
    lines += ["", f"{'SLOT':22} {'RUNNER':>7}  TAGS"]
    for slot in report["slots"]:
        runner = str(slot["runner_id"]) if slot["registered"] else "-"
        tags = ",".join(without_priorities(slot["tags"]))
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
@click.option("--gitlab-url", type=GitLabUrl(),
              help="GitLab to check against [default: the url in config.toml].")
@token_option
def doctor(gpu_source: str | None, host_name: str | None, config_path: Path | None,
           runner_config: Path | None, gitlab_url: str | None, token: str | None) -> None:
    """Check NVML, gitlab-runner, config.toml and GitLab, and say what to fix.

    GitLab: the token's scopes and role (it needs the `api` scope and Owner of the group,
    Maintainer of the project, or administrator), the runners, and their tokens. Tokens
    are verified under gitlab-runner's own system id (`.runner_system_id` beside
    config.toml), so no runner manager is added to GitLab; without that file the check
    is skipped and says so.
    """
    problems = 0

    def report(ok: bool, what: str, fix: str = "") -> None:
        nonlocal problems
        problems += 0 if ok else 1
        click.echo(f"[{'ok' if ok else 'FAIL'}] {what}" + ("" if ok or not fix else f"\n       fix: {fix}"))

    def note(what: str) -> None:
        click.echo(f"[skip] {what}")

    settings, settings_path = _settings(config_path)
    report(True, f"settings: {settings_path}" + ("" if settings_path.exists() else " (absent: defaults)"))
    for text in doubtful(settings):
        report(False, f"settings: {text}", f"change it in {settings_path}, then restart serve")
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
        if twice := config.repeated_names():
            report(False, f"config.toml: two entries are named {twice[0]} (gitlab-runner polls both, serve "
                   "drives only the last)", "remove one by hand, then run `runnerctl init` and restart serve")
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
    if entries:
        behind = _entries_behind(entries, settings, settings_path)
        report(not behind, "config.toml's runners follow the settings" + (f": {behind[0]}" if behind else ""),
               "run `runnerctl init` again (it rewrites runnerctl's entries), then restart serve")
    url = gitlab_url or next((str(e["url"]) for e in entries.values() if e.get("url")), None)
    if url and token:
        _check_gitlab(PythonGitLab(url, token), entries, report, note,
                      gitlab_runner_system_id(config.path))
    elif url:
        report(False, f"GitLab {url}: not checked (no token)", NO_TOKEN_HINT)
    if problems:
        raise click.exceptions.Exit(int(ExitCode.ERROR))


def _entries_behind(entries: dict[str, dict[str, Any]], settings: Settings, settings_path: Path) -> list[str]:
    """What config.toml's custom-executor entries say that the settings no longer do: the
    driver, the settings file and the builds and cache dirs every stage is given (a
    driver changed in runnerctl.toml reached no job until init ran again; found by a
    review as a lab admin)."""
    found = []
    for name, entry in sorted(entries.items()):
        custom = entry.get("custom")
        if entry.get("executor") != "custom" or not isinstance(custom, dict):
            continue
        argv = [str(a) for a in custom.get("prepare_args") or ()]
        try:  # as `stage_command` writes them: `-m runnerctl.executors prepare --slot ...`
            _, given, _ = parse_stage_argv(argv[2:] if argv[:2] == ["-m", "runnerctl.executors"] else argv)
        except BadArguments as exc:
            found.append(f"{name}'s prepare_args are no stage command the drivers read ({exc})")
            continue
        for flag, now, value in (("--driver", given.driver, settings.executor.driver),
                                 ("--config", given.config, str(settings_path))):
            if now != value:
                found.append(f"{name} runs with {flag} {now}, the settings say {value}")
        for key in ("builds_dir", "cache_dir"):
            if key in entry and str(entry[key]) != getattr(settings, key):
                found.append(f"{name} has {key} {entry[key]}, the settings say {getattr(settings, key)}")
    return found


SYSTEM_ID = re.compile(r"[sr]_[0-9a-zA-Z]{12}")
"""gitlab-runner's system id: `s_` + 12 hex of a machine-id HMAC, or `r_` + 12 random
characters (gitlab-org/gitlab-runner common/system_id_state.go)."""


def gitlab_runner_system_id(runner_config: Path) -> str | None:
    """The system id gitlab-runner uses on this host: it keeps it in `.runner_system_id`
    beside config.toml (gitlab-org/gitlab-runner commands/config.go, common/
    system_id_state.go, which ignores a malformed file). None when absent or unreadable."""
    try:
        text = (runner_config.parent / ".runner_system_id").read_text().strip()
    except OSError:
        return None
    return text if SYSTEM_ID.fullmatch(text) else None


def _check_gitlab(gitlab: PythonGitLab, entries: dict[str, dict[str, Any]], report: Any,
                  note: Any, system_id: str | None) -> None:
    try:
        reach = next((gitlab.runner_reach(e["id"]) for e in entries.values() if e["id"]), None)
        scope = (RunnerScope("group_type", group_id=reach.group_ids[0]) if reach and reach.group_ids
                 else RunnerScope("project_type", project_id=reach.project_ids[0])
                 if reach and reach.project_ids else RunnerScope("instance_type"))
        found = access.read_access(gitlab, scope)
        lacking = access.missing(found, scope)
        report(not lacking, f"GitLab {gitlab.url}: {found.describe()}"
               + ("" if not lacking else "; missing " + " and ".join(lacking)),
               f"use a token with the {REQUIRED_SCOPE} scope of a user who is {access.needed_role(scope)[1]}")
        if found.scopes is None:
            note(f"token scopes not checked: GitLab does not list them for this token (it needs "
                 f"{REQUIRED_SCOPE})")
        known = sum(gitlab.get_runner(e["id"]) is not None for e in entries.values() if e["id"])
        report(known == len(entries), f"GitLab {gitlab.url}: {known}/{len(entries)} runners known",
               "run `runnerctl init` again to re-register the missing ones")
        if system_id is None:
            note("runner tokens not verified: gitlab-runner's .runner_system_id is not beside "
                 "config.toml yet (it appears when gitlab-runner first starts); verifying under "
                 "another id would add a runner manager to GitLab")
            return
        bad = [name for name, entry in entries.items() if entry.get("token")
               and not gitlab.verify_runner_token(str(entry["token"]), system_id=system_id)]
        report(not bad, f"runner tokens valid ({len(entries) - len(bad)}/{len(entries)}), verified as "
               f"gitlab-runner's own manager {system_id}",
               "re-register: remove those entries from config.toml and run `runnerctl init`")
    except RunnerctlError as exc:
        report(False, f"GitLab {gitlab.url}: {exc.message}", exc.hint or "")


def _timeout_note(slots: tuple[Slot, ...], settings: Settings) -> list[str]:
    """A line when `runner_max_timeout_s` names some of the host's slot sizes but not all:
    the controller then uses none of them (`Controller._timed`). With all of them, a line
    per size whose cap is over its backfill bound (`[controller.planner]`): those jobs
    never backfill a drained block, which the admin who set the caps may expect."""
    caps = settings.controller.runner_max_timeout_s
    sizes = sorted({s.size for s in slots})
    missing = [size for size in sizes if str(size) not in caps]
    if not caps:
        return []
    if missing:
        return [f"note: runner_max_timeout_s has no entry for {'/'.join(map(str, missing))}-GPU slots; the "
                "controller uses runners' maximum timeouts only when every size has one"]
    planner = settings.controller.planner
    if not planner.backfill_max_s:
        return []  # backfill turned off on purpose
    notes = []
    for size in sizes[:-1]:  # backfill takes blocks smaller than the drained one
        key = "backfill_max_s" if size == 1 else "backfill_blocks_max_s"
        bound = getattr(planner, key)
        if bound and caps[str(size)] > bound:  # a bound of 0: turned off on purpose
            notes.append(f"note: runner_max_timeout_s {size}-GPU is {caps[str(size)]} s, over "
                         f"[controller.planner] {key} ({bound:g} s): {size}-GPU jobs never backfill "
                         f"a draining block (lower the cap or raise {key})")
    return notes
