"""Bad input to the CLI is one line on stderr and an exit code, never a traceback:
simulate traces (with line numbers), render, serve --listen, init on files the system
refuses, and toggle targets checked against the host's real GPUs and slots."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from runnerctl.cli import main
from runnerctl.controller.store import Toggle
from runnerctl.settings import ControllerSettings
from runnerctl.sim.gitlab_server import GitLabServer
from runnerctl.sim.world import PROJECT, World, build_world
from tests.conftest import defaults_toml, token_file

HEADER = "job_id,submit_time,gpus,duration\n"


def one_line(capsys: pytest.CaptureFixture[str], code: int, expected_code: int, needle: str) -> str:
    err = capsys.readouterr().err
    assert code == expected_code, err
    assert err.startswith("runnerctl: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and needle in err, err
    return err


@pytest.mark.parametrize(("body", "needle"), [
    (HEADER + "1,0,1,10\n2,5,4\n", "line 3: 3 field(s), the header has 4"),
    (HEADER + "1,0,1,10,9\n", "line 2: 5 field(s), the header has 4"),
    (HEADER + "1,0,1,nan\n", "line 2: duration 'nan' is not from 0 to 1e+09 s"),
    (HEADER + "1,inf,1,5\n", "line 2: submit_time 'inf' is not from 0"),
    (HEADER + "1,0,1,-10\n", "line 2: duration '-10' is not from 0"),
    (HEADER + "1,0,0,10\n", "line 2: gpus 0 is not from 1"),
    (HEADER + "1,0,-2,10\n", "line 2: gpus -2 is not from 1"),
    (HEADER + "1,0,1,10\n2,0,3,10\n",
     "line 3: job 2 asks for 3 GPUs, which no runner has (runners hold 1, 2, 4, 8 GPUs)"),
    (HEADER + "1,0,16,10\n", "line 2: job 1 asks for 16 GPUs"),
    (HEADER + "1,0,1.5,10\n", "line 2: gpus '1.5' is not a whole number"),
    (HEADER + "1,0,1,10\n1,4,1,10\n", "line 3: job id 1 appears twice"),
    (HEADER.replace("\n", ",project,priority\n") + "1,0,1,10,p,urgent\n", "priority 'urgent' is not one of"),
    ("job_id,gpus\n1,1\n", "missing column(s) submit_time, duration"),
    (HEADER.replace("\n", ",Timeout,usr\n") + "1,0,1,10000,3600,alice\n",
     "line 1: unknown column(s) 'Timeout', 'usr' (the columns are job_id,"),  # was run without them
    (HEADER.replace("\n", ",gpus\n") + "1,0,1,600,8\n", "line 1: column(s) named twice: gpus"),
    (HEADER, "no jobs, only the header"),
    (HEADER + "1,0,1,1_000\n", "line 2: duration '1_000' is not a number of seconds"),
    (HEADER + "1,\u0663,1,10\n", "line 2: submit_time '\u0663' is not a number of seconds"),
    ("", "missing column(s) job_id"),
    (HEADER + '1,0,1,"10\n', "line 2: unexpected end of data"),
    (HEADER + '1,0,1,"10"x\n', "line 2: ',' expected after"),
])
def test_simulate_refuses_a_bad_trace_naming_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      body: str, needle: str) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text(body)
    one_line(capsys, main(["simulate", "--trace", str(trace)]), 3, needle)


def test_simulate_refuses_non_utf8_and_nul(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_bytes(HEADER.encode() + b"1,0,1,10\n2,\xff\xfe,1,1\n")
    one_line(capsys, main(["simulate", "--trace", str(trace)]), 3, "line 3: not UTF-8 text")
    trace.write_bytes(HEADER.encode() + b"1,0,1,1\x000\n")
    one_line(capsys, main(["simulate", "--trace", str(trace)]), 3, "line 2: holds a NUL byte")


@pytest.mark.parametrize(("body", "needle"), [
    ("start,duration,host,gpu\n0,10,gpu-b,0\n", "line 2: host gpu-b is beyond --hosts 1"),
    ("start,duration,host,gpu\n0,10,gpu-a,8\n", "line 2: GPU 8 is beyond --gpus-per-host 8"),
    ("start,duration,host,gpu\n0,10,node1,0\n", "line 2: host 'node1' is not gpu-a"),
    ("start,duration,host,gpu\n0,NaN,gpu-a,0\n", "line 2: duration 'NaN' is not from 0"),
])
def test_simulate_refuses_bad_foreign_use(tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str,
                                          needle: str) -> None:
    trace, foreign = tmp_path / "jobs.csv", tmp_path / "foreign.csv"
    trace.write_text(HEADER + "1,0,1,10\n")
    foreign.write_text(body)
    one_line(capsys, main(["simulate", "--trace", str(trace), "--foreign", str(foreign)]), 3, needle)


def test_a_valid_trace_still_simulates_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text(HEADER + "1,0,1,10\n2,1.5,8,100\n3,2,2,5\n")
    assert main(["simulate", "--trace", str(trace), "--json"]) == 0
    assert '"jobs_never_started": 0' in capsys.readouterr().out


@pytest.mark.parametrize(("planner", "needle"), [
    ("drain_after=600", "--planner: unknown setting 'drain_after' (known: max_draining,"),
    ("drain_after_s", "--planner 'drain_after_s': give KEY=NUMBER"),
    ("drain_after_s=soon", "--planner 'drain_after_s=soon': give KEY=NUMBER"),
    ("drain_after_s=-1", "drain_after_s must be a finite number, not negative"),
    ("backfill_max_s=inf", "backfill_max_s must be a finite number"),
    ("max_draining=0", "--planner: max_draining must be at least 1 (blocks: else no multi-GPU job ever"),
    ("max_draining=" + "9" * 400, "max_draining is too large"),
    ("drain_after_s=" + "9" * 400, "drain_after_s is too large"),
    ("drain_after_s=1,drain_after_s=2", "--planner: drain_after_s is given twice"),
    ("drain_after_s=1,,max_draining=2", "--planner '': give KEY=NUMBER"),
    ("=5", "--planner '=5': give KEY=NUMBER"),
])
def test_simulate_refuses_bad_planner_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               planner: str, needle: str) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text(HEADER + "1,0,1,10\n")
    one_line(capsys, main(["simulate", "--trace", str(trace), "--planner", planner]), 3, needle)


def test_simulate_plans_with_the_planner_settings_given(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Eight 1-GPU jobs ending one by one, a stream of new ones, two 8-GPU jobs (no
    timeouts): the block drains once the first 8-GPU job has waited `drain_after_s`, so
    its wait follows the setting (the default 1200 s, 300 s, at once; the stream keeps
    every GPU busy until a drain starts)."""
    rows = [f"{i + 1},0,1,{300 + 100 * i}" for i in range(8)] + ["9,10,8,100", "10,10,8,100"]
    rows += [f"{11 + k},{100 + 100 * k},1,800" for k in range(40)]
    trace = tmp_path / "jobs.csv"
    trace.write_text(HEADER + "\n".join(rows) + "\n")
    waits = []
    for planner in ([], ["--planner", "drain_after_s=300"], ["--planner", " drain_after_s = 0 "]):
        assert main(["simulate", "--trace", str(trace), "--json", *planner]) == 0
        waits.append(json.loads(capsys.readouterr().out)["wait_max_s"]["8"])
    assert waits[0] > 1200 and waits[0] > waits[1] > waits[2], waits


