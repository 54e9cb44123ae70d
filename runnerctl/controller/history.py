"""Job history: every job the host's runners ran, written by the controller each tick.

The executor's lease is the ground truth of who holds which GPUs (executors/lease.py):
a job enters the history when its lease appears (start = the lease's creation, when
prepare took the GPUs) and leaves it when the lease is gone. The controller only looks
once per tick, so the end is taken halfway between the last tick that saw the lease and
the first that did not (off by at most half an interval; none of it is counted twice).
What the lease lacks comes from what the controller already read: the job's name (where
an older executor's lease has none) and queued time from the pending jobs demand polling
saw (`queued_at` stays unknown for a job never seen pending), and the GPUs' utilization
from the tick's one NVML snapshot (a tick where it is unknown adds no sample: unknown
never counts as 0 %).

Outcome: GitLab's final status (success, failed, canceled) when a job webhook brought
it (up to an hour after the lease went); else "ended" (the lease went away) or "freed"
(the controller's orphan audit released it: GitLab said the job was long over). No
request is spent on it: the API budget stays with demand polling. A freed job whose
status is heard ended by the tick that heard it, if that came before its lease went:
the lease outlived the job by minutes (`orphan_after_s`), which would lengthen its run
time (the run-time estimates read it, `estimates`) and its GPU-hours.

"Requested but unused": a job whose GPUs stay below `unused_utilization` for
`unused_after_s` gets one `unused` event, a flag in the view (badge on the page) and a
line in `runnerctl report`.

Restart: the open rows of this host are read back at start, so a job running across
a restart keeps its row (never counted twice), and one whose lease vanished while the
controller was down is closed at its last sighting.

Store failures: the controller observes the leases first in its tick (`observe`, in
memory) and writes late (`save`), so a store that cannot write fails the tick (logged
once, /healthz) but not the observing: what was not written goes with the next tick that
can write, and a job that started and ended, or ended, while the store was down keeps
its row and its real end. The user is GitLab's where the controller heard it (a pending
job, or the orphan audit's look at the runner's running jobs, `confirm`).

Retention: at most once an hour, history and events older than their retention
(`[controller] history_retention_days`, `events_retention_days`) are deleted.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from urllib.parse import urlsplit

from runnerctl.controller import jobs_store
from runnerctl.controller.demand import PendingJob, due
from runnerctl.controller.jobs_store import JobRecord
from runnerctl.controller.observe import LeasedJob
from runnerctl.controller.store import Store
from runnerctl.model import GpuSnapshot
from runnerctl.settings import ControllerSettings

log = logging.getLogger(__name__)
PRUNE_EVERY_S = 3600.0
DAY_S = 86400.0
EventSink = Callable[[str, str, str], None]
"""(kind, subject, detail) -> recorded as an event of the host."""


class History:
    """The host's open jobs in memory, mirrored to the store every tick."""

    def __init__(self, store: Store, host: str, settings: ControllerSettings) -> None:
        self.store, self.host, self.settings = store, host, settings
        self.open: dict[int, JobRecord] = {r.job_id: r for r in jobs_store.open_jobs(store, host)}
        self.pending: dict[int, PendingJob] = {}  # last seen pending: name and queued time
        self.freed: set[int] = set()
        self.outcomes: dict[int, tuple[str, float]] = {}  # job id -> (GitLab status, heard at)
        self.recent: dict[int, JobRecord] = {}  # closed as "ended" in the last hour: may hear more
        self._unsaved: dict[int, JobRecord] = {}  # rows a failed tick could not store: sent again
        self._events: list[tuple[str, str, str]] = []  # found by `observe`, recorded by `save`
        self._last_tick: float | None = None
        self._next_prune = 0.0
        self.skew = 0.0  # how far this host's clock is ahead of the shared store's (the controller's measure)
        self.unconfirmed: set[int] = set(self.open)
        """Open jobs whose user only the job's own variables name (its lease's GITLAB_USER_LOGIN,
        which a job's YAML can set): not seen pending, not yet listed by GitLab (`confirm`)."""

    def remember_pending(self, jobs: Iterable[PendingJob]) -> None:
        """Called before demand forgets the jobs now running (their queued time)."""
        for job in jobs:
            self.pending[job.job_id] = job

    def confirm(self, users: Mapping[int, str]) -> None:
        """GitLab's user of running jobs (the lease audit's look, `OrphanAudit.users`): a job
        whose lease named someone else is billed to GitLab's user from now on; its row and
        the event that says so are stored by `save`, late in the tick, as `observe`'s are."""
        for job_id, user in users.items():
            record = self.open.get(job_id) or self.recent.get(job_id)
            self.unconfirmed.discard(job_id)
            if record is None or not user or record.user == user:
                continue
            self._events.append(("user", f"job {job_id}", f"its variables name {record.user or 'no user'} "
                                 f"as GITLAB_USER_LOGIN, GitLab says {user}: its GPU time is {user}'s"))
            record = dataclasses.replace(record, user=user)
            (self.open if job_id in self.open else self.recent)[job_id] = record
            self._unsaved[job_id] = record

    def tick(self, leased: Mapping[int, LeasedJob], snapshot: GpuSnapshot | None, now: float,
             event: EventSink, outcomes: Mapping[int, str] | None = None) -> None:
        """Open rows for new leases, sample running ones, close vanished ones, store them.
        `outcomes`: final GitLab statuses heard since the last tick (job webhooks)."""
        self.observe(leased, snapshot, now, outcomes)
        self.save(now, event)

    def observe(self, leased: Mapping[int, LeasedJob], snapshot: GpuSnapshot | None, now: float,
                outcomes: Mapping[int, str] | None = None) -> None:
        """`tick`'s part in memory, which needs no store: the controller observes first in
        its tick and `save`s later, so a store that cannot write (a full disk) costs no job
        its row: before, a write earlier in the tick failed it first, and a job that
        started and ended meanwhile had none, one that ended was cut at its last sighting
        before it (found by a review of a host out of disk space)."""
        self.outcomes.update((job, (status, now)) for job, status in (outcomes or {}).items())
        interval = self.settings.interval_s
        dt = 0.0 if self._last_tick is None else max(0.0, min(now - self._last_tick, 3 * interval))
        first = self._last_tick is None
        self._last_tick = now
        utilization = {} if snapshot is None else {g.index: g.utilization for g in snapshot.gpus}
        changed: list[JobRecord] = []
        for job_id, lease in leased.items():
            record = self.open.get(job_id) or self._new(job_id, lease, now)
            values = [None if lease.elsewhere else utilization.get(g) for g in record.gpus]
            record = self._sample(record, values, now, dt)  # a batch node's use is unknown here
            self.open[job_id] = record
            changed.append(record)
        for job_id in [j for j in self.open if j not in leased]:
            record = self.open.pop(job_id)
            self.unconfirmed.discard(job_id)
            gap = max(0.0, now - record.seen_at)  # a clock stepped back: no end before the last sighting
            end = record.seen_at + (min(gap, interval) / 2 if not first else 0.0)
            outcome = "freed" if job_id in self.freed else "ended"
            closed = dataclasses.replace(record, ended_at=end, outcome=outcome, low_since=None)
            changed.append(closed)
            self.freed.discard(job_id)
            self.recent[job_id] = closed
        for job_id in [j for j in self.recent if j in self.outcomes]:
            status, heard = self.outcomes.pop(job_id)
            record = self.recent.pop(job_id)
            end = record.end
            if record.outcome == "freed":  # its lease outlived it: it ended by the tick that heard it
                end = max(record.started_at, min(end, heard))
            changed.append(dataclasses.replace(record, outcome=status, ended_at=end))
        self.recent = {j: r for j, r in self.recent.items() if now - r.end < 3600.0}
        self.outcomes = {j: o for j, o in self.outcomes.items() if now - o[1] < 3600.0}
        for job_id in [j for j in self.pending if j in leased]:
            del self.pending[job_id]
        self._unsaved.update((r.job_id, r) for r in changed)  # the latest row of each job

    def save(self, now: float, event: EventSink) -> None:
        """Store what `observe` and `confirm` changed, and the events they found; what a
        StoreError (failing the tick) leaves unsaved goes with the next."""
        while self._events:
            event(*self._events[0])
            self._events.pop(0)
        jobs_store.save_jobs(self.store, self._unsaved.values())  # a StoreError fails the tick
        self._unsaved.clear()
        if due(now, self._next_prune, PRUNE_EVERY_S):  # a clock stepped back too
            self._prune(now)

    def shift(self, step: float) -> None:
        """The wall clock stepped by `step` seconds (`Controller._clock_step`: NTP setting
        a wrong clock right at boot): the running jobs' times taken before it move with
        it, so the step is no time spent. Without this a 2-hour step flagged every running
        job "requested but unused" for 120 minutes, and a step back left their sightings
        and ends in the future. GitLab's times (queued) are GitLab's clock's: kept."""
        def moved(at: float | None) -> float | None:
            return None if at is None else at + step

        self.open = {j: dataclasses.replace(r, started_at=r.started_at + step, seen_at=r.seen_at + step,
                                            low_since=moved(r.low_since), unused_at=moved(r.unused_at))
                     for j, r in self.open.items()}
        if self._last_tick is not None:
            self._last_tick += step

    def unused(self) -> tuple[int, ...]:
        """Running jobs flagged "requested but unused" and still idle now."""
        return tuple(sorted(j for j, r in self.open.items() if r.unused_at is not None and r.low_since))

    def _new(self, job_id: int, lease: LeasedJob, now: float) -> JobRecord:
        seen = self.pending.get(job_id)
        if not (seen and seen.user):
            self.unconfirmed.add(job_id)
        started = lease.created_at if lease.created_at is not None and lease.created_at <= now else now
        return JobRecord(
            host=self.host, job_id=job_id, slot=lease.slot, gpus=tuple(lease.gpus),
            project=lease.project or project_of(lease.url) or (str(seen.project_id) if seen else ""),
            pipeline=lease.pipeline,
            name=lease.name or ((seen.name or "") if seen else ""),
            user=(seen.user if seen and seen.user else lease.user),  # GitLab's word over the job's
            url=lease.url or (seen.web_url or "" if seen else ""),
            queued_at=seen.pending_since if seen else None, started_at=started, seen_at=now)

    def _sample(self, record: JobRecord, values: list[float | None], now: float, dt: float) -> JobRecord:
        known = [v for v in values if v is not None]
        now = max(now, record.seen_at)  # a clock stepped back (NTP) moves no sighting back, below the start
        if not known:  # unknown: no sample, and the idle clock neither runs nor resets
            return dataclasses.replace(record, seen_at=now)
        limit = self.settings.unused_utilization
        mean = sum(known) / len(known)
        idle = sum(1 for v in known if v < limit)
        low_since = (record.low_since if record.low_since is not None else now) if mean < limit else None
        record = dataclasses.replace(record, seen_at=now, util_sum=record.util_sum + mean,
                                     util_samples=record.util_samples + 1,
                                     idle_gpu_s=record.idle_gpu_s + idle * dt, low_since=low_since)
        if (low_since is not None and record.unused_at is None
                and now - low_since >= self.settings.unused_after_s):
            record = dataclasses.replace(record, unused_at=now)
            self._events.append((
                "unused", f"job {record.job_id}",
                f"{record.user or 'unknown user'} holds GPU{'s' if len(record.gpus) > 1 else ''} "
                f"{', '.join(map(str, record.gpus))} at under {limit:.0%} utilization for "
                f"{(now - low_since) / 60:.0f} min (requested but unused)"))
        return record

    def _prune(self, now: float) -> None:
        """Retention, on every host's rows of a shared store: cut by the store's clock (`skew`
        off), so a host whose clock is months ahead deletes no other host's history."""
        self._next_prune = now + PRUNE_EVERY_S
        self.pending = {j: p for j, p in self.pending.items() if now - p.created_at < 7 * DAY_S}
        cut = now - self.skew
        gone = jobs_store.prune(
            self.store, jobs_before=cut - self.settings.history_retention_days * DAY_S,
            events_before=cut - self.settings.events_retention_days * DAY_S, now=cut)
        if any(gone):
            log.info("retention: deleted %d job history rows, %d events, %d expired web sessions and "
                     "the views of %d hosts not heard from since", *gone)


def project_of(url: str) -> str:
    """The project's path from a job's page (`https://gitlab/group/app/-/jobs/7` -> `group/app`),
    as CI_PROJECT_PATH, which a lease records, names it."""
    path = urlsplit(url).path.strip("/")
    return path.split("/-/", 1)[0] if "/-/" in path else ""
