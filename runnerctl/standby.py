"""The host's stand-by runner: one online, unpaused runner that never asks for jobs.

Why: GitLab fails a job that has been pending for an hour when no runner that is
unpaused, online (contacted within 2 h) and whose tags cover the job's exists
(gitlabhq `app/services/ci/stuck_builds/drop_pending_service.rb`, `Ci::Build#stuck?`
in `app/models/ci/build.rb`, `Ci::Runner#match_build_if_online?` in
`app/models/ci/runner.rb`, `online?` in `app/models/concerns/ci/has_runner_status.rb`).
runnerctl keeps block runners paused while they drain, so without this runner a
multi-GPU job that waits over an hour is failed by GitLab.

What: `runnerctl init` creates, per host, one runner unpaused, with every tag of the
host's slots (`layout.standby_tags`), in the same scope as the slot runners. It is never
written to config.toml, so gitlab-runner never polls `POST /jobs/request` with its token,
and GitLab only hands a job to the runner that requests it (gitlabhq
`lib/api/ci/runner.rb`, `Ci::RegisterJobService`): it never gets a job, and a job it
covers simply stays pending until a slot runner opens for it. The controller keeps it
online (`controller.act.StandbyKeeper`) with `POST /runners/verify`, which heartbeats the
runner and the one manager of its `system_id` (`authenticate_runner!` in
`lib/api/ci/helpers/runner.rb`, `Ci::Runner#ensure_manager`); the system_id is made once
and kept, so GitLab lists exactly one manager for it.

Its token and system_id live next to gitlab-runner's config.toml, where the other
runner tokens and gitlab-runner's own `.runner_system_id` live, as
`runnerctl-standby.json`, mode 0600, written atomically; nothing prints the token. The
record names its GitLab URL: a record made for another GitLab is never acted on.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import string
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runnerctl.errors import ConfigError
from runnerctl.layout import standby_name, standby_tags
from runnerctl.model import Slot
from runnerctl.private import write_private

if TYPE_CHECKING:  # the simulator reads this module without loading python-gitlab
    from runnerctl.gitlab import GitLabPort, RunnerInfo, RunnerScope

STANDBY_FILE = "runnerctl-standby.json"
VERIFY_EVERY_S = 900.0
"""How often the controller verifies the stand-by runner. GitLab counts a runner online
while its `contacted_at` is under 2 h old and writes that column at most every 40-55 min
(`Ci::Runner::UPDATE_CONTACT_COLUMN_EVERY` in app/models/ci/runner.rb; the `online`
scope reads the column): every 15 min keeps it at most about 70 min old."""


@dataclasses.dataclass(frozen=True, repr=False)
class Standby:
    id: int
    token: str
    system_id: str
    name: str
    tags: tuple[str, ...]
    gitlab_url: str = ""

    def __repr__(self) -> str:  # never show the token
        return f"Standby(id={self.id}, name={self.name!r}, system_id={self.system_id!r}, token=<hidden>)"


def new_system_id() -> str:
    """A system_id as gitlab-runner makes one when it has no machine id: `r_` and 12
    random characters (kept for good: a new one would be a new runner manager)."""
    alphabet = string.ascii_lowercase + string.digits
    return "r_" + "".join(secrets.choice(alphabet) for _ in range(12))


def standby_path(runner_config: Path) -> Path:
    """The record beside gitlab-runner's config.toml."""
    return Path(runner_config).parent / STANDBY_FILE


def load(runner_config: Path) -> Standby | None:
    """The stand-by runner `init` made for this config.toml, or None when there is none."""
    path = standby_path(runner_config)
    try:
        data: Any = json.loads(path.read_text())
        return Standby(int(data["id"]), str(data["token"]), str(data["system_id"]), str(data["name"]),
                       tuple(str(t) for t in data["tags"]), str(data.get("gitlab_url", "")))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path} is not a stand-by runner record ({type(exc).__name__}: {exc})",
                          hint="delete it and run `runnerctl init` again") from None


def save(runner_config: Path, standby: Standby) -> None:
    """Write the record readable by its owner only (it holds a runner token)."""
    path = standby_path(runner_config)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"id": standby.id, "token": standby.token, "system_id": standby.system_id,
            "name": standby.name, "tags": list(standby.tags), "gitlab_url": standby.gitlab_url}
    write_private(path, json.dumps(data, indent=1))  # no temp file left on a full disk


def _known(runner_config: Path, *, gitlab_url: str, name: str) -> Standby | None:
    """The recorded stand-by runner, where it is this GitLab's and host's."""
    known = load(runner_config)
    return None if known is None or known.gitlab_url != gitlab_url or known.name != name else known


def find_orphans(gitlab: GitLabPort, *, gitlab_url: str, host: str, scope: RunnerScope,
                 runner_config: Path) -> list[RunnerInfo]:
    """Runners named like this host's stand-by that the record does not know."""
    name = standby_name(host)
    known = _known(runner_config, gitlab_url=gitlab_url, name=name)
    return [r for r in gitlab.list_runners(scope)
            if r.description == name and (known is None or r.id != known.id)]


def ensure(gitlab: GitLabPort, *, gitlab_url: str, host: str, slots: list[Slot], scope: RunnerScope,
           runner_config: Path) -> tuple[str, list[str]]:
    """Make this host's stand-by runner exist, unpaused and tagged for its slots.

    Returns (what was done: created|retagged|unchanged|none, orphans deleted). A runner
    named like the stand-by that the record does not know (a create whose answer was
    lost) is deleted; a recorded runner that GitLab lost is made again, keeping the
    system_id. A record of another GitLab or host is left alone. Nothing is sent when all
    is in order (the controller's first tick brings the runner online)."""
    if not slots:
        return "none", []
    name, tags = standby_name(host), standby_tags(slots)
    known = _known(runner_config, gitlab_url=gitlab_url, name=name)
    orphans = find_orphans(gitlab, gitlab_url=gitlab_url, host=host, scope=scope, runner_config=runner_config)
    for orphan in orphans:
        gitlab.delete_runner(orphan.id)
    gone = [f"{r.description} (runner {r.id}, deleted: its token was lost)" for r in orphans]
    if known is not None:
        info = gitlab.get_runner(known.id)
        if info is not None and info.description != name:
            info = None  # that id is some other runner now: not ours to touch
        if info is not None:
            done = "unchanged"
            if sorted(info.tags) != sorted(tags):
                gitlab.set_tags(known.id, tags)
                save(runner_config, dataclasses.replace(known, tags=tuple(tags)))
                done = "retagged"
            if info.paused:
                gitlab.set_paused(known.id, False)
            return done, gone
    created = gitlab.create_runner(description=name, tags=tags, paused=False, scope=scope)
    standby = Standby(created.id, created.token, known.system_id if known else new_system_id(), name,
                      tuple(tags), gitlab_url)
    save(runner_config, standby)
    return "created", gone
