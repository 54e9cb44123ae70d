"""The page in a real browser: Playwright drives Debian's Chromium against a real
`runnerctl serve --gitlab sim --gpu-source sim:8` subprocess. Fails (never skips) when
Chromium is missing."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.serve_proc import Serve

CHROMIUM = "/usr/bin/chromium"
expect.set_options(timeout=30_000)  # a tick and a page poll on a loaded machine, not Playwright's 5 s
PASSWORD = "correct horse battery"


def _serve(state_dir: Path) -> Serve:
    """serve over `state_dir` with the busy simulated workload."""
    return Serve(state_dir.parent, "--state-dir", str(state_dir), "--sim-workload", "busy")


def _runnerctl(*args: str, stdin: str = "") -> None:
    subprocess.run([sys.executable, "-m", "runnerctl", *args], input=stdin, text=True, check=True,
                   env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    _runnerctl("user", "add", "olga", "--role", "operator", "--password-stdin", "--state-dir", str(state),
               stdin=PASSWORD + "\n")
    _runnerctl("user", "add", "victor", "--role", "viewer", "--password-stdin", "--state-dir", str(state),
               stdin=PASSWORD + "\n")
    return state


@pytest.fixture
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run .ci/setup (Debian's chromium package)"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        yield browser
        browser.close()


def _sign_in(page: Page, name: str) -> None:
    page.fill("#signin-name", name)
    page.fill("#signin-password", PASSWORD)
    page.click("#signin-submit")
    expect(page.locator("#user-name")).to_contain_text(name)


def _busy_page(page: Page) -> None:
    """The scripted workload is up: a 4-GPU job on gpu0-3, alice's process on GPU 7."""
    for gpu in range(4):
        expect(page.locator(f'.gpu[data-gpu="{gpu}"]')).to_have_attribute("data-state", "ci", timeout=60_000)
    expect(page.locator('.gpu[data-gpu="0"]')).to_contain_text("job 1000")
    foreign = page.locator('.gpu[data-gpu="7"]')
    expect(foreign).to_have_attribute("data-state", "foreign", timeout=60_000)
    expect(foreign).to_contain_text("alice")
    expect(foreign).to_contain_text("2048 MiB")
    expect(page.locator('#slots tr[data-key="gpu0-3"]')).to_contain_text("1000")


def _operator_page(browser: Browser, serve: Serve) -> Page:
    """The busy page, signed in as the operator olga."""
    page = browser.new_page()
    page.goto(serve.url)
    _busy_page(page)
    _sign_in(page, "olga")
    return page


def test_anonymous_and_viewer_see_the_host_but_cannot_toggle(state_dir: Path, browser: Browser) -> None:
    serve = _serve(state_dir)
    try:
        page = browser.new_page()
        page.goto(serve.url)
        _busy_page(page)
        expect(page.locator("button.toggle")).to_have_count(0)
        expect(page.locator("#toggle-panel")).to_be_hidden()
        for who in ("anonymous", "victor"):
            if who == "victor":
                _sign_in(page, who)
                for _ in range(2):  # a poll rendered as signed in (the next starts after it ended)
                    with page.expect_response(lambda r: "/api/host" in r.url):
                        pass
                expect(page.locator("button.toggle")).to_have_count(0)  # the cards would carry buttons
            csrf = page.request.get(f"{serve.url}/api/session").json()["csrf"]
            forged = page.request.post(f"{serve.url}/api/toggles", headers={"X-CSRF-Token": csrf},
                                       data={"action": "pause", "target": "host", "reason": "forged"})
            assert forged.status == 403, who
        assert httpx.get(f"{serve.url}/api/host").json()["toggles"] == []
    finally:
        serve.stop()


def test_operator_drains_a_gpu_and_it_survives_a_restart(state_dir: Path, browser: Browser) -> None:
    serve = _serve(state_dir)
    try:
        page = _operator_page(browser, serve)
        no_csrf = page.request.post(f"{serve.url}/api/toggles",
                                    data={"action": "drain", "target": "gpu:6", "reason": "no token"})
        assert no_csrf.status == 403
        page.click('.gpu[data-gpu="6"] button[data-action="drain"]')
        expect(page.locator("#toggle-target")).to_have_value("gpu:6")
        page.fill("#toggle-reason", "replace fan")
        page.click("#toggle-submit")
        card = page.locator('.gpu[data-gpu="6"]')
        expect(card).to_have_attribute("data-state", "draining")
        expect(card).to_contain_text("drain by olga: replace fan")
        expect(page.locator('#events tr[data-key="drain gpu:6"]')).to_contain_text("by olga: replace fan")
        state = httpx.get(f"{serve.url}/api/state").json()
        assert [(t["target"], t["action"], t["who"], t["why"]) for t in state["toggles"]] == [
            ("gpu:6", "drain", "olga", "replace fan")]
        slot = next(s for s in state["slots"] if s["name"].endswith("/gpu6"))
        assert slot["state"] == "paused" and "drain by olga" in slot["reason"]
    finally:
        serve.stop()
    again = _serve(state_dir)
    try:
        page = browser.new_page()
        page.goto(again.url)
        card = page.locator('.gpu[data-gpu="6"]')
        expect(card).to_have_attribute("data-state", "draining", timeout=30_000)
        expect(card).to_contain_text("drain by olga: replace fan")
        expect(page.locator('#events tr[data-key="drain gpu:6"]')).to_contain_text("by olga: replace fan")
    finally:
        again.stop()


