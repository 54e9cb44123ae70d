"""Lab-like traces for the simulator: a few people sharing GPU servers on a busy day.

`synthetic` (trace.py) offers uniform 1-10 minute jobs above capacity, which tests
starvation but not what makes drains expensive in a lab. Here, as in production
ML-cluster traces, durations are heavy-tailed: lognormal with a large sigma per user
(Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training
Workloads", USENIX ATC '19, the Philly trace: run times spread over minutes to days;
Hu et al., "Characterization and Prediction of Deep Learning Workloads in Large-Scale
GPU Datacenters", SC '21, the Helios traces: the same shape, most GPU time in few long
jobs). The public search tools gave the papers' descriptions, not fitted parameters,
so the parameters below are chosen, not derived: sigma 1.5 (the issue's floor) to
1.8, medians from 5 minutes to 1.5 hours by user.

- Users with their own mix of 1/2/4/8-GPU jobs and median duration; a sweep user
  submits bursts of ~50 1-GPU jobs at once (an Optuna sweep's pipeline).
- A `timeout` per job: the user's habit (`timeout_x` times their median, as one sets
  a project's timeout to a few times the usual run, within GitLab's 10 minutes to 3
  days); a job that would run longer is killed by GitLab at its timeout, so a
  duration never exceeds its timeout. Durations are also clipped to 1 minute..3 days.
- Foreign use: colleagues' processes on random GPUs, lognormal 10 minutes to hours.
- Offered load below 1 on average (default 0.85): the trace spans the time that makes
  the offered GPU-time `load` times the cluster's, so makespan measures how well a
  policy packs rather than how long the queue is.
- When sessions arrive within that span: flat (uniformly, the default) or, with
  `diurnal=True`, on a lab's daily cycle: submissions follow the working day (busy in
  working hours, quiet at night and at weekends), as the Philly and Helios analyses
  above are cited for; the search tools returned only those papers' abstracts and
  landing pages, no hourly figures, so the shape here is chosen, not fitted: a week
  starting Monday 08:00 (the trace's time 0), sessions arriving
  `QUIET` times as often outside 09:00-19:00 on weekdays as inside. About 88 % of a
  weekday's sessions then come in its 10 working hours, so with an average `load` of
  0.85 the offered load in working hours is about 1.8: queues build up by day and
  drain at night. (Measured: greedy's 8-GPU jobs then wait no longer than other
  policies', as everyone waits for the night; docs/controller.md.)
- Durations with a measured tail: `durations="philly"` draws each job's run time from
  the Philly trace's distribution of job run times (`runnerctl.sim.philly`: sigma about
  2.0, the longest tenth of the jobs holding 89 % of the run time), scaled to the user's
  median, from a random stream of its own: the jobs, users, sizes, bursts and timeouts
  are those of the lognormal trace with the same seed, and arrivals spread over the span
  their work needs at the same load. Scaled to medians of 5 to 90 minutes, with the
  1-minute floor and each user's timeout, 21-28 % of the jobs run a minute and 10-15 %
  end at their timeout (the benchmark's traces): the trace's multi-day tail is cut
  there, as GitLab would cut it.
"""

from __future__ import annotations

import dataclasses
import math
import random

from runnerctl.sim.inputs import ForeignUse, TraceJob
from runnerctl.sim.philly import philly_duration

MIN_S, MAX_S = 60.0, 3 * 86400.0  # durations clipped to 1 minute .. 3 days
TIMEOUT_MIN_S, TIMEOUT_MAX_S = 600.0, 3 * 86400.0  # GitLab's bounds on a job timeout
WORK_HOURS = (9, 19)  # the working day (diurnal traces), hours of a weekday
QUIET = 0.1  # arrival rate outside working hours and at weekends, relative to inside
START_HOUR = 8  # the trace's time 0: a Monday, 08:00
DURATIONS = ("lognormal", "philly")  # where run times come from (`lab_trace`)


@dataclasses.dataclass(frozen=True)
class LabUser:
    name: str
    sizes: tuple[tuple[int, float], ...]  # (GPUs, weight)
    median_s: float
    sigma: float
    burst: int = 1  # jobs submitted at once per session
    share: float = 1.0  # relative number of sessions
    timeout_x: float = 8.0  # their habit: timeout = this x their median


