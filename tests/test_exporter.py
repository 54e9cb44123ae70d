"""The exporter over a real controller: what a scrape shows, what it never does, and the stats behind it.

Scrapes are parsed with prometheus_client's own text parser. The controller runs against
sim GPUs and the HTTP GitLab fake (python-gitlab), as in test_controller.py.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import prometheus_client
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from runnerctl.controller.app import create_app
from runnerctl.controller.stats import Histogram
from runnerctl.controller.store import Toggle
from runnerctl.controller.toggles import set_toggle
from runnerctl.controller.view import OCCUPANCY
from runnerctl.errors import GpuError
from runnerctl.exporter import build_registry, endpoint, metrics_text
from runnerctl.exporter.dcgm import JobMappingWriter
from runnerctl.exporter.scrape import ALL_PARTS
from runnerctl.model import GpuSnapshot
from runnerctl.settings import ControllerSettings
from runnerctl.sim.gitlab_server import Fault
from runnerctl.sim.world import PROJECT, World, build_world
from runnerctl.tags import job_tags

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = build_world(tmp_path, settings=ControllerSettings(projects=(PROJECT,), cooldown_s=30.0))
    yield w
    w.close()


def scrape(world: World) -> Samples:
    text = metrics_text(lambda: world.controller.stats.view).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(found) == 1, (name, labels, len(found))
    return found[0]


def state_of(samples: Samples, gpu: int) -> str:
    on = [dict(ls)["state"] for (n, ls), v in samples.items()
          if n == "runnerctl_gpu_occupancy_state" and dict(ls)["gpu"] == str(gpu) and v == 1.0]
    assert len(on) == 1, on
    return on[0]


def test_import_creates_no_metric_on_the_global_registry() -> None:
    before = set(prometheus_client.REGISTRY._names_to_collectors)
    for name in ("runnerctl.exporter", "runnerctl.exporter.gpus", "runnerctl.exporter.runners",
                 "runnerctl.exporter.demand", "runnerctl.exporter.reconcile", "runnerctl.exporter.scrape",
                 "runnerctl.exporter.standalone", "runnerctl.controller.stats"):
        importlib.reload(importlib.import_module(name))
    assert set(prometheus_client.REGISTRY._names_to_collectors) == before
    assert not any(n.startswith("runnerctl") for n in before)


def test_before_the_first_tick_only_scrape_success_is_served(world: World) -> None:
    samples = scrape(world)
    assert {n for n, _ in samples} == {"runnerctl_exporter_scrape_success",
                                       "runnerctl_exporter_scrape_duration_seconds"}
    assert all(v == 0.0 for (n, _), v in samples.items() if n == "runnerctl_exporter_scrape_success")


def test_collector_success_names_the_host_before_and_after_the_first_tick(world: World) -> None:
    """A panel or alert picks a host's collectors by `Hostname` alone: no join on a
    series (runnerctl_controller_info) that a host before its first tick does not serve."""
    registry = build_registry(lambda: world.controller.stats.view, liveness=world.controller.liveness)
    host = world.controller.host
    for ticks in (0, 6):
        world.advance(ticks)
        text = prometheus_client.generate_latest(registry).decode()
        found = [s for f in text_string_to_metric_families(text) for s in f.samples
                 if s.name.startswith("runnerctl_exporter_scrape_")]
        assert len(found) == 2 * len(ALL_PARTS)
        assert all(s.labels["Hostname"] == host for s in found), found
        ok = {s.value for s in found if s.name == "runnerctl_exporter_scrape_success"}
        assert ok == {1.0 if ticks else 0.0}


def test_gpu_identity_and_labels_line_up_with_dcgm_exporter(world: World) -> None:
    world.advance(6)
    samples = scrape(world)
    snapshot = world.controller.view.snapshot
    assert snapshot is not None
    for gpu in snapshot.gpus:
        info = value(samples, "runnerctl_gpu_info", gpu=str(gpu.index))
        labels = next(dict(ls) for (n, ls), _ in samples.items()
                      if n == "runnerctl_gpu_info" and dict(ls)["gpu"] == str(gpu.index))
        assert info == 1.0
        assert labels["UUID"] == gpu.uuid and labels["Hostname"] == "demo"
        assert labels["device"] == f"nvidia{gpu.index}" and labels["model_name"] == gpu.name
        assert value(samples, "runnerctl_gpu_memory_total_bytes", UUID=gpu.uuid) == gpu.memory_total_bytes
        assert value(samples, "runnerctl_gpu_utilization_ratio", UUID=gpu.uuid) == 0.0
        assert state_of(samples, gpu.index) == "idle"


def test_pending_jobs_pinned_to_this_host_are_counted_apart(world: World) -> None:
    """A fleet's total is the max over hosts of the shared jobs plus each host's pinned ones
    (the fleet dashboard's sum): a job pinned elsewhere is in neither of this host's counts."""
    for _ in range(8):
        world.submit(1, 600.0)  # every GPU busy: the 4-GPU jobs below stay pending
    world.advance(6)
    world.submit(4, 60.0)
    for host in (world.controller.host, world.controller.host, "gpu-elsewhere"):
        world.state.enqueue_job(project_id=PROJECT, tags=job_tags(gpus=4, host=host), user="bob", name="job")
    world.advance(6)
    samples = scrape(world)
    assert value(samples, "runnerctl_pending_jobs", gpus="4") == 3.0
    assert value(samples, "runnerctl_pending_jobs_pinned", gpus="4") == 2.0
    assert value(samples, "runnerctl_pending_jobs_pinned", gpus="8") == 0.0


def test_states_follow_ci_foreign_draining_paused_and_unhealthy(world: World) -> None:
    for _ in range(4):
        world.submit(1, 300.0)
    world.advance(6)
    world.submit(4, 60.0)  # singles 0-3 are busy: gpu0-3 drains, then waits on them
    world.gpus.foreign[5] = (4242, "alice")
    set_toggle(world.store, Toggle("demo", "gpu:6", "pause", "carol", world.clock(), "maintenance"))
    world.gpus.unhealthy.add(7)
    world.advance(20)
    samples = scrape(world)
    assert [state_of(samples, g) for g in range(8)] == ["ci"] * 4 + ["idle", "foreign", "paused", "unhealthy"]
    assert value(samples, "runnerctl_gpu_foreign_processes", gpu="5") == 1.0
    assert value(samples, "runnerctl_runner_state", slot="gpu0-3", state="draining") == 1.0
    assert value(samples, "runnerctl_runner_paused", slot="gpu4") == 0.0
    assert value(samples, "runnerctl_runner_running_jobs", slot="gpu0") == 1.0
    assert value(samples, "runnerctl_pending_jobs", gpus="4") == 1.0
    assert value(samples, "runnerctl_pending_job_oldest_age_seconds", gpus="4") >= 19.0
    assert value(samples, "runnerctl_admin_toggles_active", action="pause") == 1.0
    assert value(samples, "runnerctl_admin_toggles_total", action="pause") == 1.0
    assert value(samples, "runnerctl_drains_total", slot="gpu0-3") == 1.0
    assert value(samples, "runnerctl_gate_decisions_total", decision="close") == 2.0  # GPUs 5 and 7
    world.gpus.foreign.clear()
    world.advance(310)  # the 4-GPU job starts once the singles end (300 s)
    samples = scrape(world)
    assert value(samples, "runnerctl_job_wait_seconds_count", gpus="4") == 1.0
    wait = value(samples, "runnerctl_job_wait_seconds_sum", gpus="4")
    job = max(world.submitted, key=lambda j: world.submitted[j][1])
    truth = world.fleet.started[job] - world.submitted[job][0]
    assert truth <= wait <= truth + world.controller.settings.interval_s + 1
    assert value(samples, "runnerctl_gate_decisions_total", decision="open") == 1.0


def test_a_block_opened_on_idle_gpus_is_a_reserve_not_a_drain(world: World) -> None:
    world.advance(6)
    world.submit(4, 60.0)  # every GPU idle: a quad opens at once
    world.advance(20)
    samples = scrape(world)
    reserved = [dict(ls)["slot"] for (n, ls), v in samples.items() if n == "runnerctl_reserves_total" and v]
    assert len(reserved) == 1 and reserved[0] in ("gpu0-3", "gpu4-7"), reserved
    assert not [v for (n, _), v in samples.items() if n == "runnerctl_drains_total" and v]
    assert {e.kind for e in world.store.events("demo")} >= {"reserve"}
    assert "drain" not in {e.kind for e in world.store.events("demo")}


def test_a_snapshot_failure_is_unknown_not_idle_and_keeps_each_gpus_series(world: World) -> None:
    """While NVML cannot be read, each GPU's series keep their UUID: relabelled UUID="" they
    were new series, and Grafana's sum of the occupancy seconds counted the unknown time
    twice once the read came back."""
    world.advance(6)
    before = {dict(ls)["gpu"]: dict(ls)["UUID"] for (n, ls) in scrape(world) if n == "runnerctl_gpu_info"}
    assert len(before) == 8 and all(before.values())
    working = world.gpus.snapshot

    def broken() -> GpuSnapshot:
        raise GpuError("NVML: driver not loaded")

    world.gpus.snapshot = broken  # type: ignore[method-assign]
    world.advance(5)
    samples = scrape(world)
    assert all(state_of(samples, g) == "unknown" for g in range(8))
    assert not [k for k in samples if k[0] == "runnerctl_gpu_utilization_ratio"]  # not measured now
    kept = ("runnerctl_gpu_occupancy_seconds_total", "runnerctl_gpu_occupancy_state", "runnerctl_gpu_info")
    during = {(dict(ls)["gpu"], dict(ls)["UUID"]) for (n, ls) in samples if n in kept}
    assert during == set(before.items())  # the same series as before the failure
    world.gpus.snapshot = working  # type: ignore[method-assign]
    world.advance(5)
    samples = scrape(world)
    seconds = [dict(ls) for (n, ls) in samples if n == "runnerctl_gpu_occupancy_seconds_total"]
    assert {(s["gpu"], s["UUID"]) for s in seconds} == set(before.items())  # no UUID="" twins
    stats = world.controller.stats.view
    assert stats is not None
    for gpu in range(8):
        total = sum(v for (n, ls), v in samples.items()
                    if n == "runnerctl_gpu_occupancy_seconds_total" and dict(ls)["gpu"] == str(gpu))
        assert total == pytest.approx(stats.view.at - stats.first_at)
    assert value(samples, "runnerctl_gpu_occupancy_seconds_total", gpu="0", state="unknown") >= 4


def test_a_gpu_that_nvml_no_longer_lists_is_unknown_under_its_own_uuid(world: World) -> None:
    """A GPU fallen off the bus is missing from NVML's list while the others still read.
    Its occupancy series ended (no alert could see it) and its GPU-seconds went on under
    UUID="" as new series; it now stays `unknown` with its last UUID, as when NVML cannot
    be read at all, and its seconds still add up to the time since the first tick."""
    world.advance(60)
    snapshot = world.controller.view.snapshot
    assert snapshot is not None
    uuid = snapshot.gpus[7].uuid
    world.gpus.count = 7
    world.advance(600)
    samples = scrape(world)
    assert state_of(samples, 7) == "unknown" and state_of(samples, 0) != "unknown"
    assert not [dict(ls) for (_, ls) in samples if dict(ls).get("UUID") == ""]
    gpu7 = {(n, dict(ls)["UUID"]) for (n, ls) in samples if dict(ls).get("gpu") == "7"}
    assert {u for _, u in gpu7} == {uuid}
    assert {n for n, _ in gpu7} >= {"runnerctl_gpu_info", "runnerctl_gpu_occupancy_state",
                                     "runnerctl_gpu_occupancy_seconds_total"}
    assert value(samples, "runnerctl_gpu_occupancy_seconds_total", gpu="7", state="unknown") >= 590
    stats = world.controller.stats.view
    assert stats is not None
    total = sum(v for (g, _), v in stats.gpu_seconds.items() if g == 7)
    assert total == pytest.approx(stats.view.at - stats.first_at)


def test_occupancy_seconds_add_up_per_gpu(world: World) -> None:
    world.submit(2, 100.0)
    world.gpus.foreign[3] = (1, "root")
    world.advance(400)
    stats = world.controller.stats.view
    assert stats is not None
    elapsed = stats.view.at - stats.first_at
    for gpu in range(8):
        mine = sum(v for (g, _), v in stats.gpu_seconds.items() if g == gpu)
        assert mine == pytest.approx(elapsed)
    samples = scrape(world)
    assert value(samples, "runnerctl_gpu_occupancy_seconds_total", gpu="3", state="foreign") > 300
    assert value(samples, "runnerctl_gpu_occupancy_seconds_total", gpu="0", state="ci") >= 95


def test_a_scrape_never_calls_gitlab_or_the_gpus(world: World) -> None:
    world.advance(11)
    requests = len(world.server.requests)
    calls = []
    original = world.gpus.snapshot

    def counting() -> GpuSnapshot:
        calls.append(1)
        return original()

    world.gpus.snapshot = counting  # type: ignore[method-assign]
    for _ in range(5):
        assert scrape(world)
    assert len(world.server.requests) == requests and not calls


def test_no_job_ids_or_user_names_in_labels(world: World) -> None:
    for _ in range(3):
        world.submit(1, 100.0)
    world.submit(8, 100.0)
    world.gpus.foreign[2] = (4242, "alice")
    world.advance(30)
    jobs = {str(j) for j in world.submitted}
    names = {name for (name, labels) in scrape(world) for name in dict(labels)}
    values = {v for (_, labels) in scrape(world) for _, v in labels}
    assert not jobs & values and not {"alice", "bob"} & values
    assert not {"job", "job_id", "user", "pid"} & names


def test_gitlab_requests_counted_by_status_and_unanswered(world: World) -> None:
    world.advance(11)
    samples = scrape(world)
    assert value(samples, "runnerctl_gitlab_api_requests_total", status="200") > 0
    assert value(samples, "runnerctl_gitlab_up") == 1.0
    for status in ("500", "503", "429", "unanswered"):  # served at 0 before the first: increase() sees it
        assert value(samples, "runnerctl_gitlab_api_requests_total", status=status) == 0
    world.server.faults.append(Fault("*", r"/runners|/projects", "500", count=1))
    world.server.faults.append(Fault("*", r"/runners|/projects", "drop", count=10_000))
    world.advance(60)
    samples = scrape(world)
    assert value(samples, "runnerctl_gitlab_api_requests_total", status="500") == 1
    assert value(samples, "runnerctl_gitlab_api_requests_total", status="unanswered") >= 1
    assert value(samples, "runnerctl_gitlab_up") == 0.0


def test_a_failing_collector_is_reported_and_the_others_still_answer(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    world.advance(6)

    def broken(stats: object) -> list[object]:
        raise KeyError("boom")

    parts = {**ALL_PARTS, "runners": broken}
    registry = build_registry(lambda: world.controller.stats.view, parts)
    with caplog.at_level(logging.ERROR):
        text = prometheus_client.generate_latest(registry).decode()
    host = world.controller.host
    assert f'runnerctl_exporter_scrape_success{{Hostname="{host}",collector="runners"}} 0.0' in text
    assert f'runnerctl_exporter_scrape_success{{Hostname="{host}",collector="gpus"}} 1.0' in text
    assert "runnerctl_gpu_info" in text and "runnerctl_runner_state" not in text
    assert "collector runners failed" in caplog.text


def test_histogram_is_cumulative() -> None:
    hist = Histogram((1.0, 10.0))
    for v in (0.5, 5.0, 50.0, 1.0):
        hist = hist.observe(v)
    assert hist.counts == (2, 3, 4) and hist.count == 4 and hist.sum == 56.5


def test_metrics_route_on_the_app_only_when_given(world: World) -> None:
    world.advance(6)
    with_metrics = TestClient(create_app(lambda: world.controller.view, world.controller.demand.webhook,
                                         endpoint(lambda: world.controller.stats.view)))
    answer = with_metrics.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "runnerctl_gpu_occupancy_state" in answer.text
    plain = TestClient(create_app(lambda: world.controller.view, world.controller.demand.webhook))
    assert plain.get("/metrics").status_code == 404


def test_dcgm_job_mapping_files_follow_the_jobs(world: World, tmp_path: Path) -> None:
    directory = tmp_path / "dcgm"
    world.controller.on_tick.append(JobMappingWriter(directory))
    world.submit(2, 30.0)
    world.submit(1, 200.0)
    umask = os.umask(0o077)  # the units' UMask=
    try:
        world.advance(12)
    finally:
        os.umask(umask)
    files = {p.name: p.read_text() for p in directory.iterdir()}
    modes = {stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir()}
    assert modes == {0o644}  # a dcgm-exporter that is not root reads them
    running = {j.job_id: j.slot.gpus for j in world.fleet.jobs.values()}
    expected = {str(g): f"{job}\n" for job, gpus in running.items() for g in gpus}
    assert files == expected and len(files) == 3
    world.advance(40)  # the 2-GPU job ended: its files are gone, never left empty
    files = {p.name: p.read_text() for p in directory.iterdir()}
    assert len(files) == 1 and all(text.strip().isdigit() for text in files.values())


def test_a_link_planted_at_the_mapping_files_temporary_name_is_not_followed(
        world: World, tmp_path: Path) -> None:
    """In a mapping directory other users can write (a configured one under /tmp), a link
    planted at the predictable temporary name had a root-only file truncated, rewritten
    and made 0644 (found by a review as a local user)."""
    directory = tmp_path / "dcgm"
    directory.mkdir()
    victim = tmp_path / "root-only"
    victim.write_text("root's")
    victim.chmod(0o600)
    for gpu in range(8):
        (directory / f".{gpu}.{os.getpid()}.tmp").symlink_to(victim)
    world.controller.on_tick.append(JobMappingWriter(directory))
    world.submit(1, 200.0)
    world.advance(12)
    assert victim.read_text() == "root's" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    [written] = [p for p in directory.iterdir() if not p.name.startswith(".")]
    assert written.read_text().strip().isdigit() and not written.is_symlink()


def test_dcgm_mapping_failure_is_logged_once_and_never_stops_the_loop(
        world: World, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the directory should be")
    world.controller.on_tick.append(JobMappingWriter(blocker))
    world.submit(1, 100.0)
    with caplog.at_level(logging.WARNING):
        world.advance(30)
    assert caplog.text.count("cannot write dcgm-exporter job mapping") == 1
    assert world.controller.ticks >= 5 and world.fleet.jobs


def test_every_occupancy_state_is_exported_for_every_gpu(world: World) -> None:
    world.advance(6)
    samples = scrape(world)
    for gpu in range(8):
        states = {dict(ls)["state"] for (n, ls), _ in samples.items()
                  if n == "runnerctl_gpu_occupancy_state" and dict(ls)["gpu"] == str(gpu)}
        assert states == set(OCCUPANCY)


def test_stats_view_carries_the_view_it_was_made_from(world: World) -> None:
    world.advance(16)
    stats = world.controller.stats.view
    assert stats is not None and stats.view is world.controller.view
    assert stats.ticks == world.controller.ticks
    assert dataclasses.is_dataclass(stats)


def test_runner_online_follows_gitlab_and_goes_to_zero_when_gitlab_runner_stops(world: World) -> None:
    """GitLab's `online` (a poll within the last two hours): a runner whose gitlab-runner no
    longer polls shows 0 once the controller reads it again, the others stay 1."""
    world.advance(30)
    assert value(scrape(world), "runnerctl_runner_online", slot="gpu3") == 1.0
    name = next(n for n in world.fleet.slots if n.endswith("/gpu3"))
    world.fleet.slots.pop(name)  # its gitlab-runner stopped polling ...
    runner = world.state.runners[world.fleet.runner_ids[name]]
    assert runner.contacted_at is not None
    runner.contacted_at -= 3 * 3600  # ... three hours ago
    world.advance(900)
    samples = scrape(world)
    assert value(samples, "runnerctl_runner_online", slot="gpu3") == 0.0
    assert value(samples, "runnerctl_runner_online", slot="gpu2") == 1.0


def test_counters_start_at_zero_and_pending_counts_only_sizes_the_host_runs(world: World) -> None:
    """increase() and rate() miss a series' step from absent to 1, so a block's first drain
    and the first wait of a GPU size after each start were lost from the panels: every
    block's drain and reserve counter and every size's wait histogram start at 0. A job
    asking for more GPUs than any runner here has is not this host's pending demand (the
    wait alert fired for it on every host that polled its project)."""
    world.submit(16, 100.0)
    world.advance(6)
    samples = scrape(world)
    blocks = {dict(ls)["slot"] for (n, ls) in samples if n == "runnerctl_drains_total"}
    assert blocks == {"gpu0-1", "gpu2-3", "gpu4-5", "gpu6-7", "gpu0-3", "gpu4-7", "gpu0-7"}
    counters = ("runnerctl_drains_total", "runnerctl_reserves_total")
    assert all(v == 0 for (n, _), v in samples.items() if n in counters)

    def sizes(name: str) -> set[str]:
        return {dict(ls)["gpus"] for (n, ls) in samples if n == name}

    assert sizes("runnerctl_job_wait_seconds_count") == {"1", "2", "4", "8"}
    assert sizes("runnerctl_pending_jobs") == {"1", "2", "4", "8"}
    assert not [k for k in samples if k[0] == "runnerctl_pending_job_oldest_age_seconds"]


def test_a_later_stages_job_is_as_old_as_its_queueing_not_its_pipeline(world: World) -> None:
    """A later stage's job is created with its pipeline, hours before it is queued; its
    age and wait counted from creation, so RunnerctlMultiGpuJobWaiting paged for a job
    queued a minute ago (found by a review of the clocks)."""
    world.advance(6)
    for _ in range(4):
        world.submit(1, 300.0)  # GPUs 0-3 busy: the 8-GPU job waits
    world.advance(6)
    job = world.submit(8, 60.0, created_at=world.clock.now - 3 * 3600.0)
    world.advance(30)
    assert value(scrape(world), "runnerctl_pending_job_oldest_age_seconds", gpus="8") < 120
    world.advance(600)
    assert job in world.fleet.finished
    waits = scrape(world)
    assert value(waits, "runnerctl_job_wait_seconds_count", gpus="8") == 1.0
    assert value(waits, "runnerctl_job_wait_seconds_sum", gpus="8") < 900
