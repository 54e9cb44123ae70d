"""Demand with no hand-written project list: the projects the runners serve are read
from GitLab, every one of them is polled within the API budget, and a job event is a
reason to look, never a source of tags. Against the HTTP GitLab through python-gitlab."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from runnerctl.controller.demand import ApiBudget, DemandTracker
from runnerctl.gitlab import JobInfo, PythonGitLab, RunnerScope
from runnerctl.sim.gitlab_server import GitLabServer
from runnerctl.sim.world import VirtualClock as Clock
from tests.conftest import ADMIN_TOKEN


@pytest.fixture
def gl(gitlab_server: GitLabServer) -> Iterator[PythonGitLab]:
    yield PythonGitLab(gitlab_server.url, ADMIN_TOKEN)


def _tracker(clock: Clock, *, runner_ids: tuple[int, ...] = (), projects: tuple[int, ...] = (),
             per_min: int = 12, wakes: list[int] | None = None, active_window_s: float = 3600.0,
             ) -> DemandTracker:
    return DemandTracker(projects=projects, priorities={}, budget=ApiBudget(per_min, clock), clock=clock,
                         runner_ids=runner_ids, secret="s3cret", active_window_s=active_window_s,
                         on_demand=lambda: wakes.append(1) if wakes is not None else None)


def _run(tracker: DemandTracker, gl: PythonGitLab, clock: Clock, seconds: float, step: float = 5.0) -> None:
    end = clock.now + seconds
    while clock.now < end:
        tracker.poll(gl)
        clock.now += step


def test_project_runners_projects_are_polled_without_a_project_list(gitlab_server: GitLabServer,
                                                                    gl: PythonGitLab) -> None:
    clock = Clock()
    runner = gl.create_runner(description="r", tags=["gpus:8"], paused=True,
                              scope=RunnerScope("project_type", project_id=5))
    job = gitlab_server.state.enqueue_job(project_id=5, tags=["gpus:8", "priority:high"])
    gitlab_server.state.enqueue_job(project_id=5, tags=["cpu"])  # asks for no GPU: no demand
    tracker = _tracker(clock, runner_ids=(runner.id,))
    _run(tracker, gl, clock, 30)
    assert tracker.projects == [5]
    assert [(j.job_id, j.gpus, j.priority) for j in tracker.jobs] == [(job.id, 8, "high")]


def test_instance_runners_warn_once_and_poll_what_webhooks_name(gitlab_server: GitLabServer, gl: PythonGitLab,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    runner = gl.create_runner(description="r", tags=["gpus:2"], paused=True, scope=RunnerScope())
    tracker = _tracker(clock, runner_ids=(runner.id,))
    with caplog.at_level("WARNING"):
        _run(tracker, gl, clock, 2000, step=30.0)
    assert tracker.projects == []
    assert sum("no instance-wide list" in r.getMessage() for r in caplog.records) == 1


def test_quiet_projects_are_still_polled_within_the_budget(gitlab_server: GitLabServer,
                                                           gl: PythonGitLab) -> None:
    """A project with no activity for hours is polled less often, never dropped: the
    first gpus:8 job pushed there after a quiet afternoon is seen."""
    clock = Clock()
    busy = [gitlab_server.state.enqueue_job(project_id=5, tags=["gpus:1"]) for _ in range(3)]
    tracker = _tracker(clock, projects=(5, 6, 7), active_window_s=300.0, per_min=6)
    _run(tracker, gl, clock, 900)
    start = len(gitlab_server.requests)
    late = gitlab_server.state.enqueue_job(project_id=7, tags=["gpus:8"])
    _run(tracker, gl, clock, 600)
    assert late.id in {j.job_id for j in tracker.jobs} and busy[0].id in {j.job_id for j in tracker.jobs}
    polled = [r.path for r in gitlab_server.requests[start:]]
    assert polled.count("/projects/5/jobs") > polled.count("/projects/6/jobs") >= 1  # busy first
    assert len(polled) <= 6 * 10 + 1  # 6 a minute, plus the bucket's burst


def test_a_job_event_is_a_reason_to_look_never_a_source_of_tags(gitlab_server: GitLabServer,
                                                                 gl: PythonGitLab) -> None:
    """GitLab's job event has no job tags (lib/gitlab/data_builder/build.rb): a pending
    job's event wakes the loop and the job is read from GitLab; a field claiming tags is
    not believed."""
    clock, wakes = Clock(), []
    tracker = _tracker(clock, projects=(5,), wakes=wakes)
    _run(tracker, gl, clock, 60)  # the first polls: nothing pending
    job = gitlab_server.state.enqueue_job(project_id=5, tags=["gpus:2"])
    event = {"object_kind": "build", "build_id": job.id, "build_status": "pending", "project_id": 5,
             "build_name": "train", "build_stage": "test", "runner": None,
             "build_tags": ["gpus:8"]}  # no GitLab sends this: ignored
    assert not tracker.webhook("wrong", event) and not wakes
    assert tracker.webhook("s3cret", event) and wakes == [1]
    assert tracker.jobs == []  # nothing is believed before GitLab is asked
    start = len(gitlab_server.requests)
    tracker.poll(gl)
    assert [r.path for r in gitlab_server.requests[start:]] == [f"/projects/5/jobs/{job.id}"]
    assert [(j.job_id, j.gpus) for j in tracker.jobs] == [(job.id, 2)]
    running = dict(event, build_status="running")
    assert tracker.webhook("s3cret", running) and tracker.jobs == [] and wakes == [1]


def test_a_burst_of_events_in_one_project_is_one_poll(gitlab_server: GitLabServer, gl: PythonGitLab) -> None:
    clock = Clock()
    tracker = _tracker(clock, projects=(5,))
    jobs = [gitlab_server.state.enqueue_job(project_id=5, tags=["gpus:4"]) for _ in range(20)]
    for job in jobs:
        tracker.webhook("s3cret", {"object_kind": "build", "build_id": job.id, "build_status": "pending",
                                   "project_id": 5})
    start = len(gitlab_server.requests)
    tracker.poll(gl)
    assert [r.path for r in gitlab_server.requests[start:]] == ["/projects/5/jobs"]
    assert sorted(j.job_id for j in tracker.jobs) == sorted(j.id for j in jobs)


def test_group_runners_poll_the_group_and_its_subgroups_projects(gitlab_server: GitLabServer,
                                                                 gl: PythonGitLab) -> None:
    """`runnerctl init --group G` then `serve`: a gpus:8 job in any project of G (also in
    a subgroup) is seen; a project outside G is never polled."""
    directory = gitlab_server.state.directory
    group = directory.add_group("ml")
    sub = directory.add_group("vision", parent_id=group.id)
    mine = [directory.add_project("a", group_id=group.id), directory.add_project("b", group_id=sub.id)]
    other = directory.add_project("elsewhere", group_id=directory.add_group("ops").id)
    runner = gl.create_runner(description="r", tags=["gpus:8"], paused=True,
                              scope=RunnerScope("group_type", group_id=group.id))
    deep = gitlab_server.state.enqueue_job(project_id=mine[1].id, tags=["gpus:8"])
    gitlab_server.state.enqueue_job(project_id=other.id, tags=["gpus:8"])
    clock = Clock()
    tracker = _tracker(clock, runner_ids=(runner.id,))
    _run(tracker, gl, clock, 60)
    assert sorted(tracker.projects) == sorted(p.id for p in mine)
    assert [j.job_id for j in tracker.jobs] == [deep.id]
    assert not [r for r in gitlab_server.requests if r.path == f"/projects/{other.id}/jobs"]
    late = directory.add_project("c", group_id=group.id)  # found at the next discovery (15 min)
    job = gitlab_server.state.enqueue_job(project_id=late.id, tags=["gpus:2"])
    _run(tracker, gl, clock, 1200, step=10.0)
    assert job.id in {j.job_id for j in tracker.jobs}


class _Queue:
    """Only what the tracker asks for a project override: its pending jobs (one page)."""

    def __init__(self, jobs: list[JobInfo]) -> None:
        self.jobs = jobs

    def pending_jobs(self, project_id: int) -> list[JobInfo]:
        return list(self.jobs)


def test_a_job_of_unknown_age_counts_from_when_it_was_first_seen() -> None:
    """Issue 15: a missing or unreadable `created_at` was 0 (1970), which put the job ahead
    of every job that really waited."""
    clock = Clock(1_000_000.0)
    old = JobInfo(1, 5, "pending", ("gpus:2",), "1970-01-12T13:30:00Z", None, None)  # 999 000 s
    odd = JobInfo(2, 5, "pending", ("gpus:2",), None, None, None)
    bad = JobInfo(3, 5, "pending", ("gpus:2",), "yesterday", None, None)
    queue = _Queue([odd, old])
    tracker = _tracker(clock, projects=(5,))
    tracker.poll(queue)  # type: ignore[arg-type]
    clock.now += 600.0
    queue.jobs = [odd, old, bad]
    tracker.poll(queue)  # type: ignore[arg-type]
    ages = {j.job_id: j.created_at for j in tracker.jobs}
    assert ages == {1: 999_000.0, 2: 1_000_000.0, 3: 1_000_600.0}  # odd keeps its first sighting
    assert [j.job_id for j in tracker.jobs] == [1, 2, 3]


def _build(project: int, job_id: int, status: str) -> dict[str, object]:
    return {"object_kind": "build", "project_id": project, "build_id": job_id, "build_status": status}


def test_a_job_that_started_while_gitlab_was_read_is_not_brought_back(gitlab_server: GitLabServer,
                                                                     gl: PythonGitLab) -> None:
    """The look's request went out while the job was pending; its "running" webhook came
    before the answer, which then put it back as pending: a host could drain a block for
    a job already running (found by a review as a concurrency engineer)."""
    clock = Clock()
    job = gitlab_server.state.enqueue_job(project_id=5, tags=["gpus:8"])
    tracker = _tracker(clock, projects=(5,))

    class Racing:  # the webhook arrives while GitLab answers
        def __getattr__(self, name: str) -> object:
            return getattr(gl, name)

        def job(self, project: int, job_id: int) -> JobInfo | None:
            found = gl.job(project, job_id)
            assert tracker.webhook("s3cret", _build(project, job_id, "running"))
            return found

        def pending_jobs(self, project: int) -> list[JobInfo]:
            found = gl.pending_jobs(project)
            assert tracker.webhook("s3cret", _build(project, job.id, "running"))
            return found

    assert tracker.webhook("s3cret", _build(5, job.id, "pending"))
    tracker.poll(Racing())  # type: ignore[arg-type]
    assert tracker.jobs == []
    clock.now += 600
    tracker.poll(Racing())  # type: ignore[arg-type]  # a whole project's poll races alike
    assert tracker.jobs == []


def test_a_look_emptied_by_a_webhook_just_before_is_no_error(gitlab_server: GitLabServer,
                                                             gl: PythonGitLab) -> None:
    """`poll` checked for looks outside its lock: a webhook that emptied them in between
    made `next(iter({}))` end the tick with StopIteration."""
    clock = Clock()
    tracker = _tracker(clock, projects=(5,))
    assert tracker.webhook("s3cret", _build(5, 77, "pending"))
    take = tracker.budget.try_take

    def racing_take(count: float = 1.0) -> bool:
        tracker.webhook("s3cret", _build(5, 77, "running"))  # empties the looks
        return take(count)

    tracker.budget.try_take = racing_take  # type: ignore[method-assign]
    tracker.poll(gl)  # no StopIteration
    assert tracker.jobs == []


def test_a_project_only_a_webhook_named_that_gitlab_hides_is_dropped_once(
        gitlab_server: GitLabServer, gl: PythonGitLab, caplog: pytest.LogCaptureFixture) -> None:
    """A job event from a project the token cannot see (404: another GitLab's hook, a project
    deleted since) kept it polled for ever, and each 404 failed the whole GitLab step:
    health flapped and real projects were polled half as often (found by a review hunting
    leaks in a long-running serve). It is dropped with one warning; a served project's
    404 still goes to the loop."""
    from runnerctl.errors import NotFoundError

    clock = Clock()
    tracker = _tracker(clock, projects=(5,))
    _run(tracker, gl, clock, 30)
    gitlab_server.state.directory.strict = True  # from here an unknown project is 404, as in GitLab
    event = {"object_kind": "build", "build_id": 999_999, "build_status": "pending", "project_id": 4242}
    assert tracker.webhook("s3cret", event) and 4242 in tracker.projects
    with caplog.at_level("WARNING"):
        _run(tracker, gl, clock, 600)  # raises if a 404 went out of poll
    assert tracker.projects == [5]
    assert sum("project 4242, named by a webhook" in r.getMessage() for r in caplog.records) == 1
    hidden = _tracker(clock, projects=(4242,))
    with pytest.raises(NotFoundError):
        _run(hidden, gl, clock, 60)


def test_a_late_created_event_does_not_drop_a_pending_job(gitlab_server: GitLabServer,
                                                          gl: PythonGitLab) -> None:
    """GitLab sends each job event from its own Sidekiq job, and the pipeline's `created`
    events from a worker that may run a minute late (Ci::ExecutePipelineBuildHooksWorker):
    a `created` after `pending` dropped the job from the demand for five minutes (found
    by a review as a webhook integration engineer)."""
    clock = Clock()
    tracker = _tracker(clock, projects=(5,))
    job = gitlab_server.state.enqueue_job(project_id=5, tags=["gpus:4"])
    event = {"object_kind": "build", "build_id": job.id, "project_id": 5}
    assert tracker.webhook("s3cret", {**event, "build_status": "pending"})
    tracker.poll(gl)
    assert [j.job_id for j in tracker.jobs] == [job.id]
    for early in ("created", "preparing", "waiting_for_resource"):
        assert tracker.webhook("s3cret", {**event, "build_status": early})
    assert [j.job_id for j in tracker.jobs] == [job.id]
    assert tracker.webhook("s3cret", {**event, "build_status": "running"}) and tracker.jobs == []


def test_one_projects_hook_holds_no_other_project_back(gitlab_server: GitLabServer, gl: PythonGitLab) -> None:
    """A fresh job event made every project wait `webhook_fresh_s` between polls, even one
    without a hook (or whose hook GitLab disabled), and any event at all counted, a
    pipeline event too (found by a review as a webhook integration engineer)."""
    clock = Clock()
    tracker = _tracker(clock, projects=(5, 6), per_min=60)
    _run(tracker, gl, clock, 30)
    tracker.webhook("s3cret", {"object_kind": "build", "build_id": 999_999, "build_status": "running",
                               "project_id": 6})
    tracker.webhook("s3cret", {"object_kind": "pipeline", "project_id": 5})
    job = gitlab_server.state.enqueue_job(project_id=5, tags=["gpus:4"])
    _run(tracker, gl, clock, 60)
    assert [j.job_id for j in tracker.jobs] == [job.id]  # project 5 is polled as before
    start = len(gitlab_server.requests)
    _run(tracker, gl, clock, 120)
    asked = [r.path for r in gitlab_server.requests[start:]]
    assert "/projects/6/jobs" not in asked  # its own events keep it to the slow safety net


def test_a_secret_with_letters_beyond_ascii_is_the_same_secret() -> None:
    """Starlette decodes header bytes as latin-1, so a secret GitLab sent as UTF-8 never
    matched, and every delivery counted a failure toward disabling the hook."""
    tracker = DemandTracker(projects=(5,), priorities={}, budget=ApiBudget(12, Clock()), clock=Clock(),
                            secret="pässwort")
    assert tracker.refusal("pässwort".encode().decode("latin-1")) == ""
    assert tracker.refusal("passwort") != ""


@pytest.mark.parametrize("tags", [["gpu", "gpus:8"], ["gpus:2", "gpus:8"], ["gpus:08"],
                                  ["gpus:8", "priority:urgent"], ["gpus:8", "host:gpu-b", "host:gpu-a"]])
def test_a_job_no_runner_of_the_host_can_take_is_no_demand_there(tags: list[str]) -> None:
    """GitLab gives a job only to a runner with every one of its tags: a job tagged `gpu`
    and `gpus:8` counted as an 8-GPU job, no runner ever took it, and its host stayed
    drained for a day until GitLab dropped it (found by a review as a hostile CI job
    author)."""
    from runnerctl.controller.demand import pending_job

    job = JobInfo(id=70, project_id=5, status="pending", tags=tuple(tags), created_at=None, user=None,
                  web_url=None)
    pending = pending_job(job, project_id=5, priorities={}, seen_at=0.0, now=0.0)
    assert pending is not None and not pending.takes("gpu-a") and not pending.takes("gpu-b")
    fine = pending_job(JobInfo(71, 5, "pending", ("gpus:8", "priority:high", "host:gpu-a"), None, None, None),
                       project_id=5, priorities={}, seen_at=0.0, now=0.0)
    assert fine is not None and fine.takes("gpu-a") and not fine.takes("gpu-b")
    single = pending_job(JobInfo(72, 5, "pending", ("gpus:1",), None, None, None),
                         project_id=5, priorities={}, seen_at=0.0, now=0.0)
    assert single is not None and single.takes("gpu-a")
