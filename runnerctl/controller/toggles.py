"""Admin toggles: pause, drain and resume per GPU, per slot or the whole host.

GitLab's pause already lets a running job finish, and runnerctl never signals a job
(S4), so both toggles close the runners they cover at once; they differ in what they
promise and report: `drain` means "let the current jobs finish, then the GPUs are
free for maintenance" and shows draining -> drained, `pause` is an open-ended hold.
`resume` removes the toggle (and the planner decides again). Each toggle is stored
with who, when and why, so a restart or another admin sees it.

Targets: `host`, `gpu:N` (every runner over GPU N), `slot:KEY` (one runner, e.g.
`slot:gpu0-3`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from runnerctl.controller.store import Event, Store, Toggle
from runnerctl.errors import ConfigError
from runnerctl.model import Slot

ACTIONS = ("pause", "drain")


def target_of(*, gpu: int | None = None, slot: str | None = None, host: bool = False) -> str:
    """The stored target of a CLI/web request; exactly one of gpu, slot, host."""
    given = [x for x in (gpu is not None, slot is not None, host) if x]
    if len(given) != 1:
        raise ConfigError("name exactly one of --gpu N, --slot KEY or --host")
    if gpu is not None:
        return f"gpu:{gpu}"
    if slot is not None:
        return f"slot:{slot.rsplit('/', 1)[-1]}"
    return "host"


def set_toggle(store: Store, toggle: Toggle) -> None:
    if toggle.action not in ACTIONS:
        raise ConfigError(f"unknown toggle {toggle.action!r}; one of {', '.join(ACTIONS)}")
    store.set_toggle(toggle)
    store.record(Event(toggle.at, toggle.host, toggle.action, toggle.target,
                       f"by {toggle.who}: {toggle.why or 'no reason given'}"))


def resume(store: Store, *, host: str, target: str, who: str, why: str, now: float) -> int:
    """Remove the toggle on `target` (`host` removes every toggle of the host)."""
    removed = store.clear_toggles(host, None if target == "host" else target)
    store.record(Event(now, host, "resume", target, f"by {who}: {why or 'no reason given'}"))
    return removed


def request(store: Store, *, action: str, host: str, target: str, who: str, why: str,
            now: float) -> str:
    """One admin request (CLI or web page): pause/drain sets a toggle, resume removes it
    and, for a GPU, also acknowledges it as healthy again. Returns a one-line outcome."""
    if action == "resume":
        removed = resume(store, host=host, target=target, who=who, why=why, now=now)
        if target.startswith("gpu:"):
            store.set_toggle(Toggle(host, target, "reopen", who, now, why))
        return f"{host} {target}: resumed ({removed} toggle{'s' if removed != 1 else ''} removed)"
    set_toggle(store, Toggle(host, target, action, who, now, why))
    return f"{host} {target}: {action} by {who}" + (f" ({why})" if why else "")


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


def describe(toggle: Toggle) -> str:
    return f"{toggle.action} by {toggle.who}" + (f": {toggle.why}" if toggle.why else "")


def toggle_status(toggle: Toggle, slots: Iterable[Slot],
                  running: Mapping[str, tuple[int, ...]]) -> str:
    """paused | draining (N jobs left) | drained, for the view and the CLI."""
    if toggle.action == "pause":
        return "paused"
    covered = [s for s in slots if _covers(toggle.target, s)]
    left = sum(len(running.get(s.name, ())) for s in covered)
    return f"draining ({left} job{'s' if left != 1 else ''} left)" if left else "drained"


def _covers(target: str, slot: Slot) -> bool:
    if target == "host":
        return True
    if target.startswith("gpu:"):
        return int(target[4:]) in slot.gpus
    return target == f"slot:{slot.key}"
