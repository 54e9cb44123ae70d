"""What a simulated job's timeout is once it runs, and what `dynamic`'s planner may know
of it while it waits, by GitLab's rules (kept apart from the event loop, `simulator`):

- A job's timeout is fixed only when a runner picks it: on the pending -> running
  transition GitLab stores the smallest of the job's timeout (else the project's) and
  the runner's `maximum_timeout` (gitlabhq app/models/ci/build.rb `after_transition
  pending: :running` -> app/models/ci/build_metadata.rb `update_timeout_state`,
  `timeout_with_highest_precedence`). gitlab-runner hands that value to the job as
  `CI_JOB_TIMEOUT` (gitlab-org/gitlab-runner common/build.go), so a running job's end
  by its timeout is what runnerctl's lease records (`SimRunner.ends_by`).
- A pending job's timeout is not in GitLab's jobs API (gitlabhq
  lib/api/entities/ci/job_basic.rb has none), and before a runner picks it GitLab has
  not computed it. What a controller can know is a bound: where the runners that may
  take it all have a `maximum_timeout` (GitLab: at least 10 minutes,
  app/models/ci/runner.rb; runnerctl's controller reads it, docs/controller.md), the
  job ends by it. The controller uses those bounds only when the runners of every slot
  size of a host have one (`Controller._timed`), and so does the planner here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from runnerctl.settings import MAX_RUNNER_TIMEOUT_S, MIN_RUNNER_TIMEOUT_S
from runnerctl.sim.hosts import slot_sizes

if TYPE_CHECKING:
    from runnerctl.sim.inputs import SimConfig, TraceJob

__all__ = ["MIN_RUNNER_TIMEOUT_S", "PENDING_TIMEOUTS", "gitlab_timeout", "job_timeouts",
           "parse_runner_timeouts"]

PENDING_TIMEOUTS = ("trace", "cap", "none")
"""What `dynamic`'s planner knows of a pending job's timeout (`SimConfig.pending_timeouts`)."""

Timeouts = dict[int, float | None]


def gitlab_timeout(own: float | None, cap: float | None) -> float | None:
    """The timeout GitLab fixes as a runner picks a job: the job's own (else its
    project's), cut at the runner's `maximum_timeout` where that is smaller
    (app/models/ci/build_metadata.rb `timeout_with_highest_precedence`). None: neither.
    The simulator and the fake GitLab (`SimRunner.job_timeout`) both use this."""
    if own is None:
        return cap
    return own if cap is None else min(own, cap)


def job_timeouts(jobs: Iterable[TraceJob], config: SimConfig) -> tuple[Timeouts, Timeouts]:
    """Per job: the timeout it runs under (GitLab's min of its own and its runners'
    `maximum_timeout`; None: neither), and what `dynamic`'s planner knows of it while it
    is pending (`SimConfig.pending_timeouts`)."""
    jobs = list(jobs)
    caps = {n: config.runner_cap(n) for n in {job.gpus for job in jobs}}
    every_size = all(config.runner_cap(n) is not None for n in slot_sizes(config.gpus_per_host))
    runs: Timeouts = {}
    known: Timeouts = {}
    for job in jobs:
        cap = caps[job.gpus]
        runs[job.job_id] = gitlab_timeout(job.timeout, cap)
        known[job.job_id] = cap if every_size else None
    if config.pending_timeouts == "trace":
        return runs, runs
    return runs, known if config.pending_timeouts == "cap" else dict.fromkeys(runs)


def uncapped_sizes(config: SimConfig) -> list[int]:
    """With `pending_timeouts` "cap", the runner sizes without a maximum timeout where
    others have one: the planner then knows no pending job's timeout (all sizes or none,
    as `Controller._timed`, which logs the same). Empty where that is not so."""
    sizes = sorted(slot_sizes(config.gpus_per_host))
    missing = [n for n in sizes if config.runner_cap(n) is None]
    return missing if config.pending_timeouts == "cap" and len(missing) < len(sizes) else []


def parse_runner_timeouts(text: str) -> tuple[float | None, tuple[tuple[int, float], ...]]:
    """`simulate --runner-max-timeout-s`: "SECONDS" for every runner, "N=SECONDS" for the
    N-GPU runners, comma-separated ("86400,1=7200"), each given once and at most what
    `[controller] runner_max_timeout_s` takes. ValueError: one line saying why."""
    default: float | None = None
    by_gpus: dict[int, float] = {}
    for part in (p.strip() for p in text.split(",")):
        gpus, _, seconds = part.rpartition("=")
        try:
            value = float(seconds)
            size = int(gpus) if gpus else None
        except ValueError:
            raise ValueError(f"runner maximum timeout {part!r}: give SECONDS or GPUS=SECONDS, "
                             "comma-separated (86400,1=7200)") from None
        if size is not None and size < 1:
            raise ValueError(f"runner maximum timeout {part!r}: a GPU count is at least 1")
        if (default if size is None else by_gpus.get(size)) is not None:
            whose = "every runner's" if size is None else f"the {size}-GPU runners'"
            raise ValueError(f"--runner-max-timeout-s {text!r}: {whose} maximum timeout is given twice")
        if value > MAX_RUNNER_TIMEOUT_S:
            raise ValueError(f"runner maximum timeout {part!r}: more than {MAX_RUNNER_TIMEOUT_S} seconds "
                             "(the most [controller] runner_max_timeout_s takes)")
        if size is None:
            default = value
        else:
            by_gpus[size] = value
    return default, tuple(sorted(by_gpus.items()))
