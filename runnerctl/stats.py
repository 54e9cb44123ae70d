"""Summary statistics shared by the report and the simulator's metrics."""

from __future__ import annotations

from collections.abc import Iterable


def quantile(values: Iterable[float], q: float) -> float:
    """The nearest-rank `q` quantile (0-1) of at least one value: the value at rank
    `int(q * n)` of the sorted values, the largest for `q` near 1 (p95 of 20 runs is the
    19th, of 10 the 10th)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("quantile of no values")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
