"""The stand-by runner: `init` makes it, the controller keeps it online, and GitLab's
hourly cron then drops no job that waits behind a drain longer than its 1 h limit."""

from __future__ import annotations

import dataclasses
import json
import logging
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomlkit

from runnerctl.cli import main
from runnerctl.controller.act import StandbyKeeper
from runnerctl.controller.serve import production_controller
from runnerctl.errors import TemporaryError
from runnerctl.gpus.sim import count_snapshot
from runnerctl.layout import plan_slots, slot_tags, standby_tags
from runnerctl.settings import ControllerSettings, ExecutorSettings, HostSettings, PathSettings, Settings
from runnerctl.sim.gitlab_server import GitLabServer
from runnerctl.sim.gitlab_state import STUCK_REASON
from runnerctl.sim.world import PROJECT, World, build_world
from runnerctl.standby import VERIFY_EVERY_S, load, standby_path
from tests.conftest import ADMIN_TOKEN, defaults_toml, token_file

HOUR = 3600.0


def _init(server: GitLabServer, config: Path, gpus: str = "sim:8") -> int:
    return main(["init", "--gitlab-url", server.url, "--token-file", token_file(config.parent),
                 "--group", "7",
                 "--gpu-source", gpus, "--host", "gpu-a", "--runner-config", str(config),
                 "--config", str(defaults_toml(config.parent))])


