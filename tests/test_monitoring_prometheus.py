"""Monitoring end to end with the real tools: Prometheus scrapes runnerctl while a simulated host works.

Targets, all real processes or servers on loopback:
- job `runnerctl`: a real controller on a simulated 8-GPU host (sim GPUs, the HTTP GitLab
  fake through python-gitlab, runner stand-ins) running a scripted workload in
  accelerated virtual time, served by the same app and exporter as `runnerctl serve`
  (`serve_in_background`, the demo's in-process equivalent), plus `runnerctl serve
  --gpu-source sim:8 --gitlab sim` as a subprocess (idle: that command has no workload);
- job `runnerctl-exporter`: `runnerctl exporter --gpu-source sim:PATH` (observe-only)
  with a foreign process and a CI lease in place;
- job `runnerctl` again: an ailing simulated host `gpu-sick` where what the alerts watch
  for has gone wrong (no gitlab-runner polls, one runner deleted in GitLab, an 8-GPU job
  pending for three hours, GPU 7 gone from NVML, then GitLab answering 500 to
  everything, and one collector broken on purpose as a bug would break it), and a
  target nothing listens on.

Expressions come from the committed dashboards and alert rules. Grafana's variables are
replaced the way Grafana would for one host: `$Hostname` -> `demo`, `$__rate_interval`
-> 20s (the test scrapes every second), `$__range` -> 10m (covers the whole run).
Every alert expression must return a series: the healthy host produces some conditions
(GPU held outside CI, GPU leased but idle), the ailing host and the dead target the
others (runner offline or unknown, target down, GitLab down, a collector failing, a
multi-GPU job waiting over two hours, a GPU that cannot be used, a clock off the store's).
The alerts that only
the ailing host should raise must return no series of the healthy hosts (they do not
fire falsely).
"""

from __future__ import annotations

import abc
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.exposition import generate_latest

from runnerctl.controller.serve import serve_in_background
from runnerctl.controller.store import Toggle
from runnerctl.controller.toggles import set_toggle
from runnerctl.exporter import CONTENT_TYPE, build_registry, endpoint
from runnerctl.exporter.dcgm import JobMappingWriter, jobs_by_gpu
from runnerctl.exporter.scrape import ALL_PARTS
from runnerctl.settings import ControllerSettings
from runnerctl.sim.gitlab_server import Fault
from runnerctl.sim.world import PROJECT, TOKEN, World, build_world
from tests.pg import free_port

ROOT = Path(__file__).resolve().parents[1]
MONITORING = ROOT / "monitoring"
DASHBOARDS = sorted((MONITORING / "grafana" / "dashboards").glob("*.json"))
ALERTS = MONITORING / "prometheus" / "alerts.yml"
GRAFANA_VARS = {"$Hostname": "demo", "$__rate_interval": "20s", "$__range": "10m"}
NOT_IN_A_HEALTHY_RUN = {"RunnerctlRunnerOffline", "RunnerctlRunnerUnknown", "RunnerctlControllerDown",
                        "RunnerctlGitLabUnreachable", "RunnerctlExporterCollectorFailed",
                        "RunnerctlMultiGpuJobWaiting", "RunnerctlReconcileStalled",
                        "RunnerctlGitLabTokenExpiring", "RunnerctlGpuUnusable", "RunnerctlClockOff"}
STEP_S, PACE_S = 5.0, 0.1  # virtual seconds per step, wall seconds between steps (about 50x)


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - loopback only
        body: bytes = response.read()
        return body


class HostThread(threading.Thread, abc.ABC):
    """A simulated host built and driven on its own thread (its SQLite store lives there);
    an error is kept for the test to report, never swallowed."""

    def __init__(self, name: str, state_dir: Path, port: int) -> None:
        super().__init__(name=name, daemon=True)
        self.state_dir, self.port = state_dir, port
        self.ready = threading.Event()
        self.stop = threading.Event()  # the test: stop working
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            self.error = exc
            self.ready.set()

    @abc.abstractmethod
    def _run(self) -> None:
        """Build the host, set `ready`, work until `stop`."""


