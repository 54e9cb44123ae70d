"""One page for the fleet, in a real browser: three hosts (`runnerctl serve` each, set up
as README.md says, tests/e2e_fleet.py) share one real PostgreSQL store and one simulated
GitLab. The page of gpu-a shows all 24 GPUs, the whole queue with a reason for every
waiting job and the job history of every host (filtered by user), and marks gpu-c
stopped within two of its tick periods once its controller is killed.
`RUNNERCTL_FLEET_SCREENSHOT=docs/img/fleet.png` retakes the docs' screenshot."""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, expect

from runnerctl.postgres import PostgresServer
from tests.e2e_fleet import Host, SimGitLab, wait_for
from tests.test_web_browser import browser  # noqa: F401 - the fixture: Debian's Chromium

HOSTS = ("gpu-a", "gpu-b", "gpu-c")
INTERVAL_S = 1.0
REASONS = {"starting", "draining", "priority", "resources", "foreign", "held"}


def _fleet_of_three(tmp_path: Path, spawned: list[subprocess.Popen[bytes]], store_url: str,
                    gitlab: SimGitLab) -> tuple[list[Host], list[subprocess.Popen[bytes]]]:
    hosts = [Host(name, tmp_path / name, gitlab, store_url=store_url) for name in HOSTS]
    for host in hosts:  # a slower tick than e2e_fleet's: three hosts and Chromium share two cores
        host.settings.write_text(host.settings.read_text().replace("interval_s = 0.5",
                                                                   f"interval_s = {INTERVAL_S}"))
    with ThreadPoolExecutor(len(hosts)) as pool:
        for host, done in zip(hosts, pool.map(lambda h: h.init(), hosts), strict=True):
            assert done.returncode == 0, (host.name, done.stderr)
    for host in hosts:
        host.start_runner(spawned)
    serves = [host.start_serve(spawned) for host in hosts]
    for host, proc in zip(hosts, serves, strict=True):
        wait_for(f"{host.name}'s /healthz", lambda h=host, p=proc: h.healthy() or p.poll() is not None)
        assert proc.poll() is None, host.logs()
    return hosts, serves


def _running(gitlab: SimGitLab, jobs: list[tuple[int, int]]) -> bool:
    return all(gitlab.job(project, job)["status"] == "running" for project, job in jobs)


def _fleet_states(host: Host) -> dict[str, str]:
    return {h["host"]: h["state"] for h in host.get("/api/fleet") or []}


def test_the_page_of_one_host_shows_the_whole_fleet(
        tmp_path: Path, spawned: list[subprocess.Popen[bytes]], pg_server: PostgresServer,
        browser: Browser) -> None:  # noqa: F811 - the fixture imported above
    gitlab = SimGitLab(spawned)
    hosts, serves = _fleet_of_three(tmp_path, spawned, pg_server.create_database("fleet_page"), gitlab)
    first, second = gitlab.info["project_ids"][:2]
    short = [(second, gitlab.enqueue(second, ["gpus:2"], duration_s=4, user=user)) for user in ("eve", "fay")]
    wait_for("two short jobs to end", lambda: all(gitlab.job(p, j)["status"] == "success" for p, j in short),
             timeout=120)
    # every host busy with one 8-GPU job, then a queue that must wait
    busy = [(first, gitlab.enqueue(first, ["gpus:8"], duration_s=900, user=f"long{i}")) for i in range(3)]
    wait_for("three 8-GPU jobs running", lambda: _running(gitlab, busy), timeout=120)
    waiting = [(second, gitlab.enqueue(second, [f"gpus:{n}"], duration_s=60, user=user))
               for n, user in ((8, "ada"), (4, "bo"), (1, "cy"), (2, "di"))]
    big = {job for (_, job), n in zip(waiting, (8, 4, 1, 2), strict=True) if n > 1}  # no room for them

    def queue_is_pending() -> list[dict[str, Any]] | None:
        queue: list[dict[str, Any]] = hosts[0].get("/api/queue") or []
        pending = {job for project, job in waiting if gitlab.job(project, job)["status"] == "pending"}
        return queue if {j["job_id"] for j in queue} == pending else None

    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.goto(hosts[0].web)
    for name in HOSTS:
        expect(page.locator(f'.host[data-host="{name}"]')).to_have_attribute("data-state", "running",
                                                                             timeout=60_000)
    expect(page.locator(".tile")).to_have_count(24)
    expect(page.locator('.tile[data-state="ci"]')).to_have_count(24, timeout=30_000)
    for job in big:
        expect(page.locator(f'#queue tr[data-key="{job}"]')).to_be_visible(timeout=30_000)
    # the queue is what GitLab has pending (the 1-GPU job may have been taken meanwhile)
    queue: list[dict[str, Any]] = wait_for("the queue of GitLab's pending jobs", queue_is_pending, timeout=30)
    assert all(j["reason"] in REASONS and j["detail"] for j in queue), queue
    users = dict(zip([job for _, job in waiting], ("ada", "bo", "cy", "di"), strict=True))
    assert [(j["position"], j["user"]) for j in queue] == [
        (n, users[j["job_id"]]) for n, j in enumerate(queue, start=1)]
    assert queue[0]["user"] == "ada"  # oldest first
    expect(page.locator("#queue tbody tr")).to_have_count(len(queue))
    for entry in queue:
        row = page.locator(f'#queue tr[data-key="{entry["job_id"]}"]')
        expect(row).to_have_attribute("data-reason", entry["reason"])
        expect(row).to_contain_text(entry["user"])
    # the history: the short jobs ended, the long ones run; filtered by user
    for _, job in short + busy:
        expect(page.locator(f'#history tr[data-key$=":{job}"]')).to_be_visible(timeout=30_000)
    for _, job in short:
        expect(page.locator(f'#history tr[data-key$=":{job}"]')).not_to_contain_text("running")
    expect(page.locator(f'#history tr[data-key$=":{busy[0][1]}"]')).to_contain_text("running")
    if shot := os.environ.get("RUNNERCTL_FLEET_SCREENSHOT"):
        page.screenshot(path=shot, full_page=True)

    page.fill("#history-user", "eve")
    page.click("#history-apply")
    expect(page.locator("#history tbody tr")).to_have_count(1)
    expect(page.locator(f'#history tr[data-key$=":{short[0][1]}"]')).to_contain_text("eve")

    serves[2].kill()  # gpu-c's controller stops
    seen: list[tuple[str, float, float]] = []  # (state, age, period) of gpu-c in each answer

    def gpu_c_stopped() -> bool:
        row = next(h for h in hosts[0].get("/api/fleet") if h["host"] == "gpu-c")
        seen.append((row["state"], row["age_s"], row["interval_s"]))
        return bool(row["state"] == "stopped")

    wait_for("gpu-c shown stopped", gpu_c_stopped, timeout=30, every=0.05)
    # the server's own figures, no wall clock: shown stopped exactly when its last good tick
    # is older than two of its periods (the interval plus that tick's own time)
    assert all((state == "stopped") == (age > 2 * period) for state, age, period in seen), seen
    assert INTERVAL_S <= seen[-1][2] < 2 * INTERVAL_S, seen
    expect(page.locator('.host[data-host="gpu-c"]')).to_have_attribute("data-state", "stopped")
    expect(page.locator('.host[data-host="gpu-c"] .state')).to_have_text("stopped")
    assert _fleet_states(hosts[0]) == {"gpu-a": "running", "gpu-b": "running", "gpu-c": "stopped"}
