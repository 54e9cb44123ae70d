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


# -- GitLab's drop rules (app/services/ci/stuck_builds/drop_pending_service.rb) -----------

def test_job_waiting_an_hour_behind_paused_runners_is_dropped_as_stuck() -> None:
    clock = Clock()
    state = GitLabState(clock=clock)
    block = state.create_runner(description="block", tags=["gpus:8", "host:a"], paused=True)
    state.request_job(block.id)  # online, but paused: it does not count
    job = state.enqueue_job(project_id=1, tags=["gpus:8"])
    clock.now += 3600
    assert state.drop_stuck_jobs() == []  # not yet over an hour
    clock.now += 1
    assert state.drop_stuck_jobs() == [job]
    assert (job.status, job.failure_reason) == ("failed", "stuck_pending_no_matching_runners")
    assert state.pending_jobs() == [] and state.request_job(block.id) is None


def test_an_online_unpaused_runner_whose_tags_cover_the_job_keeps_it_from_being_stuck() -> None:
    clock = Clock()
    state = GitLabState(clock=clock)
    standby = state.create_runner(description="standby", tags=["gpus:8", "host:a", "extra"])
    state.heartbeat(standby)
    job = state.enqueue_job(project_id=1, tags=["gpus:8", "host:a"])
    clock.now += 7199
    assert state.drop_stuck_jobs() == [] and job.status == "pending"
    clock.now += 2  # the runner has not been seen for 2 hours: offline, the job is stuck
    assert state.drop_stuck_jobs() == [job] and job.failure_reason == "stuck_pending_no_matching_runners"


def test_tags_not_covered_or_untagged_runner_rules_count_for_stuck() -> None:
    clock = Clock()
    state = GitLabState(clock=clock)
    narrow = state.create_runner(description="narrow", tags=["gpus:8"])
    state.heartbeat(narrow)
    tagged = state.enqueue_job(project_id=1, tags=["gpus:8", "priority:high"])
    untagged = state.enqueue_job(project_id=1, tags=[])
    clock.now += 3601
    state.heartbeat(narrow)
    assert {j.id for j in state.drop_stuck_jobs()} == {tagged.id, untagged.id}


def test_any_job_pending_a_day_is_dropped_even_with_a_matching_runner() -> None:
    clock = Clock()
    state = GitLabState(clock=clock)
    runner = state.create_runner(description="r", tags=["gpus:8"])
    job = state.enqueue_job(project_id=1, tags=["gpus:8"])
    clock.now += 86401
    state.heartbeat(runner)  # online and matching, but it never took the job
    assert state.drop_stuck_jobs() == [job]
    assert (job.status, job.failure_reason) == ("failed", "stuck_pending_with_matching_runners")


def test_legacy_failure_reason_for_gitlab_before_19_1() -> None:
    clock = Clock()
    state = GitLabState(clock=clock, legacy_failure_reasons=True)
    job = state.enqueue_job(project_id=1, tags=["gpus:8"])
    clock.now += 3601
    assert state.drop_stuck_jobs() == [job] and job.failure_reason == "stuck_or_timeout_failure"


def test_group_runner_serves_only_projects_of_its_group_and_subgroups() -> None:
    clock = Clock()
    state = GitLabState(clock=clock)
    top = state.directory.add_group("ml")
    sub = state.directory.add_group("vision", parent_id=top.id)
    inside = state.directory.add_project("detect", group_id=sub.id)
    outside = state.directory.add_project("other")
    runner = state.create_runner(description="g", tags=["gpu"], runner_type="group_type", group_id=top.id)
    foreign = state.enqueue_job(project_id=outside.id, tags=["gpu"])
    ours = state.enqueue_job(project_id=inside.id, tags=["gpu"])
    assert state.request_job(runner.id) is ours
    assert state.request_job(runner.id) is None
    clock.now += 3601
    state.heartbeat(runner)
    assert state.drop_stuck_jobs() == [foreign]  # the group runner does not reach it


# -- canceling (app/models/commit_status.rb) ---------------------------------------------

def test_cancel_of_a_running_job_on_a_graceful_runner_is_canceling_until_the_runner_reports() -> None:
    state = GitLabState(clock=Clock())
    runner = state.create_runner(description="r", tags=["gpu"])
    job = state.enqueue_job(project_id=1, tags=["gpu"])
    state.request_job(runner.id, system_id="s_1", cancel_gracefully=True)
    assert state.cancel_job(job.id).status == "canceling"
    assert state.jobs_of_runner(runner.id, "canceling") == [job]
    assert state.finish_job(job.id, "failed", failure_reason="script_failure").status == "canceled"
    assert state.finish_job(job.id, "success").status == "canceled"  # finished stays finished


