"""Trace files for `runnerctl simulate`, and a synthetic workload generator.

JOBS.csv: `job_id,submit_time,gpus,duration` (seconds), optional `project,priority`,
`user` (who submitted it; the per-user metrics), `timeout` (the job's GitLab timeout
in seconds, empty for none: what a controller may know of a duration in advance; a job
runs at most that long, as GitLab fails it then) and `name` (its job name: jobs of one
project and name share a run-time history, `controller.estimates`).
`runnerctl.sim.labtrace` generates lab-like traces (heavy-tailed durations, bursts,
users, timeouts; arrivals flat or on a working day).
FOREIGN.csv: `start,duration,host,gpu`, hosts named gpu-a, gpu-b, ... in order (after
gpu-z: gpu-aa, gpu-ab, ..., as `hosts.host_name` names them).

Both are UTF-8 CSV with a header line. Every row is checked before the simulation
starts, and the first bad one is reported with its line number: a row with fewer or
more fields than the header, a number that is not one (NaN and infinity included), a
negative time or duration, a timeout that is not above zero, a job asking for a GPU
count no runner of the simulated hosts has (0, 3, -2, more than a host), a foreign use
on a host or GPU that does not exist, a job id given twice; so is a header naming a
column twice or a column neither file has (a misspelt `Timeout` or `usr` would otherwise
be left out without a word), and a jobs file with no job. Numbers are ASCII decimals
(`1_000` and other digits Python's `float` takes are refused). A duration of 0 (a job
that ended at once) is allowed.
"""

from __future__ import annotations

import csv
import io
import math
import random
import re
from collections.abc import Collection
from pathlib import Path

from runnerctl.errors import ConfigError
from runnerctl.sim.simulator import ForeignUse, TraceJob
from runnerctl.tags import PRIORITIES

MAX_SECONDS = 1e9
"""Times and durations beyond ~31 years are typos (and would overflow the metrics)."""
MAX_INT = 2**63 - 1
_EXTRA = "\x00extra"  # DictReader's key for fields beyond the header
JOB_COLUMNS = ("job_id", "submit_time", "gpus", "duration")
JOB_OPTIONAL = ("project", "priority", "user", "timeout", "name")
FOREIGN_COLUMNS = ("start", "duration", "host", "gpu")


def read_jobs(path: Path, *, sizes: Collection[int] | None = None) -> list[TraceJob]:
    """Jobs of JOBS.csv; any bad row is a ConfigError naming its line. With `sizes` (the
    GPU counts the host's runners have), a job asking for another count is refused: no
    runner would ever take it."""
    jobs: list[TraceJob] = []
    seen: set[int] = set()
    for line, row in _rows(path, JOB_COLUMNS, JOB_OPTIONAL):
        where = f"{path}: line {line}"
        job = TraceJob(_int(row, "job_id", where, low=0), _time(row, "submit_time", where),
                       _int(row, "gpus", where, low=1), _time(row, "duration", where),
                       row.get("project") or "p", row.get("priority") or "normal",
                       row.get("user") or "", _timeout(row.get("timeout"), where), row.get("name") or "")
        if job.priority not in PRIORITIES:
            raise ConfigError(f"{where}: priority {job.priority!r} is not one of {', '.join(PRIORITIES)}")
        if sizes is not None and job.gpus not in sizes:
            raise ConfigError(f"{where}: job {job.job_id} asks for {job.gpus} GPUs, which no runner has",
                              hint=f"runners hold {', '.join(map(str, sorted(sizes)))} GPUs")
        if job.job_id in seen:
            raise ConfigError(f"{where}: job id {job.job_id} appears twice")
        seen.add(job.job_id)
        jobs.append(job)
    if not jobs:
        raise ConfigError(f"{path}: no jobs, only the header", hint="one line per job after the header")
    return jobs


def read_foreign(path: Path, *, hosts: int | None = None,
                 gpus_per_host: int | None = None) -> list[ForeignUse]:
    """Foreign uses of FOREIGN.csv, checked against the simulated hosts when given."""
    uses: list[ForeignUse] = []
    for line, row in _rows(path, FOREIGN_COLUMNS, ()):
        where = f"{path}: line {line}"
        try:
            host = _host(row["host"])
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if hosts is not None and host >= hosts:
            raise ConfigError(f"{where}: host {row['host']} is beyond --hosts {hosts}")
        use = ForeignUse(_time(row, "start", where), _time(row, "duration", where), host,
                         _int(row, "gpu", where, low=0))
        if gpus_per_host is not None and use.gpu >= gpus_per_host:
            raise ConfigError(f"{where}: GPU {use.gpu} is beyond --gpus-per-host {gpus_per_host}")
        uses.append(use)
    return uses