USERS = (
    LabUser("sweeper", ((1, 1.0),), median_s=300.0, sigma=1.5, burst=50, share=0.05, timeout_x=12.0),
    LabUser("student", ((1, 0.7), (2, 0.3)), median_s=600.0, sigma=1.6, share=1.0),
    LabUser("postdoc", ((1, 0.3), (2, 0.3), (4, 0.4)), median_s=1200.0, sigma=1.5, share=0.6),
    LabUser("engineer", ((4, 0.5), (8, 0.5)), median_s=2400.0, sigma=1.5, share=0.3, timeout_x=6.0),
    LabUser("bigmodel", ((8, 1.0),), median_s=5400.0, sigma=1.8, share=0.12, timeout_x=5.0),
)


def lab_trace(n: int, *, hosts: int = 1, gpus: int = 8, load: float = 0.85, seed: int = 0,
              foreign_per_host: int = 4, diurnal: bool = False, durations: str = "lognormal",
              users: tuple[LabUser, ...] = USERS) -> tuple[list[TraceJob], list[ForeignUse]]:
    """About `n` jobs (whole bursts) from `users` on `hosts` x `gpus` GPUs, offered at
    `load` times the cluster's GPU-time over the trace's span, and foreign uses;
    sessions arrive uniformly over the span, or on a daily cycle if `diurnal`; run times
    lognormal with each user's sigma, or from the Philly trace (`durations="philly"`).
    Each job is named `train-{size}gpu`, so a user's jobs of one size share a run-time
    history (`controller.estimates`)."""
    if not 0 < load <= 10 or n < 1 or hosts < 1 or gpus < 1:
        raise ValueError("lab_trace needs n, hosts, gpus >= 1 and 0 < load <= 10")
    if durations not in DURATIONS:
        raise ValueError(f"lab_trace durations: {' or '.join(DURATIONS)}, not {durations!r}")
    rng = random.Random(seed)
    philly = random.Random(f"philly-{seed}") if durations == "philly" else None
    weights = [u.share for u in users]
    sessions: list[tuple[LabUser, list[tuple[int, float, float]]]] = []
    work = 0.0
    count = 0
    while count < n:
        user = rng.choices(users, weights)[0]
        batch = []
        timeout = min(max(user.median_s * user.timeout_x, TIMEOUT_MIN_S), TIMEOUT_MAX_S)
        sizes, size_weights = zip(*user.sizes, strict=True)
        for _ in range(user.burst):
            size = min(rng.choices(sizes, size_weights)[0], gpus)
            duration = rng.lognormvariate(math.log(user.median_s), user.sigma)
            if philly is not None:  # drawn beside the lognormal one: the same jobs otherwise
                duration = philly_duration(philly, user.median_s)
            duration = min(max(duration, MIN_S), MAX_S, timeout)  # killed at its timeout
            batch.append((size, round(duration, 3), timeout))
            work += size * duration
        sessions.append((user, batch))
        count += len(batch)
    span = work / (hosts * gpus * load)
    jobs: list[TraceJob] = []
    starts = sorted(_arrivals(rng, len(sessions), span) if diurnal
                    else (rng.uniform(0, span) for _ in sessions))
    for at, (user, batch) in zip(starts, sessions, strict=True):
        for k, (size, duration, timeout) in enumerate(batch):
            jobs.append(TraceJob(len(jobs) + 1, round(at + k, 3), size, duration, project=user.name,
                                 user=user.name, timeout=timeout, name=f"train-{size}gpu"))
    foreign = [ForeignUse(round(rng.uniform(0, span), 3),
                          round(min(rng.lognormvariate(math.log(1800.0), 1.0), 6 * 3600.0), 3),
                          h, rng.randrange(gpus))
               for h in range(hosts) for _ in range(foreign_per_host)]
    return jobs, foreign


def arrival_rate(hour: int) -> float:
    """The relative arrival rate in the trace's `hour`-th hour (diurnal traces)."""
    clock = hour + START_HOUR
    weekday = clock // 24 % 7 < 5
    return 1.0 if weekday and WORK_HOURS[0] <= clock % 24 < WORK_HOURS[1] else QUIET


def _arrivals(rng: random.Random, count: int, span: float) -> list[float]:
    """`count` times in [0, span) drawn from the daily cycle's piecewise-constant rate."""
    hours = math.ceil(span / 3600.0)
    weights = [arrival_rate(h) * (min(span, 3600.0 * (h + 1)) - 3600.0 * h) for h in range(hours)]
    picked = rng.choices(range(hours), weights, k=count)
    return [min(3600.0 * (h + rng.random()), span) for h in picked]
