"""Job history, retention and `runnerctl report` on a simulated host around the real
controller (virtual time: `World.advance`)."""

from __future__ import annotations

import dataclasses
import json
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from runnerctl.cli import main
from runnerctl.columns import cells
from runnerctl.controller import jobs_store
from runnerctl.controller.history import History
from runnerctl.controller.jobs_store import JobRecord
from runnerctl.controller.loop import Controller
from runnerctl.controller.observe import LeasedJob, LeaseJobs
from runnerctl.controller.store import Event, Store, StoreError
from runnerctl.executors.lease import Lease
from runnerctl.gpus.sim import count_snapshot
from runnerctl.postgres import PostgresServer
from runnerctl.report import build, to_csv, to_text
from runnerctl.settings import ControllerSettings
from runnerctl.sim import demo
from runnerctl.sim.world import PROJECT, World, build_world


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = build_world(tmp_path, settings=ControllerSettings(projects=(PROJECT,), unused_after_s=600.0))
    yield w
    w.close()


def _finish(world: World, deadline_s: float = 7200.0) -> None:
    """Advance until every submitted job finished (bounded)."""
    end = world.clock.now + deadline_s
    while (len(world.fleet.finished) < len(world.submitted)) and world.clock.now < end:
        world.advance(10.0)
    world.advance(2 * world.controller.settings.interval_s)
    assert len(world.fleet.finished) == len(world.submitted)


def _expected_gpu_hours(world: World) -> dict[int, float]:
    return {job: world.submitted[job][1] * (world.fleet.finished[job] - world.fleet.started[job]) / 3600
            for job in world.submitted}


def test_every_job_is_recorded_once_with_its_gpus_times_and_user(world: World) -> None:
    jobs = [world.submit(1, 300.0, user="carol", name="lint"), world.submit(2, 200.0, user="dave"),
            world.submit(4, 250.0, user="carol", name="train")]
    _finish(world)
    records = {r.job_id: r for r in jobs_store.jobs(world.store)}
    assert set(records) == set(jobs)
    expected = _expected_gpu_hours(world)
    for job, record in records.items():
        assert record.ended_at is not None and record.outcome == "ended"
        assert record.name == world.state.jobs[job].name  # the lease's (CI_JOB_NAME)
        assert len(record.gpus) == world.submitted[job][1]
        assert record.gpu_hours == pytest.approx(expected[job], rel=0.02)
        assert record.started_at == world.fleet.started[job]  # from the lease: exact
        assert record.mean_utilization == pytest.approx(0.9)
        assert record.idle_gpu_s == 0.0 and record.unused_at is None
    assert records[jobs[1]].user == "dave" and records[jobs[0]].project == f"project-{PROJECT}"
    waited = records[jobs[2]]  # the 4-GPU job waited for its block: demand polling saw it pending
    assert waited.queued_at == world.submitted[jobs[2]][0] and waited.name == "train"
    assert waited.wait_s == pytest.approx(world.fleet.started[jobs[2]] - world.submitted[jobs[2]][0])


def test_a_restart_neither_loses_nor_double_counts_a_running_job(world: World) -> None:
    job = world.submit(2, 1500.0, user="erin", utilization=0.0)
    world.advance(700.0)  # flagged unused after 600 s
    assert [r.job_id for r in jobs_store.open_jobs(world.store, "demo")] == [job]
    # the controller process restarts: a new Controller over the same store, twice
    world.controller = Controller(world.controller.wiring, world.controller.settings)
    world.advance(100.0)
    assert world.controller.view.unused == (job,)  # still flagged, from the stored row
    world.controller = Controller(world.controller.wiring, world.controller.settings)
    _finish(world)
    records = jobs_store.jobs(world.store)
    assert [r.job_id for r in records] == [job]
    assert records[0].gpu_hours == pytest.approx(_expected_gpu_hours(world)[job], rel=0.01)
    assert records[0].idle_gpu_s == pytest.approx(2 * 1500.0, rel=0.02)  # samples kept across restarts
    assert records[0].util_samples >= 1500 / 5 - 3
    assert [e.kind for e in world.store.events("demo", limit=1000)].count("unused") == 1
    text = to_text(build(records, by="user", since=None, until=world.clock()))
    assert f"  job {job} of erin on demo GPUs " in text  # the flag weighed against the job's whole use:
    assert f" {records[0].idle_gpu_s / 3600:.2f} idle GPU-h of {records[0].gpu_hours:.2f}, flagged " in text


