"""A real `runnerctl serve --gitlab sim` subprocess on a free loopback port, and a burst
of concurrent calls: for the tests that need uvicorn itself (browser, sign-in limits)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.pg import free_port


class Serve:
    """`runnerctl serve --gitlab sim --gpu-source sim:8 --interval 1 ARGS...`, up once /healthz answers."""

    def __init__(self, log_dir: Path, *args: str, env: dict[str, str] | None = None,
                 port: int | None = None) -> None:
        """`port` 0: any free port, read from serve's announcement."""
        self.port = free_port() if port is None else port
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log_dir / f"serve-{self.port or 'any'}.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runnerctl", "serve", "--gitlab", "sim", "--gpu-source", "sim:8",
             "--listen", f"127.0.0.1:{self.port}", "--interval", "1", *args],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        try:
            self._wait_until_up()
        except BaseException:
            self.proc.kill()  # a serve that never came up is not left running after the test
            self.proc.wait()
            self.log.close()
            raise

    def _wait_until_up(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, Path(self.log.name).read_text()
            if not self.port:
                announced = re.search(r"runnerctl serve: http://127\.0\.0\.1:(\d+)/", self.output())
                if announced is None:
                    time.sleep(0.2)
                    continue
                self.port = int(announced.group(1))
                self.url = f"http://127.0.0.1:{self.port}"
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError("serve did not answer /healthz with 200 within 120 s")

    def output(self) -> str:
        return Path(self.log.name).read_text()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def concurrently(call: Callable[[int], int], count: int) -> list[int]:
    """`call(0..count-1)`, each on its own thread, all started at once; their results."""
    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(call, range(count), timeout=120))
