"""A toggle's reason is one line a person wrote: no control character, line or paragraph
separator (they would break or forge a line of the activity log), and a pause or drain
needs one that is not blank, invisible characters included."""

from __future__ import annotations

import pytest

from runnerctl.controller.toggles import check_reason
from runnerctl.errors import ConfigError


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
