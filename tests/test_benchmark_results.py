"""benchmarks/RESULTS.md holds each benchmark's default run, stamped with what measured
it: a quick run with smaller options replaced the committed tables (found by a review as
a benchmark auditor)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _results_md(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("results_md_under_test", BENCHMARKS / "results_md.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "RESULTS", tmp_path / "RESULTS.md")
    return module


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=300_000)
    parser.add_argument("--quick", action="store_true")
    return parser


@pytest.mark.parametrize(("argv", "written"), [
    ([], True), (["--jobs", "300000"], True),  # the defaults, spelt out
    (["--jobs", "20000"], False), (["--quick"], False), (["--no-write"], False)])
def test_only_the_default_run_writes_and_it_says_what_measured_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        argv: list[str], written: bool) -> None:
    results_md = _results_md(tmp_path, monkeypatch)
    (tmp_path / "RESULTS.md").write_text("# Benchmark results\n\n<!-- x:begin -->\nold\n<!-- x:end -->\n")
    monkeypatch.setattr(sys, "argv", ["bench", *argv])
    results_md.parse_args(_parser())
    results_md.write_section("x", ["## X", "", "new"])
    text = (tmp_path / "RESULTS.md").read_text()
    assert ("new" in text and "old" not in text) is written
    if written:
        assert "_Measured at " in text and " CPUs (" in text and "Python " in text
    elif argv != ["--no-write"]:
        assert "writes nothing" in capsys.readouterr().out
