"""Job run times of a production GPU cluster, for lab traces with a measured tail.

The Philly trace (Microsoft's multi-tenant GPU clusters; Jeon et al., "Analysis of
Large-Scale Multi-Tenant GPU Clusters for DNN Training Workloads", USENIX ATC '19;
github.com/msr-fiddle/philly-traces) holds each job's run time. A list of its 83,154 job
run times in seconds is published beside the Alibaba PAI GPU trace, for comparing the
two: github.com/alibaba/clusterdata at commit 4453045c01f58e2241e963293d2e707a5f64a0f1,
`cluster-trace-gpu-v2020/analysis/philly_runtime.csv` (a `runtime` header, one number a
line). `QUANTILES` are its 0th, 0.5th, ..., 100th percentiles: with the run times sorted
as `v` (n of them), percentile p is `v[i] + (v[i + 1] - v[i]) * f` where `i + f = p / 100
* (n - 1)`, rounded to whole seconds; so a draw from them follows that distribution to
within half a percentile.

What it says: median 1,186 s (20 minutes); 10 % of jobs end within 61 s (failures at
start-up); p90 3.6 h, p99 3.3 days, the longest 54 days; the longest tenth of the jobs
hold 89 % of the run time. Fitted as a lognormal over the jobs of at least a minute:
median 1,305 s, sigma 2.0, heavier than `labtrace`'s chosen 1.5-1.8.
"""

from __future__ import annotations

import math
import random

QUANTILES: tuple[int, ...] = (
    0, 12, 17, 20, 25, 31, 38, 42, 44, 46, 48, 49, 51, 53, 55, 56, 57, 58, 59, 60, 61, 62, 63,
    63, 64, 65, 65, 66, 67, 67, 68, 69, 69, 70, 71, 71, 72, 73, 74, 75, 76, 77, 79, 81, 84, 89,
    95, 102, 110, 119, 131, 139, 151, 160, 170, 178, 186, 197, 207, 215, 229, 249, 265, 284,
    302, 313, 325, 340, 356, 387, 428, 459, 486, 510, 528, 545, 558, 573, 589, 607, 630, 651,
    675, 699, 726, 752, 785, 818, 845, 870, 889, 906, 930, 956, 986, 1019, 1053, 1087, 1121,
    1156, 1186, 1216, 1252, 1291, 1330, 1373, 1412, 1439, 1461, 1481, 1500, 1522, 1547, 1574,
    1604, 1644, 1699, 1751, 1801, 1840, 1871, 1907, 1941, 1971, 2004, 2033, 2059, 2091, 2127,
    2173, 2242, 2307, 2354, 2395, 2433, 2461, 2490, 2519, 2545, 2568, 2590, 2619, 2647, 2676,
    2710, 2746, 2783, 2839, 2949, 3139, 3342, 3432, 3536, 3643, 3802, 3939, 4018, 4093, 4262,
    4461, 4699, 5002, 5160, 5305, 5453, 5588, 5710, 5829, 5928, 6069, 6300, 6860, 7766, 8318,
    8816, 9151, 9710, 10509, 11086, 12021, 12859, 13691, 15081, 16529, 18842, 21051, 23848,
    27428, 31999, 40449, 49948, 58481, 69287, 85606, 101863, 127174, 167784, 201023, 287283,
    484497, 4628239,
)
"""Percentiles 0, 0.5, ..., 100 of the Philly trace's job run times, in seconds."""
MEDIAN_S = QUANTILES[100]


def philly_duration(rng: random.Random, median_s: float = MEDIAN_S) -> float:
    """A run time drawn from the Philly distribution, scaled so that its median is
    `median_s` (a user's own typical job) while its shape, the spread and the tail,
    stays the trace's: one uniform draw, log-linear between neighbouring percentiles
    (linear from 0 s at the bottom)."""
    position = rng.random() * (len(QUANTILES) - 1)
    low = min(int(position), len(QUANTILES) - 2)
    lo, hi = QUANTILES[low], QUANTILES[low + 1]
    frac = position - low
    if lo <= 0:
        value = hi * frac
    else:
        value = math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * frac)
    return value * median_s / MEDIAN_S
