"""One truth per GPU (issue 15): the page's API and the metrics name the same state for
every GPU at every tick, while a busy simulated host goes through every state and the
combinations that used to split them (a job under an admin drain: the exporter said
`ci`, the page `draining`)."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from runnerctl.controller.app import create_app
from runnerctl.controller.store import Toggle
from runnerctl.controller.toggles import set_toggle
from runnerctl.controller.view import OCCUPANCY
from runnerctl.errors import GpuError
from runnerctl.exporter import endpoint
from runnerctl.model import GpuSnapshot
from runnerctl.settings import ControllerSettings, WebSettings
from runnerctl.sim.world import PROJECT, World, build_world
from runnerctl.web.routes import install


class Watcher:
    """Compares /api/host with /metrics after each controller tick."""

    def __init__(self, world: World, state_dir: Path) -> None:
        self.world = world
        metrics = endpoint(lambda: world.controller.stats.view)
        app = create_app(lambda: world.controller.view, world.controller.demand.webhook, metrics, extend=[
            lambda app: install(app, view=lambda: world.controller.view, store=world.store,
                                settings=WebSettings(), state_dir=state_dir)])
        self.client = TestClient(app)
        self.tick = -1
        self.ticks_checked = 0
        self.seen: dict[str, set[int]] = {state: set() for state in OCCUPANCY}
        self.details: list[str] = []

    def states(self) -> tuple[dict[int, str], dict[int, str]]:
        gpus = self.client.get("/api/host").json()["gpus"]
        page = {g["index"]: g["state"] for g in gpus}
        self.details.extend(g["detail"] for g in gpus)
        text = self.client.get("/metrics").text
        metrics = {int(s.labels["gpu"]): s.labels["state"] for f in text_string_to_metric_families(text)
                   for s in f.samples if s.name == "runnerctl_gpu_occupancy_state" and s.value == 1.0}
        return page, metrics

    def check(self) -> None:
        if self.world.controller.ticks == self.tick:
            return
        self.tick = self.world.controller.ticks
        page, metrics = self.states()
        if self.world.controller.view.snapshot is None:  # the page lists the GPUs of a snapshot
            assert page == {} and set(metrics.values()) == {"unknown"}, metrics
            self.seen["unknown"].update(metrics)
        else:
            assert page == metrics, f"tick {self.tick}: page {page} != metrics {metrics}"
            for gpu, state in page.items():
                self.seen[state].add(gpu)
        self.ticks_checked += 1

    def advance(self, seconds: float) -> None:
        self.world.advance(seconds, pace=self.check)

    def state(self, gpu: int) -> str:
        return self.states()[0][gpu]


def test_page_and_metrics_agree_on_every_gpu_at_every_tick(tmp_path: Path) -> None:
    settings = ControllerSettings(projects=(PROJECT,), interval_s=1.0, cooldown_s=5.0)
    world = build_world(tmp_path, settings=settings)
    try:
        w = Watcher(world, tmp_path)
        w.advance(4)
        assert {w.state(g) for g in range(8)} == {"idle"}
        for _ in range(3):
            world.submit(1, 400.0)
        w.advance(8)
        busy = sorted(g for g in range(8) if w.state(g) == "ci")
        assert len(busy) == 3
        world.submit(4, 60.0)  # three singles busy on 8 GPUs: a block must drain or open
        w.advance(6)
        free = [g for g in range(8) if w.state(g) in ("idle", "draining")]
        world.gpus.foreign[free[-1]] = (4242, "alice")
        w.advance(6)
        assert w.state(free[-1]) == "foreign"
        now = world.clock()
        set_toggle(world.store, Toggle("demo", f"gpu:{busy[0]}", "drain", "olga", now, "fan noise"))
        set_toggle(world.store, Toggle("demo", f"gpu:{busy[1]}", "pause", "olga", now, "reboot"))
        w.advance(4)
        assert (w.state(busy[0]), w.state(busy[1])) == ("draining", "paused")  # jobs still run under both
        world.gpus.unhealthy.add(busy[2])
        w.advance(4)
        assert w.state(busy[2]) == "unhealthy"
        working = world.gpus.snapshot

        def broken() -> GpuSnapshot:
            raise GpuError("NVML: driver not loaded")

        world.gpus.snapshot = broken  # type: ignore[method-assign]
        w.advance(4)
        world.gpus.snapshot = working  # type: ignore[method-assign]
        world.gpus.foreign.clear()
        w.advance(20)
    finally:
        world.close()
    missing = [state for state, gpus in w.seen.items() if not gpus]
    assert not missing, f"states never reached: {missing}"
    assert any("still running: job" in d and d.startswith("drain by olga") for d in w.details)
    assert any("still running: job" in d and d.startswith("pause by olga") for d in w.details)
    assert w.ticks_checked >= 50
