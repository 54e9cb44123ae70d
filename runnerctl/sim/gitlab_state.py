"""GitLab's runners and jobs, in memory, with GitLab's job assignment rule.

Used by the simulator (virtual clock, no I/O) and, through `gitlab_server`, as an HTTP
GitLab that python-gitlab talks to in the demo and tests.

Contract followed (docs.gitlab.com/api/runners, /api/jobs; docs.gitlab.com/ci/runners
"Use tags to control which jobs a runner can run"): a runner picks up a pending job
only if it is not paused, and the job's tags are a subset of the runner's tags; an
untagged job goes only to a runner with `run_untagged`. Pending jobs are handed out
oldest first. A runner token (`glrt-...`) is returned once, at creation.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import secrets
import time
from collections.abc import Callable, Iterable

Clock = Callable[[], float]
ONLINE_WINDOW_S = 7200.0
"""GitLab shows a runner online if it contacted GitLab in the last 2 hours."""


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


class GitLabState:
    def __init__(self, *, clock: Clock = time.time, base_url: str = "http://gitlab.sim") -> None:
        self.clock = clock
        self.base_url = base_url
        self.runners: dict[int, SimRunner] = {}
        self.jobs: dict[int, SimJob] = {}
        self._ids = itertools.count(1)
        self._job_ids = itertools.count(1000)
        # pending job ids by tag set, each queue oldest first
        self._pending: dict[frozenset[str], collections.deque[int]] = {}

    # -- runners -----------------------------------------------------------------
    def create_runner(self, *, description: str, tags: Iterable[str], paused: bool = False,
                      runner_type: str = "instance_type", group_id: int | None = None,
                      project_id: int | None = None, run_untagged: bool = False,
                      locked: bool = True, maximum_timeout: int | None = None) -> SimRunner:
        runner = SimRunner(
            id=next(self._ids), description=description, runner_type=runner_type,
            tags=frozenset(tags), paused=paused, token="glrt-" + secrets.token_urlsafe(15),
            created_at=self.clock(), group_id=group_id, project_id=project_id,
            run_untagged=run_untagged, locked=locked, maximum_timeout=maximum_timeout,
        )
        self.runners[runner.id] = runner
        return runner

    def update_runner(self, runner_id: int, *, paused: bool | None = None,
                      tags: Iterable[str] | None = None, description: str | None = None) -> SimRunner:
        runner = self.runners[runner_id]
        if paused is not None:
            runner.paused = paused
        if tags is not None:
            runner.tags = frozenset(tags)
        if description is not None:
            runner.description = description
        return runner

    def delete_runner(self, runner_id: int) -> None:
        del self.runners[runner_id]

    def runner_by_token(self, token: str) -> SimRunner | None:
        return next((r for r in self.runners.values() if secrets.compare_digest(r.token, token)), None)

    def online(self, runner: SimRunner) -> bool:
        return runner.contacted_at is not None and self.clock() - runner.contacted_at < ONLINE_WINDOW_S

    # -- jobs --------------------------------------------------------------------
    def enqueue_job(self, *, project_id: int, tags: Iterable[str], name: str = "job",
                    user: str = "user", pipeline_id: int | None = None) -> SimJob:
        job = SimJob(id=next(self._job_ids), project_id=project_id, name=name, tags=frozenset(tags),
                     created_at=self.clock(), user=user, pipeline_id=pipeline_id or 0)
        if not job.pipeline_id:
            job.pipeline_id = job.id
        self.jobs[job.id] = job
        self._pending.setdefault(job.tags, collections.deque()).append(job.id)
        return job

    def web_url(self, job: SimJob) -> str:
        return f"{self.base_url}/p{job.project_id}/-/jobs/{job.id}"

    def owner(self, job_id: int) -> tuple[str, str] | None:
        """(user, link) of a job, as the executor's lease records them."""
        job = self.jobs.get(job_id)
        return None if job is None else (job.user, self.web_url(job))

    def request_job(self, runner_id: int) -> SimJob | None:
        """What a runner's poll gets: the oldest pending job it may run, now running."""
        runner = self.runners.get(runner_id)
        if runner is None:
            return None
        runner.contacted_at = self.clock()
        if runner.paused:
            return None
        best: tuple[int, frozenset[str]] | None = None
        for tags, queue in self._pending.items():
            if not queue or not tags <= runner.tags or (not tags and not runner.run_untagged):
                continue
            if best is None or queue[0] < best[0]:
                best = (queue[0], tags)
        if best is None:
            return None
        self._pending[best[1]].popleft()
        job = self.jobs[best[0]]
        job.status, job.runner_id, job.started_at = "running", runner_id, self.clock()
        return job

    def finish_job(self, job_id: int, status: str = "success") -> SimJob:
        job = self.jobs[job_id]
        if job.status == "pending":
            self._pending[job.tags].remove(job_id)
        job.status, job.finished_at = status, self.clock()
        return job

    def cancel_job(self, job_id: int) -> SimJob:
        return self.finish_job(job_id, "canceled")

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
