"""`runnerctl init`: make GitLab runners and config.toml match this host's slots.

Planning is pure (`plan_registration`); acting creates, retags and deletes runners
through the GitLab port and then writes config.toml once. Tokens of runners created
before a failure are written before the error is raised, so nothing is lost, and a
second run picks up where the first stopped. Existing entries keep their credentials
(gitlab-runner may have rotated the token); only the keys runnerctl sets are updated.
A create whose answer never arrived (a timeout) may still have made a runner in GitLab
whose token nobody knows: every run first deletes such orphans (a runner named like one
of this host's slots that config.toml does not know), so they never pile up.

Last, `standby.ensure` makes the host's stand-by runner (never in config.toml; its token
in the state dir), which keeps GitLab from dropping jobs that wait for a drain.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from pathlib import Path
from typing import Any, Literal

import tomlkit

from runnerctl import standby
from runnerctl.errors import ConfigError, redact
from runnerctl.executors.contract import DriverArgs, custom_section
from runnerctl.gitlab import CreatedRunner, GitLabPort, RunnerInfo, RunnerScope
from runnerctl.layout import plan_slots, slot_tags, standby_name
from runnerctl.model import GpuSnapshot, Slot
from runnerctl.private import serve_pid
from runnerctl.runner_config import RunnerConfigFile, raise_concurrent, replace_owned_entries
from runnerctl.settings import Settings

Executor = Literal["custom", "docker", "shell"]
EXECUTORS: tuple[Executor, ...] = ("custom", "docker", "shell")
TOKEN_PLACEHOLDER = "<token from GitLab, written at registration>"


@dataclasses.dataclass(frozen=True)
class RegistrationOptions:
    gitlab_url: str
    executor: Executor
    scope: RunnerScope
    gpu_source: str
    settings: Settings
    settings_path: str
    optuna_storage: str | None = None
    """Put into every runner's environment as RUNNERCTL_OPTUNA_STORAGE (sweeps' default)."""
    take_over: bool = False
    """Delete orphans GitLab shows online too (`init --take-over`): this host's own runners
    whose config.toml was lost while their gitlab-runner still ran."""


@dataclasses.dataclass(frozen=True)
class RegistrationPlan:
    slots: tuple[Slot, ...]
    create: tuple[Slot, ...]
    keep: tuple[tuple[Slot, int], ...]  # slot and its runner id
    retire: tuple[tuple[str, int | None], ...]  # entry name and runner id

    def describe(self) -> list[str]:
        lines = [f"create {s.name} (gpus {_gpus(s)}, {'paused' if s.size > 1 else 'open'})"
                 for s in self.create]
        lines += [f"keep   {s.name} (runner {rid})" for s, rid in self.keep]
        lines += [f"retire {name} (runner {rid})" for name, rid in self.retire]
        if self.slots:
            lines.append(f"ensure {standby_name(self.slots[0].host)} (stand-by: unpaused, every slot's "
                         "tags, never in config.toml, token beside it)")
        return lines


def plan_registration(snapshot: GpuSnapshot, existing: dict[str, dict[str, Any]]) -> RegistrationPlan:
    """What to create, keep and retire, from the slots and config.toml's owned entries
    (`RunnerConfigFile.owned_entries`: their `id` already read as a runner id or None)."""
    slots = tuple(plan_slots(snapshot))
    wanted = {slot.name: slot for slot in slots}
    create, keep = [], []
    for slot in slots:
        entry = existing.get(slot.name, {})
        if entry.get("id") and entry.get("token"):
            keep.append((slot, entry["id"]))
        else:
            create.append(slot)
    retire = tuple(
        (name, entry.get("id")) for name, entry in existing.items() if name not in wanted
    )
    return RegistrationPlan(slots, tuple(create), tuple(keep), retire)


def entry_values(slot: Slot, snapshot: GpuSnapshot, options: RegistrationOptions) -> dict[str, Any]:
    """The `[[runners]]` keys runnerctl sets for a slot (credentials excluded)."""
    uuids = ",".join(snapshot.gpu(i).uuid for i in slot.gpus)
    values: dict[str, Any] = {
        "name": slot.name,
        "url": options.gitlab_url,
        "executor": options.executor,
        "limit": 1,
        "request_concurrency": 1,
    }
    shared = [f"RUNNERCTL_OPTUNA_STORAGE={options.optuna_storage}"] if options.optuna_storage else []
    if options.executor == "docker":
        values["environment"] = [f"CUDA_VISIBLE_DEVICES={uuids}", f"NVIDIA_VISIBLE_DEVICES={uuids}",
                                 *shared]
        values["docker"] = {"image": options.settings.executor.docker_image,
                            "gpus": f'"device={uuids}"'}
        return values
    values["environment"] = [
        f"CUDA_VISIBLE_DEVICES={_gpus(slot)}", f"NVIDIA_VISIBLE_DEVICES={uuids}",
        "CUDA_DEVICE_ORDER=PCI_BUS_ID", *shared,
    ]
    if options.executor == "custom":
        settings = options.settings
        values["builds_dir"] = settings.builds_dir
        values["cache_dir"] = settings.cache_dir
        args = DriverArgs(slot=slot.name, gpus=slot.gpus, gpu_source=options.gpu_source,
                          config=options.settings_path, driver=settings.executor.driver)
        values["custom"] = custom_section(args)
    return values


def credentials(created: CreatedRunner, now: datetime.datetime) -> dict[str, Any]:
    values: dict[str, Any] = {"id": created.id, "token": created.token, "token_obtained_at": now}
    if created.token_expires_at:
        values["token_expires_at"] = datetime.datetime.fromisoformat(
            created.token_expires_at.replace("Z", "+00:00"))
    return values


def render_dry_run(plan: RegistrationPlan, snapshot: GpuSnapshot, options: RegistrationOptions,
                   config: RunnerConfigFile) -> str:
    """The config.toml that `init` would write, with placeholder tokens; contacts nothing."""
    doc = config.read()
    entries = {}
    for slot in plan.slots:
        values = entry_values(slot, snapshot, options)
        if slot in plan.create:
            values = {"name": slot.name, "url": options.gitlab_url, "id": 0,
                      "token": TOKEN_PLACEHOLDER, **values}
        entries[slot.name] = values
    _ensure_globals(doc, len(plan.slots))
    replace_owned_entries(doc, entries, retire={name for name, _ in plan.retire})
    return mask_tokens(tomlkit.dumps(doc))


_TOKEN_VALUE = re.compile(r'^(\s*token\s*=\s*)(["\'])(?!<)[^"\']*\2', re.MULTILINE)
_GITLAB_TOKEN = re.compile(r"\b(gl[a-z]{1,6}-)[0-9A-Za-z_.\-]{8,}")




def mask_tokens(text: str) -> str:
    """config.toml text fit to print: every runner `token` value, anything shaped like a
    GitLab token (`glrt-...`, `glpat-...`) and a URL's password (the Optuna storage in
    the runners' environment) masked, so a dry run shows no secret."""
    text = _TOKEN_VALUE.sub(r"\1\2<masked>\2", text)
    return _GITLAB_TOKEN.sub(r"\1<masked>", redact(text))


