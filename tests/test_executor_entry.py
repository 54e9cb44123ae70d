"""`python -m runnerctl.executors`, the command config.toml runs for every stage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from runnerctl.executors.contract import DriverArgs, stage_command
from tests.test_locale import ASCII_LOCALE


def test_a_broken_install_is_a_system_failure_not_the_jobs(tmp_path: Path) -> None:
    """A dependency that cannot be imported ended Python with exit 1, which gitlab-runner
    reads as BUILD_FAILURE_EXIT_CODE (executors/custom/command/command.go): every job on
    the host failed as a script failure, never retried (found by a review as a
    gitlab-runner maintainer). It is SYSTEM_FAILURE_EXIT_CODE, with the reason."""
    (tmp_path / "psutil.py").write_text("raise ImportError('psutil is broken here')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path]),
           "BUILD_FAILURE_EXIT_CODE": "1", "SYSTEM_FAILURE_EXIT_CODE": "7"}
    done = subprocess.run([sys.executable, "-m", "runnerctl.executors", "prepare"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 7, done
    assert done.stderr.strip() == ("runnerctl: the stage driver cannot start on this host (ImportError: "
                                   "psutil is broken here); reinstall runnerctl here")


def test_stage_arguments_edited_into_nonsense_are_a_system_failure_in_one_line(tmp_path: Path) -> None:
    """config.toml's `*_args` edited by hand (a GPU list `0,a`, a flag renamed) ended the
    stage with argparse's usage and exit 2, whatever SYSTEM_FAILURE_EXIT_CODE said; it is
    that code now, with one line naming what is wrong and how to write them again."""
    exe, argv = stage_command("prepare", DriverArgs("runnerctl/gpu-a/gpu0", (0,), "sim:2",
                                                    str(tmp_path / "none.toml"), "shell"))
    env = {**os.environ, "BUILD_FAILURE_EXIT_CODE": "1", "SYSTEM_FAILURE_EXIT_CODE": "7"}
    for bad in ([w.replace("0", "0,a") if w == "0" else w for w in argv], [*argv[:3], *argv[5:]]):
        done = subprocess.run([exe, *bad], env=env, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 7, done
        assert done.stderr.startswith("runnerctl: config.toml's arguments for this stage: ")
        assert done.stderr.rstrip().endswith("run `runnerctl init` again to write them")
        assert done.stderr.count("\n") == 1


def test_config_reads_a_japanese_job_under_a_locale_that_is_not_utf8(tmp_path: Path) -> None:
    """Every job whose payload had Japanese in it (a commit message, a job name) failed
    in config with a UnicodeDecodeError on a host whose locale is not UTF-8 (found by a
    review as an internationalisation reviewer): the JSON is UTF-8, whatever LANG says."""
    response = tmp_path / "response.json"
    response.write_text(json.dumps({"id": 7, "job_info": {"name": "学習 🔧", "project_id": 1},
                                    "variables": [{"key": "CI_COMMIT_MESSAGE", "value": "学習率を下げた"}]},
                                   ensure_ascii=False), encoding="utf-8")
    exe, argv = stage_command("config", DriverArgs("runnerctl/gpu-a/gpu0", (0,), "sim:2",
                                                   str(tmp_path / "none.toml"), "shell"))
    env = {**os.environ, **ASCII_LOCALE, "JOB_RESPONSE_FILE": str(response),
           "BUILD_FAILURE_EXIT_CODE": "1", "SYSTEM_FAILURE_EXIT_CODE": "7"}
    done = subprocess.run([exe, *argv], env=env, capture_output=True, text=True, timeout=120, check=False,
                          encoding="utf-8")
    assert done.returncode == 0, done
    assert "job_env" in json.loads(done.stdout)

