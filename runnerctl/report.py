"""Usage reports from the job history: who used how many GPU-hours, how long jobs waited
and ran, per user, project, host or GPUs per job.

Like Slurm's `sreport` over `sacct` records: the controller writes one row per job
(controller/history.py); this module sums them per user, project, host or GPU count over
a period. A job that ran across the period's start counts only its part inside the period
(its GPU-hours; its run time counts whole).
Columns: jobs, GPU-hours, idle GPU-hours (time its GPUs sat below the "unused"
utilization while it held them), waits (queued -> started, over the jobs whose queued
time is known), run times (started -> ended, p95 and longest, over the jobs that ended
in the period on their own: not cancelled, not freed by the orphan audit, as the
planner's run-time estimates count them; and the longest a job still running has run),
and the jobs flagged "requested but unused".
`--by gpus` groups by GPUs per job: the run times per size are what to read before
setting `[controller] runner_max_timeout_s` (docs/controller.md).
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import io
import json
import statistics
from collections.abc import Sequence
from typing import Any

from runnerctl.columns import fit
from runnerctl.controller.estimates import NOT_RUNS
from runnerctl.controller.jobs_store import JobRecord
from runnerctl.errors import ConfigError
from runnerctl.stats import quantile

BY = ("user", "project", "host", "gpus")


class ReportError(ConfigError):
    """A report's input (a date, a grouping) is not valid."""


@dataclasses.dataclass(frozen=True)
class Row:
    key: str
    jobs: int
    gpu_hours: float
    idle_gpu_hours: float
    wait_mean_s: float | None
    wait_max_s: float | None
    unused_jobs: int
    run_p95_s: float | None = None
    run_max_s: float | None = None
    running_max_s: float | None = None
    """The longest a job still running has run so far (to its last tick), if any."""


@dataclasses.dataclass(frozen=True)
class Report:
    by: str
    since: float | None
    until: float
    rows: tuple[Row, ...]
    unused: tuple[JobRecord, ...]

    def to_json(self) -> dict[str, Any]:
        return {"by": self.by, "since": self.since, "until": self.until,
                "rows": [dataclasses.asdict(r) for r in self.rows],
                "unused": [j.to_json() for j in self.unused]}


def parse_since(text: str) -> float:
    """`YYYY-MM-DD` or an ISO 8601 date and time (UTC unless it names an offset)."""
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ReportError(f"--since {text!r} is not a date: use YYYY-MM-DD or YYYY-MM-DDTHH:MM "
                          "(UTC unless an offset like +02:00 is given)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def build(records: Sequence[JobRecord], *, by: str, since: float | None, until: float) -> Report:
    if by not in BY:
        raise ReportError(f"--by {by!r}: choose one of {', '.join(BY)}")
    groups: dict[str, list[tuple[JobRecord, float]]] = {}
    for record in records:
        start = record.started_at if since is None else max(record.started_at, since)
        end = min(record.end, until)
        length = record.end - record.started_at
        if end < start or (end == start and length > 0):
            continue  # outside the period
        share = (end - start) / length if length > 0 else 1.0
        groups.setdefault(_key(record, by), []).append((record, share))
    rows = []
    for key, members in sorted(groups.items(), key=lambda kv: _order(kv[0], by)):
        waits = [w for r, _ in members if (w := r.wait_s) is not None]
        runs = sorted(r.ended_at - r.started_at for r, _ in members
                      if r.ended_at is not None and r.ended_at <= until and r.outcome not in NOT_RUNS)
        running = [r.end - r.started_at for r, _ in members if r.ended_at is None]  # to its last tick
        rows.append(Row(
            key=key, jobs=len(members),
            gpu_hours=sum(r.gpu_hours * share for r, share in members),
            idle_gpu_hours=sum(r.idle_gpu_s / 3600.0 * share for r, share in members),
            wait_mean_s=statistics.fmean(waits) if waits else None, wait_max_s=max(waits, default=None),
            unused_jobs=sum(1 for r, _ in members if r.unused_at is not None),
            run_p95_s=quantile(runs, 0.95) if runs else None,
            run_max_s=runs[-1] if runs else None,
            running_max_s=max(running, default=None)))
    unused = tuple(r for members in groups.values() for r, _ in members if r.unused_at is not None)
    return Report(by, since, until, tuple(rows), tuple(sorted(unused, key=lambda r: r.started_at)))


def _key(record: JobRecord, by: str) -> str:
    if by == "gpus":
        return str(len(record.gpus))
    value = {"user": record.user, "project": record.project, "host": record.host}[by]
    return value or "(unknown)"


def _order(key: str, by: str) -> tuple[int, str]:
    """Rows by name; by GPUs per job, numerically (2 before 16)."""
    return (int(key), key) if by == "gpus" else (0, key)


def to_csv(report: Report) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([report.by, "jobs", "gpu_hours", "idle_gpu_hours", "wait_mean_s", "wait_max_s",
                     "unused_jobs", "run_p95_s", "run_max_s", "running_max_s"])
    for row in report.rows:
        writer.writerow([row.key, row.jobs, f"{row.gpu_hours:.4f}", f"{row.idle_gpu_hours:.4f}",
                         _opt(row.wait_mean_s), _opt(row.wait_max_s), row.unused_jobs,
                         _opt(row.run_p95_s), _opt(row.run_max_s), _opt(row.running_max_s)])
    return out.getvalue()


def to_text(report: Report) -> str:
    since = "the start of the history" if report.since is None else _iso(report.since)
    label = "GPUs per job" if report.by == "gpus" else report.by
    lines = [f"GPU usage by {label} from {since} to {_iso(report.until)}"]
    header = (f"{report.by:<20} {'jobs':>6} {'GPU-h':>9} {'idle GPU-h':>11} {'wait mean':>10} "
              f"{'wait max':>10} {'run p95':>10} {'run max':>10}")
    lines.append(header)
    for row in report.rows:
        lines.append(f"{fit(row.key, 20)} {row.jobs:>6} {row.gpu_hours:>9.2f} {row.idle_gpu_hours:>11.2f} "
                     f"{_duration(row.wait_mean_s):>10} {_duration(row.wait_max_s):>10} "
                     f"{_duration(row.run_p95_s):>10} {_duration(row.run_max_s):>10}")
    if not report.rows:
        lines.append("(no jobs in this period)")
    for row in report.rows:  # a cap chosen from the run max would cut such a job
        if row.running_max_s is not None and row.running_max_s > (row.run_max_s or 0.0):
            what = f"{row.key} GPUs" if report.by == "gpus" else row.key
            lines.append(f"{what}: a job still running has run {_duration(row.running_max_s)} so far, "
                         "longer than any that ended")
    if report.unused:
        lines.append("requested but unused (GPUs held at near-zero utilization):")
    for job in report.unused:
        lines.append(f"  job {job.job_id} of {job.user or '(unknown)'} on {job.host} GPUs "
                     f"{','.join(map(str, job.gpus))}: {job.idle_gpu_s / 3600.0:.2f} idle GPU-h "
                     f"of {job.gpu_hours:.2f}, flagged {_iso(job.unused_at or job.started_at)}")
    return "\n".join(lines)


def to_json_text(report: Report) -> str:
    return json.dumps(report.to_json(), indent=2, sort_keys=True)


def _opt(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
