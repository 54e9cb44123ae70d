"""gitlab-runner's config.toml, edited safely (invariant S5).

gitlab-runner owns this file and rewrites it itself (for example when it rotates a
runner token), so every edit re-reads the file, applies a change function to what is
there *now*, and writes atomically (temp file in the same directory + rename, mode
0600). If the file changed between our read and our rename, the edit is applied again
to the new content. Keys and comments runnerctl does not own are kept (tomlkit keeps
them). A malformed file is refused with a clear error and never written.

runnerctl owns the `[[runners]]` entries whose `name` starts with `runnerctl/`.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import AoT, Item, Table
from tomlkit.toml_document import TOMLDocument

from runnerctl.errors import ConfigError

OWNED_PREFIX = "runnerctl/"
_RETRIES = 5


def default_runner_config_path() -> Path:
    """Where gitlab-runner looks: /etc/gitlab-runner as root, ~/.gitlab-runner otherwise."""
    if os.geteuid() == 0:
        return Path("/etc/gitlab-runner/config.toml")
    return Path.home() / ".gitlab-runner" / "config.toml"


class RunnerConfigFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> TOMLDocument:
        """The parsed file; an empty document when it does not exist yet."""
        doc, _ = self._read_with_digest()
        return doc

    def owned_entries(self) -> dict[str, dict[str, Any]]:
        """runnerctl's `[[runners]]` entries by name, as plain values; `id` is the GitLab
        runner id (`runner_id`), None when the entry has none."""
        entries = {str(entry["name"]): entry.unwrap() for entry in owned(self.read())}
        for name, entry in entries.items():
            entry["id"] = runner_id(entry, name=name, path=self.path)
        return entries

    def runner_ids(self) -> dict[str, int]:
        """GitLab's runner id of each runnerctl entry that has one, by entry name: the
        runners serve drives."""
        return {name: e["id"] for name, e in self.owned_entries().items() if e["id"] is not None}

    def repeated_names(self) -> list[str]:
        """runnerctl entry names given to more than one `[[runners]]` entry: gitlab-runner
        polls each, while `owned_entries` (and so serve) keeps the last (doctor and serve
        say so; init refuses to write on such a file)."""
        names = [str(entry["name"]) for entry in owned(self.read())]
        return sorted({name for name in names if names.count(name) > 1})

    def edit(self, change: Callable[[TOMLDocument], None]) -> TOMLDocument:
        """Apply `change` to the current content and write it atomically; returns the result."""
        for _ in range(_RETRIES):
            doc, digest = self._read_with_digest()
            before = doc.unwrap()
            change(doc)
            validate(doc, self.path)
            if doc.unwrap() == before and digest is not None:
                return doc  # nothing to change: leave the file (and its mtime) alone
            text = tomlkit.dumps(doc)
            if self._replace_if_unchanged(text, digest):
                return doc
        raise ConfigError(
            f"{self.path} kept changing while runnerctl tried to edit it",
            hint="stop whatever rewrites it in a loop and run the command again",
        )

    def _read_with_digest(self) -> tuple[TOMLDocument, str | None]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return tomlkit.document(), None
        except OSError as exc:
            raise ConfigError(f"cannot read {self.path}: {exc.strerror}") from None
        try:  # a BOM, as some editors write, gitlab-runner's TOML reader skips
            doc = tomlkit.parse(raw.decode("utf-8").removeprefix("\ufeff"))
        except (TOMLKitError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"{self.path} is not valid TOML ({exc}); it was left untouched",
                hint="fix the file by hand or move it away, then run the command again",
            ) from None
        validate(doc, self.path)
        return doc, hashlib.sha256(raw).hexdigest()

    def _replace_if_unchanged(self, text: str, digest: str | None) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        target = Path(os.path.realpath(self.path))  # a link's file: the link itself stays
        fd, tmp = tempfile.mkstemp(prefix=".config.toml.", dir=target.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o600)
            if _digest_of(self.path) != digest:
                return False
            os.replace(tmp, target)
            tmp = ""
            return True
        finally:
            if tmp:
                os.unlink(tmp)


def validate(doc: TOMLDocument, path: Path) -> None:
    """Refuse what gitlab-runner itself would refuse, before anything is written."""
    concurrent = doc.get("concurrent")
    if concurrent is not None and (not isinstance(concurrent, int) or concurrent < 1):
        raise ConfigError(f"{path}: `concurrent` must be a positive integer, not {concurrent!r}")
    runners = doc.get("runners")
    if runners is not None and not isinstance(runners, AoT | list):
        raise ConfigError(f"{path}: `runners` must be an array of tables ([[runners]])")
    for entry in _runners(doc):
        if not isinstance(entry, Table | dict):
            raise ConfigError(f"{path}: every [[runners]] entry must be a table")


MAX_RUNNER_ID = 2**63 - 1  # GitLab's ci_runners.id is a bigint


def runner_id(entry: dict[str, Any], *, name: str, path: Path) -> int | None:
    """The GitLab runner id of a `[[runners]]` entry: a positive whole number, None when
    it has none (absent, or 0 as gitlab-runner leaves it before registration)."""
    value = entry.get("id")
    if value is None or (type(value) is int and value == 0):
        return None
    if type(value) is not int or not 0 < value <= MAX_RUNNER_ID:
        raise ConfigError(f"{path}: runner {name!r} has id = {value!r}, not a GitLab runner id "
                          "(a positive whole number)",
                          hint="fix or remove that entry by hand, then run the command again")
    return value


_RAISED = re.compile(r"# runnerctl init (?:raised it from (\d+)|set it, absent before,) to (\d+)(?:; (.*))?")
"""The comment `raise_concurrent` leaves on `concurrent`: what it was before (a number, or
absent), what init set, and the lab's own comment that ours replaced."""


