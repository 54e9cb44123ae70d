"""Stateful property test of the controller: random jobs, foreign use, toggles, GitLab
errors and controller deaths (in the middle of a tick too), checking at every GitLab
change that unpaused runners never share a GPU (S1), and that no job is double
allocated or started next to a foreign process. A final settle checks liveness (L1:
every job starts once the disturbances stop). One test also SIGKILLs a real `serve`.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from runnerctl.controller.loop import Controller
from runnerctl.controller.store import Toggle
from runnerctl.settings import ControllerSettings
from runnerctl.sim.fleet import SimFleet
from runnerctl.sim.gitlab_server import Fault
from runnerctl.sim.world import PROJECT, TOKEN, World, build_world
from tests.conftest import token_file

SETTINGS = ControllerSettings(projects=(PROJECT,), cooldown_s=20.0, backoff_max_s=20.0)
EXAMPLES = int(os.environ.get("CONTROLLER_EXAMPLES", "8"))


class Killed(BaseException):
    """The controller process dies here (nothing after this point of the tick runs)."""


def unpaused_overlap(world: World) -> tuple[str, str] | None:
    slots = world.fleet.slots
    opened = [slots[r.description] for r in world.state.runners.values()
              if not r.paused and r.description in slots]
    for i, a in enumerate(opened):
        for b in opened[i + 1:]:
            if set(a.gpus) & set(b.gpus):
                return a.key, b.key
    return None


def watch(world: World, violations: list[object]) -> None:
    state = world.state
    original = state.update_runner

    def update(runner_id: int, **fields: Any) -> Any:
        result = original(runner_id, **fields)
        overlap = unpaused_overlap(world)
        if overlap is not None:
            violations.append(overlap)
        return result

    state.update_runner = update  # type: ignore[method-assign]


class ControllerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.world = build_world(Path(self.tmp.name), settings=SETTINGS)
        self.kill_after: int | None = None
        self.violations: list[object] = []
        self._watch_updates()

    def _watch_updates(self) -> None:
        """S1 is checked after every runner change GitLab receives (on the server's thread)."""
        watch(self.world, self.violations)
        port, machine = self.world.controller.wiring.gitlab, self
        original = port.set_paused

        def set_paused(runner_id: int, paused: bool) -> None:
            if machine.kill_after is not None:
                if machine.kill_after == 0:
                    machine.kill_after = None
                    raise Killed()
                machine.kill_after -= 1
            original(runner_id, paused)

        port.set_paused = set_paused  # type: ignore[method-assign]

    def teardown(self) -> None:
        self.world.close()
        self.tmp.cleanup()

    @rule(gpus=st.sampled_from([1, 1, 1, 2, 4, 8]), duration=st.integers(5, 120))
    def submit(self, gpus: int, duration: int) -> None:
        self.world.submit(gpus, float(duration))

    @rule(seconds=st.integers(1, 40))
    def advance(self, seconds: int) -> None:
        try:
            self.world.advance(float(seconds), step=3.0)
        except Killed:
            self.restart()

    @rule(gpu=st.integers(0, 7))
    def foreign_on(self, gpu: int) -> None:
        self.world.gpus.foreign[gpu] = (5000 + gpu, "alice")

    @rule(gpu=st.integers(0, 7))
    def foreign_off(self, gpu: int) -> None:
        self.world.gpus.foreign.pop(gpu, None)

    @rule(where=st.sampled_from(["gpu:1", "gpu:6", "slot:gpu0-3", "slot:gpu4", "host"]),
          action=st.sampled_from(["pause", "drain", "resume"]))
    def toggle(self, where: str, action: str) -> None:
        store = self.world.store
        if action == "resume":
            store.clear_toggles("demo", None if where == "host" else where)
        else:
            store.set_toggle(Toggle("demo", where, action, "admin", self.world.clock(), "test"))

    @rule(kind=st.sampled_from(["401", "403", "404", "429", "500", "drop"]), count=st.integers(1, 6))
    def gitlab_fault(self, kind: str, count: int) -> None:
        self.world.server.faults.append(Fault("*", r"/runners|/projects", kind, count=count))

    @rule(after=st.integers(0, 6))
    def die_mid_tick(self, after: int) -> None:
        """The next tick dies after `after` runner changes (a SIGKILL between API calls)."""
        self.kill_after = after

    @rule()
    def restart(self) -> None:
        self.kill_after = None
        self.world.controller = Controller(self.world.controller.wiring, SETTINGS)

    @invariant()
    def no_double_allocation_or_foreign_collision(self) -> None:
        assert self.world.fleet.double_allocations == 0
        assert self.world.fleet.foreign_collisions == 0
        assert unpaused_overlap(self.world) is None
        assert not self.violations, self.violations

    @precondition(lambda self: len(self.world.submitted) > 0)
    @rule()
    def settle(self) -> None:
        """Disturbances stop: every job must start (no starvation, L1/L2 liveness)."""
        world = self.world
        world.gpus.foreign.clear()
        world.server.faults.clear()
        world.store.clear_toggles("demo")
        self.kill_after = None
        longest = max(world.durations.values(), default=0.0)
        budget = len(world.submitted) * (longest + 10) + SETTINGS.cooldown_s + SETTINGS.backoff_max_s + 60
        while budget > 0 and not set(world.submitted) <= set(world.fleet.started):
            world.advance(30.0, step=3.0)
            budget -= 30
        missing = set(world.submitted) - set(world.fleet.started)
        assert not missing, missing


TestControllerProperties = ControllerMachine.TestCase
TestControllerProperties.settings = settings(max_examples=EXAMPLES, stateful_step_count=20, deadline=None)


class CappedMachine(ControllerMachine):
    """The same, with the runners' maximum job timeouts set (random per slot size, from
    GitLab's 10-minute minimum up), so the planner knows every pending job's bound and
    every running job's end: jobs in age order, backfill into draining blocks. The jobs
    here run 5-120 s, so every bound is 5 to 1,400 times their real length (estimates far
    off; shorter is impossible: GitLab kills a job at its runner's maximum timeout)."""

    def __init__(self) -> None:
        super().__init__()
        for size in (1, 2, 4, 8):  # short singles under long blocks: backfill can open
            self.set_cap(size, 600 if size == 1 else 7200)

    @rule(duration=st.integers(60, 120), short=st.integers(5, 60), singles=st.integers(1, 3))
    def drain_behind_a_quad(self, duration: int, short: int, singles: int) -> None:
        """A quad, then an 8-GPU job that drains the host behind it, then short jobs that
        may backfill the drained half (the case backfill exists for). `event` counts the
        examples where backfill opened a runner (hypothesis --hypothesis-show-statistics)."""
        self.world.submit(4, float(duration))
        self.advance(9)  # a controller death mid-tick restarts it, as in `advance`
        self.world.submit(8, float(short))
        self.advance(9)  # the drain begins: the idle half is paused for the 8-GPU job
        for _ in range(singles):
            self.world.submit(1, float(short))
        self.advance(12)
        if any("backfill" in e.detail for e in self.world.store.events("demo", limit=50)):
            event("backfill opened a runner")

    @rule(size=st.sampled_from([1, 2, 4, 8]), seconds=st.sampled_from([600, 1200, 7200, 86400]))
    def set_cap(self, size: int, seconds: int) -> None:
        """An admin sets a maximum timeout on the host's `size`-GPU runners in GitLab."""
        for name, runner_id in self.world.fleet.runner_ids.items():
            if self.world.fleet.slots[name].size == size:
                self.world.state.runners[runner_id].maximum_timeout = seconds


TestCappedControllerProperties = CappedMachine.TestCase
TestCappedControllerProperties.settings = settings(max_examples=EXAMPLES, stateful_step_count=20,
                                                   deadline=None)


def _config(tmp: Path, runner_ids: dict[str, int]) -> tuple[Path, Path]:
    (tmp / "runnerctl.toml").write_text('[host]\nname = "demo"\n[controller]\nprojects = [1]\n'
                                        'api_budget_per_min = 600\n')
    lines = ["concurrent = 8", ""]
    for name, rid in runner_ids.items():
        lines += ["[[runners]]", f'name = "{name}"', f"id = {rid}", 'url = "http://gitlab"', ""]
    (tmp / "config.toml").write_text("\n".join(lines))
    return tmp / "runnerctl.toml", tmp / "config.toml"


def test_sigkill_of_serve_at_random_points_keeps_invariants(tmp_path: Path) -> None:
    """A real `serve` process against the HTTP GitLab, killed with SIGKILL and restarted."""
    world = build_world(tmp_path / "unused", settings=SETTINGS)
    world.clock.now = time.time()  # serve uses the wall clock
    world.fleet = SimFleet(world.state, world.fleet.runner_ids, list(world.fleet.slots.values()),
                           world.gpus, check_s=0.3, duration_of=lambda j: 1.5, lease_dir=tmp_path)
    violations: list[object] = []
    watch(world, violations)
    settings_path, config = _config(tmp_path, world.fleet.runner_ids)
    command = [sys.executable, "-m", "runnerctl", "serve", "--gitlab", world.server.url,
               "--token-file", token_file(tmp_path, TOKEN),
               "--config", str(settings_path), "--runner-config", str(config), "--gpu-source", "sim:8",
               "--state-dir", str(tmp_path), "--interval", "0.2", "--listen", "127.0.0.1:0"]
    rng = random.Random(3)
    try:
        for round_no in range(4):
            for _ in range(3):
                world.submit(rng.choice([1, 1, 2, 4, 8]), 1.5)
            asked = len(world.server.requests)
            proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            # the random point is counted from serve's first request to GitLab: counted from
            # its start, a slow import could take the whole time and the round tested nothing
            deadline, talking = time.monotonic() + 120, False
            while time.monotonic() < deadline:
                world.clock.now = time.time()
                world.fleet.step(world.clock.now)
                assert unpaused_overlap(world) is None
                if not talking and len(world.server.requests) > asked:
                    deadline, talking = time.monotonic() + rng.uniform(0.5, 3.0), True
                time.sleep(0.05)
            assert talking, proc.stderr.read() if proc.poll() is not None and proc.stderr else "no request"
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            assert world.fleet.double_allocations == 0 and not violations, round_no
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not set(world.submitted) <= set(world.fleet.started):
            world.clock.now = time.time()
            world.fleet.step(world.clock.now)
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert set(world.submitted) <= set(world.fleet.started), err.decode()[-2000:]
        assert unpaused_overlap(world) is None and not violations
    finally:
        world.close()
