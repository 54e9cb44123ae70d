"""Prometheus metrics for runnerctl: custom collectors over the controller's last tick.

Nothing here is created at import time and nothing touches the global registry:
`build_registry(source)` makes a fresh `CollectorRegistry` holding one
`RunnerctlCollector`, which on every scrape reads `source()` (the controller's frozen
`StatsView`, replaced once per tick) and never calls NVML or GitLab. One collector per
file: `gpus`, `runners`, `demand`, `reconcile`; `scrape` runs them and reports each
one's success. `dcgm` writes dcgm-exporter's job mapping files; `standalone` is the
observe-only `runnerctl exporter`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from runnerctl.controller.liveness import Liveness
from runnerctl.exporter.scrape import ALL_PARTS, Part, RunnerctlCollector, Source

__all__ = ["CONTENT_TYPE", "build_registry", "endpoint", "metrics_text"]
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The classic text exposition format, which every Prometheus 2.x parses."""


def build_registry(source: Source, parts: Mapping[str, Part] | None = None, *,
                   liveness: Liveness | None = None,
                   standing_by: Callable[[], bool] | None = None) -> CollectorRegistry:
    """`standing_by`: only `runnerctl exporter`'s, True while it stands by for a serve."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunnerctlCollector(source, ALL_PARTS if parts is None else parts, liveness,
                                         standing_by))
    return registry


def metrics_text(source: Source) -> bytes:
    """One scrape in the text exposition format (what `/metrics` answers)."""
    return generate_latest(build_registry(source))


def endpoint(source: Source, *, liveness: Liveness | None = None) -> Callable[[], tuple[bytes, str]]:
    """What `/metrics` of `runnerctl serve` calls per request: (body, content type)."""
    registry = build_registry(source, liveness=liveness)
    return lambda: (generate_latest(registry), CONTENT_TYPE)
