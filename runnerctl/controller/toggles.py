"""Admin toggles: pause, drain and resume per GPU, per slot or the whole host.

GitLab's pause already lets a running job finish, and runnerctl never signals a job
(S4), so both toggles close the runners they cover at once; they differ in what they
promise and report: `drain` means "let the current jobs finish, then the GPUs are
free for maintenance" and shows draining -> drained, `pause` is an open-ended hold.
`resume` removes the toggle (and the planner decides again). Each toggle is stored
with who, when and why, so a restart or another admin sees it.

Targets: `host`, `gpu:N` (every runner over GPU N), `slot:KEY` (one runner, e.g.
`slot:gpu0-3`). A target is checked before it is stored: written the one way the
loop matches it (`gpu:6`, not `gpu:006`), and naming a GPU or slot the host has, as its
controller recorded them in the store (`Store.inventory`); a host whose controller never
ran is checked for the form only. A pause or drain needs a reason (one line): whoever
finds the runners closed must learn why.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Literal, NamedTuple

from runnerctl.controller.store import Event, Store, Toggle
from runnerctl.errors import ConfigError
from runnerctl.model import Slot, slot_key

ACTIONS = ("pause", "drain")
_NOT_IN_A_LINE = ("Cc", "Zl", "Zp")
"""Unicode categories a reason may not hold: controls (C0, DEL, C1 with NEL) and the line
and paragraph separators, which would break or forge a line of the activity log."""
MAX_REASON = 500
_TARGET = re.compile(r"host|gpu:(0|[1-9][0-9]{0,3})|slot:gpu(0|[1-9][0-9]{0,3})([-+](0|[1-9][0-9]{0,3}))*")


class Target(NamedTuple):
    """What a toggle covers: the host, one GPU (`name` its index) or one slot (`name` its
    key). Stored and shown as text: `host`, `gpu:N`, `slot:KEY` (`str(target)`)."""

    kind: Literal["host", "gpu", "slot"]
    name: str = ""

    @classmethod
    def parse(cls, text: str) -> Target | None:
        """The target a well-formed text names; None for anything else."""
        if not _TARGET.fullmatch(text):
            return None
        if text == "host":
            return cls("host")
        kind, _, name = text.partition(":")
        return cls("gpu" if kind == "gpu" else "slot", name)

    @property
    def gpu(self) -> int | None:
        return int(self.name) if self.kind == "gpu" else None

    def __str__(self) -> str:
        return self.kind if self.kind == "host" else f"{self.kind}:{self.name}"


def target_of(*, gpu: int | None = None, slot: str | None = None, host: bool = False,
              on_host: str = "") -> str:
    """The stored target of a CLI/web request; exactly one of gpu, slot, host. A slot given
    by its runner name (`runnerctl/HOST/KEY`) must be on `on_host`, the host toggled."""
    given = [x for x in (gpu is not None, slot is not None, host) if x]
    if len(given) != 1:
        raise ConfigError("name exactly one of --gpu N, --slot KEY or --host")
    if gpu is not None:
        return str(Target("gpu", str(gpu)))
    if slot is not None:
        named = slot.split("/")
        if len(named) == 3 and on_host and named[1] != on_host:
            raise ConfigError(f"slot {slot!r} is a runner of {named[1]}, not of {on_host}",
                              hint=f"--host-name {named[1]} toggles that host's runners")
        return str(Target("slot", slot_key(slot)))
    return "host"


def check_target(store: Store, host: str, target: str) -> str:
    """`target` when the host has it; ConfigError (one line) otherwise."""
    if not _TARGET.fullmatch(target):
        raise ConfigError(f"toggle target {target!r} is not host, gpu:N or slot:KEY",
                          hint="N a GPU index without leading zeros, KEY a slot key such as gpu0-3")
    known = store.inventory(host)
    parsed = Target.parse(target)
    if known is None or parsed is None or parsed.kind == "host":
        return target
    gpus, slots = known
    if parsed.gpu is not None and parsed.gpu not in gpus:
        raise ConfigError(f"{host} has no GPU {parsed.name}", hint=f"its GPUs: {_ranges(gpus) or 'none'}")
    if parsed.kind == "slot" and parsed.name not in slots:
        raise ConfigError(f"{host} has no slot {parsed.name}",
                          hint=f"its slots: {', '.join(slots) or 'none'}")
    return target


def check_reason(action: str, why: str) -> str:
    """One line of at most MAX_REASON characters; not blank for pause and drain (a reason
    of spaces or invisible format characters, such as a zero-width space, is blank)."""
    if any(unicodedata.category(c) in _NOT_IN_A_LINE for c in why):
        raise ConfigError("the reason must be one line without control characters")
    if len(why) > MAX_REASON:
        raise ConfigError(f"the reason is longer than {MAX_REASON} characters")
    if action in ACTIONS and all(c.isspace() or unicodedata.category(c) == "Cf" for c in why):
        raise ConfigError(f"a {action} needs a reason", hint="whoever finds the runners closed learns "
                                                              "why (--why TEXT, or the page's reason field)")
    return why.strip()


def _ranges(numbers: Iterable[int]) -> str:
    ordered = sorted(numbers)
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}-{ordered[-1]}"
    return ", ".join(map(str, ordered))


def set_toggle(store: Store, toggle: Toggle) -> None:
    if toggle.action not in ACTIONS:
        raise ConfigError(f"unknown toggle {toggle.action!r}; one of {', '.join(ACTIONS)}")
    store.set_toggle(toggle)
    store.record(Event(toggle.at, toggle.host, toggle.action, toggle.target,
                       f"by {toggle.who}: {toggle.why or 'no reason given'}"))


def resume(store: Store, *, host: str, target: str, who: str, why: str, now: float) -> int:
    """Remove the toggle on `target` (`host` removes every toggle of the host; a GPU's is
    replaced by a reopen, in one transaction, so that a pause set in between is not lost
    unseen); the number of pauses and drains removed (a reopen a controller has not read
    yet is no toggle an admin set)."""
    held = [t for t in store.toggles(host) if t.action in ACTIONS and target in ("host", t.target)]
    if target.startswith("gpu:"):  # also acknowledged healthy: the reopen replaces the toggle in one step
        store.set_toggle(Toggle(host, target, "reopen", who, now, why))
    else:
        store.clear_toggles(host, None if target == "host" else target)
    store.record(Event(now, host, "resume", target, f"by {who}: {why or 'no reason given'}"))
    return len(held)


def request(store: Store, *, action: str, host: str, target: str, who: str, why: str,
            now: float) -> str:
    """One admin request (CLI or web page): pause/drain sets a toggle, resume removes it
    and, for a GPU, also acknowledges it as healthy again. Returns a one-line outcome.
    The target and reason are checked first (`check_target`, `check_reason`)."""
    if action not in (*ACTIONS, "resume"):
        raise ConfigError(f"unknown toggle {action!r}; one of {', '.join((*ACTIONS, 'resume'))}")
    why = check_reason(action, why)
    if not who.strip() or any(unicodedata.category(c) in _NOT_IN_A_LINE for c in who):
        raise ConfigError(f"who asks must be a name on one line, not {who!r}")
    target = check_target(store, host, target)
    if action == "resume":
        removed = resume(store, host=host, target=target, who=who, why=why, now=now)
        said = f"{host} {target}: resumed ({removed} toggle{'s' if removed != 1 else ''} removed)"
        nothing_seen = removed == 0  # a resume that removed nothing may name a wrong host
    else:
        set_toggle(store, Toggle(host, target, action, who, now, why))
        said = f"{host} {target}: {action} by {who}" + (f" ({why})" if why else "")
        nothing_seen = True
    if nothing_seen and store.inventory(host) is None:  # no serve ran there, or a misspelt name
        hosts = [h for h in store.hosts() if h != host and store.inventory(h) is not None]  # a controller ran
        said += (f"; no controller has run on {host} yet, it applies once one does"
                 + (f" (the store's hosts: {', '.join(hosts)})" if hosts else ""))
    return said


def held_slots(toggles: Iterable[Toggle], slots: Iterable[Slot]) -> dict[str, str]:
    """Slot name -> why an admin keeps it closed."""
    by_target = {t.target: t for t in toggles}
    held: dict[str, str] = {}
    for slot in slots:
        toggle = by_target.get("host") or by_target.get(f"slot:{slot.key}") or next(
            (by_target[f"gpu:{g}"] for g in slot.gpus if f"gpu:{g}" in by_target), None)
        if toggle is not None:
            held[slot.name] = describe(toggle)
    return held


def toggle_over_gpu(toggles: Iterable[Toggle], gpu: int, slot_keys: Iterable[str]) -> Toggle | None:
    """The admin toggle shown on a GPU: one on the host, on the GPU itself, or on a slot
    over it (`slot_keys`: the keys of the slots that contain the GPU)."""
    targets = {"host", f"gpu:{gpu}", *(f"slot:{key}" for key in slot_keys)}
    return next((t for t in toggles if t.target in targets), None)


def describe(toggle: Toggle) -> str:
    return f"{toggle.action} by {toggle.who}" + (f": {toggle.why}" if toggle.why else "")


def toggle_status(toggle: Toggle, slots: Iterable[Slot],
                  running: Mapping[str, tuple[int, ...]]) -> str:
    """paused | draining (N jobs left) | drained, for the view and the CLI."""
    covered = [s for s in slots if _covers(toggle.target, s)]
    if not covered:
        return "no such GPU or slot on this host"
    if toggle.action == "pause":
        return "paused"
    left = sum(len(running.get(s.name, ())) for s in covered)
    return f"draining ({left} job{'s' if left != 1 else ''} left)" if left else "drained"


def _covers(target: str, slot: Slot) -> bool:
    parsed = Target.parse(target)
    if parsed is None:
        return False
    if parsed.kind == "host":
        return True
    if parsed.gpu is not None:
        return parsed.gpu in slot.gpus
    return parsed.name == slot.key
