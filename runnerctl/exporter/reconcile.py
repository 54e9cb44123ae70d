"""Controller metrics: identity, ticks and their duration, GitLab requests, gate decisions,
and (`liveness`) the age of the last good tick and failed ticks.

`runnerctl_occupancy_since_timestamp_seconds` and `runnerctl_last_reconcile_timestamp_seconds`
are on the controller's clock, so `sum(runnerctl_gpu_occupancy_seconds_total)` equals the
GPU count times their difference.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)

from runnerctl import __version__
from runnerctl.controller.liveness import Liveness
from runnerctl.controller.stats import StatsView
from runnerctl.exporter.demand import bucket_samples

GATE_DECISIONS = {"close": "gate-close", "open": "gate-open", "reopen": "reopen"}


def collect(stats: StatsView) -> Iterator[Metric]:
    view = stats.view
    host = [view.host]
    info = InfoMetricFamily("runnerctl_controller", "The controller: host, version and GPU source.",
                            labels=["Hostname"])
    source = view.snapshot.source if view.snapshot else ""
    info.add_metric(host, {"version": __version__, "gpu_source": source})
    yield info
    hist = stats.reconcile
    duration = HistogramMetricFamily("runnerctl_reconcile_duration_seconds",
                                     "Wall time of one reconcile tick (observe, plan, act).",
                                     labels=["Hostname"])
    duration.add_metric(host, bucket_samples(hist.bounds, hist.counts), hist.sum)
    yield duration
    yield _counter("runnerctl_reconcile_ticks", "Reconcile ticks done.", host, stats.ticks)
    yield _gauge("runnerctl_last_reconcile_timestamp_seconds", "When the last tick ran (controller clock).",
                 host, view.at)
    yield _gauge("runnerctl_occupancy_since_timestamp_seconds",
                 "Start of the GPU-seconds counters (the first tick, controller clock).", host,
                 stats.first_at)
    gate = CounterMetricFamily("runnerctl_gate_decisions", "GPU gate decisions: close (foreign use or "
                               "unhealthy), open (clean for the cool-down), reopen (an admin acknowledged "
                               "an unhealthy GPU).", labels=["Hostname", "decision"])
    for decision, kind in GATE_DECISIONS.items():
        gate.add_metric([view.host, decision], stats.events.get(kind, 0))
    yield gate
    if stats.gitlab_requests is None:  # observe-only (`runnerctl exporter`): no GitLab here
        return
    yield _gauge("runnerctl_gitlab_up", "1 if the last tick talked to GitLab without error, else 0.", host,
                 0.0 if view.gitlab_error else 1.0)
    requests = CounterMetricFamily("runnerctl_gitlab_api_requests", "HTTP requests to GitLab's API by "
                                   "status code (`unanswered`: timeout or no connection).",
                                   labels=["Hostname", "status"])
    if stats.gitlab_requests is not None:  # expected statuses from 0: increase() misses a first step
        counts = {status: 0 for status in EXPECTED_STATUSES} | dict(stats.gitlab_requests)
        for status, count in sorted(counts.items()):
            requests.add_metric([view.host, status], count)
    yield requests
    if stats.token_expires_at is not None:
        yield _gauge("runnerctl_gitlab_token_expiry_timestamp_seconds", "When GitLab starts refusing the "
                     "controller's token (the start of its expires_at day, UTC); absent when it never "
                     "expires or GitLab cannot say.", host, stats.token_expires_at)


EXPECTED_STATUSES = ("200", "201", "204", "400", "401", "403", "404", "409", "429", "500", "502", "503",
                     "504", "unanswered")
"""Statuses the controller's GitLab calls answer in practice, served at 0 before the first:
a first 500 or timeout then shows in `rate()`/`increase()` (another status still appears
from its first count, at 1)."""


def liveness(live: Liveness) -> Iterator[Metric]:
    """The loop's own health, at scrape time (also before the first tick)."""
    host = [live.host]
    yield _gauge("runnerctl_reconcile_last_success_age_seconds", "Seconds since the last reconcile tick "
                 "that finished (since start before the first one); grows while ticks fail or stop.",
                 host, live.age_s())
    yield _gauge("runnerctl_reconcile_stale_after_seconds", "Age of the last good tick at which "
                 "/healthz fails (a few reconcile intervals).", host, live.stale_after_s)
    trouble = GaugeMetricFamily("runnerctl_reconcile_trouble_seconds", "How long a part the loop needs "
                                "has failed: gitlab (GitLab answers no or errs), gpus (NVML cannot be "
                                "read), clock (this host's clock is off the shared store's); 0 while it "
                                "works.", labels=["Hostname", "part"])
    for part, seconds in live.trouble_ages().items():
        trouble.add_metric([live.host, part], seconds)
    yield trouble
    failures = CounterMetricFamily("runnerctl_reconcile_failures", "Reconcile ticks that failed, by "
                                   "exception type.", labels=["Hostname", "kind"])
    for kind, count in sorted(live.failures.items()):
        failures.add_metric([live.host, kind], count)
    yield failures


def _counter(name: str, doc: str, host: list[str], value: float) -> Metric:
    family = CounterMetricFamily(name, doc, labels=["Hostname"])
    family.add_metric(host, value)
    return family


def _gauge(name: str, doc: str, host: list[str], value: float) -> Metric:
    family = GaugeMetricFamily(name, doc, labels=["Hostname"])
    family.add_metric(host, value)
    return family