def test_render_refuses_what_no_runner_takes_and_unwritable_output(
        capsys: pytest.CaptureFixture[str]) -> None:
    job = ["render", "gpu-job", "-i", "command=python train.py"]
    one_line(capsys, main([*job, "-i", "gpus=3"]), 3, "runner blocks hold 1, 2, 4, 8, ... GPUs")
    sweep = ["render", "optuna-sweep", "-i", "study_name=s", "-i", "command=python s.py"]
    one_line(capsys, main([*sweep, "-i", "gpus_per_worker=6"]), 3, "'gpus_per_worker' is 6")
    one_line(capsys, main([*job, "-o", "/nonexistent/x"]), 3,
             "cannot write /nonexistent/x: No such file or directory")
    assert main([*job, "-i", "gpus=4"]) == 0


@pytest.mark.parametrize(("listen", "needle"), [
    ("127.0.0.1:99999", "port 99999 is not from 0 to 65535"),
    ("127.0.0.1:８０", "is not HOST:PORT"),
    ("8080", "is not HOST:PORT"),
    ("203.0.113.9:8080", "cannot listen on 203.0.113.9:8080: Cannot assign requested address"),
])
def test_serve_refuses_a_bad_listen_address(tmp_path: Path, capsys: pytest.CaptureFixture[str], listen: str,
                                            needle: str) -> None:
    code = main(["serve", "--gitlab", "sim", "--listen", listen, "--state-dir", str(tmp_path)])
    one_line(capsys, code, 3, needle)