def _int(row: dict[str, str], column: str, where: str, *, low: int) -> int:
    text = row[column].strip()
    if not re.fullmatch(r"-?[0-9]+", text):
        raise ConfigError(f"{where}: {column} {row[column]!r} is not a whole number")
    value = int(text)
    if not low <= value <= MAX_INT:
        raise ConfigError(f"{where}: {column} {value} is not from {low} to {MAX_INT}")
    return value


def _time(row: dict[str, str], column: str, where: str) -> float:
    """Seconds: a finite number from 0 to MAX_SECONDS."""
    try:
        value = _float(row[column])
    except ValueError:
        raise ConfigError(f"{where}: {column} {row[column]!r} is not a number of seconds") from None
    if not (math.isfinite(value) and 0 <= value <= MAX_SECONDS):
        raise ConfigError(f"{where}: {column} {row[column]!r} is not from 0 to {MAX_SECONDS:.0e} s")
    return value


def _timeout(text: str | None, where: str) -> float | None:
    """The optional `timeout` column: empty, or seconds above zero up to MAX_SECONDS
    (GitLab's minimum is 10 minutes, but traces from elsewhere may say less)."""
    if text is None or not text.strip():
        return None
    try:
        value = _float(text)
    except ValueError:
        raise ConfigError(f"{where}: timeout {text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and 0 < value <= MAX_SECONDS):
        raise ConfigError(f"{where}: timeout {text!r} is not a number of seconds above 0 "
                          f"and at most {MAX_SECONDS:.0e}")
    return value


def _float(text: str) -> float:
    """`float` of ASCII text without `_`: `float` also reads "1_000" and non-ASCII digits."""
    if not text.isascii() or "_" in text:
        raise ValueError(text)
    return float(text)


def _host(name: str) -> int:
    letters = name.removeprefix("gpu-")
    if not (letters != name and letters and all("a" <= c <= "z" for c in letters)):
        raise ValueError(f"host {name!r} is not gpu-a, gpu-b, ..., gpu-z, gpu-aa, ...")
    index = 0
    for c in letters:  # as spreadsheet columns: a..z, aa..az, ba..
        index = index * 26 + ord(c) - ord("a") + 1
    return index - 1


def _rows(path: Path, needed: tuple[str, ...], optional: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    """(line number, row) of a UTF-8 CSV file with a header naming `needed` columns and
    any of `optional`, each once; a row with fewer or more fields than the header is
    refused."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}: line {line}: not UTF-8 text") from None
    if "\x00" in text:
        line = text[:text.index("\x00")].count("\n") + 1
        raise ConfigError(f"{path}: line {line}: holds a NUL byte")
    reader = csv.DictReader(io.StringIO(text, newline=""), restkey=_EXTRA, strict=True)
    last = 1  # the line the last good record ended on (the header's at first)
    try:
        names = list(reader.fieldnames or [])
        missing = [c for c in needed if c not in names]
        if missing:
            raise ConfigError(f"{path}: missing column(s) {', '.join(missing)}",
                              hint=f"the first line names the columns: {','.join(needed)}")
        twice = sorted({c for c in names if names.count(c) > 1})
        unknown = [c for c in names if c not in needed + optional]
        if twice or unknown:
            what = (f"column(s) named twice: {', '.join(twice)}" if twice
                    else f"unknown column(s) {', '.join(map(repr, unknown))}")
            raise ConfigError(f"{path}: line 1: {what}",
                              hint=f"the columns are {','.join(needed + optional)}")
        rows = []
        for row in reader:
            header = len(reader.fieldnames or [])
            fields = header - sum(v is None for v in row.values()) + len(row.get(_EXTRA) or [])
            if fields != header:
                raise ConfigError(f"{path}: line {reader.line_num}: {fields} field(s), "
                                  f"the header has {header}")
            rows.append((reader.line_num, row))
            last = reader.line_num
    except csv.Error as exc:
        raise ConfigError(f"{path}: line {last + 1}: {exc}") from None
    return rows


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
