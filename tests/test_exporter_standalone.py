"""`runnerctl exporter` (observe-only): GPUs from a sim file, CI from real leases and /proc.

A real process carrying a lease's RUNNERCTL_LEASE token (as the executor's stages do)
sits on GPU 2 under that lease; a process without one sits on GPU 1. The observer must
call the first CI and the second foreign, with the gate's cool-down after it leaves.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from runnerctl.cli import main
from runnerctl.controller.gate import GateThresholds
from runnerctl.controller.observe import LeaseJobs
from runnerctl.executors.lease import Lease, LeaseTable, new_nonce, process_started
from runnerctl.exporter import build_registry, gpus, reconcile
from runnerctl.exporter.standalone import Observer, lease_holders, observer_registry
from runnerctl.gpus import open_gpu_source
from runnerctl.settings import ControllerSettings

LIMITS = GateThresholds.from_settings()
COOL_30 = GateThresholds.from_settings(ControllerSettings(cooldown_s=30.0))


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def ci_process(tmp_path: Path) -> Iterator[tuple[int, Lease]]:
    me = os.getpid()
    lease = Lease(gpu=-1, job_id="4711", slot="runnerctl/gpu-c/gpu2", driver="shell", owner_pid=me,
                  owner_started=process_started(me) or 0.0, created_at=time.time(), nonce=new_nonce())
    assert LeaseTable(tmp_path).try_acquire((2,), lease) == []
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env={**os.environ, "RUNNERCTL_LEASE": lease.token})
    try:
        yield proc.pid, lease
    finally:
        proc.kill()
        proc.wait()


def write_gpus(path: Path, processes: list[dict[str, object]]) -> None:
    path.write_text(yaml.safe_dump({"host": "gpu-c", "gpus": 4, "processes": processes}))


def states(text: str) -> dict[str, str]:
    return {s.labels["gpu"]: s.labels["state"] for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "runnerctl_gpu_occupancy_state" and s.value == 1.0}


def test_observer_tells_ci_from_foreign_and_cools_down(tmp_path: Path, ci_process: tuple[int, Lease]) -> None:
    pid, _ = ci_process
    gpus_file = tmp_path / "gpus.yml"
    write_gpus(gpus_file, [{"gpu": 1, "pid": 4343, "user": "dave", "memory": "3GiB"},
                           {"gpu": 2, "pid": pid, "user": "gitlab-runner", "memory": "5GiB"}])
    jobs = LeaseJobs(tmp_path)
    clock = Clock()
    observer = Observer(host="gpu-c", gpus=open_gpu_source(f"sim:{gpus_file}", host="gpu-c", watch_xid=True),
                        held=lease_holders(jobs), is_ci=jobs.is_ci, clock=clock,
                        limits=COOL_30)
    parts = {"gpus": gpus.collect, "reconcile": reconcile.collect}
    registry = build_registry(lambda: observer.stats.view, parts)
    observer.tick()
    text = generate_latest(registry).decode()
    assert states(text) == {"0": "idle", "1": "foreign", "2": "ci", "3": "idle"}
    assert 'runnerctl_gpu_foreign_processes{Hostname="gpu-c",UUID=' in text
    assert "runnerctl_runner_state" not in text and "runnerctl_gitlab_up" not in text  # observe-only
    write_gpus(gpus_file, [{"gpu": 2, "pid": pid, "user": "gitlab-runner", "memory": "5GiB"}])
    clock.now += 10
    observer.tick()
    assert states(generate_latest(registry).decode())["1"] == "foreign"  # cooling down
    clock.now += 30
    stats = observer.tick()
    assert states(generate_latest(registry).decode())["1"] == "idle"
    assert stats.events == {"gate-close": 1, "gate-open": 1}
    assert sum(stats.gpu_seconds.values()) == pytest.approx(4 * 40.0)


def test_exporter_command_refuses_a_bad_listen_address(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNNERCTL_CONFIG", str(tmp_path / "none.toml"))
    code = main(["exporter", "--gpu-source", "sim:2", "--listen", "nowhere", "--state-dir", str(tmp_path)])
    assert code != 0
    assert "--listen 'nowhere' is not HOST:PORT" in capsys.readouterr().err


def test_settings_carry_the_dcgm_mapping_dir(tmp_path: Path) -> None:
    from runnerctl.errors import ConfigError
    from runnerctl.settings import load_settings

    path = tmp_path / "runnerctl.toml"
    path.write_text('[monitoring]\ndcgm_job_mapping_dir = "/run/dcgm-job-map"\n')
    assert load_settings(path).monitoring.dcgm_job_mapping_dir == "/run/dcgm-job-map"
    path.write_text('[monitoring]\ndcgm_job_map = "/run/x"\n')
    with pytest.raises(ConfigError, match="unknown setting 'dcgm_job_map'"):
        load_settings(path)


def test_an_unreadable_lease_keeps_its_gpu_closed_in_the_exporter_too(tmp_path: Path) -> None:
    """Issue 14: as under the controller (test_orphans), a lease nobody can read holds its
    GPU: the exporter's gate closes it and says why, instead of counting it a CI job."""
    gpus_file = tmp_path / "gpus.yml"
    write_gpus(gpus_file, [])
    (tmp_path / "leases").mkdir()
    (tmp_path / "leases" / "gpu3.json").write_bytes(b"\x00 not a lease")
    jobs = LeaseJobs(tmp_path)
    observer = Observer(host="gpu-c", gpus=open_gpu_source(f"sim:{gpus_file}", host="gpu-c", watch_xid=True),
                        held=lease_holders(jobs), unreadable=jobs.unreadable, is_ci=jobs.is_ci,
                        clock=Clock(), limits=COOL_30)
    parts = {"gpus": gpus.collect, "reconcile": reconcile.collect}
    registry = build_registry(lambda: observer.stats.view, parts)
    stats = observer.tick()
    assert stats.events == {"gate-close": 1}
    gpu3 = next(g for g in observer.stats.view.view.gpus if g.index == 3)
    assert not gpu3.open and "unreadable lease" in gpu3.reason, gpu3
    found = states(generate_latest(registry).decode())
    assert found["3"] not in ("idle", "ci") and found["0"] == "idle", found


