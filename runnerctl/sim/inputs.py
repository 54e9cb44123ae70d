"""The simulator's inputs: trace jobs, foreign GPU use and the run's configuration.

Kept apart from `simulator` (the event loop) so each stays small. Here too: what a
job's timeout is once it runs, and what the planner may know of it while it waits
(`job_timeouts`), by GitLab's rules:

- A job's timeout is fixed only when a runner picks it: on the pending -> running
  transition GitLab stores the smallest of the job's timeout (else the project's) and
  the runner's `maximum_timeout` (gitlabhq app/models/ci/build.rb `after_transition
  pending: :running` -> app/models/ci/build_metadata.rb `update_timeout_state`,
  `timeout_with_highest_precedence`). gitlab-runner hands that value to the job as
  `CI_JOB_TIMEOUT` (gitlab-org/gitlab-runner common/build.go), so a running job's end
  by its timeout is what runnerctl's lease records (`SimRunner.ends_by`).
- A pending job's timeout is not in GitLab's jobs API (gitlabhq
  lib/api/entities/ci/job_basic.rb has none), and before a runner picks it GitLab has
  not computed it. What a controller can know is a bound: where its runners all have
  a `maximum_timeout` (GitLab: at least 10 minutes, app/models/ci/runner.rb; runnerctl's
  controller reads it, docs/controller.md), no job runs longer than that cap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from runnerctl.controller.fairshare import FairPolicy
from runnerctl.controller.plan import PlanPolicy


@dataclasses.dataclass(frozen=True)
class TraceJob:
    job_id: int
    submit: float
    gpus: int
    duration: float
    project: str = "p"
    priority: str = "normal"
    user: str = ""
    """Who submitted it (GITLAB_USER_LOGIN); empty: the project stands for its user."""
    timeout: float | None = None
    """The job's timeout in GitLab (seconds), if the trace gives it: what a controller
    could know of its duration in advance (the duration itself it cannot know)."""

    @property
    def owner(self) -> str:
        """The user the per-user metrics count it for."""
        return self.user or self.project


@dataclasses.dataclass(frozen=True)
class ForeignUse:
    start: float
    duration: float
    host: int
    gpu: int


PENDING_TIMEOUTS = ("trace", "cap", "none")
"""What `dynamic`'s planner knows of a pending job's timeout (`SimConfig.pending_timeouts`)."""
MIN_RUNNER_TIMEOUT_S = 600.0  # GitLab's least runner maximum_timeout (app/models/ci/runner.rb)


@dataclasses.dataclass(frozen=True)
class SimConfig:
    hosts: int = 1
    gpus_per_host: int = 8
    policy: str = "dynamic"
    reconcile_s: float = 5.0  # controller interval
    check_s: float = 3.0  # gitlab-runner check_interval
    cooldown_s: float = 30.0  # a GPU stays closed this long after foreign use ends
    plan_policy: PlanPolicy = PlanPolicy()
    standby: bool = True  # dynamic: each host has runnerctl's stand-by runner (False: as before it)
    runner_type: str = "group"
    """Which job GitLab hands a polling runner (`runnerctl.sim.fair`): "group" (and
    project) runners the oldest, "instance" runners fair by project."""
    fair: FairPolicy = FairPolicy()  # dynamic: fair share between users and projects (off: weight 0)
    fair_update_s: float = 300.0  # dynamic: how often the controller reads usage again
    pending_timeouts: str = "trace"
    """What `dynamic`'s planner knows of a pending job's timeout (`Demand.timeout_s`):
    "trace": the timeout it will run under (the trace's, capped by the runners' cap):
    an upper bound on what runnerctl can do, as no real controller reads a pending job's
    timeout from GitLab; "cap": `runner_max_timeout_s` for every job (runners that
    all have that maximum timeout, which runnerctl's controller reads: every job ends by
    it); "none": unknown (runners without a maximum timeout). Running jobs' timeouts are known in every mode
    (CI_JOB_TIMEOUT)."""
    runner_max_timeout_s: float | None = None
    """The runners' `maximum_timeout` (seconds), None: unset. GitLab runs every job at
    most min(its timeout, this): jobs without a timeout in the trace get this one."""

    def __post_init__(self) -> None:
        if self.pending_timeouts not in PENDING_TIMEOUTS:
            raise ValueError(f"unknown pending_timeouts {self.pending_timeouts!r}; one of "
                             f"{', '.join(PENDING_TIMEOUTS)}")
        if self.runner_max_timeout_s is not None and not self.runner_max_timeout_s >= MIN_RUNNER_TIMEOUT_S:
            raise ValueError(f"runner maximum timeout {self.runner_max_timeout_s} s: GitLab needs at least "
                             f"{MIN_RUNNER_TIMEOUT_S:.0f} s (10 minutes)")
        if self.pending_timeouts == "cap" and self.runner_max_timeout_s is None:
            raise ValueError('pending_timeouts "cap" needs the runners\' maximum timeout '
                             "(runner_max_timeout_s; simulate --runner-max-timeout-s)")


Timeouts = dict[int, float | None]


def job_timeouts(jobs: Iterable[TraceJob], config: SimConfig) -> tuple[Timeouts, Timeouts]:
    """Per job: the timeout it runs under (GitLab's min of its own and the runners'
    `maximum_timeout`; None: neither), and what `dynamic`'s planner knows of it while it
    is pending (`SimConfig.pending_timeouts`)."""
    cap = config.runner_max_timeout_s
    runs: Timeouts = {}
    for job in jobs:
        own = job.timeout
        runs[job.job_id] = cap if own is None else own if cap is None else min(own, cap)
    if config.pending_timeouts == "trace":
        return runs, runs
    known = cap if config.pending_timeouts == "cap" else None
    return runs, dict.fromkeys(runs, known)
