"""`runnerctl exporter`: GPU occupancy metrics on a host where no controller runs.

Standalone means observe-only: every interval it reads the GPUs (NVML or a simulated
source) and the executor's leases, steps the same gate the controller uses (foreign
processes, memory or utilization without an owner, cool-down, unhealthy GPUs) and
serves the GPU and tick metrics on its own HTTP port. It talks to no GitLab, so runner,
demand and GitLab metrics are absent; use `runnerctl serve`'s `/metrics` for those.
Run it where runners are plain per-GPU gitlab-runner runners with runnerctl's executor
(leases exist). On a host where `runnerctl serve` runs (its state directory's lock names
a live serve), it stands by: serve exports the same GPU series, and both together counted
every GPU twice in the fleet panels; it exports again once serve stops. Standing by, it
serves `runnerctl_exporter_standing_by 1` and no collector success (a 0 there reads as a
failing collector and raised `RunnerctlExporterCollectorFailed`). It also writes
dcgm-exporter's job mapping files when `[monitoring] dcgm_job_mapping_dir` is set (not
while it stands by: serve writes them).
No failure ends its loop: a failing tick is logged once per kind and retried with a
back-off, and the age of its last good tick is exported as under `serve`
(`runnerctl_reconcile_last_success_age_seconds`, alert `RunnerctlReconcileStalled`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry

from runnerctl.controller.gate import GateState, GateThresholds, IsCi
from runnerctl.controller.liveness import Liveness
from runnerctl.controller.observe import LeaseJobs, gate_step
from runnerctl.controller.stats import ControllerStats, StatsView
from runnerctl.controller.store import Event
from runnerctl.controller.view import ControllerView, GpuView, SlotView
from runnerctl.errors import GpuError
from runnerctl.exporter import build_registry, gpus, reconcile
from runnerctl.exporter.http import start_server
from runnerctl.exporter.scrape import Part
from runnerctl.gpus import GpuSource

log = logging.getLogger(__name__)
HeldBy = Callable[[], Mapping[int, tuple[int, ...]]]
"""GPU index -> ids of the CI jobs holding it (from the leases)."""


def lease_holders(jobs: LeaseJobs) -> HeldBy:
    """GPUs held by readable leases; `jobs.unreadable` names the others (after this call)."""
    def held() -> dict[int, tuple[int, ...]]:
        jobs.running()  # reads the leases once; refreshes the tokens `jobs.is_ci` compares with
        return jobs.holders()
    return held


class Observer:
    """One observe-only tick at a time; `stats.view` is what the exporter serves."""

    def __init__(self, *, host: str, gpus: GpuSource, held: HeldBy, is_ci: IsCi, limits: GateThresholds,
                 clock: Callable[[], float] = time.time,
                 on_tick: list[Callable[[ControllerView], None]] | None = None,
                 unreadable: Callable[[], Mapping[int, str]] = dict,
                 serve: Callable[[], int | None] = lambda: None) -> None:
        """`unreadable` (read after `held`): GPU -> why its lease cannot be read; the gate
        keeps such a GPU closed, as under the controller (`LeaseJobs.unreadable`).
        `serve`: the pid of a serve running on this host (`private.serve_pid`), if any."""
        self.host, self.gpus, self.held, self.is_ci, self.limits = host, gpus, held, is_ci, limits
        self.unreadable = unreadable
        self.clock = clock
        self.on_tick = on_tick or []
        self.stats = ControllerStats()
        self.gate: dict[int, GateState] = {}
        self.ticks = 0
        self.liveness = Liveness(host=host, interval_s=5.0)  # serve_exporter sets its interval
        self.serve = serve
        self.beside: int | None = None  # the serve it stands by for

    def tick(self) -> StatsView | None:
        started = time.perf_counter()
        now = self.clock()
        self.ticks += 1
        if self._stands_by():
            self.liveness.good()
            return None
        try:
            snapshot = self.gpus.snapshot()
        except GpuError as exc:
            self.liveness.trouble("gpus", str(exc), warn="cannot read GPUs")  # logged once while it lasts
            snapshot = None
        else:
            self.liveness.trouble("gpus", "", warn="cannot read GPUs")
        held = self.held()
        if snapshot is not None:
            new = gate_step(snapshot, self.gate, now=now, is_ci=self.is_ci, owned=held, limits=self.limits,
                            unreadable=self.unreadable())
            for gpu, state in new.items():
                if state.closed != self.gate.get(gpu, GateState()).closed:
                    kind = "gate-close" if state.closed else "gate-open"
                    self.stats.event(Event(now, self.host, kind, f"gpu{gpu}", state.reason))
            self.gate = new
        indexes = sorted(self.gate) if snapshot is None else [g.index for g in snapshot.gpus]
        slots = tuple(SlotView(f"runnerctl/{self.host}/gpu{g}", (g,), 0, "open", None,
                               "observe-only: runner state not read", held.get(g, ())) for g in indexes)
        views = tuple(GpuView(g, not s.closed, s.reason, s.unhealthy) for g, s in sorted(self.gate.items()))
        view = ControllerView(self.host, now, self.ticks, snapshot, slots, views)
        stats = self.stats.observe(view, duration_s=time.perf_counter() - started, is_ci=self.is_ci)
        for hook in self.on_tick:
            hook(view)
        self.liveness.good()
        return stats

    @property
    def standing_by(self) -> bool:
        """True while it stands by for a serve on this host (as of its last tick)."""
        return self.beside is not None

    def _stands_by(self) -> bool:
        """True while a serve runs on this host: it exports these GPUs, so the exporter
        exports none (its series start again from nothing when serve stops). Said once
        each way."""
        pid = self.serve()
        if pid is not None and self.beside is None:
            log.warning("runnerctl serve (pid %d) runs on this host and exports its GPUs: the exporter "
                        "stands by until it stops", pid)
            self.stats, self.gate = ControllerStats(), {}
        elif pid is None and self.beside is not None:
            log.warning("runnerctl serve (pid %d) stopped: the exporter exports this host's GPUs again",
                        self.beside)
        self.beside = pid
        return pid is not None

    def run(self, stop: threading.Event, interval_s: float) -> None:
        """Tick until `stop`; no failure ends it (logged once per kind, backed off, and
        shown as the age of the last good tick)."""
        while not stop.is_set():
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001 - any kind: logged, counted, retried (liveness.py)
                self.liveness.failed(exc, self.ticks)
            stop.wait(self.liveness.backoff_s(interval_s))


def observer_registry(observer: Observer) -> CollectorRegistry:
    """What the exporter's /metrics serves: GPU and tick metrics of the observer's last
    tick, its liveness, and whether it stands by."""
    parts: dict[str, Part] = {"gpus": gpus.collect, "reconcile": reconcile.collect}
    return build_registry(lambda: observer.stats.view, parts, liveness=observer.liveness,
                          standing_by=lambda: observer.standing_by)


def serve_exporter(observer: Observer, *, host: str, port: int, interval_s: float,
                   stop: threading.Event) -> None:
    """Serve /metrics on HOST:PORT and tick every `interval_s` until `stop` is set."""
    observer.liveness = Liveness(host=observer.host, interval_s=interval_s)
    registry = observer_registry(observer)
    server, thread = start_server(host, port, registry)
    log.warning("runnerctl exporter: http://%s:%d/metrics (observe-only)", host, server.server_port)
    try:
        observer.run(stop, interval_s)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
