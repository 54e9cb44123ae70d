"""One simulated host around a real controller: sim GPUs, HTTP GitLab, runner stand-ins.

The controller talks to the simulated GitLab over HTTP through the real python-gitlab
adapter, exactly as in production; only GitLab, the GPUs and gitlab-runner are fakes.
Time is a `VirtualClock` that `advance()` moves in steps, so the demo can run an hour
in a minute and tests run without sleeping. Used by `runnerctl demo`, by `serve
--gitlab sim` and by the controller tests.

As in production the host has a stand-by runner (runnerctl/standby.py; kept in memory
here, not in a state dir), and `advance()` plays GitLab's hourly cron
(`StuckCiJobsWorker`, `0 * * * *` in gitlabhq `config/initializers/1_settings.rb`),
which drops stuck and outdated pending jobs (`GitLabState.drop_stuck_jobs`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from runnerctl.controller.loop import Controller, Wiring
from runnerctl.controller.observe import JobSource, LeaseJobs, nothing_is_ci
from runnerctl.controller.plan import PlanPolicy
from runnerctl.controller.store import Event, Store
from runnerctl.gitlab import PythonGitLab, RunnerScope
from runnerctl.layout import slot_tags, standby_name, standby_tags
from runnerctl.settings import ControllerSettings
from runnerctl.sim.fleet import RunningJob, SimFleet, SimGpus
from runnerctl.sim.gitlab_cron import CRON_S
from runnerctl.sim.gitlab_server import GitLabServer
from runnerctl.sim.gitlab_state import GitLabState
from runnerctl.standby import Standby, new_system_id
from runnerctl.tags import job_tags

TOKEN = "glpat-runnerctl-sim"
PROJECT = 1


class VirtualClock:
    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.start = start
        self.now = start

    def __call__(self) -> float:
        return self.now

    @property
    def elapsed(self) -> float:
        return self.now - self.start


@dataclasses.dataclass
class World:
    clock: VirtualClock
    state: GitLabState
    server: GitLabServer
    gitlab: PythonGitLab
    gpus: SimGpus
    fleet: SimFleet
    controller: Controller
    store: Store
    durations: dict[int, float]
    submitted: dict[int, tuple[float, int]]  # job id -> (when, GPUs)
    utilizations: dict[int, float] = dataclasses.field(default_factory=dict)  # job id -> its GPUs' load
    standby: Standby | None = None
    dropped: dict[int, str] = dataclasses.field(default_factory=dict)  # job id -> failure reason
    _next_tick: float = 0.0
    _next_cron: float = 0.0

    def submit(self, gpus: int, duration: float, *, user: str = "bob", priority: str = "",
               utilization: float = 0.9, name: str = "job", created_at: float | None = None) -> int:
        """A pending job; `created_at` before now: a later stage's job, queued only now."""
        job = self.state.enqueue_job(project_id=PROJECT, tags=job_tags(gpus=gpus, priority=priority),
                                     user=user, name=name, created_at=created_at)
        self.durations[job.id] = duration
        self.utilizations[job.id] = utilization
        self.submitted[job.id] = (self.clock(), gpus)
        return job.id

    def advance(self, seconds: float, *, step: float = 1.0, pace: Callable[[], None] | None = None,
                failed_ticks: list[Exception] | None = None) -> None:
        """Move virtual time: runners poll on their beat, the controller ticks on its own.
        With `failed_ticks`, a tick that raises (a store that cannot write) is added to it
        and the world goes on, as `Controller.run` retries; else it propagates."""
        end = self.clock.now + seconds
        while self.clock.now < end:
            self.clock.now = min(end, self.clock.now + step)
            self.fleet.step(self.clock.now)
            if self.clock.now >= self._next_tick:
                try:
                    self.controller.tick()
                except Exception as exc:
                    if failed_ticks is None:
                        raise
                    failed_ticks.append(exc)
                self._next_tick = self.clock.now + self.controller.settings.interval_s
            if self.clock.now >= self._next_cron:
                self._next_cron = (self.clock.now // CRON_S + 1) * CRON_S
                self.dropped.update((job.id, str(job.failure_reason)) for job in self.state.drop_stuck_jobs())
            if pace is not None:
                pace()

    def close(self) -> None:
        self.server.stop()
        self.store.close()


def build_world(state_dir: Path, *, host: str = "demo", gpu_count: int = 8,
                settings: ControllerSettings | None = None, policy: PlanPolicy | None = None,
                on_event: Callable[[Event], None] = lambda e: None,
                on_job: Callable[[str, RunningJob, float], None] = lambda kind, job, now: None,
                webhook_secret: str = "", store_url: str = "", store_timeout_s: float = 30.0,
                check_s: float = 3.0,
                lease_dir: Path | None = None, standby: bool = True,
                start: float = 1_700_000_000.0) -> World:
    """With `lease_dir`, the runner stand-ins take real lease files there and the controller
    reads running jobs from them (`LeaseJobs`), as in production. `standby=False` leaves
    out the stand-by runner (runnerctl before it had one). `start` is the virtual clock's
    first reading: a world a browser looks at starts at the wall clock, so that dates and
    the page's own "ran" figures (the browser's clock) agree."""
    clock = VirtualClock(start)
    state = GitLabState(clock=clock)
    server = GitLabServer(state, tokens={TOKEN: "admin"})
    # small answers written in two sends otherwise wait 40 ms for a delayed ACK (Nagle)
    server._httpd.RequestHandlerClass.disable_nagle_algorithm = True  # type: ignore[attr-defined]
    server.start()
    gitlab = PythonGitLab(server.url, TOKEN, timeout=5.0)
    gpus = SimGpus(host, gpu_count, clock)
    slots = gpus.slots()
    runner_ids = {}
    for slot in slots:
        created = gitlab.create_runner(description=slot.name, tags=slot_tags(slot), paused=slot.size > 1,
                                       scope=RunnerScope())
        runner_ids[slot.name] = created.id
    keep: Standby | None = None
    if standby and slots:
        made = gitlab.create_runner(description=standby_name(host), tags=standby_tags(slots), paused=False,
                                    scope=RunnerScope())
        keep = Standby(made.id, made.token, new_system_id(), standby_name(host), tuple(standby_tags(slots)))
    durations: dict[int, float] = {}
    utilizations: dict[int, float] = {}
    fleet = SimFleet(state, runner_ids, slots, gpus, check_s=check_s,
                     duration_of=lambda job_id: durations.get(job_id, 60.0), on_change=on_job,
                     lease_dir=lease_dir, utilization_of=lambda job_id: utilizations.get(job_id, 0.9))
    jobs: JobSource = fleet if lease_dir is None else LeaseJobs(lease_dir)
    store = Store.open(url=store_url, state_dir=state_dir, timeout_s=store_timeout_s)
    settings = settings or ControllerSettings(projects=(PROJECT,))
    wiring = Wiring(host=host, gpus=gpus, gitlab=gitlab, runner_ids=runner_ids, store=store, jobs=jobs,
                    clock=clock, is_ci=nothing_is_ci, webhook_secret=webhook_secret, on_event=on_event,
                    standby=keep)
    controller = Controller(wiring, settings, policy)
    return World(clock, state, server, gitlab, gpus, fleet, controller, store, durations, {}, utilizations,
                 standby=keep)
