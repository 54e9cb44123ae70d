"""Take the README's screenshots of the web page: `python docs/img/screenshots.py`.

Starts `runnerctl serve --gitlab sim --gpu-source sim:8 --sim-workload busy` in a
temporary state dir, adds an operator, drains GPU 6 through the page in Debian's
Chromium (Playwright) and writes docs/img/web-host.png and docs/img/web-operator.png.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from playwright.sync_api import expect, sync_playwright

HERE = Path(__file__).resolve().parent
PASSWORD = "screenshot-password"


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        state = Path(tmp) / "state"
        subprocess.run([sys.executable, "-m", "runnerctl", "user", "add", "olga", "--role", "operator",
                        "--password-stdin", "--state-dir", str(state)], input=PASSWORD, text=True, check=True)
        serve = subprocess.Popen([sys.executable, "-m", "runnerctl", "serve", "--gitlab", "sim",
                                  "--gpu-source", "sim:8", "--listen", f"127.0.0.1:{port}",
                                  "--state-dir", str(state), "--interval", "1", "--sim-workload", "busy"],
                                 stdout=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(100):
                try:
                    httpx.get(f"{url}/healthz")
                    break
                except httpx.HTTPError:
                    time.sleep(0.2)
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path="/usr/bin/chromium",
                                                     args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(url)
                expect(page.locator('.gpu[data-gpu="7"]')).to_have_attribute("data-state", "foreign",
                                                                             timeout=60_000)
                expect(page.locator('.gpu[data-gpu="5"]')).to_have_attribute("data-state", "ci")
                page.screenshot(path=str(HERE / "web-host.png"), full_page=True)
                page.fill("#signin-name", "olga")
                page.fill("#signin-password", PASSWORD)
                page.click("#signin-submit")
                page.click('.gpu[data-gpu="6"] button[data-action="drain"]')
                page.fill("#toggle-reason", "replace the fan")
                page.click("#toggle-submit")
                expect(page.locator('.gpu[data-gpu="6"]')).to_have_attribute("data-state", "draining")
                page.screenshot(path=str(HERE / "web-operator.png"), full_page=True)
                browser.close()
        finally:
            serve.terminate()
            serve.wait(timeout=30)


if __name__ == "__main__":
    main()