def test_cancel_without_graceful_support_is_canceled_at_once() -> None:
    state = GitLabState(clock=Clock())
    runner = state.create_runner(description="r", tags=["gpu"])
    job = state.enqueue_job(project_id=1, tags=["gpu"])
    state.request_job(runner.id)
    assert state.cancel_job(job.id).status == "canceled"


def test_canceling_job_without_updates_for_30_minutes_is_dropped() -> None:
    clock = Clock()
    state = GitLabState(clock=clock)
    runner = state.create_runner(description="r", tags=["gpu"])
    job = state.enqueue_job(project_id=1, tags=["gpu"])
    state.request_job(runner.id, cancel_gracefully=True)
    state.cancel_job(job.id)
    clock.now += 1801
    assert state.drop_stuck_jobs() == [job]
    assert (job.status, job.failure_reason) == ("canceled", "no_updates_canceling")


def test_failure_without_reason_is_unknown_failure() -> None:
    state = GitLabState(clock=Clock())
    runner = state.create_runner(description="r", tags=["gpu"])
    job = state.enqueue_job(project_id=1, tags=["gpu"])
    state.request_job(runner.id)
    assert state.finish_job(job.id, "failed").failure_reason == "unknown_failure"


# -- queue order (app/services/ci/queue/pending_builds_strategy.rb) ----------------------

def test_instance_runners_serve_the_project_with_fewest_running_jobs_first() -> None:
    clock = Clock()
    state = GitLabState(clock=clock)
    runners = [state.create_runner(description=f"r{i}", tags=["gpu"]) for i in range(3)]
    busy = [state.enqueue_job(project_id=1, tags=["gpu"]) for _ in range(3)]
    quiet = state.enqueue_job(project_id=2, tags=["gpu"])
    assert state.request_job(runners[0].id) is busy[0]  # nobody runs anything: oldest first
    assert state.request_job(runners[1].id) is quiet  # project 1 has one running, project 2 none
    assert state.request_job(runners[2].id) is busy[1]


def test_group_runners_serve_oldest_first() -> None:
    state = GitLabState(clock=Clock())
    group = state.directory.add_group("ml")
    p1 = state.directory.add_project("a", group_id=group.id)
    p2 = state.directory.add_project("b", group_id=group.id)
    runners = [state.create_runner(description=f"g{i}", tags=["gpu"], runner_type="group_type",
                                   group_id=group.id) for i in range(2)]
    first, second = (state.enqueue_job(project_id=p1.id, tags=["gpu"]) for _ in range(2))
    state.enqueue_job(project_id=p2.id, tags=["gpu"])
    assert state.request_job(runners[0].id) is first
    assert state.request_job(runners[1].id) is second


def test_managers_are_created_per_system_id_and_go_offline_after_2_hours() -> None:
    clock = Clock()
    state = GitLabState(clock=clock)
    runner = state.create_runner(description="r", tags=["gpu"])
    state.request_job(runner.id, system_id="s_a")
    state.request_job(runner.id, system_id="s_a")
    state.request_job(runner.id, system_id="s_b")
    assert [m.system_id for m in state.managers_of(runner.id)] == ["s_a", "s_b"]
    clock.now += 7201
    assert not state.online(runner) and not any(state.manager_online(m) for m in state.managers_of(runner.id))


def test_running_job_without_updates_for_an_hour_is_dropped_when_enabled() -> None:
    clock = Clock()
    state = GitLabState(clock=clock, drop_silent_running=True)
    runner = state.create_runner(description="r", tags=["gpu"])
    quiet, chatty = (state.enqueue_job(project_id=1, tags=["gpu"]) for _ in range(2))
    state.request_job(runner.id)
    state.request_job(runner.id)
    clock.now += 3000
    state.touch_job(chatty.id)  # a trace patch, as gitlab-runner sends every few seconds
    clock.now += 601
    assert state.drop_stuck_jobs() == [quiet]
    assert (quiet.status, quiet.failure_reason, chatty.status) == ("failed", "no_updates_running", "running")
    assert GitLabState(clock=clock).drop_silent_running is False  # the simulator's runners send no updates