def test_serve_refuses_a_port_in_use_before_starting(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["serve", "--gitlab", "sim", "--listen", f"127.0.0.1:{port}",
                     "--state-dir", str(tmp_path)])
    one_line(capsys, code, 3, "Address already in use")
    assert not (tmp_path / "controller.sqlite").exists()  # nothing started


def test_a_second_serve_of_the_same_state_directory_refuses_to_start(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two controllers of one host both acted, spent the API budget twice and recorded every
    event twice; the second now stops in one line naming the first one's pid."""
    import os

    from runnerctl.controller.serve import hold_state_dir

    first = hold_state_dir(tmp_path)  # as the first serve holds it
    try:
        code = main(["serve", "--gitlab", "sim", "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path)])
        one_line(capsys, code, 3, f"another runnerctl serve runs on {tmp_path} (pid {os.getpid()})")
        assert not (tmp_path / "controller.sqlite").exists()  # nothing started
    finally:
        os.close(first.fd)
    second = hold_state_dir(tmp_path)  # free once the first ends
    os.close(second.fd)


@pytest.fixture
def immutable() -> Iterator[list[Path]]:
    """Paths made immutable (chattr +i: even root may not change them), made mutable after."""
    assert shutil.which("chattr"), "chattr (e2fsprogs) is missing"
    paths: list[Path] = []
    yield paths
    for path in paths:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_init_on_an_immutable_config_or_directory_is_one_line(
        gitlab_server: GitLabServer, tmp_path: Path, immutable: list[Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    token = token_file(tmp_path)

    def init(config: Path) -> int:
        return main(["init", "--gitlab-url", gitlab_server.url, "--token-file", token, "--group", "7",
                     "--gpu-source", "sim:2", "--host", "gpu-a", "--runner-config", str(config),
                     "--config", str(defaults_toml(tmp_path))])

    config = tmp_path / "config.toml"
    config.write_text("concurrent = 4\n")
    subprocess.run(["chattr", "+i", str(config)], check=True)
    immutable.append(config)
    err = one_line(capsys, init(config), 1, "Operation not permitted (check its owner, mode and attributes")
    assert str(tmp_path) in err and config.read_text() == "concurrent = 4\n"
    locked = tmp_path / "locked"
    locked.mkdir()
    subprocess.run(["chattr", "+i", str(locked)], check=True)
    immutable.append(locked)
    one_line(capsys, init(locked / "config.toml"), 1, f"{locked}")


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = build_world(tmp_path, settings=ControllerSettings(projects=(PROJECT,)))
    w.advance(6)  # the controller has run: its GPUs and slots are in the store
    yield w
    w.close()


@pytest.mark.parametrize(("args", "code", "needle"), [
    (["--gpu", "999", "--why", "x"], 3, "demo has no GPU 999 (its GPUs: 0-7)"),
    (["--gpu", "-5", "--why", "x"], 2, "-5 is not in the range x>=0"),
    (["--slot", "", "--why", "x"], 3, "toggle target 'slot:' is not host, gpu:N or slot:KEY"),
    (["--slot", "gpu0-5", "--why", "x"], 3, "demo has no slot gpu0-5 (its slots: "),
    (["--slot", "gpu9", "--why", "x"], 3, "demo has no slot gpu9"),
    (["--gpu", "3"], 3, "a pause needs a reason"),
    (["--gpu", "3", "--why", "   "], 3, "a pause needs a reason"),
    (["--gpu", "3", "--why", "fan\nforged log line"], 3, "the reason must be one line"),
    (["--gpu", "3", "--slot", "gpu3", "--why", "x"], 3, "name exactly one of"),
])
def test_toggle_targets_are_checked_against_the_host(world: World, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str], args: list[str],
                                                     code: int, needle: str) -> None:
    done = main(["pause", *args, "--host-name", "demo", "--state-dir", str(tmp_path)])
    one_line(capsys, done, code, needle)
    assert world.store.toggles("demo") == []


def test_good_targets_pass_and_a_stored_bad_one_is_never_shown_as_paused(
        world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--gpu", "7"], ["--slot", "runnerctl/demo/gpu0-3"], ["--host"]):
        assert main(["pause", *args, "--why", "maintenance", "--host-name", "demo",
                     "--state-dir", str(tmp_path)]) == 0, capsys.readouterr().err
    assert main(["pause", "--gpu", "1", "--why", "x", "--host-name", "gpu-new",
                 "--state-dir", str(tmp_path)]) == 0  # no controller ran there yet: form only
    world.store.clear_toggles("demo")
    world.store.set_toggle(Toggle("demo", "gpu:006", "pause", "old", 1.0, "before targets were checked"))
    world.advance(6)
    assert dict((t.target, s) for t, s in world.controller.view.toggles) == {
        "gpu:006": "no such GPU or slot on this host"}
    assert all(not r.paused for r in world.state.runners.values() if r.description.endswith("/gpu6"))


def test_the_web_api_answers_422_for_a_target_the_host_lacks(world: World, tmp_path: Path) -> None:
    from runnerctl.controller.app import create_app

    app = create_app(lambda: world.controller.view, world.controller.demand.webhook)

    @app.get("/probe")
    def probe() -> None:
        from runnerctl.controller.toggles import request

        request(world.store, action="pause", host="demo", target="gpu:006", who="w", why="x", now=1.0)

    answer = TestClient(app).get("/probe")
    assert answer.status_code == 422 and "is not host, gpu:N or slot:KEY" in answer.json()["detail"]


@pytest.mark.parametrize("args", [["demo", "--duration", "inf", "--listen", ""],
                                  ["demo", "--duration", "nan"],
                                  ["serve", "--gitlab", "sim", "--interval", "nan"],
                                  ["serve", "--gitlab", "sim", "--interval", "1e999"],
                                  ["exporter", "--interval", "-inf"]])
def test_durations_must_be_finite(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    one_line(capsys, main(args), 2, "seconds (see `runnerctl")


@pytest.mark.parametrize("line", ["interval_s = nan", "interval_s = inf", "cooldown_s = -1.0",
                                  "claim_ttl_s = -inf"])
def test_settings_numbers_must_be_finite_and_not_negative(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          line: str) -> None:
    config = tmp_path / "runnerctl.toml"
    config.write_text(f"[controller]\n{line}\n")
    code = main(["pause", "--gpu", "0", "--why", "x", "--config", str(config), "--state-dir", str(tmp_path)])
    one_line(capsys, code, 3, "must be a finite number, not negative")


def test_serve_interval_too_long_for_the_claims_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    """A claim renewed each tick must outlive two late ticks (found by a review as a lab
    admin running three hosts: nothing checked `claim_ttl_s` against the interval)."""
    settings = tmp_path / "runnerctl.toml"
    settings.write_text("[controller]\nclaim_ttl_s = 120\n")
    code = main(["serve", "--gitlab", "sim", "--interval", "60", "--listen", "127.0.0.1:0",
                 "--state-dir", str(tmp_path), "--config", str(settings)])
    one_line(capsys, code, 3, "--interval 60: claim_ttl_s must be at least 3 reconcile intervals")


@pytest.mark.parametrize("source", ["sim:0", "sim:1000", "sim:x", "nvml", "sim:/some.yml"])
def test_serve_sim_takes_only_sim_n(tmp_path: Path, capsys: pytest.CaptureFixture[str], source: str) -> None:
    code = main(["serve", "--gitlab", "sim", "--gpu-source", source, "--listen", "127.0.0.1:0",
                 "--state-dir", str(tmp_path)])
    one_line(capsys, code, 3, "with --gitlab sim it is sim:N, N from 1 to 64")