def raise_concurrent(doc: TOMLDocument, at_least: int) -> None:
    """`concurrent` at least `at_least` (gitlab-runner runs no more jobs at once than it
    says), with a comment saying what it was, so `restore_concurrent` can put it back;
    a second raise keeps the first one's origin."""
    current = doc.get("concurrent")
    if isinstance(current, int) and current >= at_least:
        return
    comment = _comment(doc)
    mark = _RAISED.fullmatch(comment)
    if mark is not None:
        origin, lab = mark[1], mark[3]
    else:
        origin = str(current) if isinstance(current, int) else None
        lab = comment.lstrip("#").strip() or None
    said = f"raised it from {origin}" if origin is not None else "set it, absent before,"
    ours = f"runnerctl init {said} to {at_least}"
    doc["concurrent"] = _commented(at_least, f"{ours}; {lab}" if lab else ours)


def _comment(doc: TOMLDocument) -> str:
    item = doc.item("concurrent") if "concurrent" in doc else None
    return item.trivia.comment if isinstance(item, Item) else ""


def restore_concurrent(doc: TOMLDocument) -> str | None:
    """Undo `raise_concurrent`: `concurrent` back to what it was (removed if it was absent),
    the lab's comment back, unless it was changed since (then only our comment goes).
    Returns what it did, None when init never raised it."""
    mark = _RAISED.fullmatch(_comment(doc))
    if mark is None:
        return None
    origin, set_to, lab = mark[1], int(mark[2]), mark[3]
    value = doc.get("concurrent")
    if value != set_to:
        doc["concurrent"] = _commented(value, lab)
        return f"keep concurrent = {value} (changed since runnerctl init set it to {set_to})"
    if origin is None:
        del doc["concurrent"]
        return f"remove concurrent = {set_to} (runnerctl init added it)"
    doc["concurrent"] = _commented(int(origin), lab)
    return f"set concurrent back to {origin} (runnerctl init raised it to {set_to})"


