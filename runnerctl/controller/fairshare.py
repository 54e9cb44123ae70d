"""Fair share between users and projects: how many seconds younger a pending job counts.

Why: one student submitting 200 jobs must not lock everyone else out for a day. The
planner orders jobs by priority, then age (`plan.Demand`); this module turns recent GPU
use into a bounded handicap on age, `Demand.fair_s`, so a heavy user's job counts up to
`weight_s` younger than a light user's job of the same age and priority. Bounded: after
waiting `weight_s` longer, a heavy user's job wins again, so no job starves.

The factor is Slurm's classic fair-share factor (slurm.schedmd.com classic_fair_share
page, priority/multifactor with PriorityFlags=NO_FAIR_TREE): F = 2^(-U/S), U the
usage's fraction of all usage (decayed with a half-life, as Slurm's
PriorityDecayHalfLife), S the share's fraction of all shares of those that count. F is 1
without use, 1/2 at exactly one's share, towards 0 far above it. It is computed for the
job's user and for its project; the penalty is `weight_s * (1 - (F_user + F_project) / 2)`,
in [0, weight_s).

Usage counts a new user's flood only as its jobs run, so the queue share counts the work
a user and project have now as well (`queue_share_s`: GPUs running plus GPUs of their
pending jobs ahead, `queue_step_s` each), and `fair_seconds` combines both under
`weight_s` for every pending job.

Pure: no I/O and no clock; the controller (from its job history and GitLab's pending
jobs) and the simulator (from the jobs it started and its queue) hand in spans of use,
the jobs running and pending, and the time now.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

DAY_S = 86400.0
QUEUE_STEP_S = 300.0


@dataclasses.dataclass(frozen=True)
class FairPolicy:
    """The fair-share tunables ([controller] fair_half_life_h, fair_weight_h, *_shares)."""

    weight_s: float = 0.0
    """The most seconds younger a job counts (0: fair share off)."""
    half_life_s: float = 7 * DAY_S
    """Use this long ago counts half."""
    user_shares: Mapping[str, float] = dataclasses.field(default_factory=dict)
    project_shares: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Shares by user login / project path; unnamed ones have 1 (equal by default)."""
    queue_step_s: float = QUEUE_STEP_S
    """Queue share: seconds younger per GPU that the job's user (and project) holds in
    running jobs and asks for in pending jobs ahead of it (`queue_share_s`)."""

    @property
    def on(self) -> bool:
        return self.weight_s > 0


@dataclasses.dataclass(frozen=True)
class Span:
    """GPUs one job held from `start` to `end` (None: still running)."""

    user: str
    project: str
    gpus: int
    start: float
    end: float | None = None


def decayed_gpu_s(gpus: int, start: float, end: float, now: float, half_life_s: float) -> float:
    """GPU-seconds used from `start` to `end`, each second weighted 2^-(age/half-life) at
    `now` (the exact integral, so the result does not depend on how often it is read)."""
    end, start = min(end, now), min(start, now)
    if end <= start:
        return 0.0
    rate = math.log(2) / half_life_s
    return gpus * (math.exp(-rate * (now - end)) - math.exp(-rate * (now - start))) / rate


class Usage:
    """Decayed GPU-seconds per user and per project, as of `at`; add spans as they run.

    Incremental (the simulator adds what ran since its last read); `decay_to` moves the
    reference time forward, which scales every value by the same factor."""

    def __init__(self, half_life_s: float) -> None:
        if half_life_s <= 0:
            raise ValueError(f"fair-share half-life must be > 0, got {half_life_s}")
        self.half_life_s = half_life_s
        self.at = 0.0
        self.users: dict[str, float] = {}
        self.projects: dict[str, float] = {}

    def decay_to(self, now: float) -> None:
        if now > self.at:
            scale = 2.0 ** (-(now - self.at) / self.half_life_s)
            for table in (self.users, self.projects):
                for key in table:
                    table[key] *= scale
            self.at = now

    def add(self, span: Span, *, since: float | None = None) -> None:
        """Add the span's use from `since` (default its start) up to `at`."""
        start = span.start if since is None else max(span.start, since)
        used = decayed_gpu_s(span.gpus, start, self.at if span.end is None else span.end,
                             self.at, self.half_life_s)
        if used > 0:
            self.users[span.user] = self.users.get(span.user, 0.0) + used
            self.projects[span.project] = self.projects.get(span.project, 0.0) + used

    @classmethod
    def of(cls, spans: Iterable[Span], now: float, half_life_s: float) -> Usage:
        usage = cls(half_life_s)
        usage.at = now
        for span in spans:
            usage.add(span)
        return usage


