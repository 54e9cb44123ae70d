"""Hypothesis over the CLI: arguments and trace files, as a user could type or write
them, never make `runnerctl` raise (a traceback to the user); every outcome is an
exit code with at most a one-line error.

`main(argv)` is called in-process for the commands that start no server or process:
simulate (with generated JOBS.csv/FOREIGN.csv), render, pause/drain/resume, user list
and remove, status, and init --dry-run. Runs are derandomized: the same examples each
time, so a failure reproduces.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runnerctl.cli import main

SETTINGS = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
ODD = ["", " ", "0", "-5", "3", "7", "999", "99999", "1e309", "nan", "inf", "-0", "0x10", "१", "gpu:006",
       "host", "gpu0-3", "gpu0-5", "slot:", "a\nb", "\t", "\udcff", "x" * 600, "/nonexistent/x",
       "127.0.0.1:99999", "sim:2", "sim:0", "sim:-1", "sim:x", "sim:/nonexistent.yml", "custom", "--",
       "-", "--help", "=", "gpus=3", "gpus=4", "command=python t.py", "study_name=s", "gpus_per_worker=6"]
ARG_TEXT = st.text(st.characters(exclude_characters="\x00"), max_size=12)  # argv is C strings: no NUL
value = st.one_of(st.sampled_from(ODD), ARG_TEXT)
cell = st.one_of(st.sampled_from(["1", "0", "-2", "3", "8", "16", "2.5", "nan", "NaN", "inf", "-1e3", "1e12",
                                  "", " ", "x", "high", "urgent", "gpu-a", "gpu-zz", "\"", "1\n2"]),
                 st.integers(-10, 10).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                 st.text(max_size=6))
JOBS = ["job_id", "submit_time", "gpus", "duration", "project", "priority"]
FOREIGN = ["start", "duration", "host", "gpu"]


def run(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)  # raising here would be a traceback for the user
    return code, err.getvalue()


def check(code: int, err: str) -> None:
    assert isinstance(code, int)
    assert "Traceback" not in err, err
    if code != 0 and err:
        assert err.startswith(("runnerctl: error:", "runnerctl: aborted")), err
        assert err.rstrip("\n").count("\n") == 0, err


@st.composite
def csv_file(draw: st.DrawFn, columns: list[str]) -> bytes:
    header = draw(st.one_of(st.just(columns[:4]), st.just(columns), st.permutations(columns),
                            st.lists(st.sampled_from(columns + ["x"]), max_size=6)))
    rows = draw(st.lists(st.lists(cell, min_size=0, max_size=len(header) + 2), max_size=6))
    text = "\n".join(",".join(row) for row in [header, *rows]) + draw(st.sampled_from(["", "\n", "\r\n"]))
    raw = text.encode("utf-8", "surrogateescape")
    return draw(st.one_of(st.just(raw), st.binary(max_size=40).map(lambda junk: raw + junk)))


@pytest.fixture(autouse=True)
def no_settings_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNNERCTL_CONFIG", str(tmp_path / "absent.toml"))
    monkeypatch.delenv("RUNNERCTL_GITLAB_TOKEN", raising=False)


@SETTINGS
@given(jobs=csv_file(JOBS), foreign=st.none() | csv_file(FOREIGN),
       extra=st.lists(st.sampled_from([["--hosts", "2"], ["--gpus-per-host", "4"], ["--policy", "greedy"],
                                       ["--json"], ["--hosts", "0"], ["--gpus-per-host", "3"],
                                       ["--runner-type", "instance"], ["--fair-weight-h", "4"]]), max_size=3))
def test_simulate_never_raises_on_any_trace(tmp_path: Path, jobs: bytes, foreign: bytes | None,
                                            extra: list[list[str]]) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_bytes(jobs)
    argv = ["simulate", "--trace", str(trace), *sum(extra, [])]
    if foreign is not None:
        (tmp_path / "foreign.csv").write_bytes(foreign)
        argv += ["--foreign", str(tmp_path / "foreign.csv")]
    check(*run(argv))


OPTIONS = {
    "simulate": ["--trace", "--foreign", "--hosts", "--gpus-per-host", "--policy", "--json", "--runner-type",
                 "--fair-weight-h", "--fair-half-life-h", "--fair-queue-step-min"],
    "render": ["-i", "-o", "--input", "--output"],
    "pause": ["--gpu", "--slot", "--host", "--why", "--who", "--host-name"],
    "drain": ["--gpu", "--slot", "--host", "--why", "--who", "--host-name"],
    "resume": ["--gpu", "--slot", "--host", "--why", "--who", "--host-name"],
    "status": ["--gpu-source", "--host", "--json", "--runner-config"],
    "init": ["--gitlab-url", "--token", "--token-file", "--group", "--project", "--executor", "--gpu-source",
             "--host", "--runner-config", "--optuna-storage"],
}


@st.composite
def command_line(draw: st.DrawFn, state_dir: Path) -> list[str]:
    command = draw(st.sampled_from([*OPTIONS, "user list", "user remove", "render gpu-job",
                                    "render optuna-sweep"]))
    argv = command.split()
    for _ in range(draw(st.integers(0, 5))):
        if draw(st.integers(0, 4)):  # mostly an option and its value, sometimes a stray word
            argv.append(draw(st.sampled_from(OPTIONS.get(argv[0], ["--role"]))))
        argv.append(draw(value))
    if argv[0] in ("pause", "drain", "resume", "user"):
        argv += ["--state-dir", str(state_dir)]
    if argv[0] == "init":
        argv.append("--dry-run")  # contacts nothing
    if argv[0] in ("status", "init"):
        argv += ["--runner-config", str(state_dir / "config.toml")]
    return argv


@SETTINGS
@given(data=st.data())
def test_no_command_line_makes_runnerctl_raise(tmp_path: Path, data: st.DataObject) -> None:
    argv = data.draw(command_line(tmp_path / "state"))
    with contextlib.chdir(tmp_path):  # a relative -o lands in the test's directory
        check(*run(argv))