def _commented(value: Any, comment: str | None) -> Item:
    item: Item = tomlkit.item(value)
    if comment:
        item.comment(comment)
    return item


def owned(doc: TOMLDocument) -> list[Table]:
    """runnerctl's `[[runners]]` entries of `doc` (name `runnerctl/...`)."""
    return [entry for entry in _runners(doc) if str(entry.get("name", "")).startswith(OWNED_PREFIX)]


def _runners(doc: TOMLDocument) -> list[Table]:
    runners = doc.get("runners")
    return list(runners) if runners is not None else []


def _digest_of(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


RUNNERCTL_ENVIRONMENT = frozenset({"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
                                   "RUNNERCTL_OPTUNA_STORAGE"})
"""The `environment` variables runnerctl sets in its entries; others there are the lab's."""
_NOT_TOLD = frozenset({"id", "token", "token_obtained_at", "token_expires_at"})  # rotated, not edited


def replace_owned_entries(doc: TOMLDocument, entries: dict[str, dict[str, Any]], *,
                          retire: set[str], reset: list[str] | None = None) -> None:
    """Set runnerctl's entries: update by name in place, append new ones, drop `retire`.

    Entries runnerctl does not own, keys inside owned entries that runnerctl does not
    set, and `environment` variables it does not set (a lab's HTTPS_PROXY) are kept as
    they are. A key of an existing entry set back to runnerctl's value (a hand edit, or
    a changed setting) is added to `reset` as "entry: key", so init can say so.
    """
    names = [str(entry["name"]) for entry in owned(doc)]
    if entries and (twice := sorted({name for name in names if names.count(name) > 1})):
        # refused where init would write them, not on every read: serve and uninstall go on
        raise ConfigError(f"two [[runners]] entries are named {twice[0]}: gitlab-runner would poll both, "
                          "and the second job on its GPUs would wait for the first; nothing was changed",
                          hint="remove one of them by hand, then run the command again")
    runners = doc.get("runners")
    if not isinstance(runners, AoT):  # absent, or `runners = []` as an older uninstall left it:
        if runners is not None:       # an inline key, maybe above the top-level keys, which an
            del doc["runners"]        # array of tables there would swallow
        runners = tomlkit.aot()
    kept = tomlkit.aot()
    seen: set[str] = set()
    for entry in runners:
        name = str(entry.get("name", ""))
        if name in retire:
            continue
        if name in entries:
            changed: list[str] = []
            _merge(entry, entries[name], changed)
            if reset is not None and changed:
                reset.append(f"{name}: {', '.join(changed)}")
            seen.add(name)
        kept.append(entry)
    for name, values in entries.items():
        if name not in seen:
            table = tomlkit.table()
            _merge(table, values)
            kept.append(table)
    if not kept:  # no key at all: tomlkit writes an empty array of tables as `runners = []`,
        if "runners" in doc:  # which a [[runners]] added by hand contradicts, and init refused
            del doc["runners"]
    elif "runners" in doc:
        doc["runners"] = kept  # in place: the file keeps its layout
    else:
        doc.append("runners", kept)


def _merge(table: Table, values: dict[str, Any], changed: list[str] | None = None, where: str = "") -> None:
    for key, value in values.items():
        if isinstance(value, dict):
            if key not in table:
                table[key] = tomlkit.table()
            sub = table[key]
            assert isinstance(sub, Table)
            _merge(sub, value, changed, f"{where}{key}.")
            continue
        old = table.get(key)
        if key == "environment" and isinstance(old, list) and isinstance(value, list):
            ours = {str(v).partition("=")[0] for v in value} | RUNNERCTL_ENVIRONMENT
            value = [*value, *(v for v in old if str(v).partition("=")[0] not in ours)]
        if old != value:
            if changed is not None and old is not None and key not in _NOT_TOLD:
                changed.append(f"{where}{key}")
            table[key] = value
