"""GitLab's runners and jobs, in memory, with GitLab's own rules for them.

One model of GitLab, used by the simulator (virtual clock, no I/O) and, through
`gitlab_server`, as an HTTP GitLab that python-gitlab and the runner stand-in talk to.
Each rule names the gitlabhq/gitlabhq file it follows:

- Which runner may take which job (app/models/ci/runner.rb `matches_build?` through
  lib/gitlab/ci/matching/runner_matcher.rb): the runner is not paused, the job's tags
  are a subset of the runner's, an untagged job only goes to a runner with
  `run_untagged`, and the runner serves the job's project: instance runners every
  project, group runners the projects of their group and its subgroups, project runners
  their project (app/services/ci/queue/pending_builds_strategy.rb
  `builds_for_group_runner`, build_queue_service.rb `builds_for_project_runner`).
- Queue order (app/services/ci/queue/pending_builds_strategy.rb): instance runners use
  fair scheduling, projects with the fewest jobs running on instance runners first, then
  oldest job; group and project runners take the oldest job first.
- Online (app/models/ci/runner.rb, `ONLINE_CONTACT_TIMEOUT = 2.hours`): contacted in the
  last 2 hours. Contact is any job request (lib/api/ci/runner.rb `POST /jobs/request`,
  through app/models/ci/runner_manager.rb `heartbeat`) or `POST /runners/verify` with a
  `system_id`.
- Dropping (`drop_stuck_jobs`, app/services/ci/stuck_builds/drop_pending_service.rb and
  drop_canceling_service.rb, run by StuckBuildsDropWorker from cron): see there.
- Cancel (app/models/commit_status.rb / app/models/concerns/ci/has_status.rb state
  machine, app/models/ci/build.rb `supports_canceling?`): see `cancel_job`.

A runner token (`glrt-...`) is returned once, at creation.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import secrets
import time
from collections.abc import Callable, Iterable

from runnerctl.sim.gitlab_directory import Directory
from runnerctl.sim.timeouts import gitlab_timeout

Clock = Callable[[], float]
ONLINE_WINDOW_S = 7200.0
"""GitLab shows a runner online if it contacted GitLab in the last 2 hours."""
STUCK_AFTER_S = 3600.0
"""drop_pending_service.rb `BUILD_PENDING_STUCK_TIMEOUT = 1.hour`."""
OUTDATED_AFTER_S = 86400.0
"""drop_pending_service.rb `BUILD_PENDING_OUTDATED_TIMEOUT = 1.day`."""
CANCELING_OUTDATED_S = 1800.0
"""drop_canceling_service.rb `BUILD_CANCELING_OUTDATED_TIMEOUT = 30.minutes`."""
STUCK_REASON = "stuck_pending_no_matching_runners"
OUTDATED_REASON = "stuck_pending_with_matching_runners"
LEGACY_STUCK_REASON = "stuck_or_timeout_failure"
"""GitLab before 19.1 wrote this for both pending drops (ci.yml `retry:when` still accepts it)."""
CANCELING_REASON = "no_updates_canceling"
RUNNING_OUTDATED_S = 3600.0
"""drop_running_service.rb `BUILD_RUNNING_OUTDATED_TIMEOUT = 1.hour`."""
RUNNING_REASON = "no_updates_running"
DEFAULT_TIMEOUT_S = 3600
"""A project's default job timeout (app/models/project_ci_cd_setting.rb, 60 minutes)."""
FINAL = frozenset({"success", "failed", "canceled", "skipped"})
LIVE = frozenset({"running", "canceling"})


@dataclasses.dataclass
class SimRunner:
    id: int
    description: str
    runner_type: str
    tags: frozenset[str]
    paused: bool
    token: str
    created_at: float
    group_id: int | None = None
    project_id: int | None = None
    run_untagged: bool = False
    locked: bool = True
    maximum_timeout: int | None = None
    contacted_at: float | None = None
    token_expires_at: str | None = None
    creator: str = ""

    def job_timeout(self, project_timeout_s: int = DEFAULT_TIMEOUT_S) -> int:
        """The timeout of a job this runner takes: the project's (`GitLabState.
        project_timeout_s`), cut at the runner's maximum timeout where that is smaller
        (doc/ci/runners/configure_runners.md, "Set the maximum job timeout"; the rule is
        `sim.timeouts.gitlab_timeout`)."""
        return int(gitlab_timeout(project_timeout_s, self.maximum_timeout or None) or project_timeout_s)


