"""The simulator's inputs: trace jobs, foreign GPU use and the run's configuration.

Kept apart from `simulator` (the event loop) so each stays small.
"""

from __future__ import annotations

import dataclasses

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
