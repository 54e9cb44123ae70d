"""The one collector a registry holds: runs every part over one `StatsView` and says how it went.

Each part (`gpus`, `runners`, `demand`, `reconcile`) gets the same view, so a scrape
never mixes two ticks. A part that fails is logged and reported as
`runnerctl_exporter_scrape_success{collector="...", Hostname="..."} 0`; the other parts still answer
(node_exporter's `node_scrape_collector_success` pattern). Before the first tick only
the success metrics are served, and, under `serve`, the loop's liveness (the age of
its last good tick, measured at scrape time, so a stalled loop shows as a growing age
though its last `StatsView` stays as it was). The success and duration series carry the
host's `Hostname` like every other series (from the loop's liveness, which exists before
the first tick), so a panel or alert picks a host's collectors without a join on a
series that a failing host may not serve.

`runnerctl exporter` beside a running `serve` stands by (exporter/standalone.py): its
collectors have nothing to export on purpose, so it serves no success or duration for
them (0 said "failing" and raised `RunnerctlExporterCollectorFailed` for as long as
serve ran) and `runnerctl_exporter_standing_by{Hostname="..."} 1` instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from runnerctl.controller.liveness import Liveness
from runnerctl.controller.stats import StatsView
from runnerctl.exporter import demand, gpus, reconcile, runners

log = logging.getLogger(__name__)
Source = Callable[[], StatsView | None]
Part = Callable[[StatsView], Iterable[Metric]]

ALL_PARTS: dict[str, Part] = {
    "gpus": gpus.collect,
    "runners": runners.collect,
    "demand": demand.collect,
    "reconcile": reconcile.collect,
}


class RunnerctlCollector(Collector):
    def __init__(self, source: Source, parts: Mapping[str, Part], liveness: Liveness | None = None,
                 standing_by: Callable[[], bool] | None = None) -> None:
        """`standing_by` (only `runnerctl exporter` has one): True while it stands by for a
        serve on its host, when its collectors export nothing on purpose."""
        self.source = source
        self.parts = dict(parts)
        self.liveness = liveness
        self.standing_by = standing_by
        self._failing: set[str] = set()  # collectors failing now: logged once until they work

    def collect(self) -> Iterator[Metric]:
        stats = self.source()
        live = self.liveness
        host = live.host if live is not None else stats.view.host if stats is not None else ""
        idle = self.standing_by is not None and self.standing_by()
        if self.standing_by is not None:
            standby = GaugeMetricFamily("runnerctl_exporter_standing_by",
                                        "1 while runnerctl exporter stands by because runnerctl serve "
                                        "runs on this host and exports its GPUs (no collector runs), "
                                        "else 0.",
                                        labels=["Hostname"])
            standby.add_metric([host], 1.0 if idle else 0.0)
            yield standby
        if not idle:  # standing by, there is nothing to export on purpose: no success 0 (a failure)
            yield from self._parts(stats, host)
        if self.liveness is not None:
            yield from reconcile.liveness(self.liveness)

    def _parts(self, stats: StatsView | None, host: str) -> Iterator[Metric]:
        """Each part's metrics, then its success and duration in this scrape."""
        success = GaugeMetricFamily("runnerctl_exporter_scrape_success",
                                    "1 if the collector produced its metrics in this scrape, else 0 "
                                    "(also 0 before the controller's first tick).",
                                    labels=["Hostname", "collector"])
        duration = GaugeMetricFamily("runnerctl_exporter_scrape_duration_seconds",
                                     "Wall time each collector took in this scrape.",
                                     labels=["Hostname", "collector"])
        for name, part in self.parts.items():
            started = time.perf_counter()
            ok = stats is not None
            if stats is not None:
                try:
                    found = list(part(stats))
                except (ArithmeticError, AttributeError, LookupError, TypeError, ValueError):
                    if name not in self._failing:  # once while it fails, not at every scrape
                        log.exception("collector %s failed; its metrics are left out of every scrape while "
                                      "it fails (runnerctl_exporter_scrape_success), logged once", name)
                    self._failing.add(name)
                    ok = False
                else:
                    if name in self._failing:
                        log.warning("collector %s works again", name)
                    self._failing.discard(name)
                    yield from found
            success.add_metric([host, name], 1.0 if ok else 0.0)
            duration.add_metric([host, name], time.perf_counter() - started)
        yield success
        yield duration
