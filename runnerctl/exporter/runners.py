"""Runner metrics: each slot's state, GitLab's paused flag, its jobs, toggles and drains.

A slot is one runner (`gpu3`, `gpu4-7`): at most 2N-1 per host of N GPUs, so the label
stays bounded. Job ids and user names never become labels.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from runnerctl.controller.stats import StatsView
from runnerctl.model import slot_key

SLOT_LABELS = ["Hostname", "slot", "gpus"]
SLOT_STATES = ("open", "paused", "draining")
ADMIN_ACTIONS = ("pause", "drain")


def collect(stats: StatsView) -> Iterator[Metric]:
    view = stats.view
    state = GaugeMetricFamily(
        "runnerctl_runner_state",
        "The controller's desired state of each runner, as a state set: open (may take jobs), "
        "paused, draining (a block waiting for its GPUs).", labels=[*SLOT_LABELS, "state"])
    paused = GaugeMetricFamily("runnerctl_runner_paused",
                               "1 if the runner is paused in GitLab, 0 if active (absent while unknown).",
                               labels=SLOT_LABELS)
    known = GaugeMetricFamily("runnerctl_runner_state_known",
                              "1 if the runner's paused flag in GitLab is known, 0 if it could not be read "
                              "(runner deleted in GitLab, or GitLab unreachable).", labels=SLOT_LABELS)
    online = GaugeMetricFamily("runnerctl_runner_online",
                               "1 if GitLab shows the runner online (its gitlab-runner polled lately), "
                               "0 if offline (absent while unknown).", labels=SLOT_LABELS)
    jobs = GaugeMetricFamily("runnerctl_runner_running_jobs", "CI jobs running on the runner.",
                             labels=SLOT_LABELS)
    for slot in view.slots:
        labels = [view.host, _key(slot.name), str(len(slot.gpus))]
        for name in SLOT_STATES:
            state.add_metric([*labels, name], 1.0 if slot.state == name else 0.0)
        if slot.paused_in_gitlab is not None:
            paused.add_metric(labels, 1.0 if slot.paused_in_gitlab else 0.0)
        known.add_metric(labels, 0.0 if slot.paused_in_gitlab is None else 1.0)
        if slot.online is not None:
            online.add_metric(labels, 1.0 if slot.online else 0.0)
        jobs.add_metric(labels, len(slot.running_jobs))
    yield from (state, paused, known, online, jobs)
    yield from _toggles(stats)
    drains = CounterMetricFamily("runnerctl_drains", "Drains started: a block held for a pending "
                                 "multi-GPU job while jobs still ran on its GPUs (its singles "
                                 "closed until they end).", labels=["Hostname", "slot"])
    blocks = {slot.name for slot in view.slots if len(slot.gpus) > 1}
    # every block from 0, not from its first drain: increase() and rate() miss the step
    # from a series' absence to 1, so the first drain of a block after a start went unseen
    for name in sorted(blocks | set(stats.drains)):
        drains.add_metric([view.host, _key(name)], stats.drains.get(name, 0))
    yield drains
    reserves = CounterMetricFamily("runnerctl_reserves", "Blocks opened at once on idle GPUs for a "
                                   "pending multi-GPU job (nothing waited: not a drain).",
                                   labels=["Hostname", "slot"])
    for name in sorted(blocks | set(stats.reserves)):
        reserves.add_metric([view.host, _key(name)], stats.reserves.get(name, 0))
    yield reserves


def _toggles(stats: StatsView) -> Iterator[Metric]:
    host = stats.view.host
    sent = CounterMetricFamily("runnerctl_runner_toggles", "Pauses and resumes the controller sent to "
                               "GitLab, by result.", labels=["Hostname", "action", "result"])
    for action in ("pause", "resume"):
        sent.add_metric([host, action, "ok"], stats.events.get(action, 0))
        sent.add_metric([host, action, "failed"], stats.events.get(f"{action}-failed", 0))
    yield sent
    seen = CounterMetricFamily("runnerctl_admin_toggles", "Admin toggles (pause, drain) the controller "
                               "picked up from the store.", labels=["Hostname", "action"])
    active = GaugeMetricFamily("runnerctl_admin_toggles_active", "Admin toggles in force now.",
                               labels=["Hostname", "action"])
    now = Counter(t.action for t, _ in stats.view.toggles)
    for action in ADMIN_ACTIONS:
        seen.add_metric([host, action], stats.admin_toggles.get(action, 0))
        active.add_metric([host, action], now.get(action, 0))
    yield seen
    yield active


def _key(name: str) -> str:
    return slot_key(name)
