"""Leases left by a killed cleanup: the controller asks GitLab, waits out any cleanup
that could still be at work, then reaps and releases; a running job is never touched.

The world is the simulated host with real lease files (the runner stand-ins take them,
the controller reads them through `LeaseJobs`, as in production), the HTTP GitLab
through python-gitlab, and real processes carrying a lease's token."""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runnerctl.controller import jobs_store
from runnerctl.executors.lease import LEASE_ENV, Lease, LeaseTable, new_nonce, process_started
from runnerctl.settings import ControllerSettings
from runnerctl.sim.gitlab_server import Fault
from runnerctl.sim.world import PROJECT, World, build_world

SETTINGS = ControllerSettings(projects=(PROJECT,))
ORPHAN = 4242  # a job GitLab does not list as running: its cleanup was killed


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = build_world(tmp_path / "store", settings=SETTINGS, lease_dir=tmp_path / "state")
    yield w
    w.close()


def _slot(world: World, suffix: str) -> str:
    return next(name for name in world.controller.cache.ids if name.endswith(suffix))


def _lease(world: World, tmp_path: Path, job_id: int, suffix: str, gpus: tuple[int, ...], *,
           user: str = "bob", project: str = "") -> Lease:
    """What prepare writes (shell driver), owned by a gitlab-runner that is alive (us);
    `user` is the job's GITLAB_USER_LOGIN, which its YAML can set."""
    me = os.getpid()
    template = Lease(gpu=-1, job_id=str(job_id), slot=_slot(world, suffix), driver="shell", owner_pid=me,
                     owner_started=process_started(me) or 0.0, created_at=time.time(), user=user,
                     project=project,
                     nonce=new_nonce())
    LeaseTable(tmp_path / "state").acquire(gpus, template, wait_s=0)
    return template


def _job_process(lease: Lease, spawned: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["sleep", "600"], env={**os.environ, LEASE_ENV: lease.token})
    spawned.append(proc)
    return proc


def _leased(tmp_path: Path) -> set[str]:
    return {lease.job_id for lease in LeaseTable(tmp_path / "state").all()}


def test_a_job_long_over_in_gitlab_is_reaped_and_released(world: World, tmp_path: Path,
                                                          spawned: list[subprocess.Popen[bytes]]) -> None:
    orphan = _lease(world, tmp_path, ORPHAN, "/gpu3", (3,))
    left_over = _job_process(orphan, spawned)
    live = world.state.enqueue_job(project_id=PROJECT, tags=["gpu"])
    assert world.state.request_job(world.controller.cache.ids[_slot(world, "/gpu5")]) is live
    running = _lease(world, tmp_path, live.id, "/gpu5", (5,))
    live_process = _job_process(running, spawned)
    world.advance(400, step=5.0)
    assert ORPHAN in world.controller.orphans.suspects  # GitLab does not list it...
    assert _leased(tmp_path) == {str(ORPHAN), str(live.id)}  # ...but a cleanup might still be at work
    assert left_over.poll() is None
    world.advance(400, step=5.0)
    assert _leased(tmp_path) == {str(live.id)}
    assert left_over.wait(timeout=120) == -9  # reaped: it carried the job's token
    assert live_process.poll() is None and live.id not in world.controller.orphans.suspects
    freed = [e for e in world.store.events(world.controller.host) if e.kind == "free"]
    assert [(e.subject, "GPUs 3 released" in e.detail) for e in freed] == [(f"job {ORPHAN}", True)]
    assert ORPHAN not in {j for jobs in world.controller.view.slots for j in jobs.running_jobs}


def test_a_process_without_the_token_is_never_signalled(world: World, tmp_path: Path,
                                                        spawned: list[subprocess.Popen[bytes]]) -> None:
    """S4: reaping goes by the lease's token, so a process beside it lives on."""
    orphan = _lease(world, tmp_path, ORPHAN, "/gpu2", (2,))
    carrier = _job_process(orphan, spawned)
    plain_env = {k: v for k, v in os.environ.items() if k != LEASE_ENV}
    bystander = subprocess.Popen(["sleep", "600"], env=plain_env)
    spawned.append(bystander)
    world.advance(900, step=5.0)
    assert carrier.wait(timeout=120) == -9 and bystander.poll() is None
    assert _leased(tmp_path) == set()


def test_while_gitlab_fails_that_look_nothing_is_freed_and_the_controller_goes_on(
        world: World, tmp_path: Path, spawned: list[subprocess.Popen[bytes]],
        caplog: pytest.LogCaptureFixture) -> None:
    orphan = _lease(world, tmp_path, ORPHAN, "/gpu7", (7,))
    left_over = _job_process(orphan, spawned)
    world.server.faults.append(Fault("GET", r"/runners/\d+/jobs", "500", count=10_000))
    with caplog.at_level(logging.WARNING, logger="runnerctl"):
        big = world.submit(4, 60.0)
        world.advance(1500, step=5.0)
    assert big in world.fleet.started  # drains and resumes went on
    assert str(ORPHAN) in _leased(tmp_path) and left_over.poll() is None
    warned = [r.getMessage() for r in caplog.records if "no lease is freed" in r.getMessage()]
    assert len(warned) == 1, warned
    world.server.faults.clear()
    world.advance(900, step=5.0)
    assert str(ORPHAN) not in _leased(tmp_path) and left_over.wait(timeout=120) == -9


