"""Demand metrics: pending GPU jobs by GPUs asked, the oldest one's age, and waits.

`gpus` (1, 2, 4, 8, ...) is the only label: job ids, projects and users stay out.
Every host sees the same GitLab queue, so a fleet's count of the shared pending jobs is
the max over hosts, not the sum; jobs a `host:` tag pins are seen by their host alone,
and `runnerctl_pending_jobs_pinned` counts them apart so a fleet total can add them.
Pending counts are exported for every block size of the host, 0 included, so a panel
shows "no demand" rather than "no data". Waits are timed by the controller from a job's
creation in GitLab to the first tick that sees it running on this host (see
`runnerctl.controller.stats`).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

from runnerctl.controller.stats import WAIT_BUCKETS_S, Histogram, StatsView


def collect(stats: StatsView) -> Iterator[Metric]:
    view = stats.view
    sizes = sorted({len(s.gpus) for s in view.slots})  # a job of another size has no runner here
    mine = [j for j in view.demand if j.takes(view.host) and j.gpus in sizes]
    pending = GaugeMetricFamily("runnerctl_pending_jobs", "GPU jobs pending in GitLab that this host could "
                                "run, by GPUs asked.", labels=["Hostname", "gpus"])
    pinned = GaugeMetricFamily("runnerctl_pending_jobs_pinned", "Of runnerctl_pending_jobs, those a `host:` "
                               "tag pins to this host (no other host counts them: a fleet total is the "
                               "max over hosts of the rest plus the sum of these).",
                               labels=["Hostname", "gpus"])
    oldest = GaugeMetricFamily("runnerctl_pending_job_oldest_age_seconds",
                               "Age of the oldest pending job asking for this many GPUs (absent when none).",
                               labels=["Hostname", "gpus"])
    for size in sizes:
        jobs = [j for j in mine if j.gpus == size]
        pending.add_metric([view.host, str(size)], len(jobs))
        pinned.add_metric([view.host, str(size)], sum(j.host == view.host for j in jobs))
        since = [j.pending_since for j in jobs if j.pending_since > 0]  # queued, not created (later stages)
        if since:
            oldest.add_metric([view.host, str(size)], max(0.0, view.at - min(since)))
    yield pending
    yield pinned
    yield oldest
    waits = HistogramMetricFamily("runnerctl_job_wait_seconds", "Time from a job's queueing to its start "
                                  "on this host, by GPUs asked.", labels=["Hostname", "gpus"])
    empty = Histogram(WAIT_BUCKETS_S, (0,) * (len(WAIT_BUCKETS_S) + 1))
    run_here = {len(slot.gpus) for slot in view.slots} | set(stats.job_waits)
    for size in sorted(run_here):  # each size this host runs from 0: rate() misses a series' first step
        hist = stats.job_waits.get(size, empty)
        waits.add_metric([view.host, str(size)], bucket_samples(hist.bounds, hist.counts), hist.sum)
    yield waits


def bucket_samples(bounds: tuple[float, ...], counts: tuple[int, ...]) -> list[tuple[str, float]]:
    return [*((repr(b), float(c)) for b, c in zip(bounds, counts, strict=False)), ("+Inf", float(counts[-1]))]
