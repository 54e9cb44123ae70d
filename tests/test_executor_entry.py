"""`python -m runnerctl.executors`, the command config.toml runs for every stage."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


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