def test_the_wait_outlasts_every_cleanup_gitlab_runner_allows() -> None:
    from runnerctl.executors.contract import (
        CLEANUP_EXEC_TIMEOUT_S,
        FORCE_KILL_TIMEOUT_S,
        GRACEFUL_KILL_TIMEOUT_S,
    )

    assert ControllerSettings().orphan_after_s > (CLEANUP_EXEC_TIMEOUT_S + GRACEFUL_KILL_TIMEOUT_S
                                                  + FORCE_KILL_TIMEOUT_S)


def test_a_job_canceling_in_gitlab_is_never_freed(world: World, tmp_path: Path,
                                                  spawned: list[subprocess.Popen[bytes]]) -> None:
    """After a cancel, gitlab-runner still runs after_script, uploads and cleanup while
    GitLab shows the job `canceling` (gitlabhq has_status.rb EXECUTING_STATUSES): live."""
    job = world.state.enqueue_job(project_id=PROJECT, tags=["gpu"])
    assert world.state.request_job(world.controller.cache.ids[_slot(world, "/gpu1")]) is job
    lease = _lease(world, tmp_path, job.id, "/gpu1", (1,))
    after_script = _job_process(lease, spawned)
    job.status = "canceling"  # cancelled; gitlab-runner's after_script is still at work
    world.advance(1500, step=5.0)
    assert job.id not in world.controller.orphans.suspects
    assert _leased(tmp_path) == {str(job.id)} and after_script.poll() is None
    asked = {r.query.get("status", [""])[0] for r in world.server.requests if r.path.endswith("/jobs")}
    assert asked >= {"running", "canceling"}
    job.status = "canceled"  # reported, but its cleanup never released the lease
    world.advance(900, step=5.0)
    assert _leased(tmp_path) == set() and after_script.wait(timeout=120) == -9


def test_an_unreadable_lease_keeps_its_gpu_closed_and_is_reported(world: World, tmp_path: Path) -> None:
    """Issue 14: an unreadable lease holds its GPU for the controller too, not only for prepare:
    its single and every block with it stay paused, the page says why, and it is never
    planned as idle (nor freed as an orphan: nobody can tell whose it is)."""
    _lease(world, tmp_path, 77, "gpu2", (2,))
    (tmp_path / "state" / "leases" / "gpu2.json").write_bytes(b"\x00 not a lease")
    world.advance(30, step=5.0)
    view = world.controller.view
    gpu2 = next(g for g in view.gpus if g.index == 2)
    assert not gpu2.open and "unreadable lease" in gpu2.reason, gpu2
    with_2 = [s for s in view.slots if 2 in s.gpus]
    assert with_2 and all(s.state == "paused" and s.paused_in_gitlab for s in with_2), with_2
    assert any(s.state == "open" for s in view.slots if s.gpus == (3,))  # the others serve
    closed = [e for e in world.store.events(world.controller.host) if e.kind == "gate-close"]
    assert [e.subject for e in closed] == ["gpu2"] and "unreadable lease" in closed[0].detail
    world.advance(900, step=5.0)  # the orphan audit does not free what it cannot read
    assert (tmp_path / "state" / "leases" / "gpu2.json").exists()
    assert not next(g for g in world.controller.view.gpus if g.index == 2).open


def test_a_job_naming_another_user_is_billed_to_gitlabs_user(world: World, tmp_path: Path) -> None:
    """A job that sets GITLAB_USER_LOGIN in its YAML writes that name in its lease (GitLab
    lists YAML variables before its user variables, builder.rb `scoped_variables`). Taken
    by a runner before the controller saw it pending, only the lease named its user, so
    mallory's GPU time counted as alice's in fair share. The lease audit's next look
    lists GitLab's user, which the history and the page then show."""
    spoofed = world.state.enqueue_job(project_id=PROJECT, tags=["gpu"], user="mallory")
    assert world.state.request_job(world.controller.cache.ids[_slot(world, "/gpu2")]) is spoofed
    _lease(world, tmp_path, spoofed.id, "/gpu2", (2,), user="alice")
    honest = world.state.enqueue_job(project_id=PROJECT, tags=["gpu"], user="carol")
    assert world.state.request_job(world.controller.cache.ids[_slot(world, "/gpu6")]) is honest
    _lease(world, tmp_path, honest.id, "/gpu6", (6,), user="carol")
    world.advance(330, step=5.0)
    assert not world.controller.history.unconfirmed
    assert {j.job_id: j.user for j in jobs_store.open_jobs(world.store, world.controller.host)} == {
        spoofed.id: "mallory", honest.id: "carol"}
    assert world.controller.view.owners[spoofed.id][0] == "mallory"
    said = [e.detail for e in world.store.events(world.controller.host) if e.kind == "user"]
    assert said == ["its variables name alice as GITLAB_USER_LOGIN, GitLab says mallory: "
                    "its GPU time is mallory's"]


