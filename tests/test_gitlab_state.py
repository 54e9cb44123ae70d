"""The simulated GitLab's assignment rule, as GitLab documents it."""

from __future__ import annotations

from runnerctl.sim.gitlab_state import GitLabState


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_job_goes_only_to_runner_whose_tags_cover_it() -> None:
    state = GitLabState(clock=Clock())
    single = state.create_runner(description="s", tags=["gpu", "gpus:1", "host:a"])
    quad = state.create_runner(description="q", tags=["gpus:4", "host:a"])
    job = state.enqueue_job(project_id=1, tags=["gpus:4"])
    assert state.request_job(single.id) is None
    got = state.request_job(quad.id)
    assert got is job and job.status == "running" and job.runner_id == quad.id


def test_paused_runner_gets_nothing_but_is_seen_online() -> None:
    state = GitLabState(clock=Clock())
    runner = state.create_runner(description="r", tags=["gpu"], paused=True)
    state.enqueue_job(project_id=1, tags=["gpu"])
    assert state.request_job(runner.id) is None
    assert state.online(runner)
    state.update_runner(runner.id, paused=False)
    assert state.request_job(runner.id) is not None


def test_untagged_jobs_only_to_run_untagged_runners() -> None:
    state = GitLabState(clock=Clock())
    strict = state.create_runner(description="strict", tags=["gpu"])
    loose = state.create_runner(description="loose", tags=["gpu"], run_untagged=True)
    state.enqueue_job(project_id=1, tags=[])
    assert state.request_job(strict.id) is None
    assert state.request_job(loose.id) is not None


def test_oldest_pending_job_first_across_tag_sets() -> None:
    clock = Clock()
    state = GitLabState(clock=clock)
    runner = state.create_runner(description="r", tags=["gpu", "gpus:1", "priority:high"])
    first = state.enqueue_job(project_id=1, tags=["gpu"])
    clock.now += 1
    second = state.enqueue_job(project_id=1, tags=["gpus:1", "priority:high"])
    assert state.request_job(runner.id) is first
    assert state.request_job(runner.id) is second
    assert state.request_job(runner.id) is None


def test_cancel_pending_and_project_scopes() -> None:
    state = GitLabState(clock=Clock())
    job = state.enqueue_job(project_id=7, tags=["gpus:2"])
    other = state.enqueue_job(project_id=8, tags=["gpus:2"])
    assert [j.id for j in state.project_jobs(7, ["pending"])] == [job.id]
    state.cancel_job(job.id)
    assert state.project_jobs(7, ["pending"]) == []
    assert [j.id for j in state.pending_jobs()] == [other.id]


def test_tokens_are_unique_and_verifiable() -> None:
    state = GitLabState(clock=Clock())
    a = state.create_runner(description="a", tags=[])
    b = state.create_runner(description="b", tags=[])
    assert a.token != b.token and a.token.startswith("glrt-")
    assert state.runner_by_token(b.token) is b
    assert state.runner_by_token("glrt-nope") is None
