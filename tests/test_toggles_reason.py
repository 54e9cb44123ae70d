"""A toggle's reason is one line a person wrote: no control character, line or paragraph
separator (they would break or forge a line of the activity log), and a pause or drain
needs one that is not blank, invisible characters included."""

from __future__ import annotations

import getpass
from pathlib import Path

import pytest

from runnerctl.cli import main
from runnerctl.controller.store import Store
from runnerctl.controller.toggles import check_reason, request
from runnerctl.errors import ConfigError
from tests.conftest import defaults_toml


@pytest.mark.parametrize("why", ["x\ny", "x\x1b[2J", "x\x7f", "x\u009b2J", "x\u0085FORGED: resumed",
                                 "x\u2028y", "x\u2029y"])
def test_a_reason_that_breaks_the_line_is_refused(why: str) -> None:
    with pytest.raises(ConfigError, match="one line without control characters"):
        check_reason("pause", why)


@pytest.mark.parametrize("why", ["", "   ", "\u200b", " \u200b\u2060 "])
def test_a_blank_reason_is_refused_for_pause_and_drain_not_resume(why: str) -> None:
    for action in ("pause", "drain"):
        with pytest.raises(ConfigError, match=f"a {action} needs a reason"):
            check_reason(action, why)
    assert check_reason("resume", why) == why.strip()


def test_a_reason_in_any_script_is_kept_trimmed() -> None:
    assert check_reason("drain", "  ファン交換 (fan swap) 🛠️ ") == "ファン交換 (fan swap) 🛠️"


def test_a_slot_named_by_another_hosts_runner_is_refused(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`--slot runnerctl/gpu-b/gpu0-3` on host gpu-a once paused gpu-a's gpu0-3."""
    args = ["--slot", "runnerctl/gpu-b/gpu0-3", "--why", "fan", "--host-name", "gpu-a",
            "--state-dir", str(tmp_path), "--config", str(defaults_toml(tmp_path))]
    assert main(["pause", *args]) == 3
    err = capsys.readouterr().err
    assert err == ("runnerctl: error: slot 'runnerctl/gpu-b/gpu0-3' is a runner of gpu-b, not of gpu-a "
                   "(--host-name gpu-b toggles that host's runners)\n")
    assert not (tmp_path / "controller.sqlite").exists()  # refused before the store opened
    assert main(["pause", *args[:-6], "--host-name", "gpu-b", *args[-4:]]) == 0
    assert capsys.readouterr().out == ("gpu-b slot:gpu0-3: pause by " + getpass.getuser() + " (fan); no "
                                       "controller has run on gpu-b yet, it applies once one does\n")


@pytest.mark.parametrize("who", ["", "  ", "ann\nroot"])
def test_who_asks_is_a_name_on_one_line(tmp_path: Path, who: str) -> None:
    store = Store.open(state_dir=tmp_path)
    try:
        with pytest.raises(ConfigError, match="who asks must be a name"):
            request(store, action="pause", host="h", target="gpu:0", who=who, why="fan", now=1.0)
        assert store.toggles("h") == []
    finally:
        store.close()


def test_resume_counts_only_what_an_admin_set(tmp_path: Path) -> None:
    """A resume of a GPU leaves a reopen for the controller; a second resume before the
    controller read it removes no pause or drain."""
    store = Store.open(state_dir=tmp_path)
    try:
        request(store, action="pause", host="h", target="gpu:0", who="ann", why="fan", now=1.0)
        first = request(store, action="resume", host="h", target="gpu:0", who="ann", why="", now=2.0)
        second = request(store, action="resume", host="h", target="gpu:0", who="ann", why="", now=3.0)
    finally:
        store.close()
    assert first == "h gpu:0: resumed (1 toggle removed)"
    assert second == ("h gpu:0: resumed (0 toggles removed); no controller has run on h yet, it applies "
                      "once one does")  # (h has no controller here: a misspelt name would look resumed)
