"""`runnerctl uninstall`: take back what runnerctl put on a host, and nothing else.

What runnerctl made, and how it is recognized:
- its runners in GitLab: the ones named in its own `[[runners]]` entries of
  gitlab-runner's config.toml (name `runnerctl/...`, with the runner `id`), plus the
  host's stand-by runner recorded in `runnerctl-standby.json` beside it. A runner is
  deleted only when GitLab still lists that id under that name (an id GitLab gave to
  another runner since is left alone); one already gone counts as deleted;
- those config.toml entries (every other entry and key is kept as it is, byte for byte)
  and the stand-by record; once the last of them is gone, the `concurrent` that init
  raised goes back to the lab's value (its comment says what that was), unless it was
  changed since;
- the systemd units `runnerctl install` wrote (`runnerctl-<service>.service` whose
  `ExecStart` runs `-m runnerctl`), and its tmpfiles.d entry (`runnerctl.conf` starting
  with install's header line); a file of such a name that runnerctl did not write is
  left and named. (The job mapping directory that entry made goes at the next boot.)
The state directory, the PostgreSQL data, `/etc/runnerctl` (settings, serve.env with
the token) are left for the admin (docs/operations.md, "Uninstall"). In a shared store
the command retires the host (`Store.retire_host`): off the fleet page, history kept.

Order: each runner is deleted in GitLab before its entry leaves config.toml, so a
failure midway (GitLab down) leaves exactly what is still to do for the next run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from runnerctl import standby
from runnerctl.install import SERVICES, TMPFILES, unit_path, written_by_runnerctl
from runnerctl.runner_config import RunnerConfigFile, owned, replace_owned_entries, restore_concurrent

if TYPE_CHECKING:
    from tomlkit.toml_document import TOMLDocument

    from runnerctl.gitlab import GitLabPort


@dataclasses.dataclass(frozen=True)
class UninstallPlan:
    runners: tuple[tuple[str, int | None], ...]  # config.toml entry name, its runner id
    standby: standby.Standby | None
    units: tuple[Path, ...]  # absolute, below the root
    foreign_units: tuple[Path, ...]  # named like ours, not written by runnerctl: kept
    concurrent: str | None = None  # what becomes of the `concurrent` init raised, if it did
    leftovers: tuple[Path, ...] = ()  # an enable's links and an admin's drop-ins of our units: named

    def describe(self, config: Path) -> list[str]:
        lines = [f"delete runner {rid} ({name}) in GitLab" if rid else f"no runner id for {name}"
                 for name, rid in self.runners]
        if self.standby is not None:
            lines.append(f"delete runner {self.standby.id} ({self.standby.name}, the stand-by) in GitLab")
        lines += [f"remove {name} from {config}" for name, _ in self.runners]
        if self.concurrent is not None:
            lines.append(f"{self.concurrent} in {config}")
        if self.standby is not None:
            lines.append(f"remove {standby.standby_path(config)}")
        lines += [f"remove {unit}" for unit in self.units]
        lines += [f"keep   {unit} (not written by runnerctl install)" for unit in self.foreign_units]
        lines += [f"left   {path} (remove it, then systemctl daemon-reload)" for path in self.leftovers]
        return lines or ["nothing of runnerctl's here"]


def plan_uninstall(config: RunnerConfigFile, *, root: Path, gitlab_url: str | None) -> UninstallPlan:
    """What runnerctl would remove; reads only. `gitlab_url`: the stand-by record is
    acted on only when it was made for this GitLab (None: any)."""
    runners = tuple((name, entry["id"]) for name, entry in config.owned_entries().items())
    kept = standby.load(config.path)
    if kept is not None and gitlab_url is not None and kept.gitlab_url not in ("", gitlab_url):
        kept = None
    units: list[Path] = []
    foreign: list[Path] = []
    leftovers: list[Path] = []
    for service in SERVICES:
        path = unit_path(root, service)
        if path.is_file():
            (units if written_by_runnerctl(path) else foreign).append(path)
        # `systemctl enable`'s links (dangling once the unit goes) and drop-ins (systemctl edit)
        leftovers += sorted(path.parent.glob(f"*.wants/{path.name}"))
        leftovers += [d for d in (path.parent / f"{path.name}.d",) if d.is_dir()]
    tmpfiles = root / TMPFILES.relative_to("/")
    if tmpfiles.is_file():
        (units if written_by_runnerctl(tmpfiles) else foreign).append(tmpfiles)
    return UninstallPlan(runners, kept, tuple(units), tuple(foreign), restore_concurrent(config.read()),
                         tuple(leftovers))


@dataclasses.dataclass
class UninstallResult:
    deleted: list[str] = dataclasses.field(default_factory=list)
    not_ours: list[str] = dataclasses.field(default_factory=list)
    removed: list[str] = dataclasses.field(default_factory=list)
    changed: list[str] = dataclasses.field(default_factory=list)


def apply_uninstall(plan: UninstallPlan, *, config: RunnerConfigFile,
                    gitlab: GitLabPort | None) -> UninstallResult:
    """Carry the plan out; `gitlab` may be None only when no runner is to be deleted."""
    if gitlab is None and (plan.standby is not None or any(rid for _, rid in plan.runners)):
        raise ValueError("runners to delete, and no GitLab to delete them in")
    result = UninstallResult()
    done: set[str] = set()
    try:
        for name, rid in plan.runners:
            if rid is not None and gitlab is not None:
                _delete(gitlab, rid, name, result)
            done.add(name)
        if plan.standby is not None and gitlab is not None:
            _delete(gitlab, plan.standby.id, plan.standby.name, result)
            standby.standby_path(config.path).unlink(missing_ok=True)
            result.removed.append(str(standby.standby_path(config.path)))
    finally:
        said: list[str | None] = [None]

        def change(doc: TOMLDocument) -> None:
            if done:
                replace_owned_entries(doc, {}, retire=done)
            if not owned(doc):
                said[0] = restore_concurrent(doc)  # the last of runnerctl's entries is gone

        if done or plan.concurrent is not None:
            config.edit(change)
            result.removed += [f"{name} (config.toml)" for name in sorted(done)]
            if said[0] is not None:
                result.changed.append(said[0])
    for unit in plan.units:
        unit.unlink(missing_ok=True)
        result.removed.append(str(unit))
    return result


def _delete(gitlab: GitLabPort, runner_id: int, name: str, result: UninstallResult) -> None:
    info = gitlab.get_runner(runner_id)
    if info is not None and info.description != name:
        result.not_ours.append(f"runner {runner_id} is {info.description!r} now, not {name}: left in GitLab")
        return
    if info is not None:
        gitlab.delete_runner(runner_id)
    result.deleted.append(f"{name} (runner {runner_id}{'' if info is not None else ', already gone'})")
