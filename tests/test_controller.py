"""The reconcile loop against sim GPUs, the HTTP GitLab (real python-gitlab) and runner stand-ins."""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from runnerctl.cli import main
from runnerctl.controller.app import create_app
from runnerctl.controller.demand import ApiBudget, DemandTracker, due
from runnerctl.controller.loop import Controller
from runnerctl.controller.migrations import StoreError
from runnerctl.controller.orphans import OrphanAudit
from runnerctl.controller.plan import PlanPolicy
from runnerctl.controller.store import Store
from runnerctl.controller.toggles import request
from runnerctl.settings import ControllerSettings
from runnerctl.sim.gitlab_server import Fault
from runnerctl.sim.world import PROJECT, World, build_world

SETTINGS = ControllerSettings(projects=(PROJECT,), cooldown_s=30.0)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = build_world(tmp_path, settings=SETTINGS, webhook_secret="s3cret")
    yield w
    w.close()


def _open(world: World) -> set[str]:
    """Open slot runners (the stand-by is always unpaused and never runs a job)."""
    return {r.description.rsplit("/", 1)[-1] for r in world.state.runners.values()
            if not r.paused and r.description in world.fleet.slots}


def _assert_s1(world: World) -> None:
    slots = {s.name: s for s in world.fleet.slots.values()}
    opened = [slots[r.description] for r in world.state.runners.values()
              if not r.paused and r.description in slots]
    for i, a in enumerate(opened):
        for b in opened[i + 1:]:
            assert not set(a.gpus) & set(b.gpus), (a.key, b.key)


def test_idle_host_opens_singles_only(world: World) -> None:
    world.advance(6)
    assert _open(world) == {f"gpu{i}" for i in range(8)}


def test_four_gpu_job_composed_run_and_released(world: World) -> None:
    for i in range(8):
        world.submit(1, 100.0 + 10 * i)
    world.advance(5)
    big = world.submit(4, 60.0)
    for _ in range(200):
        world.advance(1)
        _assert_s1(world)
        if big in world.fleet.started:
            break
    # L1: no later than the last job on its block, plus two intervals and a runner poll
    assert world.fleet.started[big] <= world.clock.start + 6 + 130 + 2 * 5 + 3
    world.advance(70)
    assert big in world.fleet.finished
    world.advance(6)  # L2: singles back within one interval
    assert _open(world) == {f"gpu{i}" for i in range(8)}


def test_foreign_process_closes_and_cooldown_reopens(world: World) -> None:
    world.advance(6)
    world.gpus.foreign[3] = (999, "alice")
    world.advance(5)
    assert "gpu3" not in _open(world)
    view = world.controller.view
    assert "alice" in next(g.reason for g in view.gpus if g.index == 3)
    del world.gpus.foreign[3]
    world.advance(20)
    assert "gpu3" not in _open(world)  # cool-down
    world.advance(20)
    assert "gpu3" in _open(world)


