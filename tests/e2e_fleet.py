"""The push-to-GPU path as separate processes, set up the way README.md tells a lab to.

`runnerctl sim gitlab` stands in for GitLab, `runnerctl sim runner` for gitlab-runner
(one per host, reading the config.toml that `runnerctl init` wrote), and `runnerctl
serve` is the controller, each its own process talking HTTP. Used by
tests/test_e2e_push.py (one host) and tests/test_e2e_fleet.py (three hosts sharing a
PostgreSQL store).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tests.pg import free_port

FINAL = frozenset({"success", "failed", "canceled", "skipped"})


def wait_for(what: str, check: Callable[[], Any], *, timeout: float = 180.0, every: float = 0.2) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def runnerctl(*args: str) -> list[str]:
    return [sys.executable, "-m", "runnerctl", *args]


class SimGitLab:
    """A `runnerctl sim gitlab` process and what its JSON line said."""

    def __init__(self, spawned: list[subprocess.Popen[bytes]]) -> None:
        proc = subprocess.Popen(runnerctl("sim", "gitlab", "--listen", "127.0.0.1:0"),
                                stdout=subprocess.PIPE)
        spawned.append(proc)
        assert proc.stdout is not None
        self.info: dict[str, Any] = json.loads(proc.stdout.readline())
        self.url: str = self.info["url"]
        self.token: str = self.info["admin_token"]

    def request(self, method: str, path: str, body: dict[str, Any] | None = None, *,
                token: str | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        req.add_header("PRIVATE-TOKEN", token or self.token)
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def enqueue(self, project_id: int, tags: Iterable[str], *, duration_s: float, user: str) -> int:
        answer = self.request("POST", "/-/sim/jobs", {"project_id": project_id, "tags": list(tags),
                                                      "duration_s": duration_s, "user": user})
        return int(answer["id"])

    def job(self, project_id: int, job_id: int) -> dict[str, Any]:
        return dict(self.request("GET", f"/api/v4/projects/{project_id}/jobs/{job_id}"))

    def token_with(self, scopes: list[str]) -> str:
        user_id = self.info["admin_user_id"]
        answer = self.request("POST", f"/api/v4/users/{user_id}/personal_access_tokens",
                              {"name": "e2e-" + "-".join(scopes), "scopes": scopes})
        return str(answer["token"])


@dataclasses.dataclass
class Host:
    """One simulated GPU host: its settings, config.toml, and the processes it runs."""

    name: str
    root: Path
    gitlab: SimGitLab
    store_url: str = ""
    listen_port: int = dataclasses.field(default_factory=free_port)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.settings = self.root / "runnerctl.toml"
        self.runner_config = self.root / "gitlab-runner" / "config.toml"
        self.state_dir = self.root / "state"
        store = f'store_url = "{self.store_url}"\n' if self.store_url else ""
        self.settings.write_text(
            f'[host]\nname = "{self.name}"\ngpu_source = "sim:8"\n\n'
            f'[paths]\nstate_dir = "{self.state_dir}"\nrunner_config = "{self.runner_config}"\n'
            f'builds_dir = "{self.root / "builds"}"\ncache_dir = "{self.root / "cache"}"\n\n'
            '[executor]\ndriver = "shell"\ngate_wait_s = 60\nallow_root = true\n\n'
            f'[controller]\ninterval_s = 0.5\napi_budget_per_min = 600\n{store}')

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "RUNNERCTL_CONFIG": str(self.settings),
                "RUNNERCTL_GITLAB_TOKEN": self.gitlab.token, "PYTHONUNBUFFERED": "1"}

    @property
    def web(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    def init(self, *, token: str | None = None) -> subprocess.CompletedProcess[str]:
        env = self.env if token is None else {**self.env, "RUNNERCTL_GITLAB_TOKEN": token}
        return subprocess.run(runnerctl("init", "--gitlab-url", self.gitlab.url,
                                        "--group", str(self.gitlab.info["group_id"])),
                              env=env, capture_output=True, text=True, timeout=120, check=False)

    def start_runner(self, spawned: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        log = (self.root / "runner.log").open("wb")
        proc = subprocess.Popen(runnerctl("sim", "runner", "--runner-config", str(self.runner_config)),
                                env=self.env, stdout=log, stderr=subprocess.STDOUT)
        spawned.append(proc)
        return proc

    def start_serve(self, spawned: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        log = (self.root / "serve.log").open("wb")
        proc = subprocess.Popen(runnerctl("serve", "--gitlab", self.gitlab.url,
                                          "--listen", f"127.0.0.1:{self.listen_port}"),
                                env=self.env, stdout=log, stderr=subprocess.STDOUT)
        spawned.append(proc)
        return proc

    def get(self, path: str) -> Any:
        try:
            with urllib.request.urlopen(self.web + path, timeout=10) as resp:
                return json.loads(resp.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.web + "/healthz", timeout=10) as resp:
                return resp.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
                         for p in sorted(self.root.glob("*.log")))


class LeaseWatch:
    """Samples every host's lease files while jobs run: which job holds which GPU.

    A lease file per GPU cannot name two jobs at once, so the check that matters is
    across files: every job holds exactly its runner's GPU set, all at once, and no GPU
    is seen with two jobs in one sample (a stale file left behind would show as that).
    """

    def __init__(self, hosts: list[Host]) -> None:
        self.hosts = hosts
        self.samples: list[dict[tuple[str, int], str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LeaseWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            sample: dict[tuple[str, int], str] = {}
            for host in self.hosts:
                for path in (host.state_dir / "leases").glob("gpu*.json"):
                    try:
                        record = json.loads(path.read_text())
                    except (OSError, ValueError):
                        continue  # released (or being written) between glob and read
                    sample[(host.name, int(record["gpu"]))] = str(record["job_id"])
            self.samples.append(sample)

    def gpus_of_jobs(self) -> dict[str, set[tuple[str, int]]]:
        """Every (host, gpu) a job was ever seen holding."""
        held: dict[str, set[tuple[str, int]]] = {}
        for sample in self.samples:
            for key, job in sample.items():
                held.setdefault(job, set()).add(key)
        return held


def all_final(gitlab: SimGitLab, jobs: dict[tuple[int, int], int]) -> dict[int, dict[str, Any]] | None:
    """Each (project, job) -> its GitLab record, once every one of them has ended."""
    infos = {job_id: gitlab.job(project, job_id) for project, job_id in jobs}
    return infos if all(info["status"] in FINAL for info in infos.values()) else None
