"""GitLab's runners, jobs and job assignment, in memory, for the simulator and the HTTP fake.

Why: GitLab cannot run on these machines, yet runnerctl's decisions only make sense
against GitLab's real rules for who gets which job. This module holds that state with no
I/O and no threads; time comes from an injected clock, so the simulator can drive it
with a virtual clock and `gitlab_http.GitLabHttpServer` can serve it over REST.

Contract followed (sources):
- docs.gitlab.com/api/users/#create-a-runner-linked-to-a-user: `POST /user/runners`
  takes runner_type (instance_type|group_type|project_type), group_id/project_id,
  description, paused, locked, run_untagged, tag_list, maximum_timeout; it answers
  {id, token, token_expires_at} and the `glrt-` token is shown only then.
- docs.gitlab.com/api/runners: list/get/update/delete, `status` is online (contact in
  the last 2 hours), offline, stale (no contact for 7 days, or never contacted and
  created over 7 days ago) or never_contacted; `POST /runners/verify` checks a runner
  token (system_id is documented as required for glrt- tokens; this model enforces it).
- docs.gitlab.com/ci/runners/configure_runners (tags): a runner takes a job only if the
  job's tags are a subset of its tags; an untagged job only if `run_untagged`; paused
  runners get nothing. Group/project runners take jobs in FIFO order.
- docs.gitlab.com/ci/runners/runners_scope ("How instance runners pick jobs"): instance
  runners use a fair usage queue, the project with the fewest jobs running on instance
  runners first (`fair_instance_queue`, on by default), then the oldest job.
- docs.gitlab.com/api/jobs: job fields and scopes (pending, running, success, ...).
- docs.gitlab.com/api/members: `GET /groups/:id/members/all/:user_id` access levels.

Speed: `request_job` is called ~100k times with ~300 runners and up to 10k jobs. Pending
jobs are indexed by (tag set, project) in heaps, and each runner's eligible tag sets are
cached, so a poll looks only at queue heads it may take.

Not modelled: protected refs (access_level), `locked` project assignment, maximum_timeout
enforcement, sub-group inheritance. A project whose group is unknown (`add_project` not
called) is treated as inside every group.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
import secrets
import string
import time
from collections.abc import Callable, Iterable

Clock = Callable[[], float]
RUNNER_TYPES = ("instance_type", "group_type", "project_type")
JOB_STATUSES = ("pending", "running", "success", "failed", "canceled")
FINAL_STATUSES = frozenset({"success", "failed", "canceled"})
ONLINE_WINDOW_S = 2 * 3600.0
STALE_AFTER_S = 7 * 86400.0


class ModelError(Exception):
    """A request GitLab would refuse; `status` is the HTTP code it would answer."""

    status = 400


class BadRequest(ModelError):
    status = 400


class Forbidden(ModelError):
    status = 403


class NotFound(ModelError):
    status = 404


@dataclasses.dataclass
class User:
    id: int
    username: str
    name: str
    is_admin: bool = False


@dataclasses.dataclass
class Runner:
    id: int
    description: str
    runner_type: str
    group_id: int | None
    project_id: int | None
    tag_list: frozenset[str]
    run_untagged: bool
    locked: bool
    paused: bool
    maximum_timeout: int | None
    token: str
    token_expires_at: float | None
    created_at: float
    contacted_at: float | None = None
    system_ids: set[str] = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class Job:
    id: int
    project_id: int
    name: str
    stage: str
    ref: str
    status: str
    tag_list: frozenset[str]
    created_at: float
    user: User
    pipeline_id: int
    web_url: str
    started_at: float | None = None
    finished_at: float | None = None
    runner_id: int | None = None
    queued_duration: float | None = None
    """Fixed when the job starts; while pending use `GitLabModel.queued_duration`."""


_HeapItem = tuple[float, int]  # (created_at, job id): oldest first


class GitLabModel:
    """In-memory GitLab. Not thread-safe: the HTTP server wraps it in one lock."""

    def __init__(self, clock: Clock = time.time, *, base_url: str = "https://gitlab.example.com",
                 fair_instance_queue: bool = True, rng: random.Random | None = None) -> None:
        self.clock = clock
        self.base_url = base_url.rstrip("/")
        self.fair_instance_queue = fair_instance_queue
        self._rng = rng
        self.users: dict[int, User] = {}
        self.runners: dict[int, Runner] = {}
        self.jobs: dict[int, Job] = {}
        self.project_groups: dict[int, int] = {}
        self.members: dict[tuple[int, int], int] = {}  # (group id, user id) -> access level
        self._user_ids = itertools.count(1)
        self._runner_ids = itertools.count(1)
        self._job_ids = itertools.count(1)
        self._pipeline_ids = itertools.count(1)
        # pending jobs: tag set -> project id -> heap of (created_at, job id)
        self._pending: dict[frozenset[str], dict[int, list[_HeapItem]]] = {}
        self._eligible: dict[tuple[frozenset[str], bool], list[frozenset[str]]] = {}
        self._runner_jobs: dict[int, list[int]] = {}
        self._project_jobs: dict[int, list[int]] = {}
        self._instance_running: dict[int, int] = {}  # project id -> jobs on instance runners

    # -- users, projects, groups -------------------------------------------------------
    def add_user(self, username: str, *, name: str | None = None, is_admin: bool = False) -> User:
        """The user called `username`, created on first use."""
        for user in self.users.values():
            if user.username == username:
                return user
        user = User(next(self._user_ids), username, name or username, is_admin)
        self.users[user.id] = user
        return user

    def add_project(self, project_id: int, *, group_id: int) -> None:
        """Put a project in a group, so group runners of other groups skip its jobs."""
        self.project_groups[project_id] = group_id

    def add_member(self, group_id: int, user_id: int, access_level: int) -> None:
        self.members[(group_id, user_id)] = access_level

    def get_member(self, group_id: int, user_id: int) -> tuple[User, int]:
        """(user, access level) of a member of a group, or NotFound."""
        level = self.members.get((group_id, user_id))
        if level is None or user_id not in self.users:
            raise NotFound("404 Not found")
        return self.users[user_id], level

    # -- runners -----------------------------------------------------------------------
    def create_runner(self, *, runner_type: str = "instance_type", group_id: int | None = None,
                      project_id: int | None = None, description: str = "",
                      tag_list: Iterable[str] = (), run_untagged: bool = True, locked: bool = False,
                      paused: bool = False, maximum_timeout: int | None = None,
                      token_expires_at: float | None = None) -> tuple[Runner, str]:
        """Create a runner; the token is returned here and never shown again by the API."""
        tags = _tags(tag_list)
        if runner_type not in RUNNER_TYPES:
            raise BadRequest("runner_type does not have a valid value")
        if runner_type == "group_type" and group_id is None:
            raise BadRequest("group_id is missing")
        if runner_type == "project_type" and project_id is None:
            raise BadRequest("project_id is missing")
        if runner_type == "instance_type" and (group_id is not None or project_id is not None):
            raise BadRequest("instance runners take no group_id or project_id")
        if not tags and not run_untagged:
            raise BadRequest("Tags list can not be empty when runner is not allowed to pick untagged jobs")
        runner = Runner(
            id=next(self._runner_ids), description=description, runner_type=runner_type,
            group_id=group_id if runner_type == "group_type" else None,
            project_id=project_id if runner_type == "project_type" else None,
            tag_list=tags, run_untagged=run_untagged, locked=locked, paused=paused,
            maximum_timeout=maximum_timeout, token="glrt-" + self._random_token(),
            token_expires_at=token_expires_at, created_at=self.clock())
        self.runners[runner.id] = runner
        self._runner_jobs[runner.id] = []
        return runner, runner.token

    def list_runners(self, *, runner_type: str | None = None, paused: bool | None = None,
                     status: str | None = None, tag_list: Iterable[str] | None = None) -> list[Runner]:
        """Runners by id; `status` is online|offline|stale|never_contacted (or the
        deprecated active|paused); `tag_list` keeps runners having all those tags."""
        wanted = _tags(tag_list or ())
        out = []
        for runner in self.runners.values():
            if runner_type is not None and runner.runner_type != runner_type:
                continue
            if paused is not None and runner.paused != paused:
                continue
            if status in ("active", "paused"):
                if runner.paused != (status == "paused"):
                    continue
            elif status is not None and self.runner_status(runner) != status:
                continue
            if not wanted <= runner.tag_list:
                continue
            out.append(runner)
        return sorted(out, key=lambda r: r.id)

    def get_runner(self, runner_id: int) -> Runner:
        runner = self.runners.get(runner_id)
        if runner is None:
            raise NotFound("404 Not found")
        return runner

    def update_runner(self, runner_id: int, *, paused: bool | None = None,
                      tag_list: Iterable[str] | None = None, description: str | None = None,
                      run_untagged: bool | None = None, locked: bool | None = None,
                      maximum_timeout: int | None = None) -> Runner:
        runner = self.get_runner(runner_id)
        tags = runner.tag_list if tag_list is None else _tags(tag_list)
        untagged = runner.run_untagged if run_untagged is None else run_untagged
        if not tags and not untagged:
            raise BadRequest("Tags list can not be empty when runner is not allowed to pick untagged jobs")
        runner.tag_list, runner.run_untagged = tags, untagged
        if paused is not None:
            runner.paused = paused
        if description is not None:
            runner.description = description
        if locked is not None:
            runner.locked = locked
        if maximum_timeout is not None:
            runner.maximum_timeout = maximum_timeout
        return runner

    def delete_runner(self, runner_id: int) -> None:
        """Forget a runner. Its running jobs keep their runner_id, as in GitLab."""
        self.get_runner(runner_id)
        del self.runners[runner_id]

    def verify_runner(self, token: str, system_id: str | None = None) -> Runner:
        """`POST /runners/verify`: the runner a valid, unexpired token belongs to.
        Counts as contact (the runner shows online), like a runner's first check-in."""
        if not token:
            raise BadRequest("token is missing")
        if token.startswith("glrt-") and not system_id:
            raise BadRequest("system_id is missing")
        runner = next((r for r in self.runners.values() if secrets.compare_digest(r.token, token)), None)
        now = self.clock()
        if runner is None or (runner.token_expires_at is not None and runner.token_expires_at <= now):
            raise Forbidden("403 Forbidden")
        if system_id:
            runner.system_ids.add(system_id)
        runner.contacted_at = now
        return runner

    def is_online(self, runner: Runner) -> bool:
        return runner.contacted_at is not None and self.clock() - runner.contacted_at < ONLINE_WINDOW_S

    def runner_status(self, runner: Runner) -> str:
        now = self.clock()
        if runner.contacted_at is None:
            return "stale" if now - runner.created_at > STALE_AFTER_S else "never_contacted"
        age = now - runner.contacted_at
        return "online" if age < ONLINE_WINDOW_S else "stale" if age > STALE_AFTER_S else "offline"

    # -- jobs --------------------------------------------------------------------------
    def enqueue_job(self, project_id: int, tags: Iterable[str] = (), name: str = "job",
                    user: str | User = "user", *, pipeline_id: int | None = None,
                    stage: str = "test", ref: str = "main", created_at: float | None = None) -> Job:
        """A new pending job (a pipeline of one unless `pipeline_id` is given)."""
        owner = user if isinstance(user, User) else self.add_user(user)
        job_id = next(self._job_ids)
        job = Job(id=job_id, project_id=project_id, name=name, stage=stage, ref=ref, status="pending",
                  tag_list=_tags(tags), created_at=self.clock() if created_at is None else created_at,
                  user=owner, pipeline_id=pipeline_id or next(self._pipeline_ids),
                  web_url=f"{self.base_url}/project-{project_id}/-/jobs/{job_id}")
        self.jobs[job.id] = job
        self._project_jobs.setdefault(project_id, []).append(job.id)
        if job.tag_list not in self._pending:
            self._pending[job.tag_list] = {}
            self._eligible.clear()  # a new tag set: recompute which runners may take it
        heapq.heappush(self._pending[job.tag_list].setdefault(project_id, []), (job.created_at, job.id))
        return job

    def get_job(self, job_id: int) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise NotFound("404 Not found")
        return job

    def request_job(self, runner_id: int) -> Job | None:
        """A runner's poll: marks contact, then hands over the job GitLab would pick
        (now running on this runner), or None. Unknown runners and expired tokens get None."""
        runner = self.runners.get(runner_id)
        now = self.clock()
        if runner is None or (runner.token_expires_at is not None and runner.token_expires_at <= now):
            return None
        runner.contacted_at = now
        if runner.paused:
            return None
        fair = self.fair_instance_queue and runner.runner_type == "instance_type"
        best: tuple[int, float, int] | None = None
        best_heap: list[_HeapItem] | None = None
        for tags in self._eligible_tag_sets(runner):
            for project_id, heap in self._pending[tags].items():
                if not self._in_scope(runner, project_id):
                    continue
                created, job_id = heap[0]
                key = (self._instance_running.get(project_id, 0) if fair else 0, created, job_id)
                if best is None or key < best:
                    best, best_heap = key, heap
        if best is None or best_heap is None:
            return None
        job = self.jobs[best[2]]
        self._unqueue(job)
        job.status, job.runner_id, job.started_at = "running", runner.id, now
        job.queued_duration = max(0.0, now - job.created_at)
        self._runner_jobs[runner.id].append(job.id)
        if runner.runner_type == "instance_type":
            self._instance_running[job.project_id] = self._instance_running.get(job.project_id, 0) + 1
        return job

    def finish_job(self, job_id: int, status: str = "success") -> Job:
        """End a job: running -> success|failed|canceled, pending -> failed|canceled."""
        job = self.get_job(job_id)
        if status not in FINAL_STATUSES:
            raise BadRequest(f"not a final status: {status}")
        if job.status in FINAL_STATUSES or (job.status == "pending" and status == "success"):
            raise BadRequest(f"job {job_id} is {job.status}, cannot become {status}")
        if job.status == "pending":
            self._unqueue(job)
        elif job.runner_id is not None and job.runner_id in self.runners \
                and self.runners[job.runner_id].runner_type == "instance_type":
            self._instance_running[job.project_id] -= 1
        job.status, job.finished_at = status, self.clock()
        return job

    def cancel_job(self, job_id: int) -> Job:
        """Cancel a pending or running job; a finished job is returned unchanged."""
        job = self.get_job(job_id)
        return job if job.status in FINAL_STATUSES else self.finish_job(job_id, "canceled")

    def queued_duration(self, job: Job) -> float:
        """Seconds the job waited (or has waited so far) for a runner."""
        if job.queued_duration is not None:
            return job.queued_duration
        return max(0.0, self.clock() - job.created_at)

    def runner_jobs(self, runner_id: int, status: str | None = None) -> list[Job]:
        """Jobs a runner has taken, newest first, optionally of one status."""
        self.get_runner(runner_id)
        jobs = (self.jobs[i] for i in reversed(self._runner_jobs[runner_id]))
        return [j for j in jobs if status is None or j.status == status]

    def project_jobs(self, project_id: int, scopes: Iterable[str] = ()) -> list[Job]:
        """A project's jobs, newest first; `scopes` keeps those in any given status."""
        wanted = frozenset(scopes)
        jobs = (self.jobs[i] for i in reversed(self._project_jobs.get(project_id, [])))
        return [j for j in jobs if not wanted or j.status in wanted]

    def pending_jobs(self) -> list[Job]:
        """Every pending job, oldest first."""
        items = sorted(item for by_project in self._pending.values()
                       for heap in by_project.values() for item in heap)
        return [self.jobs[job_id] for _, job_id in items]

    # -- internals ---------------------------------------------------------------------
    def _eligible_tag_sets(self, runner: Runner) -> list[frozenset[str]]:
        key = (runner.tag_list, runner.run_untagged)
        cached = self._eligible.get(key)
        if cached is None:
            cached = [tags for tags in self._pending
                      if tags <= runner.tag_list and (tags or runner.run_untagged)]
            self._eligible[key] = cached
        return cached

    def _in_scope(self, runner: Runner, project_id: int) -> bool:
        if runner.runner_type == "project_type":
            return project_id == runner.project_id
        if runner.runner_type == "group_type":
            group = self.project_groups.get(project_id)
            return group is None or group == runner.group_id
        return True

    def _unqueue(self, job: Job) -> None:
        by_project = self._pending[job.tag_list]
        heap = by_project[job.project_id]
        item = (job.created_at, job.id)
        if heap[0] == item:
            heapq.heappop(heap)
        else:
            heap.remove(item)
            heapq.heapify(heap)
        if not heap:
            del by_project[job.project_id]

    def _random_token(self) -> str:
        if self._rng is None:
            return secrets.token_urlsafe(15)
        alphabet = string.ascii_letters + string.digits + "-_"
        return "".join(self._rng.choice(alphabet) for _ in range(20))


def _tags(values: Iterable[str] | str) -> frozenset[str]:
    """Tags from a list or a comma-separated string, stripped, empty ones dropped."""
    items = values.split(",") if isinstance(values, str) else values
    return frozenset(t.strip() for t in items if t and t.strip())