def test_init_makes_one_unpaused_standby_with_every_slot_tag_outside_config_toml(
        gitlab_server: GitLabServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.toml"
    assert _init(gitlab_server, config) == 0
    runners = gitlab_server.state.runners.values()
    [standby] = [r for r in runners if r.description == "runnerctl/gpu-a/standby"]
    assert not standby.paused and standby.runner_type == "group_type" and standby.group_id == 7
    slots = plan_slots(count_snapshot("gpu-a", 8))
    assert standby.tags == {t for s in slots for t in slot_tags(s)} == set(standby_tags(slots))
    assert standby.tags >= {"gpu", "gpus:1", "gpus:2", "gpus:4", "gpus:8", "host:gpu-a", "priority:high"}
    names = [e["name"] for e in tomlkit.parse(config.read_text()).unwrap()["runners"]]
    assert standby.description not in names and len(names) == 15  # gitlab-runner never polls with it
    record = load(config)
    assert record is not None and record.id == standby.id and record.token == standby.token
    assert record.system_id.startswith("r_") and len(record.system_id) == 14
    assert stat.S_IMODE(standby_path(config).stat().st_mode) == 0o600
    out = capsys.readouterr()
    assert standby.token not in out.out + out.err and "standby" in out.out
    # again: nothing changes; with two GPUs fewer the stand-by is retagged, not replaced
    gitlab_server.requests.clear()
    assert _init(gitlab_server, config) == 0
    assert gitlab_server.changing_requests() == []
    assert _init(gitlab_server, config, "sim:4") == 0
    assert "gpus:8" not in gitlab_server.state.runners[standby.id].tags
    after = load(config)
    assert after is not None and (after.id, after.system_id) == (record.id, record.system_id)
    assert "gpus:8" not in after.tags


def test_a_standby_deleted_in_gitlab_is_made_again_with_the_same_system_id(
        gitlab_server: GitLabServer, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    assert _init(gitlab_server, config, "sim:2") == 0
    first = load(config)
    assert first is not None
    gitlab_server.state.delete_runner(first.id)
    assert _init(gitlab_server, config, "sim:2") == 0
    second = load(config)
    assert second is not None and second.id != first.id and second.id in gitlab_server.state.runners
    assert second.system_id == first.system_id  # never a second manager from runnerctl


@pytest.fixture
def long_world(tmp_path: Path) -> Iterator[World]:
    w = build_world(tmp_path, settings=ControllerSettings(projects=(PROJECT,), interval_s=30.0))
    yield w
    w.close()


def _drain_behind_three_hour_jobs(world: World, *, hours: float) -> int:
    """Eight 1-GPU jobs of 3 h take the host, then an 8-GPU job waits for all of them (the
    project's job timeout raised to 4 h, or GitLab would fail them at 60 minutes)."""
    world.state.project_timeout_s = 4 * 3600
    for _ in range(8):
        world.submit(1, 3 * HOUR)
    world.advance(40, step=5)
    assert len(world.fleet.jobs) == 8
    big = world.submit(8, 600.0)
    world.advance(hours * HOUR, step=10)
    return big


def test_the_standby_stays_online_through_a_three_hour_drain_and_nothing_is_dropped(
        long_world: World) -> None:
    world = long_world
    assert world.standby is not None
    standby = world.state.runners[world.standby.id]
    online_at_crons: list[bool] = []
    drop = world.state.drop_stuck_jobs

    def watched() -> list[object]:  # what GitLab's cron sees, each time it runs
        online_at_crons.append(world.state.online(standby) and not standby.paused)
        return drop()  # type: ignore[return-value]

    world.state.drop_stuck_jobs = watched  # type: ignore[method-assign,assignment]
    big = _drain_behind_three_hour_jobs(world, hours=3.5)
    assert world.dropped == {}
    assert world.fleet.started[big] - world.submitted[big][0] > 2.9 * HOUR  # waited the whole drain
    assert big in world.fleet.finished
    assert len(online_at_crons) >= 4 and all(online_at_crons)
    assert world.state.jobs_of_runner(standby.id) == []  # it never gets a job
    assert [m.system_id for m in world.state.managers_of(standby.id)] == [world.standby.system_id]
    assert world.clock() - (standby.contacted_at or 0.0) <= VERIFY_EVERY_S + 30.0


def test_on_a_gitlab_whose_verify_skips_glrt_runners_the_standby_is_kept_online_another_way(
        long_world: World, caplog: pytest.LogCaptureFixture) -> None:
    """GitLab 16 and 17 do not mark a `glrt-` runner contacted on `POST /runners/verify`
    (lib/api/ci/runner.rb `registering_created_runner`): the stand-by stayed never
    contacted, and GitLab dropped the job waiting for the drain after an hour (found by a
    review against GitLab's source). `DELETE /runners/managers` with a system_id no
    manager has heartbeats the runner there and deletes nothing."""
    world = long_world
    assert world.standby is not None
    world.state.verify_skips_contact = True
    standby = world.state.runners[world.standby.id]
    with caplog.at_level(logging.WARNING):
        big = _drain_behind_three_hour_jobs(world, hours=3.5)
    assert world.dropped == {} and big in world.fleet.finished
    assert world.state.online(standby)
    assert [m.system_id for m in world.state.managers_of(standby.id)] == [world.standby.system_id]
    assert not [r for r in caplog.records if "stand-by" in r.getMessage()]  # nothing is wrong


def test_a_restarted_controller_keeps_the_standby_online_on_such_a_gitlab(long_world: World) -> None:
    """A serve restarted while the stand-by was still online from its predecessor's calls
    sent verifies only, which GitLab 16 and 17 ignore: the runner went offline for up to
    15 minutes at each restart (found by the final review of the session)."""
    world = long_world
    assert world.standby is not None
    world.state.verify_skips_contact = True
    standby = world.state.runners[world.standby.id]
    world.advance(40 * 60, step=10)
    assert world.state.online(standby)
    world.controller.standby = StandbyKeeper(world.standby)  # serve restarted
    offline = []
    for _ in range(3 * 360):  # three hours, a look every 10 s
        world.advance(10, step=10)
        if not world.state.online(standby):
            offline.append(world.clock())
    assert offline == []


def test_a_standby_paused_by_hand_is_unpaused_and_nothing_is_dropped(
        long_world: World, caplog: pytest.LogCaptureFixture) -> None:
    """An admin paused it in GitLab's UI, where it looks idle: GitLab's stuck-job rule
    skips paused runners, so the job waiting for the drain was dropped after an hour,
    while the page said the stand-by was online (found by a review as a GitLab admin)."""
    world = long_world
    assert world.standby is not None
    world.advance(60)
    world.state.runners[world.standby.id].paused = True  # PUT /runners/:id paused=true, by hand
    with caplog.at_level(logging.WARNING):
        big = _drain_behind_three_hour_jobs(world, hours=3.5)
    assert world.dropped == {} and big in world.fleet.finished
    assert not world.state.runners[world.standby.id].paused
    said = [r.getMessage() for r in caplog.records if "was paused in GitLab: unpaused" in r.getMessage()]
    assert len(said) == 1, said


def test_without_the_standby_gitlab_drops_the_job_waiting_for_the_drain(tmp_path: Path) -> None:
    world = build_world(tmp_path, settings=ControllerSettings(projects=(PROJECT,), interval_s=30.0),
                        standby=False)
    try:
        big = _drain_behind_three_hour_jobs(world, hours=2.5)
        assert world.dropped == {big: STUCK_REASON}
        assert big not in world.fleet.started
    finally:
        world.close()


class _Failing:
    def __init__(self) -> None:
        self.calls = 0

    def heartbeat_runner(self, token: str, *, system_id: str) -> None:
        self.calls += 1
        raise TemporaryError("GitLab at http://gitlab did not answer in time", delay=5.0)


def test_keeper_logs_a_failing_verify_once_and_retries_a_minute_later(
        long_world: World, caplog: pytest.LogCaptureFixture) -> None:
    keeper = StandbyKeeper(long_world.standby)
    gitlab = _Failing()
    caplog.set_level(logging.WARNING)
    for second in range(0, 180, 5):
        keeper.keep_online(gitlab, float(second))  # type: ignore[arg-type]
    assert gitlab.calls == 3  # at 0, 60 and 120 s
    assert keeper.status().startswith("cannot keep the stand-by runner")
    assert sum("stand-by" in r.getMessage() for r in caplog.records) == 1
    assert json.dumps(keeper.error).find(long_world.standby.token) == -1  # type: ignore[union-attr]


def test_serve_keeps_the_standby_init_made_online_with_one_manager(
        gitlab_server: GitLabServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = tmp_path / "config.toml"
    assert _init(gitlab_server, config) == 0
    record = load(config)
    assert record is not None
    standby = gitlab_server.state.runners[record.id]
    assert standby.contacted_at is None  # init itself sends nothing for it
    settings = Settings(host=HostSettings(name="gpu-a"), controller=ControllerSettings(projects=(PROJECT,)),
                        paths=PathSettings(state_dir=str(tmp_path / "state")))
    controller = production_controller(settings, gitlab_url=gitlab_server.url, token=ADMIN_TOKEN,
                                       gpu_source="sim:8", runner_config=config, webhook_secret="")
    try:
        controller.tick()
        controller.tick()
        assert controller.view.standby == "online"  # in /api/state
        assert controller.liveness.notices == {}  # serve's InputsWatch sees the runners it read
        assert [type(hook).__name__ for hook in controller.on_tick] == ["InputsWatch"]
    finally:
        controller.wiring.store.close()
    assert gitlab_server.state.online(standby) and not standby.paused
    assert [m.system_id for m in gitlab_server.state.managers_of(record.id)] == [record.system_id]
    assert gitlab_server.state.jobs_of_runner(record.id) == []
    verifies = [r for r in gitlab_server.requests if r.path.endswith("/runners/verify")]
    assert len(verifies) == 1  # the second tick is within VERIFY_EVERY_S
    assert record.token not in caplog.text
    standby_path(config).unlink()
    caplog.set_level(logging.WARNING)
    doubtful = dataclasses.replace(settings, executor=ExecutorSettings(gate_wait_s=3600))
    without = production_controller(doubtful, gitlab_url=gitlab_server.url, token=ADMIN_TOKEN,
                                     gpu_source="sim:8", runner_config=config, webhook_secret="")
    without.wiring.store.close()
    assert "no stand-by runner" in caplog.text
    assert "gate_wait_s 3600 is over 600 s" in without.liveness.notices["settings"]  # and logged
    healthy, shown = without.liveness.report()  # on /healthz too: it was in the log alone
    assert healthy and "run `runnerctl init` again" in shown["notices"]["standby"], shown