@dataclasses.dataclass
class RegistrationResult:
    created: list[str] = dataclasses.field(default_factory=list)
    retagged: list[str] = dataclasses.field(default_factory=list)
    retimed: list[str] = dataclasses.field(default_factory=list)  # maximum job timeout set
    retired: list[str] = dataclasses.field(default_factory=list)
    unchanged: list[str] = dataclasses.field(default_factory=list)
    orphans: list[str] = dataclasses.field(default_factory=list)
    reset: list[str] = dataclasses.field(default_factory=list)
    """"entry: keys" of config.toml that init set back to its own values (a hand edit of
    a key runnerctl owns, or a changed setting): said, never silently."""
    replaced: list[str] = dataclasses.field(default_factory=list)
    """Runners made again for ones deleted in GitLab: created paused, since a running
    `serve` knows the old ids only and would neither pause nor drain the new one while
    its block runs (found by a review as a GitLab admin); `serve` restarted opens them."""


def apply_registration(plan: RegistrationPlan, snapshot: GpuSnapshot,
                       options: RegistrationOptions, gitlab: GitLabPort,
                       config: RunnerConfigFile) -> RegistrationResult:
    result = RegistrationResult()
    entries: dict[str, dict[str, Any]] = {}
    retired: set[str] = set()
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    orphans = find_orphans(plan, options.scope, gitlab)
    refuse_live_orphans(plan, options, gitlab, orphans, runner_config=Path(config.path))
    for orphan in orphans:
        gitlab.delete_runner(orphan.id)
        result.orphans.append(f"{orphan.description} (runner {orphan.id}, deleted: its token was lost)")
    try:
        for slot, runner_id in plan.keep:
            values = entry_values(slot, snapshot, options)
            info = gitlab.get_runner(runner_id)
            if info is None:  # deleted in GitLab: register it again, paused (`replaced`)
                created = _create(gitlab, slot, options, paused=True)
                result.replaced.append(slot.name)
                values.update(credentials(created, now))
                result.created.append(slot.name)
            else:
                changed = False
                if sorted(info.tags) != sorted(slot_tags(slot)):
                    gitlab.set_tags(runner_id, slot_tags(slot))
                    result.retagged.append(slot.name)
                    changed = True
                timeout = max_timeout(slot, options)
                if timeout is not None and info.maximum_timeout != timeout:
                    gitlab.set_maximum_timeout(runner_id, timeout)
                    result.retimed.append(slot.name)
                    changed = True
                if not changed:
                    result.unchanged.append(slot.name)
            entries[slot.name] = values
        # a running serve read config.toml at its start and drives only the runners it
        # names: one made now is paused and told as `replaced` (restart serve), or an entry
        # removed by hand (doctor's own advice) came back open while serve kept its GPU
        # paused for an admin (found by a review as a lab admin editing config)
        unknown_to_serve = serve_pid(Path(options.settings.paths.state_dir)) is not None
        for slot in plan.create:
            created = _create(gitlab, slot, options, paused=unknown_to_serve)
            entries[slot.name] = {**entry_values(slot, snapshot, options),
                                  **credentials(created, now)}
            result.created.append(slot.name)
            if unknown_to_serve:
                result.replaced.append(slot.name)
        for name, retired_id in plan.retire:
            if retired_id:
                gitlab.delete_runner(retired_id)
            retired.add(name)
            result.retired.append(name)
    finally:
        if entries or retired:
            _write(config, entries, retired, len(plan.slots), result.reset)
    _ensure_standby(plan, options, gitlab, config, result)
    return result


