"""The project's own .gitlab-ci.yml is valid against GitLab's CI schema."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gitlab_ci_yml_validates() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.gitlab-ci",
         str(ROOT / ".gitlab-ci.yml")], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok -- validation done" in result.stdout


def test_gitlab_ci_runs_the_same_checks_as_ci_run() -> None:
    text = (ROOT / ".gitlab-ci.yml").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    for command in ("ruff check", "mypy", "bash .ci/run"):
        assert command in text
    assert "pytest" in ci