def test_a_job_its_runners_list_leaves_out_is_freed_only_once_gitlab_says_it_ended(
        world: World, tmp_path: Path, spawned: list[subprocess.Popen[bytes]],
        caplog: pytest.LogCaptureFixture) -> None:
    """A runner's job list is no proof that a job is over: GitLab lists there only jobs of
    projects where the token's user is Reporter (app/finders/ci/runner_jobs_finder.rb
    `by_permission`), and a running multi-day job was freed, its processes killed (found
    by a review as a researcher running multi-day jobs). Here GitLab runs the job on
    another runner, so the lease's runner's list leaves it out all the same: it is freed
    only once the job itself (asked by the project path its lease records) has ended."""
    job = world.state.enqueue_job(project_id=PROJECT, tags=["gpu"])
    assert world.state.request_job(world.controller.cache.ids[_slot(world, "/gpu5")]) is job
    lease = _lease(world, tmp_path, job.id, "/gpu3", (3,), project=f"project-{PROJECT}")
    training = _job_process(lease, spawned)
    world.advance(1200, step=5.0)  # well past orphan_after_s
    assert _leased(tmp_path) == {str(job.id)} and training.poll() is None
    asked = [r for r in world.server.requests if r.path == f"/projects/project-{PROJECT}/jobs/{job.id}"]
    assert asked and all(r.status == 200 for r in asked)
    job.status = "success"
    world.advance(900, step=5.0)
    assert _leased(tmp_path) == set() and training.wait(timeout=120) == -9
    gone = world.state.enqueue_job(project_id=PROJECT, tags=["gpu"])  # a job the token cannot read: 404
    doubt = _lease(world, tmp_path, gone.id + 1000, "/gpu4", (4,), project="other/private")
    kept = _job_process(doubt, spawned)
    with caplog.at_level(logging.WARNING, logger="runnerctl"):
        world.advance(1500, step=5.0)
    assert _leased(tmp_path) == {str(gone.id + 1000)} and kept.poll() is None
    said = [r.getMessage() for r in caplog.records if "GitLab answers 404 for it" in r.getMessage()]
    assert len(said) == 1 and "give the token Reporter in other/private" in said[0]
    # a doubt is asked again only every orphan_after_s: the looks go on to the other runners
    orphan = _lease(world, tmp_path, ORPHAN, "/gpu6", (6,))
    left_over = _job_process(orphan, spawned)
    before = len([r for r in world.server.requests if r.path.startswith("/projects/other%2Fprivate/")])
    world.advance(1500, step=5.0)
    assert _leased(tmp_path) == {str(gone.id + 1000)} and left_over.wait(timeout=120) == -9
    asked = len([r for r in world.server.requests if r.path.startswith("/projects/other%2Fprivate/")])
    assert asked - before <= 1500 / world.controller.settings.orphan_after_s + 1


def test_a_403_on_the_job_is_doubt_and_the_free_says_how_long_it_was_missing(
        world: World, tmp_path: Path, spawned: list[subprocess.Popen[bytes]],
        caplog: pytest.LogCaptureFixture) -> None:
    """GitLab answers a token with no Reporter role 403, not 404, for a private project's
    job: that too is the token's reach, not GitLab failing. A doubt is asked again every
    orphan_after_s, and the free, once GitLab says the job ended, counts from when the
    job first went missing (it said 420 s; found by a review of the day's fixes)."""
    job = world.state.enqueue_job(project_id=PROJECT, tags=["gpu"])
    assert world.state.request_job(world.controller.cache.ids[_slot(world, "/gpu5")]) is job
    job.status = "success"  # over in GitLab, its cleanup killed: the lease stays
    lease = _lease(world, tmp_path, job.id, "/gpu7", (7,), project=f"project-{PROJECT}")
    left_over = _job_process(lease, spawned)
    world.server.faults.append(Fault("GET", rf"/projects/project-{PROJECT}/jobs/{job.id}$", "403", count=2))
    with caplog.at_level(logging.WARNING, logger="runnerctl"):
        world.advance(2400, step=5.0)
    said = [r.getMessage() for r in caplog.records if "GitLab refuses it" in r.getMessage()]
    assert len(said) == 1 and "give the token Reporter in project-1" in said[0]
    assert _leased(tmp_path) == set() and left_over.wait(timeout=120) == -9
    [freed] = [e for e in world.store.events(world.controller.host) if e.kind == "free"]
    missing = int(freed.detail.split("for ")[1].split(" s")[0])
    assert missing >= 3 * world.controller.settings.orphan_after_s, freed.detail