class Workload(HostThread):
    """The busy simulated host (one last tick follows `stop`)."""

    def __init__(self, state_dir: Path, mapping_dir: Path, port: int) -> None:
        super().__init__("workload", state_dir, port)
        self.mapping_dir = mapping_dir
        self.done = threading.Event()  # the workload: stopped, `last_at` is set
        self.release = threading.Event()  # the test: the last tick was scraped, shut down
        self.world: World | None = None
        self.first_at = 0.0
        self.last_at = 0.0
        self.mapping_checks = 0

    def _run(self) -> None:
        world = build_world(self.state_dir, settings=ControllerSettings(projects=(PROJECT,), cooldown_s=60.0))
        self.world = world
        world.controller.on_tick.append(JobMappingWriter(self.mapping_dir))
        server = serve_in_background(world.controller, f"127.0.0.1:{self.port}",  # wired as `serve`'s
                                     endpoint(lambda: world.controller.stats.view,
                                              liveness=world.controller.liveness))
        assert server is not None, "the metrics port was taken"
        try:
            for i in range(6):
                world.submit(1, 200.0 + 50 * i)
            world.advance(1.0)
            self.first_at = world.controller.view.at
            self.ready.set()
            self._play(world)
            self.done.set()
            self.release.wait(120)
        finally:
            self.done.set()
            server.should_exit = True
            world.close()

    def _play(self, world: World) -> None:
        script = [(20.0, "job4"), (60.0, "foreign"), (100.0, "job8"), (120.0, "job2"), (150.0, "pause")]
        next_single = 40.0
        while not self.stop.is_set():
            elapsed = world.clock.elapsed
            while script and script[0][0] <= elapsed:
                self._act(world, script.pop(0)[1])
            if elapsed >= next_single:
                world.submit(1, 150.0)
                next_single += 40.0
            world.advance(STEP_S)
            self._check_mapping(world)
            time.sleep(PACE_S)
        world.advance(1.0)
        self.last_at = world.controller.view.at

    def _act(self, world: World, action: str) -> None:
        if action.startswith("job"):
            world.submit(int(action[3:]), 200.0)
        elif action == "foreign":
            world.gpus.foreign[6] = (4242, "alice")  # stays: the 8-GPU job keeps waiting
        else:
            set_toggle(world.store, Toggle(world.controller.host, "gpu:7", "pause", "carol", world.clock(),
                                           "maintenance"))

    def _check_mapping(self, world: World) -> None:
        """dcgm-exporter's files match the jobs of the tick that wrote them."""
        wanted = jobs_by_gpu(world.controller.view)
        found = {int(p.name): [int(x) for x in p.read_text().split()] for p in self.mapping_dir.iterdir()
                 if p.name.isdigit()}
        assert found == wanted, (found, wanted)
        self.mapping_checks += 1 if wanted else 0