def _ensure_standby(plan: RegistrationPlan, options: RegistrationOptions, gitlab: GitLabPort,
                    config: RunnerConfigFile, result: RegistrationResult) -> None:
    """The host's stand-by runner, reported under the same labels as the slots."""
    if not plan.slots:
        return
    done, orphans = standby.ensure(gitlab, gitlab_url=options.gitlab_url, host=plan.slots[0].host,
                                   slots=list(plan.slots), scope=options.scope, runner_config=config.path)
    name = standby_name(plan.slots[0].host)
    {"created": result.created, "retagged": result.retagged}.get(done, result.unchanged).append(name)
    result.orphans.extend(orphans)


def refuse_live_orphans(plan: RegistrationPlan, options: RegistrationOptions, gitlab: GitLabPort,
                        orphans: list[RunnerInfo], *, runner_config: Path) -> None:
    """Before anything is deleted: an "orphan" GitLab shows online is no lost create (a
    runner whose token nobody ever had never contacts GitLab): some gitlab-runner polls
    with its token, most likely another machine given the same `[host] name`, whose
    runners deleting would break (its jobs failing, its controller told to run init,
    which would delete these in turn). Refused, naming them, unless `take_over`."""
    if options.take_over or not plan.slots:
        return
    standby_orphans = standby.find_orphans(gitlab, gitlab_url=options.gitlab_url, host=plan.slots[0].host,
                                           scope=options.scope, runner_config=runner_config)
    live = [r for r in [*orphans, *standby_orphans] if r.online]
    if live:
        names = ", ".join(f"{r.description} (runner {r.id})" for r in live[:3]) + (
            f" and {len(live) - 3} more" if len(live) > 3 else "")
        raise ConfigError(f"{names}: online in GitLab but not in this host's config.toml; another machine "
                          f"registers runners as host {plan.slots[0].host!r}? Nothing was changed",
                          hint="give each machine its own [host] name; if they are this host's own "
                          "(its config.toml was lost), run init again with --take-over to replace them")


def find_orphans(plan: RegistrationPlan, scope: RunnerScope, gitlab: GitLabPort) -> list[RunnerInfo]:
    """Runners in GitLab named like this host's slots (or slots being retired) that
    config.toml does not know: made by a create whose answer was lost, token unknown."""
    names = {s.name for s in plan.slots} | {name for name, _ in plan.retire}
    known = {rid for _, rid in plan.keep} | {rid for _, rid in plan.retire if rid}
    return [r for r in gitlab.list_runners(scope) if r.description in names and r.id not in known]


def _create(gitlab: GitLabPort, slot: Slot, options: RegistrationOptions, *,
            paused: bool = False) -> CreatedRunner:
    """A slot's runner: blocks paused (the controller opens them), singles open, but for a
    runner made again in place of one deleted in GitLab, paused too (`replaced`)."""
    return gitlab.create_runner(description=slot.name, tags=slot_tags(slot),
                                paused=paused or slot.size > 1, scope=options.scope,
                                maximum_timeout=max_timeout(slot, options))


def max_timeout(slot: Slot, options: RegistrationOptions) -> int | None:
    """The maximum job timeout `[controller] runner_max_timeout_s` asks for on this slot's
    runner (None: leave it as it is)."""
    return options.settings.controller.runner_max_timeout_s.get(str(slot.size))


def _write(config: RunnerConfigFile, entries: dict[str, dict[str, Any]], retired: set[str],
           slot_count: int, reset: list[str]) -> None:
    def change(doc: tomlkit.TOMLDocument) -> None:
        _ensure_globals(doc, slot_count)
        reset.clear()  # edit may run `change` again on a file changed meanwhile
        replace_owned_entries(doc, entries, retire=retired, reset=reset)

    config.edit(change)
    Path(config.path).chmod(0o600)


def _ensure_globals(doc: tomlkit.TOMLDocument, slot_count: int) -> None:
    """gitlab-runner needs `concurrent` >= the jobs that may run at once (one per slot);
    `uninstall` puts back what the lab had."""
    raise_concurrent(doc, slot_count)


def _gpus(slot: Slot) -> str:
    return ",".join(str(g) for g in slot.gpus)


