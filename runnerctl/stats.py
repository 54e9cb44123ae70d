"""Summary statistics shared by the report and the simulator's metrics."""

from __future__ import annotations

from collections.abc import Iterable


def quantile(values: Iterable[float], q: float) -> float:
    """The nearest-rank `q` quantile (0-1) of at least one value: the sorted values'
    element at index `int(q * n)` (from 0), the largest where that is past the end (p95
    of 20 or 10 values is the largest, of 40 the 39th)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("quantile of no values")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