def test_the_exporter_stands_by_while_serve_runs_on_the_host(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """serve exports the host's GPUs; an exporter beside it exported them again, so every
    fleet panel counted each GPU twice and the dcgm join found duplicate series. While the
    state dir's serve.lock names a live serve, the exporter exports no GPU series; when
    that serve stops, it exports them again."""
    from runnerctl.private import serve_pid

    state = tmp_path / "state"
    holder = subprocess.Popen(  # the real lock, held by a process whose command line is a serve's
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from runnerctl.controller.serve import hold_state_dir; hold_state_dir(Path(sys.argv[1])); "
         "print('held', flush=True); time.sleep(120)", str(state), "runnerctl", "serve"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        observer = Observer(host="gpu-c", gpus=open_gpu_source("sim:2", host="gpu-c"), held=dict,
                            is_ci=lambda pid: False, limits=LIMITS, serve=lambda: serve_pid(state))
        registry = build_registry(lambda: observer.stats.view,
                                  {"gpus": gpus.collect, "reconcile": reconcile.collect})
        assert observer.tick() is None and observer.tick() is None
        assert "runnerctl_gpu_info" not in generate_latest(registry).decode()
        assert caplog.text.count(f"runnerctl serve (pid {holder.pid}) runs on this host") == 1
    finally:
        holder.kill()
        holder.wait()
    assert serve_pid(state) is None  # the lock file stays, naming a process that is gone
    assert observer.tick() is not None
    assert generate_latest(registry).decode().count("runnerctl_gpu_info{") == 2
    assert f"runnerctl serve (pid {holder.pid}) stopped" in caplog.text


def test_an_exporter_standing_by_reports_no_collector_as_failing() -> None:
    """Beside a running serve the exporter exports nothing on purpose. It said so as
    `runnerctl_exporter_scrape_success 0` for each collector, which raised
    RunnerctlExporterCollectorFailed and showed 0 on the host dashboard for as long as
    serve ran; it now serves no success for them and `runnerctl_exporter_standing_by 1`."""
    serve: list[int | None] = [4242]
    observer = Observer(host="gpu-c", gpus=open_gpu_source("sim:2", host="gpu-c"), held=dict,
                        is_ci=lambda pid: False, limits=LIMITS, serve=lambda: serve[0])
    registry = observer_registry(observer)

    def samples() -> dict[tuple[str, str], float]:
        text = generate_latest(registry).decode()
        return {(s.name, s.labels.get("collector", "")): s.value for f in text_string_to_metric_families(text)
                for s in f.samples if s.labels.get("Hostname") == "gpu-c"}

    for _ in range(3):
        observer.tick()
    found = samples()
    assert not [key for key in found if key[0] == "runnerctl_exporter_scrape_success"], found
    assert found[("runnerctl_exporter_standing_by", "")] == 1.0
    assert ("runnerctl_reconcile_last_success_age_seconds", "") in found  # still says it is alive
    serve[0] = None
    observer.tick()
    found = samples()
    assert found[("runnerctl_exporter_standing_by", "")] == 0.0
    assert found[("runnerctl_exporter_scrape_success", "gpus")] == 1.0
    assert found[("runnerctl_exporter_scrape_success", "reconcile")] == 1.0
