"""What `runnerctl simulate --json` prints: makespan against its lower bound, occupancy,
waits by job size, the invariant counters (double allocations, foreign collisions), and
the jobs GitLab's own rules failed (`jobs_dropped` by failure reason, and by job size),
and fairness: per user GPU-hours, waits and mean bounded slowdown, and Jain's index
over the users' mean slowdowns (1: all slowed alike; 1/n: one user takes the wait).

A job counts for the time it runs (`Simulator.run_time`: its duration, but at most its
timeout), in the lower bound as in GPU-hours and slowdowns, as the makespan does.
`jobs_completed` counts every job that ended, those GitLab failed at their timeout
included: `jobs_timed_out` says how many of them ran out of time (a trace timeout or a
runner's maximum timeout under the duration), `timed_out_gpu_hours_cut` how much of
their work was cut off, so a tighter cap shows its cost beside its shorter waits.
Per user, `timed_out` and `dropped` count the same; a user all of whose jobs were
dropped shows with `jobs` 0 and no waits, and is not in Jain's index (nothing ran)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Container, Mapping
from typing import TYPE_CHECKING

from runnerctl.stats import quantile

if TYPE_CHECKING:
    from runnerctl.sim.inputs import TraceJob
    from runnerctl.sim.simulator import Simulator


def metrics(sim: Simulator) -> dict[str, object]:
    jobs = list(sim.jobs.values())
    gpus = sim.config.hosts * sim.config.gpus_per_host
    first = min((j.submit for j in jobs), default=0.0)
    end = max(sim.finished.values(), default=first)
    makespan = end - first
    run = {j.job_id: sim.run_time(j.job_id) for j in jobs}
    lower = max(sum(j.gpus * run[j.job_id] for j in jobs) / gpus,
                max((j.submit + run[j.job_id] for j in jobs), default=0.0) - first)
    reasons: dict[str, int] = {}
    sizes: dict[int, int] = {}
    for job_id, (_, reason) in sim.dropped.items():
        reasons[reason] = reasons.get(reason, 0) + 1
        sizes[sim.jobs[job_id].gpus] = sizes.get(sim.jobs[job_id].gpus, 0) + 1
    waits: dict[int, list[float]] = {}
    for job in jobs:
        if job.job_id in sim.started:
            waits.setdefault(job.gpus, []).append(sim.started[job.job_id] - job.submit)
    cut = [j for j in jobs if j.job_id in sim.finished and run[j.job_id] < j.duration]
    return {
        "policy": sim.config.policy, "makespan_s": round(makespan, 3),
        "lower_bound_s": round(lower, 3),
        "gpu_occupancy": round(sim.busy_gpu_s / (gpus * makespan), 4) if makespan else 0.0,
        "wait_p50_s": {n: round(statistics.median(w), 3) for n, w in sorted(waits.items())},
        "wait_p95_s": {n: round(quantile(w, 0.95), 3) for n, w in sorted(waits.items())},
        "wait_max_s": {n: round(max(w), 3) for n, w in sorted(waits.items())},
        "jobs_completed": len(sim.finished), "jobs_never_started": len(jobs) - len(sim.started),
        "jobs_dropped": dict(sorted(reasons.items())), "jobs_dropped_by_gpus": dict(sorted(sizes.items())),
        "jobs_timed_out": len(cut),
        "timed_out_gpu_hours_cut": round(sum(j.gpus * (j.duration - run[j.job_id]) for j in cut) / 3600, 3),
        "jobs_killed_at_deadline": sim.killed_at_deadline,
        "double_allocations": sim.double_allocations,
        "foreign_collisions": sim.foreign_collisions, "gitlab_api_calls": sim.gitlab_api_calls,
        **fairness(jobs, sim.started, sim.run_time, dropped=sim.dropped),
    }


SLOWDOWN_FLOOR_S = 60.0
"""Bounded slowdown (Feitelson et al., "Theory and practice in parallel job scheduling",
1997): (wait + run) / max(run, this), at least 1, so a 1-second job waiting a minute is
not 60x slowed."""


def fairness(jobs: list[TraceJob], started: Mapping[int, float], run_time: Callable[[int], float], *,
             dropped: Container[int] = ()) -> dict[str, object]:
    """Per user (the trace's `user`, else its project): jobs started, GPU-hours, jobs that
    ran out of time, jobs GitLab dropped (`dropped`: their ids), and where a job started
    wait p50 and p95 and mean bounded slowdown; `jain_slowdown` over the users' mean
    slowdowns. `run_time`: how long a job ran (job id -> seconds)."""
    per: dict[str, tuple[list[float], list[float], list[float]]] = {}
    lost: dict[str, list[int]] = {}  # user -> [timed out, dropped]
    for job in jobs:
        counts = lost.setdefault(job.owner, [0, 0])
        counts[1] += job.job_id in dropped
        waits, slowdowns, hours = per.setdefault(job.owner, ([], [], []))
        if job.job_id in started:
            wait = started[job.job_id] - job.submit
            waits.append(wait)
            ran = run_time(job.job_id)
            counts[0] += ran < job.duration
            slowdowns.append(max(1.0, (wait + ran) / max(ran, SLOWDOWN_FLOOR_S)))
            hours.append(job.gpus * ran / 3600)
    users: dict[str, dict[str, float | int]] = {}
    for user, (waits, slowdowns, hours) in sorted(per.items()):
        timed_out, gone = lost[user]
        if not waits and not gone:  # none ran and none was dropped (never started): as before
            continue
        users[user] = {"jobs": len(waits), "gpu_hours": round(sum(hours), 3), "timed_out": timed_out,
                       "dropped": gone}
        if waits:
            users[user].update(wait_p50_s=round(statistics.median(waits), 3),
                               wait_p95_s=round(quantile(waits, 0.95), 3),
                               mean_slowdown=round(statistics.fmean(slowdowns), 3))
    means = [float(u["mean_slowdown"]) for u in users.values() if "mean_slowdown" in u]
    jain = sum(means) ** 2 / (len(means) * sum(m * m for m in means)) if means else 1.0
    return {"users": users, "jain_slowdown": round(jain, 4)}