def test_a_wall_clock_step_is_no_time_spent(world: World, caplog: pytest.LogCaptureFixture) -> None:
    """NTP setting a wrong clock after serve started: a 2-hour step flagged every running
    job "requested but unused" for 120 minutes, and a step back left its sightings in the
    future (found by a review as an operator breaking things). The running jobs' times
    move with the step; the step is logged."""
    job = world.submit(1, 30_000.0, user="erin", utilization=0.0)
    stepped = [0.0]
    world.controller.wiring = dataclasses.replace(world.controller.wiring,
                                                  monotonic=lambda: world.clock.now - stepped[0])
    world.advance(100.0)
    started = world.fleet.started[job]
    assert world.controller.history.open[job].low_since is not None  # idle, not yet for long
    with caplog.at_level(logging.WARNING):
        world.clock.now += 2400.0  # the wall clock steps 40 min (under the job's 1-hour timeout)
        stepped[0] += 2400.0
        world.advance(100.0)
    assert "the wall clock stepped +2400 s" in caplog.text
    assert "unused" not in [e.kind for e in world.store.events("demo", limit=1000)]  # 200 s idle of 600
    [row] = jobs_store.open_jobs(world.store, "demo")
    assert row.started_at == started + 2400.0
    world.clock.now -= 2400.0  # and back
    stepped[0] -= 2400.0
    world.controller.tick()  # (the world's own schedule would wait for its next tick, 40 min on)
    [row] = jobs_store.open_jobs(world.store, "demo")
    assert row.started_at == started and row.seen_at <= world.clock.now


