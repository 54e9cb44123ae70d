"""Trace files for `runnerctl simulate`, and a synthetic workload generator.

JOBS.csv: `job_id,submit_time,gpus,duration` (seconds), optional `project,priority`,
`user` (who submitted it; the per-user metrics) and `timeout` (the job's GitLab timeout
in seconds, empty for none: what a controller may know of a duration in advance).
FOREIGN.csv: `start,duration,host,gpu`, hosts named gpu-a, gpu-b, ... in order (after
gpu-z: gpu-aa, gpu-ab, ..., as `hosts.host_name` names them).
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

from runnerctl.errors import ConfigError
from runnerctl.sim.simulator import ForeignUse, TraceJob


def read_jobs(path: Path) -> list[TraceJob]:
    rows = _rows(path, ("job_id", "submit_time", "gpus", "duration"))
    try:
        return [TraceJob(int(r["job_id"]), float(r["submit_time"]), int(r["gpus"]),
                         float(r["duration"]), r.get("project") or "p",
                         r.get("priority") or "normal", r.get("user") or "",
                         _timeout(r.get("timeout"), f"{path}: line {line}"))
                for line, r in enumerate(rows, start=2)]
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _timeout(text: str | None, where: str) -> float | None:
    """The optional `timeout` column: empty, or seconds above zero (GitLab's minimum is
    10 minutes, but traces from elsewhere may say less)."""
    if text is None or not text.strip():
        return None
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{where}: timeout {text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise ConfigError(f"{where}: timeout {text!r} is not a number of seconds above zero")
    return value


def read_foreign(path: Path) -> list[ForeignUse]:
    rows = _rows(path, ("start", "duration", "host", "gpu"))
    try:
        return [ForeignUse(float(r["start"]), float(r["duration"]), _host(r["host"]), int(r["gpu"]))
                for r in rows]
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _host(name: str) -> int:
    letters = name[4:]
    if not (name.startswith("gpu-") and letters and all("a" <= c <= "z" for c in letters)):
        raise ValueError(f"host {name!r} is not gpu-a, gpu-b, ..., gpu-z, gpu-aa, ...")
    index = 0
    for c in letters:  # as spreadsheet columns: a..z, aa..az, ba..
        index = index * 26 + ord(c) - ord("a") + 1
    return index - 1


def _rows(path: Path, needed: tuple[str, ...]) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in needed if c not in (reader.fieldnames or [])]
            if missing:
                raise ConfigError(f"{path}: missing column(s) {', '.join(missing)}")
            return list(reader)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None


def synthetic(n: int, *, hosts: int = 1, gpus: int = 8, load: float = 1.3, seed: int = 0,
              foreign_per_host: int = 0) -> tuple[list[TraceJob], list[ForeignUse]]:
    """Mixed 1/2/4/8-GPU jobs in bursts, offered at `load` times the cluster's capacity."""
    rng = random.Random(seed)
    sizes, weights = [1, 2, 4, 8], [0.55, 0.2, 0.15, 0.1]
    mean_work = sum(s * w for s, w in zip(sizes, weights, strict=True)) * 330.0
    gap = mean_work / (hosts * gpus * load)
    jobs, now = [], 0.0
    for i in range(n):
        burst = rng.random() < 0.2
        now += rng.expovariate(1 / gap) * (0.2 if burst else 1.25)
        size = min(rng.choices(sizes, weights)[0], gpus)
        jobs.append(TraceJob(i + 1, round(now, 3), size, round(rng.uniform(60, 600), 3)))
    foreign = [ForeignUse(round(rng.uniform(0, now), 3), round(rng.uniform(300, 3600), 3), h,
                          rng.randrange(gpus)) for h in range(hosts) for _ in range(foreign_per_host)]
    return jobs, foreign
