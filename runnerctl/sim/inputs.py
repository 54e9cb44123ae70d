"""The simulator's inputs: trace jobs, foreign GPU use and the run's configuration.

Kept apart from `simulator` (the event loop) so each stays small. What a job's timeout
is once it runs, and what the planner knows of it while it waits: `timeouts`.
"""

from __future__ import annotations

import dataclasses
import math

from runnerctl.controller.fairshare import FairPolicy
from runnerctl.controller.plan import PlanPolicy
from runnerctl.sim.hosts import slot_sizes
from runnerctl.sim.timeouts import MIN_RUNNER_TIMEOUT_S, PENDING_TIMEOUTS


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
    name: str = ""
    """Its job name in .gitlab-ci.yml: jobs of one project and name make one history
    (`controller.estimates`)."""

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
    fair_update_s: float = 60.0  # dynamic: how often the controller reads usage again (fair_usage.REFRESH_S)
    history: bool = True
    """dynamic: run-time estimates from the jobs that ended, per project and job name, as
    the controller reads them from its job history (`controller.estimates`); False: none,
    as on a controller's first day."""
    pending_timeouts: str = "trace"
    """What `dynamic`'s planner knows of a pending job's timeout (`Demand.timeout_s`;
    `timeouts`): "trace": the timeout it will run under (the trace's, capped by its
    runners' maximum timeout), an upper bound on what runnerctl can do, as no real
    controller reads a pending job's timeout from GitLab; "cap": its runners' maximum
    timeout (runners that have one, which runnerctl's controller reads: the job ends by
    it); "none": unknown (runners without a maximum timeout). Running jobs' timeouts are
    known in every mode (CI_JOB_TIMEOUT)."""
    runner_max_timeout_s: float | None = None
    """The runners' `maximum_timeout` (seconds), None: unset. GitLab runs every job at
    most min(its timeout, its runner's): jobs without a timeout in the trace get this."""
    runner_max_timeout_by_gpus: tuple[tuple[int, float], ...] = ()
    """(GPUs, seconds): the maximum timeout of the runners of that size, where it is not
    `runner_max_timeout_s` (a `gpus:N` job runs on an N-GPU runner)."""

    def __post_init__(self) -> None:
        if self.pending_timeouts not in PENDING_TIMEOUTS:
            raise ValueError(f"unknown pending_timeouts {self.pending_timeouts!r}; one of "
                             f"{', '.join(PENDING_TIMEOUTS)}")
        caps = [self.runner_max_timeout_s, *(s for _, s in self.runner_max_timeout_by_gpus)]
        for cap in caps:
            if cap is not None and not MIN_RUNNER_TIMEOUT_S <= cap < math.inf:
                raise ValueError(f"runner maximum timeout {cap:g} s: GitLab needs a number of seconds, "
                                 f"at least {MIN_RUNNER_TIMEOUT_S} (10 minutes)")
        sizes = slot_sizes(self.gpus_per_host)
        unknown = sorted(n for n, _ in self.runner_max_timeout_by_gpus if n not in sizes)
        if unknown:
            raise ValueError(f"runner maximum timeout for {', '.join(map(str, unknown))}-GPU runners: "
                             f"no runner holds that many GPUs on a {self.gpus_per_host}-GPU host "
                             f"(runners hold {', '.join(map(str, sorted(sizes)))})")
        if self.pending_timeouts == "cap" and caps == [None]:
            raise ValueError('pending_timeouts "cap" needs the runners\' maximum timeout '
                             "(runner_max_timeout_s; simulate --runner-max-timeout-s)")

    def runner_cap(self, gpus: int) -> float | None:
        """The maximum timeout of the runners that take `gpus:N` jobs, if they have one."""
        return dict(self.runner_max_timeout_by_gpus).get(gpus, self.runner_max_timeout_s)
