"""One host drains for a job, ever: claims in the shared store, and events that say so.

Hosts sharing a store plan on their own, so two of them, both busy, could each drain a
block (pause its singles and let their jobs end) for the same pending multi-GPU job. A
claim, one row per job (`Store.claim`, an atomic upsert with an expiry), prevents it:
`plan` never drains for a job another host claims (`Observed.elsewhere`), though it
may open an idle block for it (nothing waits then; whichever runner GitLab hands the
job to first runs it). The claim stays with the host that really drained for a job:

- while the job is pending, even when a more urgent job takes that host's drain for a
  while (otherwise another host would drain for it meanwhile: a second drain);
- after the job left the host's queue (started, here or elsewhere, or cancelled), until
  the claim lapses (`claim_ttl_s`): another host that still lists it as pending from an
  older poll does not drain for a job that is already running.

A claim passes to another host only when it lapses, i.e. its host stopped ticking.
Claims lapse by the shared store's clock: `serve` measures how far its own is off the
PostgreSQL server's and claims with its clock less that (`Controller._skew`).

Events tell the two apart: `reserve` when a block opens at once on idle GPUs for a job,
`drain` when it is held while jobs still run on its GPUs (what `runnerctl_drains_total`
counts), be they other runners' or one GitLab handed the block itself (GitLab gives an
open block the oldest job its tags cover, not necessarily the one it opened for). A
reservation that began idle and must wait later records its `drain` then.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from runnerctl.controller.plan import Observed, Plan, PlanPolicy, plan
from runnerctl.controller.store import Store

RESERVE, DRAIN = "reserve", "drain"


class Claims:
    """The claims one host holds and the reservation events it has recorded."""

    def __init__(self, store: Store, host: str, *, ttl_s: float, drains: Mapping[str, int]) -> None:
        self.store, self.host, self.ttl_s = store, host, ttl_s
        self.told = told_before(store, host, drains)  # block -> (job, reserve|drain) recorded
        self.drained_for = {job for job, kind in self.told.values() if kind == DRAIN}
        self.renewed: dict[int, float] = {}  # job -> when this host last took or renewed its claim
        self.waiting: set[str] = set()  # reserved blocks with busy GPUs in the last plan

    def plan(self, observed: Observed, policy: PlanPolicy, now: float) -> tuple[Plan, Observed]:
        """Plan, claiming the jobs it reserves blocks for; a job another host claimed
        meanwhile counts as claimed elsewhere (no drain for it here) and the plan is
        redone. Ends: each redo adds a job to `elsewhere`, and the queue is finite.
        Returns the plan and what it was made from (with those jobs elsewhere)."""
        pending = {d.job_id for d in observed.demand}
        self.drained_for &= pending
        for job in sorted(self.drained_for):
            if not self._claim(job, now):  # lapsed and taken: that host drains for it now
                self.drained_for.discard(job)
        while True:
            result = plan(observed, policy)
            lost = frozenset(job for job in result.claims if not self._claim(job, now))
            if not lost:
                break
            observed = dataclasses.replace(observed, elsewhere=observed.elsewhere | lost)
        self.waiting = waiting(observed, result)
        self.drained_for |= {job for name, job in result.reserved.items()
                             if name in self.waiting and job in result.claims}
        gone = {job for job, at in self.renewed.items() if job not in pending and now < at + self.ttl_s}
        keep = result.claims | self.drained_for | gone
        self.renewed = {job: at for job, at in self.renewed.items() if job in keep}
        self.store.release_claims(self.host, keep=sorted(keep))
        return result, observed

    def _claim(self, job: int, now: float) -> bool:
        if self.store.claim(job, self.host, now=now, ttl_s=self.ttl_s):
            self.renewed[job] = now
            return True
        return False

    def tell(self, result: Plan) -> list[tuple[str, str, str]]:
        """(kind, block, detail) of the reservation events the plan `plan` just returned
        brings: one per block and job, `reserve` or `drain`, and a `drain` after a
        `reserve` when it must wait."""
        reasons = {d.slot.name: d.reason for d in result.decisions}
        events = []
        for name, job in sorted(result.reserved.items()):
            kind = DRAIN if name in self.waiting else RESERVE
            told = self.told.get(name)
            if told is not None and told[0] == job and (told[1] == DRAIN or kind == RESERVE):
                continue
            self.told[name] = (job, kind)
            detail = "idle, opened at once" if kind == RESERVE else (
                reasons[name].partition(": ")[2] or "waiting on its own runner's job")
            events.append((kind, name, f"for pending job {job}: {detail}"))
        self.told = {name: told for name, told in self.told.items() if name in result.reserved}
        return events


def waiting(observed: Observed, result: Plan) -> set[str]:
    """The reserved blocks that must wait: a job (another runner's, or one GitLab handed
    the block's own runner) still runs on some of their GPUs."""
    busy = {g for s in observed.slots if s.running_jobs for g in s.slot.gpus}
    reserved = result.reserved
    return {d.slot.name for d in result.decisions
            if d.slot.name in reserved and not busy.isdisjoint(d.slot.gpus)}


def told_before(store: Store, host: str, drains: Mapping[str, int]) -> dict[str, tuple[int, str]]:
    """After a restart: which event each stored reservation already recorded, so a drain
    under way is not recorded (and counted) twice, and its claim is kept."""
    told: dict[str, tuple[int, str]] = {}
    for event in store.events(host, limit=500):  # newest first
        job = drains.get(event.subject)
        if (job is not None and event.subject not in told and event.kind in (RESERVE, DRAIN)
                and drained_for(event.detail) == job):
            told[event.subject] = (job, event.kind)
    return told


def drained_for(detail: str) -> int | None:
    """The job a `reserve` or `drain` event's detail names (None for an admin's drain);
    before `reserve` existed the detail was just "for pending job N"."""
    head, _, rest = detail.partition("for pending job ")
    number = rest.partition(":")[0]
    return int(number) if not head and number.isdigit() else None
