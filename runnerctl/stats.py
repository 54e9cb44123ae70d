"""Summary statistics shared by the report and the simulator's metrics."""

from __future__ import annotations

from collections.abc import Iterable


def quantile(values: Iterable[float], q: float) -> float:
    """The `q` quantile (0-1) of at least one value: the sorted values' element at index
    `int(q * n)` (from 0), the largest where that is past the end (p95 of 20 or 10 values
    is the largest, of 40 the 39th). Where `q * n` is whole this is one rank above the
    textbook nearest rank (`ceil(q * n)`-th value), so a p95 errs high, never low; every
    figure runnerctl prints (report, simulate, benchmarks) uses this one rule."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("quantile of no values")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
