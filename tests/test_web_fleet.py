"""The fleet in the JSON API, in process: each host's last good tick in the store
(controller/host_views.py), its GPUs and queue on every host's page, a host with no good
tick for two intervals shown stopped and its stale queue left out; every host's job
history with filters."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from runnerctl.controller import host_views, jobs_store
from runnerctl.controller.app import create_app
from runnerctl.controller.jobs_store import JobRecord
from runnerctl.exporter import endpoint
from runnerctl.settings import ControllerSettings, WebSettings
from runnerctl.sim.world import PROJECT, World, build_world
from runnerctl.tags import job_tags
from runnerctl.web.fleet import publisher
from runnerctl.web.routes import install


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    world = build_world(tmp_path, settings=ControllerSettings(projects=(PROJECT,), interval_s=1.0))
    world.controller.on_tick.append(publisher(world.store, interval_s=1.0, clock=world.clock))
    yield world
    world.close()


def _client(world: World, state_dir: Path) -> TestClient:
    app = create_app(lambda: world.controller.view, world.controller.demand.webhook,
                     endpoint(lambda: world.controller.stats.view), extend=[
        lambda app: install(app, view=lambda: world.controller.view, store=world.store,
                            settings=WebSettings(), state_dir=state_dir, clock=world.clock)])
    return TestClient(app)


def _other_host(world: World, name: str, *, at: float, queue: list[dict[str, Any]]) -> None:
    gpus = [{"index": i, "name": "sim", "state": "idle", "detail": "", "utilization": 0.0,
             "memory_used_mib": 0, "memory_total_mib": 81920, "processes": [], "jobs": [], "toggle": None}
            for i in range(8)]
    host_views.save(world.store, host=name, at=at, interval_s=1.0, tick=3,
                    view={"gpus": gpus, "queue": queue, "gitlab_error": ""})


def _queued(job_id: int, reason: str, *, created_at: float, priority: str = "normal",
            elsewhere: bool = False) -> dict[str, Any]:
    return {"job_id": job_id, "gpus": 8, "project_id": 1, "priority": priority, "user": "erin", "url": None,
            "created_at": created_at, "reason": reason, "detail": f"{reason} on the other host",
            "elsewhere": elsewhere}


def test_every_host_shows_its_gpus_and_a_silent_one_is_stopped(world: World, tmp_path: Path) -> None:
    world.submit(4, 3600.0, user="carol")
    world.gpus.foreign[7] = (4242, "alice")
    world.advance(20.0)
    _other_host(world, "gpu-b", at=world.clock() - 0.5, queue=[])
    _other_host(world, "gpu-c", at=world.clock() - 2.5, queue=[])  # 2.5 intervals: stopped
    fleet = {h["host"]: h for h in _client(world, tmp_path).get("/api/fleet").json()}
    assert {name: h["state"] for name, h in fleet.items()} == {"demo": "running", "gpu-b": "running",
                                                               "gpu-c": "stopped"}
    assert sum(len(h["gpus"]) for h in fleet.values()) == 24
    demo = {g["index"]: g["state"] for g in fleet["demo"]["gpus"]}
    assert [demo[i] for i in range(4)] == ["ci"] * 4 and demo[7] == "foreign"
    assert fleet["gpu-c"]["age_s"] == pytest.approx(2.5, abs=0.01)


def test_the_controller_of_this_host_stops_and_its_page_says_so(world: World, tmp_path: Path) -> None:
    world.advance(5.0)
    client = _client(world, tmp_path)
    assert client.get("/api/fleet").json()[0]["state"] == "running"
    world.clock.now += 2.5  # no tick: the controller is stopped
    assert client.get("/api/fleet").json()[0]["state"] == "stopped"


def test_the_queue_merges_hosts_with_the_most_telling_reason(world: World, tmp_path: Path) -> None:
    first = world.submit(8, 3600.0, user="carol")
    world.advance(20.0)
    busy = world.submit(8, 600.0, user="dave")  # the whole host is taken: it waits
    world.advance(3.0)
    now = world.clock()
    urgent = _queued(777, "resources", created_at=now - 100, priority="high")
    _other_host(world, "gpu-b", at=now, queue=[_queued(busy, "draining", created_at=now - 3), urgent,
                                               _queued(555, "draining", created_at=now - 2, elsewhere=True)])
    _other_host(world, "gpu-d", at=now, queue=[_queued(555, "draining", created_at=now - 2)])
    _other_host(world, "gpu-c", at=now - 5, queue=[_queued(888, "held", created_at=now - 50)])  # stopped
    queue = _client(world, tmp_path).get("/api/queue").json()
    assert [(j["position"], j["job_id"]) for j in queue] == [(1, 777), (2, busy), (3, 555)]  # 888 is stale
    assert queue[2]["host"] == "gpu-d"  # the host that drains for it, not one that says another does
    mine = queue[1]
    assert mine["reason"] == "draining" and mine["user"] == "dave"
    assert mine["host"] == "demo" and mine["detail"] == f"runner gpu0-7 drains for it, waiting on job {first}"
    assert {r["host"]: r["reason"] for r in mine["hosts"]} == {"demo": "draining", "gpu-b": "draining"}
    assert mine["waiting_s"] >= 3.0


def test_a_job_pinned_to_another_host_says_so_and_that_hosts_reason_wins(world: World,
                                                                          tmp_path: Path) -> None:
    """This host's planner leaves out a job a `host:` tag pins to gpu-b: the page said
    `resources`, "not planned yet", the only line left while gpu-b is stopped (found by a
    review as a lab admin running three hosts)."""
    job = world.state.enqueue_job(project_id=PROJECT, tags=job_tags(gpus=8, host="gpu-b"), user="erin",
                                  name="x")
    world.advance(3.0)
    now = world.clock()
    theirs = [_queued(job.id, "draining", created_at=now - 3)]
    _other_host(world, "gpu-b", at=now - 5, queue=theirs)  # stopped
    [shown] = _client(world, tmp_path).get("/api/queue").json()
    assert (shown["reason"], shown["host"]) == ("pinned", "demo")
    assert shown["detail"] == "its host: tag pins it to gpu-b"
    _other_host(world, "gpu-b", at=now, queue=theirs)  # back
    [shown] = _client(world, tmp_path).get("/api/queue").json()
    assert (shown["reason"], shown["host"]) == ("draining", "gpu-b")


def test_a_job_no_runner_can_take_names_the_tags_no_runner_has(world: World, tmp_path: Path) -> None:
    """A job tagged `gpu` and `gpus:8` is demand on no host (no runner has both tags):
    GitLab never hands it out, and the page said only "not planned yet" (found by a
    review of the day's changes, as a style reviewer)."""
    job = world.state.enqueue_job(project_id=PROJECT, tags=["gpu", "gpus:8"], user="mallory", name="x")
    world.advance(3.0)
    [shown] = _client(world, tmp_path).get("/api/queue").json()
    assert (shown["job_id"], shown["reason"]) == (job.id, "resources")
    assert shown["detail"] == ("no runner has all its tags (none of its size has gpu): GitLab gives it to "
                               "none; fix the job's tags")


def test_a_host_that_never_ticked_is_unknown(world: World, tmp_path: Path) -> None:
    from runnerctl.controller.store import Event

    world.store.record(Event(1.0, "gpu-z", "drain", "host", "by olga: old"))
    fleet = {h["host"]: h for h in _client(world, tmp_path).get("/api/fleet").json()}
    assert fleet["gpu-z"]["state"] == "unknown" and fleet["gpu-z"]["gpus"] == []


def _ran(host: str, job_id: int, user: str, project: str, *, started: float,
         ended: float | None) -> JobRecord:
    return JobRecord(host, job_id, "gpu0-1", (0, 1), project, "7", "train", user,
                     f"https://gl/{project}/-/jobs/{job_id}", started - 30, started,
                     ended or started + 60, ended, "success" if ended else "running", 1.2, 2)


def test_the_history_of_every_host_with_filters(world: World, tmp_path: Path) -> None:
    day = 86400.0
    jobs_store.save_jobs(world.store, [
        _ran("gpu-a", 1, "ada", "ml/sweeps", started=10 * day, ended=10 * day + 3600),
        _ran("gpu-b", 2, "bo", "ml/sweeps", started=20 * day, ended=20 * day + 7200),
        _ran("gpu-b", 3, "ada", "ml/vision", started=30 * day, ended=None)])
    client = _client(world, tmp_path)

    def shown(**filters: str) -> list[tuple[str, int]]:
        answer = client.get("/api/history", params=filters)
        assert answer.status_code == 200, answer.text
        return [(j["host"], j["job_id"]) for j in answer.json()]

    assert shown() == [("gpu-b", 3), ("gpu-b", 2), ("gpu-a", 1)]  # newest first
    assert shown(user="ada") == [("gpu-b", 3), ("gpu-a", 1)]
    assert shown(project="ml/sweeps", host="gpu-b") == [("gpu-b", 2)]
    assert shown(since="1970-01-21") == [("gpu-b", 3), ("gpu-b", 2)]  # day 20: job 2 ran then
    assert shown(since="1970-01-21T02:00:01") == [("gpu-b", 3)]
    assert shown(since="1970-01-21T04:00:00+02:00") == [("gpu-b", 3), ("gpu-b", 2)]
    assert shown(user="nobody") == [] and shown(limit="1") == [("gpu-b", 3)]
    first = client.get("/api/history", params={"host": "gpu-a"}).json()[0]
    assert first["gpus"] == [0, 1] and first["gpu_hours"] == 2.0 and first["wait_s"] == 30.0
    assert first["mean_utilization"] == 0.6 and first["outcome"] == "success" and not first["unused"]


@pytest.mark.parametrize("filters", [{"since": "last week"}, {"since": "2026-13-01"}, {"user": "a\x00b"},
                                     {"user": ""}, {"project": "x" * 201}, {"limit": "0"}, {"limit": "x"}])
def test_a_bad_history_filter_is_a_one_line_422(world: World, tmp_path: Path,
                                                filters: dict[str, str]) -> None:
    answer = _client(world, tmp_path).get("/api/history", params=filters)
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert len(detail) == 1 and detail[0]["loc"] == ["query", next(iter(filters))], detail


def test_api_state_says_why_each_job_waits(world: World, tmp_path: Path) -> None:
    first = world.submit(8, 3600.0, user="carol")
    world.advance(20.0)
    waiting = world.submit(8, 600.0, user="dave")
    world.advance(3.0)
    state = _client(world, tmp_path).get("/api/state").json()
    detail = f"runner gpu0-7 drains for it, waiting on job {first}"
    assert state["waiting"] == {str(waiting): {"code": "draining", "detail": detail, "elsewhere": False}}


def test_a_large_answer_is_compressed_for_a_browser_that_takes_it(world: World, tmp_path: Path) -> None:
    """The fleet's queue is 1.7 MB at 30 hosts and 500 pending jobs, polled every 2 s per
    open page (found by a review sizing a big lab); it goes gzipped to a browser."""
    for host in range(5):
        _other_host(world, f"gpu-{host}", at=world.clock(), queue=[
            _queued(9000 + i, "resources", created_at=world.clock() - i) for i in range(60)])
    client = _client(world, tmp_path)
    big = client.get("/api/queue", headers={"Accept-Encoding": "gzip"})
    assert big.status_code == 200 and big.headers["content-encoding"] == "gzip"
    assert len(big.json()) == 60  # httpx undoes the encoding
    assert "content-encoding" not in client.get("/api/queue", headers={"Accept-Encoding": "identity"}).headers
