"""Each runner's decision once the blocks are reserved: the last step of `plan.plan`.

Split from `plan` so each stays small, and written as one loop over the slots without
helper calls per slot: the simulator makes this decision for every runner of a host at
each of its plans (hundreds of thousands of times on a large trace).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from runnerctl.model import Slot

if TYPE_CHECKING:
    from runnerctl.controller.plan import Observed

NO_DEMAND = "no pending job needs this block"


class Decision(NamedTuple):  # a tuple: plans are made often (the simulator), keep them cheap
    slot: Slot
    open: bool
    reason: str


def decide(observed: Observed, busy: Mapping[int, list[str]],
           reservations: Mapping[str, tuple[Slot, int]]) -> tuple[Decision, ...]:
    """Per slot: closed if a GPU of it is closed or an admin holds it; a reserved block
    opens once no other slot's job runs on its GPUs; a slot on GPUs reserved for a block
    stays closed (drained); an unreserved block stays closed; a single opens unless
    another slot's job runs on its GPU."""
    closed, held = observed.closed, observed.held
    reserved_gpus = {g: name for name, (block, _) in reservations.items() for g in block.gpus}
    only = f"drained for {next(iter(reservations))}" if len(reservations) == 1 else None
    decisions: list[Decision] = []
    append, new = decisions.append, tuple.__new__  # Decision(...) without its Python-level __new__
    for state in observed.slots:
        slot = state.slot
        gpus = slot.gpus
        if closed and not closed.keys().isdisjoint(gpus):
            shut = next(g for g in gpus if g in closed)
            append(new(Decision, (slot, False, f"GPU {shut} closed: {closed[shut]}")))
            continue
        name = slot.name
        if held and name in held:
            append(new(Decision, (slot, False, held[name])))
            continue
        if reservations:
            reservation = reservations.get(name)
            if reservation is not None:
                others = sorted({h for g in gpus for h in busy.get(g, ()) if h != name}) if busy else None
                job = reservation[1]
                if others:
                    why = f"draining for job {job}: waiting on {', '.join(others)}"
                    append(new(Decision, (slot, False, why)))
                else:
                    append(new(Decision, (slot, True, f"open for job {job}")))
                continue
            if not reserved_gpus.keys().isdisjoint(gpus):  # the first block (by name) it lies in
                why = only or f"drained for {min(reserved_gpus[g] for g in gpus if g in reserved_gpus)}"
                append(new(Decision, (slot, False, why)))
                continue
        if len(gpus) > 1:
            append(new(Decision, (slot, False, NO_DEMAND)))
            continue
        holders = busy.get(gpus[0]) if busy else None  # a single: its one GPU
        if holders and any(h != name for h in holders):
            append(new(Decision, (slot, False, f"GPU in use by {min(h for h in holders if h != name)}")))
        else:
            append(new(Decision, (slot, True, "free")))
    return tuple(decisions)