class AilingHost(HostThread):
    """A simulated host where everything the alerts watch for has gone wrong (built on this
    thread, like `Workload`): its gitlab-runner never polls (every runner offline in
    GitLab), runner gpu0 was deleted in GitLab (state unknown), an 8-GPU job has been
    pending for three hours, its token expires in six days, GPU 7 falls off the bus (NVML
    no longer lists it), then GitLab answers 500 to every request, and its clock is off the
    shared store's; its /metrics has one
    collector that raises, as a bug would; after a few ticks with GitLab failing its loop
    hangs (no tick finishes any more, as when a tick waits on a locked store)."""

    HOST = "gpu-sick"

    def __init__(self, state_dir: Path, port: int) -> None:
        super().__init__("ailing", state_dir, port)

    def _run(self) -> None:
        world = build_world(self.state_dir, host=self.HOST, settings=ControllerSettings(projects=(PROJECT,)))
        world.state.directory.tokens[TOKEN].expires_at = "2023-11-20"  # the world starts on 2023-11-14
        world.controller.wiring = dataclasses.replace(world.controller.wiring, check_token=True)  # as serve
        world.fleet.slots.clear()  # gitlab-runner is down: no runner ever polls
        world.state.delete_runner(next(i for n, i in world.fleet.runner_ids.items() if n.endswith("/gpu0")))
        job = world.submit(8, 3600.0)
        world.state.jobs[job].created_at -= 3 * 3600

        def broken(stats: object) -> list[object]:
            raise KeyError("a bug in a collector")

        registry = build_registry(lambda: world.controller.stats.view, {**ALL_PARTS, "broken": broken},
                                  liveness=world.controller.liveness)
        server = serve_in_background(world.controller, f"127.0.0.1:{self.port}",
                                     lambda: (generate_latest(registry), CONTENT_TYPE))
        assert server is not None, "the metrics port was taken"
        try:
            world.advance(30.0)  # runners read (offline, one gone), the old job seen pending
            world.gpus.count = 7  # GPU 7 gone from NVML: unknown
            world.server.faults.append(Fault("*", ".*", "500", count=10**9))
            world.advance(30.0)  # ticks with GitLab failing
            assert world.controller.view.gitlab_error
            world.controller.liveness.trouble("clock", "60 s ahead of the store's server")  # as check_clock
            self.ready.set()
            self.stop.wait()  # the loop hangs: its last good tick ages
        finally:
            server.should_exit = True
            world.close()


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict[str, Any]]:
        body = http_get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        answer = json.loads(body)
        assert answer["status"] == "success", (expr, answer)
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def wait_for(self, expr: str, timeout_s: float = 120.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.query(expr)
            if found:
                return found
            assert time.monotonic() < deadline, f"no series for {expr} within {timeout_s} s"
            time.sleep(0.5)


def start(cmd: list[str], *, env: dict[str, str] | None = None, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, f"{url}: the process exited: {log.read_text()[-2000:]}"
        try:
            http_get(url, timeout=2.0)
            return
        except OSError:
            assert time.monotonic() < deadline, f"{url} did not answer: {log.read_text()[-2000:]}"
            time.sleep(0.2)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("monitoring")
    prometheus_bin = shutil.which("prometheus")
    assert prometheus_bin, "prometheus is not installed (apt-get install prometheus, see .ci/setup)"
    runnerctl = [sys.executable, "-m", "runnerctl"]
    child_env = {**os.environ, "RUNNERCTL_CONFIG": str(tmp / "no-such-settings.toml")}
    procs: list[subprocess.Popen[bytes]] = []
    workload = Workload(tmp / "inproc", tmp / "dcgm", free_port())
    ailing = AilingHost(tmp / "ailing", free_port())
    try:
        serve_port, exporter_port, prom_port = free_port(), free_port(), free_port()
        procs.append(start([*runnerctl, "serve", "--gpu-source", "sim:8", "--gitlab", "sim", "--listen",
                            f"127.0.0.1:{serve_port}", "--state-dir", str(tmp / "serve"), "--interval", "1"],
                           env=child_env, log=tmp / "serve.log"))
        gpus_file = tmp / "gpus.yml"
        gpus_file.write_text(yaml.safe_dump({"host": "gpu-c", "gpus": 4, "processes": [
            {"gpu": 1, "pid": 4343, "user": "dave", "memory": "3GiB", "command": "python notebook.py"}]}))
        procs.append(start([*runnerctl, "exporter", "--gpu-source", f"sim:{gpus_file}", "--host", "gpu-c",
                            "--listen", f"127.0.0.1:{exporter_port}", "--state-dir", str(tmp / "exporter"),
                            "--interval", "0.5"], env=child_env, log=tmp / "exporter.log"))
        workload.start()
        assert workload.ready.wait(60), "the simulated host did not start"
        assert workload.error is None, workload.error
        ailing.start()
        assert ailing.ready.wait(60) and ailing.error is None, ailing.error
        dead = free_port()  # nothing listens here: `up` is 0
        config = prometheus_config([workload.port, serve_port, ailing.port, dead], exporter_port)
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        procs.append(start([prometheus_bin, f"--config.file={tmp / 'prometheus.yml'}",
                            f"--storage.tsdb.path={tmp / 'tsdb'}",
                            f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
                           log=tmp / "prometheus.log"))
        for url, proc, log in ((f"http://127.0.0.1:{serve_port}/metrics", procs[0], tmp / "serve.log"),
                               (f"http://127.0.0.1:{exporter_port}/metrics", procs[1], tmp / "exporter.log"),
                               (f"http://127.0.0.1:{prom_port}/-/ready", procs[2], tmp / "prometheus.log")):
            wait_http(url, proc, log)
        yield {"tmp": tmp, "workload": workload, "prometheus": Prometheus(f"http://127.0.0.1:{prom_port}"),
               "config": tmp / "prometheus.yml", "metrics": f"http://127.0.0.1:{workload.port}/metrics",
               "serve_metrics": f"http://127.0.0.1:{serve_port}/metrics",
               "exporter_metrics": f"http://127.0.0.1:{exporter_port}/metrics",
               "ailing": f"127.0.0.1:{ailing.port}", "dead": f"127.0.0.1:{dead}"}
    finally:
        workload.stop.set()
        workload.release.set()
        ailing.stop.set()
        workload.join(timeout=30)
        ailing.join(timeout=30)
        for proc in procs:
            stop(proc)


def prometheus_config(controllers: list[int], exporter: int) -> dict[str, Any]:
    """The committed prometheus.yml with a 1 s interval and loopback targets (dcgm-exporter
    cannot run here, so its job is left out)."""
    config = yaml.safe_load((MONITORING / "prometheus" / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(ALERTS)]
    targets = {"runnerctl": [f"127.0.0.1:{port}" for port in controllers],
               "runnerctl-exporter": [f"127.0.0.1:{exporter}"]}
    config["scrape_configs"] = [dict(job, static_configs=[{"targets": targets[job["job_name"]]}])
                                for job in config["scrape_configs"] if job["job_name"] in targets]
    assert len(config["scrape_configs"]) == 2
    return config


def dashboard_queries() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        panels = list(board["panels"])
        while panels:
            panel = panels.pop(0)
            panels.extend(panel.get("panels", []))
            found.extend((f"{path.name}: {panel['title']}", t["expr"]) for t in panel.get("targets", []))
        for var in board["templating"]["list"]:
            if var["type"] == "query":
                found.append((f"{path.name}: variable {var['name']}", var["query"]))
    assert len(found) > 20
    return found


def alert_rules() -> list[tuple[str, str]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [(rule["alert"], rule["expr"]) for group in groups for rule in group["rules"]]


def grafana(expr: str) -> str:
    for name, value in GRAFANA_VARS.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unhandled Grafana variable in {expr}"
    return expr


def wait_until_busy(prom: Prometheus) -> None:
    """Until the workload has produced what every panel shows (a started 4-GPU job, foreign
    use, a waiting 8-GPU job, an admin pause) and 25 s of samples exist for the rate windows."""
    for expr in ('runnerctl_job_wait_seconds_count{gpus="4"} > 0',
                 'runnerctl_gpu_occupancy_state{state="foreign",Hostname="demo"} == 1',
                 'runnerctl_pending_jobs{gpus="8"} > 0', 'runnerctl_admin_toggles_active{action="pause"} > 0',
                 'runnerctl_runner_toggles_total{action="pause",result="ok"} > 0',
                 'count_over_time(runnerctl_reconcile_ticks_total{Hostname="demo"}[1m]) > 25'):
        prom.wait_for(expr)


def test_promtool_checks_config_and_rules(env: dict[str, Any]) -> None:
    for args in (["check", "config", str(MONITORING / "prometheus" / "prometheus.yml")],
                 ["check", "config", str(env["config"])], ["check", "rules", str(ALERTS)]):
        done = subprocess.run(["promtool", *args, "--lint=all", "--lint-fatal"], capture_output=True,
                              text=True, check=False)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out
        assert "SUCCESS" in out and not re.search(r"WARN|FAIL|error", out, re.IGNORECASE), out


def test_promtool_check_metrics_is_silent_on_busy_and_observe_only_scrapes(env: dict[str, Any]) -> None:
    wait_until_busy(env["prometheus"])
    for url in (env["metrics"], env["serve_metrics"], env["exporter_metrics"]):
        scrape = http_get(url)
        assert b"runnerctl_gpu_occupancy_state" in scrape
        done = subprocess.run(["promtool", "check", "metrics"], input=scrape, capture_output=True,
                              check=False)
        assert done.returncode == 0 and done.stdout + done.stderr == b"", (url, done.stdout, done.stderr)
    busy = http_get(env["metrics"]).decode()
    for needle in ('state="ci"} 1.0', 'state="foreign"} 1.0', 'state="paused"} 1.0',
                   "runnerctl_job_wait_seconds_bucket", "runnerctl_drains_total"):
        assert needle in busy, needle


@pytest.mark.parametrize(("where", "expr"), dashboard_queries(), ids=lambda x: x.split(": ")[-1][:60])
def test_every_dashboard_expression_returns_data(env: dict[str, Any], where: str, expr: str) -> None:
    prom = env["prometheus"]
    wait_until_busy(prom)
    variable = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", expr)
    if variable:  # a Grafana variable: the series must exist and carry the label
        found = prom.query(variable.group(1))
        assert found and all(variable.group(2) in s["metric"] for s in found), where
        return
    found = prom.query(grafana(expr))
    assert found, f"{where}: no series for {grafana(expr)}"
    assert any(s["value"][1] not in ("NaN", "+Inf", "-Inf") for s in found), (where, found)


@pytest.mark.parametrize(("alert", "expr"), alert_rules(), ids=lambda x: x[:40])
def test_every_alert_expression_returns_data(env: dict[str, Any], alert: str, expr: str) -> None:
    prom = env["prometheus"]
    wait_until_busy(prom)
    found = prom.wait_for(expr, timeout_s=60)  # the ailing host's GitLab fails a few ticks in
    if alert in NOT_IN_A_HEALTHY_RUN:  # an alert over all hosts (a job in the shared queue) names none:
        # here only the ailing host's job waited over two hours
        healthy = [s["metric"] for s in found
                   if s["metric"].get("instance", env["ailing"]) not in (env["ailing"], env["dead"])]
        assert not healthy, f"{alert} would fire on a healthy host: {healthy}"


def test_occupancy_seconds_add_up_to_gpus_times_elapsed(env: dict[str, Any]) -> None:
    prom, workload = env["prometheus"], env["workload"]
    wait_until_busy(prom)
    workload.stop.set()
    assert workload.done.wait(60) and workload.error is None, workload.error
    assert workload.mapping_checks > 10  # the dcgm job mapping was checked while jobs ran
    target = f'{{job="runnerctl",instance="{env["metrics"].split("/")[2]}"}}'
    last = f"runnerctl_last_reconcile_timestamp_seconds{target}"
    prom.wait_for(f"{last} == {workload.last_at}")
    total = float(prom.query(f"sum(runnerctl_gpu_occupancy_seconds_total{target})")[0]["value"][1])
    gpus = len(prom.query(f"runnerctl_gpu_info{target}"))
    elapsed = workload.last_at - workload.first_at  # the controller's clock, read by the test
    assert gpus == 8 and elapsed > 300
    assert abs(total - gpus * elapsed) <= 0.01 * gpus * elapsed, (total, gpus, elapsed)
    by_state = {s["metric"]["state"]: float(s["value"][1]) for s in prom.query(
        f"sum by (state) (runnerctl_gpu_occupancy_seconds_total{target})")}
    assert by_state["ci"] > 0 and by_state["foreign"] > 0 and by_state["paused"] > 0, by_state