def test_a_job_that_ends_while_the_store_fails_is_closed_once_it_is_back(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    job = world.submit(2, 40.0, user="erin")
    world.advance(20)
    assert [r.job_id for r in jobs_store.open_jobs(world.store, "demo")] == [job]
    real = jobs_store.save_jobs

    def down(store: object, records: object) -> None:
        raise StoreError("the controller store is busy: database is locked")

    monkeypatch.setattr(jobs_store, "save_jobs", down)
    failed = 0
    for _ in range(60):  # the job ends while every tick fails on the store
        try:
            world.advance(1)
        except StoreError:
            failed += 1
    assert failed > 0 and job in world.fleet.finished
    monkeypatch.setattr(jobs_store, "save_jobs", real)
    world.advance(10)
    (record,) = [r for r in jobs_store.jobs(world.store) if r.job_id == job]
    assert record.ended_at == pytest.approx(world.fleet.finished[job], abs=5.0)
    assert jobs_store.open_jobs(world.store, "demo") == []


def test_a_lease_gone_while_the_controller_was_down_ends_at_its_last_sighting(tmp_path: Path) -> None:
    store = Store.open(state_dir=tmp_path)
    settings = ControllerSettings()
    lease = LeasedJob("runnerctl/h/gpu0", (0,), "ann", created_at=1000.0)
    history = History(store, "h", settings)
    snapshot = count_snapshot("h", 2)
    history.tick({7: lease}, snapshot, 1000.0, lambda *e: None)
    history.tick({7: lease}, snapshot, 1005.0, lambda *e: None)
    again = History(store, "h", settings)  # restarted an hour later: the lease is gone
    again.tick({}, snapshot, 4605.0, lambda *e: None)
    [record] = jobs_store.jobs(store)
    assert record.ended_at == 1005.0 and record.gpu_hours == pytest.approx(5 / 3600)
    store.close()


def test_unknown_utilization_stays_unknown(tmp_path: Path) -> None:
    store = Store.open(state_dir=tmp_path)
    history = History(store, "h", ControllerSettings(unused_after_s=1.0))
    base = count_snapshot("h", 1)
    blind = dataclasses.replace(base, gpus=tuple(dataclasses.replace(g, utilization=None) for g in base.gpus))
    events: list[tuple[str, ...]] = []
    lease = LeasedJob("runnerctl/h/gpu0", (0,), "ann", created_at=0.0)
    for t in (0.0, 5.0, 10.0, 15.0):
        history.tick({1: lease}, blind, t, lambda *e: events.append(e))
    history.tick({}, None, 20.0, lambda *e: events.append(e))
    [record] = jobs_store.jobs(store)
    assert record.mean_utilization is None and record.to_json()["mean_utilization"] is None
    assert record.idle_gpu_s == 0.0 and record.unused_at is None and events == []
    store.close()


def test_a_batch_job_is_never_flagged_by_this_hosts_gpus(tmp_path: Path) -> None:
    """A batch driver's job runs on a cluster node: the runner host's GPUs (often `sim:`,
    at 0 %) flagged every batch job "requested but unused" (found by a review against the
    HPC seeds). Its use is unknown here; a lease read from disk says so."""
    store = Store.open(state_dir=tmp_path)
    history = History(store, "h", ControllerSettings(unused_after_s=1.0))
    idle = count_snapshot("h", 1)  # utilization 0.0
    events: list[tuple[str, ...]] = []
    lease = LeasedJob("runnerctl/h/gpu0", (0,), "ann", created_at=0.0, elsewhere=True)
    for t in (0.0, 5.0, 10.0):
        history.tick({1: lease}, idle, t, lambda *e: events.append(e))
    [record] = jobs_store.jobs(store)
    assert record.unused_at is None and record.mean_utilization is None and events == []
    store.close()
    jobs = LeaseJobs(tmp_path / "state")
    for driver, elsewhere in (("slurm", True), ("pjm", True), ("docker", False)):
        jobs.table.acquire((0,), Lease(gpu=-1, job_id="7", slot="runnerctl/h/gpu0", driver=driver,
                                       owner_pid=1, owner_started=0.0, created_at=0.0, nonce="n"), wait_s=0)
        jobs.running()
        assert jobs.leased()[7].elsewhere is elsewhere, driver
        jobs.table.release("7")


def test_a_job_at_zero_utilization_is_flagged_once_shown_and_reported(world: World) -> None:
    idle = world.submit(2, 1500.0, user="frank", utilization=0.0)
    busy = world.submit(1, 1500.0, user="gina")
    world.advance(300.0)
    assert world.controller.view.unused == ()  # not yet: 600 s threshold
    world.advance(400.0)
    assert world.controller.view.unused == (idle,)
    from fastapi.testclient import TestClient

    from runnerctl.controller.app import create_app

    app = create_app(lambda: world.controller.view, world.controller.demand.webhook)
    state = TestClient(app).get("/api/state")
    assert state.json()["unused"] == [idle]  # the flag in /api/state
    from runnerctl.web.view import JobMemory, host_page

    page = host_page(world.controller.view, [], JobMemory())
    flagged = {j.job_id for g in page.gpus for j in g.jobs if j.unused}
    assert flagged == {idle}  # the page's badge
    _finish(world)
    unused_events = [e for e in world.store.events("demo", limit=1000) if e.kind == "unused"]
    assert [e.subject for e in unused_events] == [f"job {idle}"]  # once per job
    assert "frank" in unused_events[0].detail
    report = build(jobs_store.jobs(world.store), by="user", since=None, until=world.clock.now)
    rows = {r.key: r for r in report.rows}
    assert [j.job_id for j in report.unused] == [idle] and rows["frank"].unused_jobs == 1
    assert rows["frank"].idle_gpu_hours == pytest.approx(rows["frank"].gpu_hours, rel=0.02)
    assert rows["gina"].idle_gpu_hours == 0.0 and busy not in {j.job_id for j in report.unused}


def test_retention_keeps_the_store_bounded_over_a_long_run(tmp_path: Path) -> None:
    settings = ControllerSettings(projects=(PROJECT,), interval_s=60.0, history_retention_days=1 / 24,
                                  events_retention_days=1 / 48)
    recorded: list[object] = []
    world = build_world(tmp_path, settings=settings, on_event=recorded.append)
    try:
        sizes = []
        for _hour in range(7):
            for i in range(6):
                world.submit(1 + (i % 2), 500.0, user=f"u{i % 3}")
            world.advance(3600.0, step=30.0)
            sizes.append(jobs_store.count_rows(world.store))
        assert len(world.fleet.finished) == 42
        print("rows (job history, events) after each hour:", sizes)
        # 42 jobs ran; kept: those of the last retention period plus at most an hour to the next prune
        assert all(jobs <= 18 for jobs, _ in sizes[2:]), sizes
        assert all(events <= max(e for _, e in sizes[:3]) for _, events in sizes[3:]), sizes
        assert sizes[-1][1] < len(recorded) / 3
        oldest = min(r.end for r in jobs_store.jobs(world.store))
        assert world.clock.now - oldest <= 2 * 3600.0 + 60.0
    finally:
        world.close()


def test_retention_reaches_expired_sessions_and_hosts_gone_quiet(tmp_path: Path) -> None:
    """Retention covered the job history and the events only: an expired web session
    stayed until someone signed in, and a stopped host's last queue (users, job links)
    for good (found by a privacy review)."""
    from runnerctl.controller import host_views
    from runnerctl.controller.store import WebSession

    day = 86400.0
    world = build_world(tmp_path, settings=ControllerSettings(projects=(PROJECT,), events_retention_days=30))
    try:
        now = world.clock()
        world.store.save_session(WebSession("k-new", "bo", "local", "operator", None, now, now, now + day))
        world.store.save_session(WebSession("k-old", "ada", "gitlab", "viewer", 7, now - 2 * day,
                                            now - 2 * day, now - day))  # its sign-in removes no later one
        host_views.save(world.store, host="gpu-gone", at=now - 31 * day, interval_s=5.0, tick=9,
                        view={"gpus": [], "queue": [{"user": "ada"}], "gitlab_error": None})
        host_views.save(world.store, host="gpu-b", at=now - day, interval_s=5.0, tick=9,
                        view={"gpus": [], "queue": [], "gitlab_error": None})
        world.advance(10.0, step=5.0)  # the first tick prunes
        with world.store.transaction() as cur:
            keys = {row[0] for row in cur.query("SELECT key FROM web_sessions")}
        assert keys == {"k-new"}
        hosts = {row.host for row in host_views.load(world.store)}
        assert "gpu-b" in hosts and "gpu-gone" not in hosts
    finally:
        world.close()


def test_report_after_the_demo_matches_the_simulated_gpu_hours(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "demo-state"
    assert main(["demo", "--duration", "0", "--listen", "", "--state-dir", str(state)]) == 0
    capsys.readouterr()
    assert main(["report", "--state-dir", str(state), "--by", "user", "--json"]) == 0
    rows = {r["key"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    expected: dict[str, float] = {}
    jobs = [arg for _, action, arg in sorted(demo.SCRIPT, key=lambda item: item[0]) if action == "job"]
    for index, (gpus, duration) in enumerate(jobs):
        user = demo.USERS[index % len(demo.USERS)]
        expected[user] = expected.get(user, 0.0) + gpus * duration / 3600
    assert set(rows) == set(demo.USERS)
    for user, hours in expected.items():
        assert rows[user]["gpu_hours"] == pytest.approx(hours, rel=0.01), user
    assert sum(r["jobs"] for r in rows.values()) == len(jobs)

    kept = (state / "controller.sqlite").read_bytes()  # a second demo there would overwrite it
    assert main(["demo", "--duration", "0", "--listen", "", "--state-dir", str(state)]) == 2
    err = capsys.readouterr().err
    assert f"{state} is not empty; give a new or empty directory" in err and len(err.splitlines()) == 1
    assert (state / "controller.sqlite").read_bytes() == kept


def test_report_by_gpus_gives_the_run_times_per_size() -> None:
    """`--by gpus`: one row per GPUs per job, in numeric order; run p95 and longest over
    the jobs that ended on their own (a cancelled or freed run says when someone stopped
    it, a running one has no end yet), for choosing runner_max_timeout_s."""
    def job(job_id: int, gpus: int, run_s: float | None, outcome: str = "success") -> JobRecord:
        ended = None if run_s is None else 1000.0 + run_s
        return JobRecord("gpu-a", job_id, "slot", tuple(range(gpus)), "lab/app", "", "train", "ann", "",
                         queued_at=900.0, started_at=1000.0, seen_at=ended or 99_000.0, ended_at=ended,
                         outcome=outcome if run_s is not None else "running")
    records = [job(1, 8, 600.0), job(2, 8, 7200.0, "failed"), job(3, 8, 50_000.0, "canceled"),
               job(4, 2, 600.0), job(5, 2, 900.0, "freed"), job(6, 16, None)]
    records += [job(10 + i, 1, 60.0 * (i + 1)) for i in range(40)]
    report = build(records, by="gpus", since=None, until=100_000.0)
    rows = {r.key: r for r in report.rows}
    assert [r.key for r in report.rows] == ["1", "2", "8", "16"]
    assert (rows["8"].jobs, rows["8"].run_p95_s, rows["8"].run_max_s) == (3, 7200.0, 7200.0)  # failed counts
    assert (rows["2"].run_p95_s, rows["2"].run_max_s) == (600.0, 600.0)
    assert (rows["1"].run_p95_s, rows["1"].run_max_s) == (60.0 * 39, 60.0 * 40)  # p95 of 40 runs: the 39th
    assert rows["16"].run_max_s is None and rows["16"].jobs == 1 and rows["16"].running_max_s == 98_000.0
    text = to_text(report)
    assert "run p95" in text and " 2.0 h " in text
    assert "16 GPUs: a job still running has run 27.2 h so far, longer than any that ended" in text
    assert "8 GPUs: a job still running" not in text and rows["8"].running_max_s is None
    assert to_csv(report).splitlines()[0].endswith("unused_jobs,run_p95_s,run_max_s,running_max_s")
    late = build(records, by="gpus", since=9000.0, until=100_000.0)  # after every run but 3 and 6 ended
    assert [(r.key, r.jobs, r.run_max_s) for r in late.rows] == [("8", 1, None), ("16", 1, None)]
    across = {r.key: r for r in build(records, by="gpus", since=1500.0, until=100_000.0).rows}
    assert across["8"].run_max_s == 7200.0 and across["8"].gpu_hours < 8 * (7200 + 50_000) / 3600  # run whole


def test_report_outputs_and_one_line_errors(world: World, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    world.submit(1, 120.0, user="carol")
    _finish(world)
    state = str(tmp_path)
    assert main(["report", "--state-dir", state, "--by", "host", "--csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("host,jobs,gpu_hours") and lines[1].startswith("demo,1,")
    assert main(["report", "--state-dir", state, "--since", "2000-01-01"]) == 0
    assert "carol" in capsys.readouterr().out
    assert main(["report", "--state-dir", state, "--since", "2999-01-01", "--by", "project"]) == 0
    assert "(no jobs in this period)" in capsys.readouterr().out
    for args in (["--since", "last tuesday"], ["--since", "2024-13-40"]):
        assert main(["report", "--state-dir", state, *args]) != 0
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is not a date" in err and "Traceback" not in err
    assert main(["report", "--state-dir", str(tmp_path / "nowhere")]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no controller store" in err
    assert not (tmp_path / "nowhere").exists()
    config = tmp_path / "runnerctl.toml"
    config.write_text("[controller]\nhistory_retention_days = 0\n")
    assert main(["report", "--config", str(config)]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "history_retention_days must be more than 0" in err


def test_the_outcome_comes_from_gitlab_job_webhooks_else_ended(tmp_path: Path) -> None:
    world = build_world(tmp_path, webhook_secret="hook-secret")
    try:
        early, late, silent = (world.submit(1, 100.0, user="ann") for _ in range(3))

        def hook(job: int, status: str) -> None:
            payload = {"object_kind": "build", "build_id": job, "build_status": status, "project_id": PROJECT}
            assert world.controller.demand.webhook("hook-secret", payload)

        world.advance(30.0)
        hook(early, "failed")  # heard while its lease still stands
        _finish(world)
        hook(late, "canceled")  # heard after its lease went
        world.advance(10.0)
        outcomes = {r.job_id: r.outcome for r in jobs_store.jobs(world.store)}
        assert outcomes == {early: "failed", late: "canceled", silent: "ended"}
    finally:
        world.close()


def test_history_on_a_shared_postgresql_store(pg_server: PostgresServer) -> None:
    """Two hosts write to one PostgreSQL store; the report sums both; retention prunes it."""
    url = pg_server.create_database("history_store")
    settings = ControllerSettings(history_retention_days=1.0, events_retention_days=1.0)
    stores = [Store.open(url=url), Store.open(url=url)]
    try:
        snapshot = count_snapshot("h", 2)
        for index, (store, host) in enumerate(zip(stores, ("gpu-a", "gpu-b"), strict=True)):
            history = History(store, host, settings)
            lease = LeasedJob(f"runnerctl/{host}/gpu0-1", (0, 1), f"user{index}", project="lab/app",
                              created_at=1000.0)
            for t in (1000.0, 1005.0, 4600.0):
                history.tick({10 + index: lease}, snapshot, t, lambda *e: None)
            history.tick({}, snapshot, 4605.0, lambda *e: None)
        store.record(Event(1000.0, "gpu-a", "resume", "gpu0", "old"))
        report = build(jobs_store.jobs(stores[0]), by="project", since=None, until=5000.0)
        assert [(r.key, r.jobs) for r in report.rows] == [("lab/app", 2)]
        assert report.rows[0].gpu_hours == pytest.approx(2 * 2 * 3602.5 / 3600)
        assert jobs_store.open_jobs(stores[1], "gpu-b") == []
        assert jobs_store.prune(stores[1], jobs_before=1e9, events_before=1e9)[:2] == (2, 1)
        assert jobs_store.count_rows(stores[0]) == (0, 0)
    finally:
        for store in stores:
            store.close()


def test_the_job_name_comes_from_the_lease_when_the_job_was_never_seen_pending(tmp_path: Path) -> None:
    store = Store.open(state_dir=tmp_path)
    history = History(store, "h", ControllerSettings())
    snapshot = count_snapshot("h", 2)
    named = LeasedJob("runnerctl/h/gpu0", (0,), "ann", created_at=0.0, name="train")
    older = LeasedJob("runnerctl/h/gpu1", (1,), "bob", created_at=0.0)  # an older executor's lease
    history.tick({1: named, 2: older}, snapshot, 0.0, lambda *e: None)
    history.tick({}, snapshot, 5.0, lambda *e: None)
    assert {r.job_id: r.name for r in jobs_store.jobs(store)} == {1: "train", 2: ""}
    store.close()


@pytest.mark.parametrize("freed", [True, False])
def test_a_freed_job_ends_by_the_tick_that_heard_its_status(tmp_path: Path, freed: bool) -> None:
    """The orphan audit frees a lease minutes after its job ended in GitLab; the webhook
    heard at the job's end says when it ended. A job that was not freed keeps its
    lease's end (a `canceled` job's processes may hold the GPUs until its lease goes)."""
    store = Store.open(state_dir=tmp_path)
    history = History(store, "h", ControllerSettings())
    snapshot = count_snapshot("h", 1)
    lease = LeasedJob("runnerctl/h/gpu0", (0,), "ann", created_at=0.0, name="train")
    for t in (0.0, 5.0, 100.0):
        heard = {7: "success"} if t == 100.0 else None  # the job's webhook
        history.tick({7: lease}, snapshot, t, lambda *e: None, outcomes=heard)
    for t in (105.0, 520.0):
        history.tick({7: lease}, snapshot, t, lambda *e: None)
    if freed:
        history.freed.add(7)
    history.tick({}, snapshot, 525.0, lambda *e: None)
    [record] = jobs_store.jobs(store)
    assert record.outcome == "success"
    assert record.ended_at == (100.0 if freed else 522.5)
    store.close()


def test_a_job_across_a_clock_stepped_back_stays_in_the_history_and_the_report(tmp_path: Path) -> None:
    """NTP steps the clock back an hour while a 4-GPU job runs: its row ended before it
    started, and the report left it out without a word."""
    store = Store.open(state_dir=tmp_path)
    history = History(store, "gpu-a", ControllerSettings())
    start = 1_800_000_000.0
    lease = LeasedJob(slot="runnerctl/gpu-a/gpu0-3", gpus=(0, 1, 2, 3), user="carol", project="ml/a",
                      created_at=start)
    for k in range(0, 600, 5):
        history.tick({7: lease}, None, start + k, lambda *event: None)
    for k in range(0, 3000, 5):  # an hour back, then 50 more minutes
        history.tick({7: lease}, None, start + 600 - 3600 + k, lambda *event: None)
    history.tick({}, None, start + 600 - 3600 + 3000, lambda *event: None)
    (row,) = jobs_store.jobs(store, since=0)
    assert row.started_at <= row.seen_at <= row.ended_at  # type: ignore[operator]
    assert row.ended_at is not None and row.ended_at - row.started_at >= 590  # the part it saw
    assert "carol" in to_text(build([row], by="user", since=None, until=start + 7200))


def test_the_pages_job_memory_is_shared_by_request_threads_and_forgets_jobs_gone(world: World) -> None:
    """Two page requests updating it at once raised "dictionary changed size during
    iteration" (a 500), and jobs that ran on another host stayed in it for ever (found by
    a review as a concurrency engineer)."""
    import sys
    import threading

    from runnerctl.web.view import JobMemory

    for _ in range(8):
        world.submit(1, 3600.0)
    world.advance(12)  # every GPU busy
    pending = world.submit(8, 600.0)  # waits for a drain, listed in demand
    world.advance(12)
    busy = world.controller.view
    assert any(j.job_id == pending for j in busy.demand)
    empty = dataclasses.replace(busy, demand=(), owners={}, slots=())
    memory = JobMemory()
    memory.update(busy)
    assert pending in memory.owner
    memory.update(empty)  # it ran elsewhere, or was cancelled
    assert memory.owner == {} and memory.first_seen == {}
    errors: list[BaseException] = []

    def hammer() -> None:
        for i in range(2000):
            try:
                memory.update(busy if i % 2 else empty)
            except BaseException as exc:  # noqa: BLE001 - any error is the finding
                errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        threads = [threading.Thread(target=hammer) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        sys.setswitchinterval(interval)
    assert errors == []


def test_a_host_whose_clock_is_months_ahead_prunes_by_the_stores_clock(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retention deletes every host's rows of a shared store; it cut by this host's own
    clock, so one booted 120 days ahead deleted the whole lab's events on its first tick
    though it had just measured its skew (found by a review of the clocks). It cuts by the
    store's clock now."""
    ahead = 120 * 86400.0
    world.store.record(Event(at=world.clock.now - 86400.0, host="gpu-b", kind="note", subject="s",
                             detail="d"))
    monkeypatch.setattr("runnerctl.controller.loop.clock_skew", lambda store, clock: (ahead, "ahead"))
    c = world.controller
    c.wiring = dataclasses.replace(c.wiring, check_clock=True)
    world.clock.now += ahead
    c.history._next_prune = 0.0  # prune on this tick
    c.tick()
    assert [e.host for e in world.store.events("gpu-b")] == ["gpu-b"]


def test_a_later_stages_job_waited_from_when_it_was_queued_not_created(world: World) -> None:
    """A job of a later stage is created with its pipeline and queued when the stages
    before it end; the history, the page and the report counted its wait from creation,
    hours of earlier stages included (found by a review of the clocks)."""
    from runnerctl.web.view import JobMemory, host_page

    for _ in range(8):
        world.submit(1, 100.0)  # every GPU busy for a while
    world.advance(10)
    job = world.submit(1, 60.0, created_at=world.clock.now - 3 * 3600.0)  # its stage 1 ran 3 h
    world.advance(10)
    [row] = [d for d in host_page(world.controller.view, [], JobMemory()).demand if d.job_id == job]
    assert row.waiting_s < 60
    world.advance(300)
    assert job in world.fleet.finished
    [record] = [r for r in jobs_store.jobs(world.store) if r.job_id == job]
    assert record.wait_s is not None and record.wait_s < 300


def test_a_running_jobs_run_time_on_the_page_survives_a_restart_of_serve(world: World) -> None:
    """The page counted a job's run time from its own first sighting, so after `serve`
    restarted every running job showed 0 s (found by a review of the clocks); the lease
    says when the job took its GPUs."""
    from runnerctl.web.view import JobMemory, host_page

    job = world.submit(1, 3000.0)
    world.advance(600)
    page = host_page(world.controller.view, [], JobMemory())  # a page process just started
    [shown] = [j for g in page.gpus for j in g.jobs if j.job_id == job]
    assert 500 < shown.runtime_s < 700


def test_report_columns_line_up_with_japanese_names() -> None:
    """Padded by characters, a Japanese name (two terminal cells each) pushed the rest of
    its row six cells right of the others' (found by a review as an internationalisation
    reviewer); a name longer than the column is cut at its width, never mid-character."""
    def job(job_id: int, user: str) -> JobRecord:
        return JobRecord("gpu-a", job_id, "slot", (0,), "lab/app", "", "train", user, "", queued_at=900.0,
                         started_at=1000.0, seen_at=1600.0, ended_at=1600.0, outcome="success")
    names = ["carol", "田中太郎", "渡辺・ワタナベ・わたなべ・🔧"]
    report = build([job(i, name) for i, name in enumerate(names)], by="user", since=None, until=2000.0)
    rows = to_text(report).splitlines()[2:5]
    assert sorted(line.split()[0] for line in rows) == ["carol", "渡辺・ワタナベ・わた", "田中太郎"], rows
    assert len({cells(line) for line in rows}) == 1, rows  # every row as wide as the others
    assert all(cells(line[:line.index(" 1 ")]) == 25 for line in rows), rows  # the jobs column, aligned


def test_a_store_that_cannot_write_costs_no_job_its_row(tmp_path: Path) -> None:
    """A write early in the tick (the gate, the drains, an event) failed it before the
    history looked at the leases: a job that started and ended while the store could
    not write (a full disk) had no row, and one that ended then was cut at the last
    sighting before (found by a review of a host out of disk space)."""
    world = build_world(tmp_path / "store", settings=ControllerSettings(projects=(PROJECT,)),
                        store_timeout_s=0.1)
    try:
        long = world.submit(1, 200.0, user="alice")
        world.advance(100, step=5.0)
        holder = sqlite3.connect(tmp_path / "store" / "controller.sqlite", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # no write gets through, as on a full disk
        short = world.submit(1, 50.0, user="carol")
        failed: list[Exception] = []
        world.advance(300, step=5.0, failed_ticks=failed)
        assert failed and all("locked" in str(exc) for exc in failed)
        holder.execute("ROLLBACK")
        holder.close()
        world.advance(30, step=5.0)
        rows = {r.job_id: r for r in jobs_store.jobs(world.store)}
        assert short in rows and 40 <= rows[short].end - rows[short].started_at <= 65
        assert 190 <= rows[long].end - rows[long].started_at <= 215
    finally:
        world.close()