def test_a_clock_step_moves_the_gates_cool_down_and_the_orphan_audit_and_rechecks_the_skew(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Times the controller keeps on the wall clock move with a step (found by a review of
    the clocks): stepped back an hour just after a foreign process left, a GPU stayed
    closed for the hour; stepped forward, a leased job GitLab had not listed for a minute
    counted as missing for the step's length and its GPUs were freed before their grace;
    and the skew to the store NTP had just corrected was kept until the next check."""
    c = world.controller
    stepped = [0.0]
    checks: list[float] = []
    monkeypatch.setattr("runnerctl.controller.loop.clock_skew",
                        lambda store, clock: (checks.append(clock()), (0.0, ""))[1])
    c.wiring = dataclasses.replace(c.wiring, monotonic=lambda: world.clock.now - stepped[0], check_clock=True)
    world.advance(6)
    world.gpus.foreign[3] = (999, "alice")
    world.advance(5)
    del world.gpus.foreign[3]
    c.orphans.suspects[77] = world.clock.now - 60  # a leased job GitLab has not listed for a minute
    world.advance(5)
    assert "gpu3" not in _open(world) and len(checks) == 1
    world.clock.now -= 3600.0  # NTP steps the clock back an hour
    stepped[0] -= 3600.0
    c.tick()
    assert len(checks) == 2  # compared again at once, not CLOCK_CHECK_S later
    for _ in range(8):  # the cool-down (30 s) passes on the stepped clock
        world.clock.now += 5
        c.tick()  # (the world's own schedule would wait for its next tick, an hour on)
    assert not c.gate[3].closed
    shifts: list[float] = []
    shift = c.orphans.shift
    monkeypatch.setattr(c.orphans, "shift", lambda step: (shifts.append(step), shift(step)))
    world.clock.now += 3600.0  # and forward again
    stepped[0] += 3600.0
    c.tick()
    assert shifts == [3600.0]
    audit = OrphanAudit(check_s=60, orphan_after_s=420)
    audit.suspects[78] = 1000.0  # a leased job GitLab has not listed since then
    audit.shift(3600.0)
    assert audit.suspects[78] == 4600.0  # still as long missing, not an hour longer


def test_a_driver_upgraded_without_a_reboot_closes_every_runner_until_it_is_mended(world: World) -> None:
    """Every job started on the host fails with 'Driver/library version mismatch' then: the
    runners close (jobs wait, none fails), each GPU shows unhealthy with the reason, and
    after the reboot they open again a cool-down later, with no admin reopen."""
    world.advance(6)
    assert _open(world) == {f"gpu{i}" for i in range(8)}
    world.gpus.host_problem = "the NVIDIA library on disk is 570.86.10 but the kernel driver is 550.54.15"
    world.advance(10)
    assert _open(world) == set()
    occupancy = world.controller.view.occupancy
    assert {o.state for o in occupancy.values()} == {"unhealthy"}
    assert "570.86.10" in occupancy[0].detail
    world.gpus.host_problem = ""  # rebooted
    world.advance(SETTINGS.cooldown_s + 20)
    assert _open(world) == {f"gpu{i}" for i in range(8)}


def test_unhealthy_gpu_stays_closed_until_admin_reopens(world: World, tmp_path: Path) -> None:
    world.gpus.unhealthy.add(2)
    world.advance(6)
    world.gpus.unhealthy.discard(2)
    world.gpus.unhealthy.add(2)  # the Xid count stays
    world.advance(100)
    assert "gpu2" not in _open(world)
    assert main(["resume", "--gpu", "2", "--host-name", "demo", "--state-dir", str(tmp_path),
                 "--why", "reseated"]) == 0
    world.advance(6)
    assert "gpu2" in _open(world)


def test_a_gpu_switched_to_mig_is_closed_and_its_runners_stay_paused(world: World) -> None:
    world.advance(6)
    assert "gpu3" in _open(world)
    world.gpus.mig.add(3)  # init ran before MIG was turned on: its runners exist
    world.advance(6)
    assert "gpu3" not in _open(world)
    reason = next(g.reason for g in world.controller.view.gpus if g.index == 3)
    assert reason.startswith("MIG mode on: runnerctl leaves MIG GPUs alone")
    world.submit(4, 30.0)  # a block over GPU 3 is never opened for it
    world.advance(60)
    assert not {"gpu0-3", "gpu0-7", "gpu2-3"} & _open(world) and world.fleet.holder.get(3) is None
    world.gpus.mig.discard(3)
    world.advance(60)
    assert "gpu3" in _open(world)


def test_gate_counts_xids_again_after_the_counter_restarts() -> None:
    """The Xid count lives as long as the controller's NVML session: after a restart it
    starts from 0 below the stored baseline, and the next Xid must still close the GPU."""
    from runnerctl.controller.gate import GateState, GateThresholds, reopen, step
    from runnerctl.model import Gpu

    def gpu(xids: int) -> Gpu:
        return Gpu(0, "GPU-0", "sim", 80 << 30, 0, 0.0, xid_errors=xids, ecc_uncorrected_errors=0)

    limits = GateThresholds.from_settings()
    sick = step(GateState(), gpu(3), now=0, is_ci=lambda i, p: False, owned=False, limits=limits)
    assert sick.closed and sick.unhealthy
    state = reopen(sick, gpu(3))  # the admin's reopen: 3 becomes the baseline
    assert state.xid_baseline == 3 and not state.closed
    state = step(state, gpu(0), now=1, is_ci=lambda i, p: False, owned=False, limits=limits)
    assert not state.closed and state.xid_baseline == 0  # restarted counter: rebased, still open
    state = step(state, gpu(1), now=2, is_ci=lambda i, p: False, owned=False, limits=limits)
    assert state.closed and state.unhealthy and "1 Xid" in state.reason


def test_a_gpu_whose_processes_nvml_cannot_list_stays_closed() -> None:
    """With no process list the gate fell back on memory and utilization alone, which a
    quiet foreign process passes (found by a review as an NVML expert)."""
    from runnerctl.controller.gate import UNLISTED_REASON, GateState, GateThresholds, step
    from runnerctl.model import Gpu

    quiet = Gpu(0, "GPU-0", "sim", 80 << 30, 0, 0.0, processes_known=False)
    limits = GateThresholds.from_settings()
    state = step(GateState(), quiet, now=0, is_ci=lambda i, p: False, owned=False, limits=limits)
    assert state.closed and state.reason == UNLISTED_REASON
    held = step(GateState(), quiet, now=0, is_ci=lambda i, p: False, owned=True, limits=limits)
    assert not held.closed  # a CI lease holds it: its job runs there


def test_an_unlisted_gpu_shows_as_unknown() -> None:
    """Closed because NVML cannot list its processes: "unknown" on the page and in the
    occupancy metric, not "foreign" (no one is known to use it)."""
    from runnerctl.controller.view import GpuView, _one
    from runnerctl.model import Gpu

    quiet = Gpu(1, "GPU-1", "sim", 80 << 30, 0, 0.0, processes_known=False)
    state = _one(1, {1: quiet}, GpuView(1, False, "NVML cannot list its processes", False), [], None, {})
    assert state.state == "unknown" and "cannot list" in state.detail
    listed = _one(1, {1: dataclasses.replace(quiet, processes_known=True)},
                  GpuView(1, False, "foreign process 42", False), [], None, {})
    assert listed.state == "foreign"


def test_admin_toggles_pause_drain_resume(world: World, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    job = world.submit(1, 100.0)
    world.advance(6)
    slot = next(n for n, j in world.fleet.jobs.items() if j.job_id == job).rsplit("/", 1)[-1]
    args = ["--host-name", "demo", "--state-dir", str(tmp_path)]
    assert main(["drain", "--slot", slot, "--why", "maintenance", "--who", "carol", *args]) == 0
    assert main(["pause", "--gpu", "7", "--why", "fan", *args]) == 0
    world.advance(6)
    assert slot not in _open(world) and "gpu7" not in _open(world)
    statuses = {t.target: s for t, s in world.controller.view.toggles}
    assert statuses == {f"slot:{slot}": "draining (1 job left)", "gpu:7": "paused"}
    world.advance(100)
    assert {t.target: s for t, s in world.controller.view.toggles}[f"slot:{slot}"] == "drained"
    assert main(["resume", "--host", *args]) == 0
    world.advance(6)
    assert _open(world) == {f"gpu{i}" for i in range(8)}
    assert "carol" in capsys.readouterr().out
    kinds = [e.kind for e in world.store.events("demo")]
    assert {"drain", "pause", "resume"} <= set(kinds)

    # a misspelt host: the toggle closed nothing and said it had (found by a review fuzzing the CLI)
    typo = ["--host-name", "dmeo", "--state-dir", str(tmp_path)]
    assert main(["pause", "--gpu", "7", "--why", "fan", "--who", "carol", *typo]) == 0
    assert capsys.readouterr().out == ("dmeo gpu:7: pause by carol (fan); no controller has run on dmeo yet, "
                                       "it applies once one does (the store's hosts: demo)\n")
    assert main(["resume", "--gpu", "7", "--host-name", "dmoe", "--state-dir", str(tmp_path)]) == 0
    said = capsys.readouterr().out
    assert "(0 toggles removed); no controller has run on dmoe yet" in said  # it looked done
    assert said.endswith("(the store's hosts: demo)\n")  # not the misspelt dmeo its toggle named


def _whole_host_drained(world: World, singles_s: float, settle_s: float) -> int:
    """Eight 1-GPU jobs of `singles_s`, then an 8-GPU job the host drains for (its id)."""
    for _ in range(8):
        world.submit(1, singles_s)
    world.advance(5)
    big = world.submit(8, 30.0)
    world.advance(settle_s)
    assert world.controller.drains
    return big


def test_restart_recovers_drain_and_never_resumes_a_covered_single(world: World) -> None:
    big = _whole_host_drained(world, 200.0, 12)
    assert world.controller.protected == {big}  # it came when no other multi-GPU job waited
    # restart: a fresh controller on the same store and GitLab
    world.controller = Controller(world.controller.wiring, SETTINGS)
    assert world.controller.drains
    assert world.controller.protected == {big}  # no later job may delay it after a restart either
    for _ in range(250):
        world.advance(1)
        _assert_s1(world)
        assert not _open(world) & {f"gpu{i}" for i in range(8)} or big in world.fleet.started
    assert big in world.fleet.started


def test_a_restart_keeps_the_stored_drains_until_every_project_is_read(world: World) -> None:
    """Demand polls are metered (the API budget; discovery first), so a restarted
    controller ticks a while before it has read the drained-for job again. It dropped the
    drain at once and resumed the singles under it, and younger 1-GPU jobs took the GPUs
    (found by a review as an operator killing serve mid-drain)."""
    big = _whole_host_drained(world, 40.0, 10)
    younger = {world.submit(1, 300.0) for _ in range(4)}
    world.controller = Controller(world.controller.wiring, SETTINGS)
    poll = world.controller.demand.poll
    world.controller.demand.poll = lambda gitlab: None  # type: ignore[method-assign] # no poll answered yet
    world.advance(60)  # the 40 s jobs end meanwhile
    assert not world.controller.demand.complete and world.controller.drains
    assert not younger & set(world.fleet.started)
    assert not _open(world) & {f"gpu{i}" for i in range(8)}
    world.controller.demand.poll = poll  # type: ignore[method-assign]
    world.advance(30)
    assert world.controller.demand.complete and big in world.fleet.started
    started = world.fleet.started
    assert all(started[big] < started[job] for job in younger & set(started))  # the 8-GPU job first


def test_job_another_host_drains_for_is_not_drained_for_here_but_takes_an_idle_block(world: World) -> None:
    """Claims (shared store) keep two hosts from draining for one job; a host with room
    for it now still starts it."""
    world.advance(6)
    small = world.submit(1, 100.0)
    world.advance(6)
    assert small in world.fleet.started
    big = world.submit(8, 30.0)
    assert world.store.claim(big, "gpu-b", now=world.clock(), ttl_s=3600.0)  # gpu-b drains for it
    world.advance(60)
    assert big not in world.fleet.started
    assert _open(world) == {f"gpu{i}" for i in range(8)}  # no drain here
    assert "drain" not in {e.kind for e in world.store.events("demo")}
    world.advance(100)  # the 1-GPU job ends: an idle host has room for the 8-GPU job
    assert big in world.fleet.started
    assert world.fleet.started[big] <= world.fleet.started[small] + 100.0 + 2 * 5 + 3
    assert world.store.claims(world.clock()) == {big: "gpu-b"}  # not taken from gpu-b


FAULTS = ["401", "403", "404", "429", "500", "drop", "delay"]


@pytest.mark.parametrize("kind", FAULTS)
def test_gitlab_failures_leave_runners_unchanged_or_paused(world: World, kind: str,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    world.gitlab = world.controller.wiring.gitlab  # the adapter the controller uses
    world.controller.wiring.gitlab._gl.timeout = 0.3  # type: ignore[attr-defined]
    world.advance(6)
    before = _open(world)
    world.server.faults.append(Fault("*", r"/runners|/projects", kind, count=10_000, delay_s=0.6))
    world.submit(4, 30.0)
    with caplog.at_level(logging.DEBUG, logger="runnerctl"):
        world.advance(40)
    assert _open(world) <= before  # unchanged or safer
    _assert_s1(world)
    warnings = [r for r in caplog.records
                if r.levelno >= logging.WARNING and "GitLab failed" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert world.controller.health.retry_at > world.clock()  # backing off
    changing = [r for r in world.server.requests if r.method == "PUT"]
    world.server.faults.clear()
    world.advance(300)
    assert world.controller.health.failures == 0 and len(changing) <= 2


def test_api_state_and_webhook(world: World) -> None:
    world.advance(6)
    client = TestClient(create_app(lambda: world.controller.view, world.controller.demand.webhook))
    state = client.get("/api/state").json()
    assert state["host"] == "demo" and len(state["slots"]) == 15
    assert state["snapshot"]["gpus"][0]["index"] == 0
    job = world.state.enqueue_job(project_id=PROJECT, tags=["gpus:2"])
    payload = {"object_kind": "build", "build_id": job.id, "build_status": "pending", "project_id": PROJECT,
               "build_created_at": "2023-11-14 22:13:20 UTC", "runner": None}  # GitLab's fields: no tags
    assert client.post("/webhooks/gitlab", json=payload).status_code == 401
    wrong = client.post("/webhooks/gitlab", json=payload, headers={"X-Gitlab-Token": "nope"})
    assert wrong.status_code == 401
    world.controller.wake.clear()
    ok = client.post("/webhooks/gitlab", json=payload, headers={"X-Gitlab-Token": "s3cret"})
    assert ok.status_code == 200 and world.controller.wake.is_set()  # the loop ticks now...
    start = len(world.server.requests)
    for _ in range(3):  # ...and asks GitLab about that job before polling anything else
        world.clock.now += 5.0  # (runners stand still: the job stays pending)
        world.controller.tick()
    asked = [r.path for r in world.server.requests[start:] if r.path.startswith("/projects")]
    assert asked[0] == f"/projects/{PROJECT}/jobs/{job.id}"
    assert [(j.job_id, j.gpus) for j in world.controller.demand.jobs] == [(job.id, 2)]


def test_polling_stays_within_the_api_budget(world: World) -> None:
    world.advance(10)
    start = len(world.server.requests)
    world.advance(600)
    assert len(world.server.requests) - start <= 12 * 10 + 2


def test_a_failing_hook_is_logged_once_and_never_stops_the_loop(world: World,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """A side task of the tick (here a hook raising KeyError, as a bug would) runs after the
    controller acted: the tick still returns its view, and the error is logged once."""
    calls: list[int] = []

    def broken(view: object) -> None:
        calls.append(1)
        raise KeyError("a bug in a hook")

    world.controller.on_tick.append(broken)
    job = world.submit(1, 30.0)
    with caplog.at_level(logging.ERROR):
        world.advance(20)
    assert len(calls) >= 3 and job in world.fleet.started  # ticks went on, jobs ran
    assert sum("broken failed after tick" in r.getMessage() for r in caplog.records) == 1


def test_a_runner_deleted_in_gitlab_keeps_neither_the_others_unread_nor_the_host_backed_off(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    """A runner that stays unknown (404 on every read) took every re-read, so a runner
    paused by hand in GitLab's UI stayed paused while the page said open; and each pause
    sent to it failed with 404 and backed off the whole host as if GitLab were down."""
    c = world.controller
    world.advance(60)
    gone = "runnerctl/demo/gpu0-1"
    world.gitlab.delete_runner(c.cache.ids[gone])
    world.advance(60)
    gpu5 = c.cache.ids["runnerctl/demo/gpu5"]
    world.gitlab.set_paused(gpu5, True)  # by hand, in GitLab's UI
    world.advance(3600)
    assert world.gitlab.get_runner(gpu5).paused is False  # re-read, seen paused, opened again
    assert c.cache.paused["runnerctl/demo/gpu5"] is False and gone in c.cache.gone
    said = [r.getMessage() for r in caplog.records if "by someone other than runnerctl" in r.getMessage()]
    assert said == ["runner runnerctl/demo/gpu5 was paused in GitLab by someone other than runnerctl, which "
                    "sets it as its plan says: to hold runners back, use `runnerctl pause` or the web page"]
    assert c.health.failures == 0 and c.health.last_error == ""
    assert caplog.text.count(f"runner {gone} (id") == 1  # warned once, not each re-read
    job = world.submit(1, 60)
    world.advance(600)
    assert next(j.status for j in world.state.project_jobs(PROJECT) if j.id == job) == "success"


def test_a_wall_clock_stepped_back_stops_neither_polling_nor_gitlab(world: World) -> None:
    """NTP stepping the clock back an hour drove the API budget an hour's tokens into
    debt and made every project look polled in the future: no poll for an hour."""
    c = world.controller
    world.advance(120)
    world.clock.now -= 3600
    polls = c.demand.polls
    job = world.submit(4, 600)
    for _ in range(60):  # five minutes of ticks, on the stepped clock
        world.clock.now += 5
        c.tick()
    assert c.demand.polls - polls >= 10 and any(j.job_id == job for j in c.demand.jobs)
    assert c.health.ready(world.clock())


def test_due_treats_a_time_further_ahead_than_its_period_as_a_clock_stepped_back() -> None:
    assert due(10.0, 10.0, 5.0) and not due(9.0, 10.0, 5.0)
    assert due(0.0, 3600.0, 300.0)  # planned 300 s ahead at most: the clock went back
    assert not due(0.0, float("inf"), 300.0)  # never


def test_a_pause_set_while_the_loop_handles_a_reopen_stays(world: World,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Alice resumes gpu:3 (a reopen for the loop); Bob pauses it between the loop's read
    of the toggles and its removal of the reopen: the loop removed Bob's pause with it."""
    import runnerctl.controller.loop as loop

    store = world.store
    world.advance(5)
    request(store, action="resume", host="demo", target="gpu:3", who="alice", why="fixed", now=world.clock())
    real = loop.reopen

    def bob_pauses_meanwhile(state: Any, found: Any) -> Any:
        request(store, action="pause", host="demo", target="gpu:3", who="bob", why="fan", now=world.clock())
        return real(state, found)

    monkeypatch.setattr(loop, "reopen", bob_pauses_meanwhile)
    world.advance(5)  # a tick
    monkeypatch.setattr(loop, "reopen", real)
    world.advance(15)
    assert [(t.target, t.action, t.who) for t in store.toggles("demo")] == [("gpu:3", "pause", "bob")]
    assert "gpu3" not in _open(world)


def test_a_runner_deleted_in_gitlab_gets_no_cap_either(tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """With backfill by estimate, a gone runner still needed its maximum timeout set: each
    404 on it backed off the whole host."""
    settings = ControllerSettings(projects=(PROJECT,), cooldown_s=30.0,
                                  runner_max_timeout_s={"1": 7200, "2": 7200, "4": 7200, "8": 7200})
    world = build_world(tmp_path, settings=settings, policy=PlanPolicy(backfill_estimated=True))
    try:
        c = world.controller
        world.advance(60)
        world.gitlab.delete_runner(c.cache.ids["runnerctl/demo/gpu5"])
        world.advance(1800)
        assert "runnerctl/demo/gpu5" in c.cache.gone
        assert c.health.failures == 0 and "GitLab failed" not in caplog.text
    finally:
        world.close()


def test_every_project_is_polled_after_the_clock_stepped_back() -> None:
    """Every project polled 'in the future' had age 0 but the first polled after the step,
    which then won every poll: the others went unpolled for the step's length."""
    class Clock:
        now = 1_700_000_000.0

        def __call__(self) -> float:
            return self.now

    class GitLab:
        def __init__(self) -> None:
            self.polled: Counter[int] = Counter()

        def pending_jobs(self, project: int) -> list[object]:
            self.polled[project] += 1
            return []

    clock, gitlab = Clock(), GitLab()
    tracker = DemandTracker(projects=[1, 2, 3], priorities={}, budget=ApiBudget(600, clock), clock=clock)
    for _ in range(120):
        clock.now += 5
        tracker.poll(gitlab)  # type: ignore[arg-type]
    gitlab.polled.clear()
    clock.now -= 3600
    for _ in range(120):  # the ten minutes after an hour's step back
        clock.now += 5
        tracker.poll(gitlab)  # type: ignore[arg-type]
    assert set(gitlab.polled) == {1, 2, 3} and min(gitlab.polled.values()) >= 30, gitlab.polled


def test_tags_changed_in_gitlab_are_set_back_and_said(world: World, caplog: pytest.LogCaptureFixture) -> None:
    """An admin added `gpus:4` to a single in GitLab's UI: a 4-GPU job could start on one
    GPU, and neither serve nor doctor said so (found by a review as a GitLab admin)."""
    world.advance(6)
    single = world.state.runners[world.controller.cache.ids["runnerctl/demo/gpu2"]]
    want = set(single.tags)
    single.tags = want | {"gpus:4"}
    with caplog.at_level(logging.WARNING):
        world.advance(120)  # every runner is read again within this
    assert single.tags == want
    said = [r.getMessage() for r in caplog.records if "had tags" in r.getMessage()]
    assert len(said) == 1 and "runnerctl/demo/gpu2" in said[0] and "gpus:4" in said[0], said


def test_tags_that_cannot_be_set_back_are_said_once(world: World, caplog: pytest.LogCaptureFixture) -> None:
    world.advance(6)
    single = world.state.runners[world.controller.cache.ids["runnerctl/demo/gpu3"]]
    single.tags = set(single.tags) | {"gpus:4"}
    world.server.faults.append(Fault("PUT", rf"^/runners/{single.id}$", "500", count=10_000))
    with caplog.at_level(logging.WARNING):
        world.advance(300)
    said = [r.getMessage() for r in caplog.records if "setting them back failed" in r.getMessage()]
    assert len(said) == 1 and "runnerctl/demo/gpu3" in said[0], said


def test_a_block_is_not_resumed_over_a_runner_a_short_run_of_404s_hid(world: World) -> None:
    """A fresh controller's first reads met four 404s (a proxy hiccup): the singles they
    hid were open in GitLab, yet counted as gone, nothing was sent to them, and the block
    over gpu2 was resumed beside the open gpu2 (S1; found by the property test). The block
    waits until a read finds the single (then paused like any other) or 404s repeat."""
    from tests.test_properties_controller import unpaused_overlap, watch

    violations: list[object] = []
    watch(world, violations)
    job = world.submit(2, 5.0)
    world.controller = Controller(world.controller.wiring, SETTINGS)  # a restart: nothing known
    world.server.faults.append(Fault("*", r"/runners|/projects", "404", count=4))
    world.advance(36)
    assert violations == [] and unpaused_overlap(world) is None
    world.advance(300)
    assert job in world.fleet.started  # and the job ran once the singles were read again


def test_a_store_made_again_under_the_controller_gets_its_inventory_again(world: World) -> None:
    """Published once per start, the host's GPUs and slots (what a toggle may name) were
    missing from a store whose tables were dropped and made again until serve restarted."""
    world.advance(6)
    store = world.controller.wiring.store
    assert store.inventory(world.controller.host) is not None
    with store._tx() as cur:  # the database dropped and made again: no table left
        for (table,) in cur.query("SELECT name FROM sqlite_master WHERE type = 'table' "
                                  "AND name NOT LIKE 'sqlite_%'"):
            cur.execute(f'DROP TABLE "{table}"')
    with pytest.raises(StoreError, match="no such table"):
        world.advance(5)  # the tick that finds the tables gone fails (serve's loop logs it, retries)
    world.advance(30)  # the next makes the schema again
    assert store.inventory(world.controller.host) is not None


def test_a_store_another_host_made_again_gets_this_hosts_inventory_too(world: World, tmp_path: Path) -> None:
    """The tables dropped and made again by another process (another host's serve, a CLI
    command): this controller never saw a missing table, and never published its GPUs and
    slots again (found by a review of the change)."""
    world.advance(6)
    store = world.controller.wiring.store
    with store._tx() as cur:
        for (table,) in cur.query("SELECT name FROM sqlite_master WHERE type = 'table' "
                                  "AND name NOT LIKE 'sqlite_%'"):
            cur.execute(f'DROP TABLE "{table}"')
    Store.open(state_dir=tmp_path).close()  # another opener makes the schema again
    assert store.inventory(world.controller.host) is None
    world.advance(10)
    assert store.inventory(world.controller.host) is not None
