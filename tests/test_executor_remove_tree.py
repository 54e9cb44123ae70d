"""What a driver removes after a job (the docker driver's per-job scripts, the shell
driver's copy of the job's script) is removed as far as it can be; what is left is one
line on stderr, not silence and not the job's result."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runnerctl.executors.driver import remove_tree


def _tree(root: Path) -> Path:
    tree = root / "job-1"
    (tree / "scripts").mkdir(parents=True)
    for name in ("build_script", "after_script", "scripts/step_script"):
        (tree / name).write_text("echo $CI_JOB_TOKEN\n")
    return tree


def test_a_tree_is_removed_and_an_absent_one_is_removed_already(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    tree = _tree(tmp_path)
    assert remove_tree(tree, "job's scripts") and not tree.exists()
    assert remove_tree(tree, "job's scripts")
    assert capsys.readouterr().err == ""


def test_what_cannot_be_removed_is_one_line_and_the_rest_goes(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    tree = _tree(tmp_path)
    unlink = os.unlink

    def refuse_scripts(path: str | Path, *args: object, **kwargs: object) -> None:
        if "script" in os.fspath(path) and "step" not in os.fspath(path):  # root ignores modes
            raise PermissionError(1, "Operation not permitted", os.fspath(path))
        unlink(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "unlink", refuse_scripts)
    assert not remove_tree(tree, "job's scripts")
    err = capsys.readouterr().err
    assert err == ("runnerctl: cannot remove all of the job's scripts: Operation not permitted, "
                   "3 entries left\n")  # two files and the directory holding them
    assert not (tree / "scripts" / "step_script").exists()  # the rest is gone
    assert (tree / "build_script").exists() and (tree / "after_script").exists()