def factor(used: Mapping[str, float], key: str, shares: Mapping[str, float],
           present: Iterable[str]) -> float:
    """Slurm's classic F = 2^(-U/S) for `key` among those `present` (with use or waiting)."""
    total_used = sum(used.values())
    if total_used <= 0:
        return 1.0
    keys = set(present) | set(used) | {key}
    share = shares.get(key, 1.0)
    total_share = sum(shares.get(k, 1.0) for k in keys)
    if share <= 0:
        return 0.0
    return float(2.0 ** (-(used.get(key, 0.0) / total_used) / (share / total_share)))


class Penalties:
    """`penalty_s(user, project)` for one reading of usage: the seconds a job counts younger."""

    def __init__(self, usage: Usage, policy: FairPolicy, *, users: Iterable[str] = (),
                 projects: Iterable[str] = ()) -> None:
        self.usage, self.policy = usage, policy
        self.users, self.projects = set(users), set(projects)
        self._cache: dict[tuple[str, str], float] = {}

    def penalty_s(self, user: str, project: str) -> float:
        found = self._cache.get((user, project))
        if found is None:
            if not self.policy.on:
                found = 0.0
            else:
                fu = factor(self.usage.users, user, self.policy.user_shares, self.users)
                fp = factor(self.usage.projects, project, self.policy.project_shares, self.projects)
                found = self.policy.weight_s * (1.0 - (fu + fp) / 2.0)
            self._cache[(user, project)] = found
        return found


@dataclasses.dataclass(frozen=True)
class Queued:
    """A pending or running job as the queue share counts it."""

    job_id: int
    user: str
    project: str
    gpus: int
    created_at: float = 0.0


def queue_share_s(pending: Iterable[Queued], running: Iterable[Queued], step_s: float) -> dict[int, float]:
    """Job id -> seconds a pending job counts younger for the work its user and project
    have now: `step_s` x the mean, over its user and its project, of the GPUs they hold in
    running jobs plus those they ask for in pending jobs ahead of it (created earlier;
    ties by id). So a user's k-th pending 1-GPU job counts about k steps younger: the
    jobs of users who wait with few interleave with a flood's (round robin by GPUs).
    Usage (`Penalties`) builds up only as jobs run; this counts them from submission, as
    Slurm's fair-share counts a running job's use as it accrues and GitLab's instance
    runners count each project's running builds (module `runnerctl.sim.fair`).

    Within one user the order stays age order, and a job's value changes only when one
    of its user's or project's jobs ends, leaves the queue unstarted, or starts ahead of
    an older one of theirs. A job both running and pending (the controller's list of
    pending jobs is a poll older than the host's lease) counts once, as running."""
    by_user: dict[str, int] = {}
    by_project: dict[str, int] = {}
    held: set[int] = set()
    for job in running:
        held.add(job.job_id)
        by_user[job.user] = by_user.get(job.user, 0) + job.gpus
        by_project[job.project] = by_project.get(job.project, 0) + job.gpus
    found: dict[int, float] = {}
    for job in sorted(pending, key=lambda j: (j.created_at, j.job_id)):
        user, project = by_user.get(job.user, 0), by_project.get(job.project, 0)
        found[job.job_id] = step_s * (user + project) / 2.0
        if job.job_id not in held:  # one that started is still pending in an older poll: once
            by_user[job.user] = user + job.gpus
            by_project[job.project] = project + job.gpus
    return found


def fair_seconds(penalties: Penalties, pending: Sequence[Queued],
                 running: Iterable[Queued]) -> dict[int, float]:
    """Job id -> `Demand.fair_s` for each pending job: `weight_s - (weight_s - usage) *
    e^(-queue / weight_s)`, from its user's and project's usage penalty (`Penalties`) and
    its queue share (`queue_share_s`). About `usage + queue` while both are small; always
    under `weight_s` (no job waits more than that for fair share), and still larger for
    more usage or more queue when both are large (a plain sum capped at `weight_s` would
    give every busy user the cap, and age order again). Empty when fair share is off.
    The controller (pending jobs from GitLab, running ones from the job history) and the
    simulator both call this."""
    policy = penalties.policy
    if not policy.on:
        return {}
    weight = policy.weight_s
    queue = queue_share_s(pending, running, policy.queue_step_s)
    return {job.job_id: weight - (weight - penalties.penalty_s(job.user, job.project))
            * math.exp(-queue[job.job_id] / weight) for job in pending}