def test_sign_in_with_gitlab_makes_a_maintainer_an_operator(state_dir: Path, browser: Browser) -> None:
    serve = _serve(state_dir)
    try:
        page = browser.new_page()
        page.goto(serve.url)
        expect(page.locator('.gpu[data-gpu="0"]')).to_be_visible(timeout=30_000)
        expect(page.locator("button.toggle")).to_have_count(0)
        page.click("#gitlab-signin")
        page.click("text=Authorize as mia")  # the simulated GitLab's consent page
        expect(page.locator("#user-name")).to_contain_text("mia (operator)")
        expect(page.locator('.gpu[data-gpu="6"] button[data-action="pause"]')).to_be_visible()
    finally:
        serve.stop()


def test_the_page_keeps_focus_and_says_when_the_session_or_the_controller_is_gone(
        state_dir: Path, browser: Browser) -> None:
    """Found by a review as a lab member using the page with a keyboard: each 2 s poll
    rebuilt the cards and dropped the focus to the page; an ended session went unnoticed
    (toggles refused, no way to sign in); "Failed to fetch" stayed after the controller
    came back, in the colour of success; a resume could not be sent without a reason."""
    serve = _serve(state_dir)
    try:
        page = _operator_page(browser, serve)
        expect(page.locator("#signout")).to_be_focused()  # not lost with the hidden form
        drain6 = page.get_by_role("button", name="drain GPU 6")  # a name a screen reader tells apart
        drain6.focus()
        page.evaluate("window.card = document.querySelector('#gpus .gpu[data-gpu=\"6\"]')")
        page.wait_for_function("() => document.querySelector('#gpus .gpu[data-gpu=\"6\"]') !== window.card",
                               timeout=10_000)  # a poll rebuilt the card...
        expect(drain6).to_be_focused()  # ...and its button has the focus again
        page.keyboard.press("Enter")
        expect(page.locator("#toggle-reason")).to_be_focused()
        page.keyboard.type("fan")
        page.keyboard.press("Enter")
        expect(page.locator('.gpu[data-gpu="6"]')).to_have_attribute("data-state", "draining")
        page.get_by_role("button", name="resume GPU 6").click()
        expect(page.get_by_label("reason")).to_have_attribute("placeholder", "reason (optional)")
        page.click("#toggle-submit")  # no reason: a resume needs none
        expect(page.locator('.gpu[data-gpu="6"]')).not_to_have_attribute("data-state", "draining")
        _runnerctl("user", "remove", "olga", "--state-dir", str(state_dir))
        page.get_by_role("button", name="pause GPU 5").click()
        page.keyboard.type("x")
        page.keyboard.press("Enter")
        expect(page.locator("#message")).to_have_text("your session ended: sign in again")
        expect(page.locator("#signin")).to_be_visible()
        expect(page.locator("#toggle-panel")).to_be_hidden()
    finally:
        serve.stop()
    message = page.locator("#message")
    expect(message).to_contain_text("cannot reach the controller", timeout=30_000)
    expect(message).to_contain_text("retrying")
    assert message.evaluate("e => getComputedStyle(e).color") == "rgb(185, 28, 28)"  # an error's red
    again = Serve(state_dir.parent, "--state-dir", str(state_dir), "--sim-workload", "busy", port=serve.port)
    try:
        expect(message).to_have_text("", timeout=60_000)  # the next good poll clears it
    finally:
        again.stop()


def test_times_show_their_offset_and_the_since_filter_reads_local_time(state_dir: Path,
                                                                       browser: Browser) -> None:
    """The table showed "11/29/2026, 3:42:09 PM" with no zone while the filter read what
    was typed as UTC: copying a start time from the page filtered nine hours off in Tokyo
    (found by a review as a lab member using the page)."""
    serve = _serve(state_dir)
    context = browser.new_context(timezone_id="Asia/Tokyo")
    try:
        page = context.new_page()
        page.goto(serve.url)
        started = page.locator("#history tbody tr td").first
        expect(started).to_contain_text("+09:00", timeout=60_000)
        page.fill("#history-since", "2026-07-01T09:30")  # a summer day: Tokyo has no summer time
        with page.expect_request(lambda r: "/api/history?" in r.url and "since=" in r.url) as sent:
            page.click("#history-apply")
        assert "since=2026-07-01T09%3A30%2B09%3A00" in sent.value.url, sent.value.url
        page.fill("#history-since", "2026-07-01")
        with page.expect_request(lambda r: "since=2026-07-01T00" in r.url) as sent:
            page.click("#history-apply")  # (a poll may still send the filter before)
        assert "since=2026-07-01T00%3A00%2B09%3A00" in sent.value.url, sent.value.url
    finally:
        context.close()
        serve.stop()