@dataclasses.dataclass
class SimManager:
    """A gitlab-runner process using a runner's token (app/models/ci/runner_manager.rb)."""

    runner_id: int
    system_id: str
    created_at: float
    contacted_at: float | None
    features: dict[str, bool] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class SimJob:
    id: int
    project_id: int
    name: str
    tags: frozenset[str]
    created_at: float
    user: str
    pipeline_id: int
    status: str = "pending"
    runner_id: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    failure_reason: str | None = None
    exit_code: int | None = None
    updated_at: float = 0.0
    token: str = ""
    system_id: str | None = None
    cancel_gracefully: bool = False
    script: tuple[str, ...] = ("true",)
    after_script: tuple[str, ...] = ()
    stage: str = "test"
    ref: str = "main"
    shared: bool = False  # taken by an instance runner (fair scheduling counts these)
    queued_at: float | None = None
    """When it became pending (None: when it was created). A job of a later stage is
    created with its pipeline and queued when the stages before it end; its
    `queued_duration` counts from here (app/models/commit_status.rb: `queued_at` to
    `started_at`, or now)."""

    @property
    def pending_since(self) -> float:
        return self.created_at if self.queued_at is None else self.queued_at


class GitLabState:
    def __init__(self, *, clock: Clock = time.time, base_url: str = "http://gitlab.sim",
                 directory: Directory | None = None, legacy_failure_reasons: bool = False,
                 drop_silent_running: bool = False, verify_skips_contact: bool = False) -> None:
        """`drop_silent_running`: also apply drop_running_service.rb (see `drop_stuck_jobs`).
        Off where the runners are stand-ins that send no updates while a job runs (the
        simulator's), which a real gitlab-runner does every few seconds.

        `verify_skips_contact`: a GitLab whose `POST /runners/verify` in lib/api/ci/runner.rb
        reads `registering_created_runner = params[:token].start_with?(CREATED_RUNNER_TOKEN_PREFIX)`
        and calls `authenticate_runner!(update_contacted_at: !registering_created_runner)`
        ("we want to update the contacted_at value only when it starts polling for jobs"),
        GitLab 16 and 17: a `glrt-` runner's verify leaves it, and its manager, never
        contacted. There `DELETE /runners/managers` calls `authenticate_runner!(
        ensure_runner_manager: false)`, whose `update_contacted_at` defaults to true
        (lib/api/ci/helpers/runner.rb), so it heartbeats the runner before it looks the
        manager up. Newer GitLab verifies with a plain `authenticate_runner!` (a heartbeat),
        and its helper heartbeats only `if ensure_runner_manager`."""
        self.verify_skips_contact = verify_skips_contact
        self.runner_registrars = frozenset({"group", "project"})
        """Admin area > Settings > CI/CD > Runners, "Runner registration" (application setting
        `valid_runner_registrars`): where "group" is not in it, app/policies/group_policy.rb
        `rule { ~admin & ~group_runner_registration_allowed }` prevents `create_runner`, so
        a group's Owner may not create its runners; project_policy.rb likewise for "project"."""
        self.clock = clock
        self.base_url = base_url
        self.directory = directory or Directory()
        self.legacy_failure_reasons = legacy_failure_reasons
        self.drop_silent_running = drop_silent_running
        self.project_timeout_s = DEFAULT_TIMEOUT_S
        """Every project's CI/CD job timeout: 60 minutes unless a project sets more or less
        (app/models/project_ci_cd_setting.rb; Settings > CI/CD > General pipelines)."""
        self.runners: dict[int, SimRunner] = {}
        self.managers: dict[tuple[int, str], SimManager] = {}
        self.jobs: dict[int, SimJob] = {}
        self.listeners: list[Callable[[SimJob], None]] = []
        """Called after every job status change (job webhooks hang here)."""
        self._ids = itertools.count(1)
        self._job_ids = itertools.count(1000)
        # pending job ids by (tag set, project), each queue oldest first
        self._pending: dict[tuple[frozenset[str], int], collections.deque[int]] = {}
        self._shared_running: collections.Counter[int] = collections.Counter()

    # -- runners -----------------------------------------------------------------
    def create_runner(self, *, description: str, tags: Iterable[str], paused: bool = False,
                      runner_type: str = "instance_type", group_id: int | None = None,
                      project_id: int | None = None, run_untagged: bool = False,
                      locked: bool = True, maximum_timeout: int | None = None,
                      creator: str = "") -> SimRunner:
        runner = SimRunner(
            id=next(self._ids), description=description, runner_type=runner_type,
            tags=frozenset(tags), paused=paused, token="glrt-" + secrets.token_urlsafe(15),
            created_at=self.clock(), group_id=group_id, project_id=project_id,
            run_untagged=run_untagged, locked=locked, maximum_timeout=maximum_timeout, creator=creator,
        )
        self.runners[runner.id] = runner
        return runner

    def update_runner(self, runner_id: int, *, paused: bool | None = None,
                      tags: Iterable[str] | None = None, description: str | None = None,
                      maximum_timeout: int | None = None, clear_maximum_timeout: bool = False) -> SimRunner:
        runner = self.runners[runner_id]
        if maximum_timeout is not None or clear_maximum_timeout:
            runner.maximum_timeout = maximum_timeout
        if paused is not None:
            runner.paused = paused
        if tags is not None:
            runner.tags = frozenset(tags)
        if description is not None:
            runner.description = description
        return runner

    def delete_runner(self, runner_id: int) -> None:
        del self.runners[runner_id]
        for key in [k for k in self.managers if k[0] == runner_id]:
            del self.managers[key]

    def runner_by_token(self, token: str) -> SimRunner | None:
        return next((r for r in self.runners.values() if secrets.compare_digest(r.token, token)), None)

    def online(self, runner: SimRunner) -> bool:
        return runner.contacted_at is not None and self.clock() - runner.contacted_at < ONLINE_WINDOW_S

    def heartbeat(self, runner: SimRunner, system_id: str | None = None,
                  features: dict[str, bool] | None = None, *, contact: bool = True) -> SimManager | None:
        """A contact from a gitlab-runner process: the runner (and its manager) seen now.

        app/models/ci/runner_manager.rb: a manager is created the first time a
        `system_id` is seen with a runner's token (lib/api/ci/helpers/runner.rb
        `current_runner_manager`, `find_or_create`), and counts as online for 2 hours.
        `contact` False (`update_contacted_at: false`): the manager is still made, but
        neither it nor the runner is marked contacted.
        """
        now = self.clock()
        if contact:
            runner.contacted_at = now
        if system_id is None:
            return None
        manager = self.managers.get((runner.id, system_id))
        if manager is None:
            manager = SimManager(runner.id, system_id, now, None)
            self.managers[(runner.id, system_id)] = manager
        if contact:
            manager.contacted_at = now
        if features is not None:
            manager.features = dict(features)
        return manager

    def managers_of(self, runner_id: int) -> list[SimManager]:
        return [m for (rid, _), m in sorted(self.managers.items()) if rid == runner_id]

    def manager_online(self, manager: SimManager) -> bool:
        return manager.contacted_at is not None and self.clock() - manager.contacted_at < ONLINE_WINDOW_S

    def serves(self, runner: SimRunner, job: SimJob) -> bool:
        """runner_matcher.rb `matches?` plus the runner's reach (see the module docstring)."""
        if not job.tags <= runner.tags or (not job.tags and not runner.run_untagged):
            return False
        return self._reaches(runner, job.project_id)

    def _reaches(self, runner: SimRunner, project_id: int) -> bool:
        if runner.runner_type == "instance_type":
            return True
        if runner.runner_type == "group_type":
            return runner.group_id in self.directory.project_group_ids(project_id)
        return runner.project_id == project_id

    # -- jobs --------------------------------------------------------------------
    def enqueue_job(self, *, project_id: int, tags: Iterable[str], name: str = "job",
                    user: str = "user", pipeline_id: int | None = None,
                    script: Iterable[str] | None = None, after_script: Iterable[str] = (),
                    created_at: float | None = None) -> SimJob:
        """A job pending from now; `created_at` earlier than now is a job of a later stage,
        created with its pipeline and queued only now."""
        now = self.clock()
        job = SimJob(id=next(self._job_ids), project_id=project_id, name=name, tags=frozenset(tags),
                     created_at=now if created_at is None else min(created_at, now), user=user,
                     pipeline_id=pipeline_id or 0, updated_at=now, token="glcbt-" + secrets.token_urlsafe(15),
                     queued_at=None if created_at is None else now)
        if script is not None:
            job.script = tuple(script)
        job.after_script = tuple(after_script)
        if not job.pipeline_id:
            job.pipeline_id = job.id
        self.directory.project(project_id)
        self.jobs[job.id] = job
        self._pending.setdefault((job.tags, project_id), collections.deque()).append(job.id)
        self._changed(job)
        return job

    def web_url(self, job: SimJob) -> str:
        project = self.directory.projects.get(job.project_id)
        path = project.path_with_namespace if project else f"p{job.project_id}"
        return f"{self.base_url}/{path}/-/jobs/{job.id}"

    def owner(self, job_id: int) -> tuple[str, str] | None:
        """(user, link) of a job, as the executor's lease records them."""
        job = self.jobs.get(job_id)
        return None if job is None else (job.user, self.web_url(job))

    def job_name(self, job_id: int) -> str:
        """A job's name (CI_JOB_NAME, as the executor's lease records it); "" if unknown."""
        job = self.jobs.get(job_id)
        return "" if job is None else job.name

    def request_job(self, runner_id: int, *, system_id: str | None = None,
                    cancel_gracefully: bool = False) -> SimJob | None:
        """What a runner's poll gets: the next pending job it may run, now running.

        app/services/ci/register_job_service.rb picks from the queue of
        pending_builds_strategy.rb (see the module docstring for the order).
        `cancel_gracefully`: the runner announced `features.cancel_gracefully`.
        """
        runner = self.runners.get(runner_id)
        if runner is None:
            return None
        self.heartbeat(runner, system_id)
        if runner.paused:
            return None
        shared = runner.runner_type == "instance_type"
        best: tuple[int, int, tuple[frozenset[str], int]] | None = None
        for key, queue in self._pending.items():
            tags, project_id = key
            if not queue or not tags <= runner.tags or (not tags and not runner.run_untagged):
                continue
            if not self._reaches(runner, project_id):
                continue
            rank = (self._shared_running[project_id] if shared else 0, queue[0], key)
            if best is None or rank[:2] < best[:2]:
                best = rank
        if best is None:
            return None
        job = self.jobs[self._pending[best[2]].popleft()]
        job.status, job.runner_id, job.started_at = "running", runner_id, self.clock()
        job.updated_at, job.system_id, job.cancel_gracefully = self.clock(), system_id, cancel_gracefully
        job.shared = shared
        if shared:
            self._shared_running[job.project_id] += 1
        self._changed(job)
        return job

    def touch_job(self, job_id: int) -> SimJob:
        """A runner's update of a running job (trace or `state=running`)."""
        job = self.jobs[job_id]
        job.updated_at = self.clock()
        return job

    def finish_job(self, job_id: int, status: str = "success", *, failure_reason: str | None = None,
                   exit_code: int | None = None) -> SimJob:
        """The runner's final report, or a finish forced by GitLab.

        commit_status.rb: `success` and `drop` on a `canceling` job make it `canceled`
        ("runner returns success/failed"); a failure without a reason is
        `unknown_failure` (build.rb `drop_with_exit_code!`). A finished job stays as it is.
        """
        job = self.jobs[job_id]
        if job.status in FINAL:
            return job
        if job.status == "pending":
            self._pending[(job.tags, job.project_id)].remove(job_id)
        if job.status == "canceling":
            status = "canceled"
        elif status == "failed":
            job.failure_reason = failure_reason or "unknown_failure"
        if job.status in LIVE and job.shared:
            self._shared_running[job.project_id] -= 1
        job.exit_code = exit_code if exit_code is not None else job.exit_code
        job.status, job.finished_at, job.updated_at = status, self.clock(), self.clock()
        self._changed(job)
        return job

    def cancel_job(self, job_id: int) -> SimJob:
        """commit_status.rb `cancel`: a running job whose runner manager supports graceful
        cancel (build.rb `supports_canceling?`, runner `features.cancel_gracefully`) goes to
        `canceling` and the runner, seeing `Job-Status: canceling`, runs after_script and
        then reports; any other unfinished job is `canceled` at once."""
        job = self.jobs[job_id]
        if job.status == "running" and job.cancel_gracefully:
            job.status, job.updated_at = "canceling", self.clock()
            self._changed(job)
            return job
        if job.status in FINAL or job.status == "canceling":
            return job
        return self.finish_job(job_id, "canceled")

    def drop_stuck_jobs(self) -> list[SimJob]:
        """What GitLab's StuckBuildsDropWorker cron does to waiting jobs, at `clock()`.

        drop_pending_service.rb: a job pending for more than 1 day is dropped whatever
        the runners (`stuck_pending_with_matching_runners`); one pending for more than
        1 hour is dropped when it is stuck (`stuck_pending_no_matching_runners`),
        build.rb `stuck?`: no runner with `match_build_if_online?` (runner.rb: not
        paused, online, and `matches_build?`). drop_canceling_service.rb: a job
        `canceling` with no update for 30 minutes is dropped (`no_updates_canceling`;
        from canceling, `drop` means `canceled`). With `drop_silent_running`,
        drop_running_service.rb: a job running with no update (trace or state) for 1 hour
        is failed (`no_updates_running`). With `legacy_failure_reasons`, the pending and
        running drops write `stuck_or_timeout_failure` as GitLab did before 19.1.
        """
        now = self.clock()
        dropped: list[SimJob] = []
        served: dict[tuple[frozenset[str], int], bool] = {}  # one answer per tag set and project
        for job in self.pending_jobs():
            waited = min(now - job.created_at, now - job.updated_at)
            key = (job.tags, job.project_id)
            if waited > OUTDATED_AFTER_S:
                reason = LEGACY_STUCK_REASON if self.legacy_failure_reasons else OUTDATED_REASON
            elif waited > STUCK_AFTER_S and not served.setdefault(key, self._any_runner_online_for(job)):
                reason = LEGACY_STUCK_REASON if self.legacy_failure_reasons else STUCK_REASON
            else:
                continue
            dropped.append(self.finish_job(job.id, "failed", failure_reason=reason))
        for job in [j for j in self.jobs.values() if j.status in LIVE]:
            limit = CANCELING_OUTDATED_S if job.status == "canceling" else RUNNING_OUTDATED_S
            if job.status == "running" and not self.drop_silent_running:
                continue
            if now - job.updated_at > limit and now - job.created_at > limit:
                job.failure_reason = (CANCELING_REASON if job.status == "canceling" else
                                      LEGACY_STUCK_REASON if self.legacy_failure_reasons else RUNNING_REASON)
                dropped.append(self.finish_job(job.id, "failed", failure_reason=job.failure_reason))
        return dropped

    def _any_runner_online_for(self, job: SimJob) -> bool:
        return any(not r.paused and self.online(r) and self.serves(r, job) for r in self.runners.values())

    def pending_jobs(self, project_id: int | None = None) -> list[SimJob]:
        ids = sorted(i for queue in self._pending.values() for i in queue)
        return [self.jobs[i] for i in ids if project_id is None or self.jobs[i].project_id == project_id]

    def jobs_of_runner(self, runner_id: int, status: str | None = None) -> list[SimJob]:
        return [j for j in self.jobs.values()
                if j.runner_id == runner_id and (status is None or j.status == status)]

    def project_jobs(self, project_id: int, scopes: Iterable[str] = ()) -> list[SimJob]:
        wanted = set(scopes)
        return sorted((j for j in self.jobs.values() if j.project_id == project_id
                       and (not wanted or j.status in wanted)), key=lambda j: -j.id)

    def job_by_token(self, token: str) -> SimJob | None:
        return next((j for j in self.jobs.values() if token and secrets.compare_digest(j.token, token)), None)

    def _changed(self, job: SimJob) -> None:
        for listener in list(self.listeners):
            listener(job)
