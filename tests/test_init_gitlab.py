"""`runnerctl init` against the HTTP GitLab: 15 runners, idempotent, follows GPU changes."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import tomlkit

from runnerctl.cli import main
from runnerctl.sim.gitlab_server import Fault, GitLabServer
from runnerctl.sim.gitlab_state import SimRunner
from tests.conftest import ADMIN_TOKEN, defaults_toml, token_file


def _init(server: GitLabServer, config: Path, gpus: str = "sim:8", *extra: str) -> int:
    return main(["init", "--gitlab-url", server.url, "--token-file", token_file(config.parent),
                 "--group", "7", "--gpu-source", gpus, "--host", "gpu-a", "--runner-config", str(config),
                 "--config", str(defaults_toml(config.parent)), *extra])


def _slot_runners(server: GitLabServer) -> dict[int, SimRunner]:
    """The runners in config.toml: all but the host's stand-by (tests/test_standby.py)."""
    return {i: r for i, r in server.state.runners.items() if not r.description.endswith("/standby")}


def test_init_creates_15_runners_blocks_paused(gitlab_server: GitLabServer, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.toml"
    assert _init(gitlab_server, config) == 0
    runners = list(_slot_runners(gitlab_server).values())
    assert len(runners) == 15
    paused = [r for r in runners if r.paused]
    assert len(paused) == 7 and all("gpu" not in r.tags for r in paused)
    assert all(r.group_id == 7 and r.runner_type == "group_type" for r in runners)
    by_name = {r.description: r for r in runners}
    assert by_name["runnerctl/gpu-a/gpu3"].tags >= {"gpu", "gpus:1", "host:gpu-a"}
    assert by_name["runnerctl/gpu-a/gpu4-7"].tags >= {"gpus:4", "host:gpu-a"}
    doc = tomlkit.parse(config.read_text()).unwrap()
    assert len(doc["runners"]) == 15
    tokens = {e["name"]: e["token"] for e in doc["runners"]}
    assert tokens == {r.description: r.token for r in runners}
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    out = capsys.readouterr()
    assert not any(r.token in out.out + out.err for r in runners)


def test_second_init_changes_nothing(gitlab_server: GitLabServer, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    assert _init(gitlab_server, config) == 0
    before = config.read_bytes()
    mtime = config.stat().st_mtime_ns
    gitlab_server.requests.clear()
    assert _init(gitlab_server, config) == 0
    assert gitlab_server.changing_requests() == []
    assert config.read_bytes() == before and config.stat().st_mtime_ns == mtime


def test_rotated_token_is_kept(gitlab_server: GitLabServer, tmp_path: Path) -> None:
    """gitlab-runner rewrites tokens itself; init must not put the old one back."""
    config = tmp_path / "config.toml"
    _init(gitlab_server, config)
    text = config.read_text()
    doc = tomlkit.parse(text)
    doc["runners"][0]["token"] = "glrt-rotated-by-gitlab-runner"
    config.write_text(tomlkit.dumps(doc))
    assert _init(gitlab_server, config) == 0
    assert "glrt-rotated-by-gitlab-runner" in config.read_text()


def test_gpu_removed_then_added_retires_and_adds_exactly_those(gitlab_server: GitLabServer,
                                                                tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    _init(gitlab_server, config, "sim:4")
    ids_before = set(_slot_runners(gitlab_server))
    assert len(ids_before) == 7  # 4 singles, 2 pairs, 1 quad
    gitlab_server.requests.clear()
    _init(gitlab_server, config, "sim:2")  # two GPUs gone
    remaining = {r.description for r in _slot_runners(gitlab_server).values()}
    assert remaining == {"runnerctl/gpu-a/gpu0", "runnerctl/gpu-a/gpu1", "runnerctl/gpu-a/gpu0-1"}
    assert sum(r.method == "DELETE" for r in gitlab_server.changing_requests()) == 4
    assert not any(r.method == "POST" for r in gitlab_server.changing_requests())
    gitlab_server.requests.clear()
    _init(gitlab_server, config, "sim:4")
    assert sum(r.method == "POST" for r in gitlab_server.changing_requests()) == 4
    assert not any(r.method == "DELETE" for r in gitlab_server.changing_requests())
    assert len(tomlkit.parse(config.read_text())["runners"]) == 7


def test_runner_deleted_in_gitlab_is_registered_again_paused(gitlab_server: GitLabServer, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Made again paused: a running serve knows the old id only, so an open new single
    stayed open beside the block over it (found by a review as a GitLab admin); init
    says to restart serve, which opens it."""
    config = tmp_path / "config.toml"
    _init(gitlab_server, config, "sim:2")
    victim = next(r for r in gitlab_server.state.runners.values() if r.description.endswith("gpu1"))
    gitlab_server.state.delete_runner(victim.id)
    capsys.readouterr()
    _init(gitlab_server, config, "sim:2")
    entry = next(e for e in tomlkit.parse(config.read_text())["runners"]
                 if e["name"].endswith("/gpu1"))
    assert entry["id"] != victim.id and entry["token"] != victim.token
    assert entry["id"] in gitlab_server.state.runners and gitlab_server.state.runners[entry["id"]].paused
    assert "then: restart runnerctl serve" in capsys.readouterr().out


def test_an_entry_removed_by_hand_while_serve_runs_comes_back_paused(
        gitlab_server: GitLabServer, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """doctor's advice for a broken entry is to remove it and run init: the runner made
    again came back open while the running serve, which knows only the runners it read at
    its start, kept that GPU paused for an admin (found by a review as a lab admin)."""
    config = tmp_path / "config.toml"
    _init(gitlab_server, config, "sim:2")
    doc = tomlkit.parse(config.read_text())
    kept = [e for e in doc["runners"] if not e["name"].endswith("/gpu1")]
    doc["runners"] = tomlkit.aot()
    for entry in kept:
        doc["runners"].append(entry)
    config.write_text(tomlkit.dumps(doc))
    monkeypatch.setattr("runnerctl.registration.serve_pid", lambda state_dir: 4242)
    capsys.readouterr()
    assert _init(gitlab_server, config, "sim:2") == 0
    entry = next(e for e in tomlkit.parse(config.read_text())["runners"] if e["name"].endswith("/gpu1"))
    assert gitlab_server.state.runners[entry["id"]].paused
    assert "then: restart runnerctl serve" in capsys.readouterr().out


def test_a_hand_edit_of_an_owned_key_is_said_and_a_labs_own_variable_is_kept(
        gitlab_server: GitLabServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by a review as a lab admin: init set back a hand-edited builds_dir and dropped
    an HTTPS_PROXY added to `environment` (no setting carries one), saying "unchanged"."""
    config = tmp_path / "config.toml"
    _init(gitlab_server, config, "sim:2")
    doc = tomlkit.parse(config.read_text())
    entry = next(e for e in doc["runners"] if e["name"].endswith("/gpu0"))
    entry["environment"].append("HTTPS_PROXY=http://proxy.lab:3128")
    entry["builds_dir"] = "/scratch/builds"
    entry["pre_build_script"] = "echo mine"
    config.write_text(tomlkit.dumps(doc))
    capsys.readouterr()
    assert _init(gitlab_server, config, "sim:2") == 0
    out = capsys.readouterr().out
    entry = next(e for e in tomlkit.parse(config.read_text())["runners"] if e["name"].endswith("/gpu0"))
    assert "HTTPS_PROXY=http://proxy.lab:3128" in entry["environment"]
    assert entry["builds_dir"] != "/scratch/builds" and entry["pre_build_script"] == "echo mine"
    [said] = [line for line in out.splitlines() if line.startswith("set again")]
    assert said.startswith(f"set again  {entry['name']}: builds_dir (keys runnerctl sets"), out
    capsys.readouterr()
    assert _init(gitlab_server, config, "sim:2") == 0
    assert "set again" not in capsys.readouterr().out  # the lab's variable is no change to undo


def test_failure_midway_keeps_tokens_of_runners_already_created(gitlab_server: GitLabServer,
                                                                tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    gitlab_server.faults.append(Fault("POST", "^/user/runners$", "500", count=100))
    gitlab_server.faults[0].count = 0  # armed below, after three creations
    state = gitlab_server.state
    original = state.create_runner
    calls = 0

    def create_then_fail(**kwargs: object) -> object:
        nonlocal calls
        calls += 1
        if calls == 3:
            gitlab_server.faults[0].count = 100
        return original(**kwargs)  # type: ignore[arg-type]

    state.create_runner = create_then_fail  # type: ignore[method-assign]
    assert _init(gitlab_server, config, "sim:4") == 4
    written = tomlkit.parse(config.read_text())["runners"]
    assert len(written) == 3 == len(state.runners)
    assert {e["token"] for e in written} == {r.token for r in state.runners.values()}
    gitlab_server.faults.clear()
    assert _init(gitlab_server, config, "sim:4") == 0
    assert len(_slot_runners(gitlab_server)) == 7  # picked up where it stopped, no duplicates


def test_wrong_token_one_line_config_untouched(gitlab_server: GitLabServer, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("# mine\nconcurrent = 2\n")
    before = config.read_bytes()
    result = subprocess.run(
        [sys.executable, "-m", "runnerctl", "init", "--gitlab-url", gitlab_server.url, "--token-file",
         token_file(tmp_path, "glpat-wrong"), "--gpu-source", "sim:2", "--runner-config", str(config),
         "--config", str(defaults_toml(tmp_path))],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 4
    assert len(result.stderr.strip().splitlines()) == 1
    assert "rejected the token (401)" in result.stderr and "Traceback" not in result.stderr
    assert "glpat-wrong" not in result.stderr
    assert config.read_bytes() == before
    assert gitlab_server.state.runners == {}


def test_optuna_storage_goes_into_every_runner_environment(gitlab_server: GitLabServer,
                                                           tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    url = "postgresql+psycopg://s:pw@10.0.0.5:5432/s"
    assert _init(gitlab_server, config, "sim:2", "--optuna-storage", url) == 0
    for entry in tomlkit.parse(config.read_text()).unwrap()["runners"]:
        assert f"RUNNERCTL_OPTUNA_STORAGE={url}" in entry["environment"]


def test_a_create_whose_answer_was_lost_leaves_no_orphan(gitlab_server: GitLabServer, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """GitLab made the runner but the answer (its token) never arrived: init fails, and the
    next init deletes that runner (nobody can use it) before creating the slot again."""
    config = tmp_path / "config.toml"
    gitlab_server.faults.append(Fault("POST", "^/user/runners$", "lost", count=1))
    assert _init(gitlab_server, config, "sim:2") != 0
    state = gitlab_server.state
    assert len(state.runners) == 1  # in GitLab, unknown to config.toml
    [orphan] = state.runners
    assert not config.exists() or "runners" not in tomlkit.parse(config.read_text())
    capsys.readouterr()
    assert _init(gitlab_server, config, "sim:2") == 0
    assert orphan not in state.runners and len(_slot_runners(gitlab_server)) == 3
    written = tomlkit.parse(config.read_text())["runners"]
    assert {e["id"] for e in written} == set(_slot_runners(gitlab_server))
    assert f"runner {orphan}, deleted" in capsys.readouterr().out
    gitlab_server.requests.clear()
    assert _init(gitlab_server, config, "sim:2") == 0
    assert gitlab_server.changing_requests() == []  # known runners are never taken for orphans


def test_an_administrators_lost_create_is_found_in_a_group_they_are_no_member_of(
        gitlab_server: GitLabServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An administrator may make a group's runners without being a member, but `GET
    /runners` lists only runners of groups the user is a member of (ci_owned_runners):
    a lost create stayed in GitLab for good, and the same host name on a second machine
    went unnoticed (found by a review against GitLab's source). The group's own runner
    list shows them."""
    directory = gitlab_server.state.directory
    group = directory.add_group("lab", group_id=7)
    assert directory.group_level(group, "admin") == 0  # root, no member of the group
    config = tmp_path / "config.toml"
    gitlab_server.faults.append(Fault("POST", "^/user/runners$", "lost", count=1))
    assert _init(gitlab_server, config, "sim:2") != 0
    [orphan] = gitlab_server.state.runners
    capsys.readouterr()
    assert _init(gitlab_server, config, "sim:2") == 0
    assert orphan not in gitlab_server.state.runners
    assert f"runner {orphan}, deleted" in capsys.readouterr().out


def test_a_second_machine_with_the_same_host_name_deletes_nothing(
        gitlab_server: GitLabServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Machine one's runners, polled by its gitlab-runner, are online; machine two, given
    the same [host] name by mistake, once took them for lost creates and deleted all of
    them (found by a review as a lab admin running three hosts). It now refuses in one
    line, changing nothing; --take-over (a host whose config.toml was lost) replaces them."""
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    assert _init(gitlab_server, one / "config.toml", "sim:2") == 0
    for entry in tomlkit.parse((one / "config.toml").read_text()).unwrap()["runners"]:
        answer = httpx.post(f"{gitlab_server.url}/api/v4/runners/verify", json={"token": entry["token"]})
        assert answer.status_code == 200, answer.text  # what gitlab-runner's polling does
    standby = next(r for r in gitlab_server.state.runners.values() if r.description.endswith("/standby"))
    gitlab_server.state.heartbeat(standby)  # serve keeps it online (runnerctl.standby)
    before = dict(gitlab_server.state.runners)
    capsys.readouterr()
    gitlab_server.requests.clear()
    assert _init(gitlab_server, two / "config.toml", "sim:2") == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "online in GitLab but not in this host's config.toml" in err, err
    assert "runnerctl/gpu-a/gpu0 (runner" in err and "--take-over" in err
    assert gitlab_server.changing_requests() == [] and gitlab_server.state.runners == before
    assert not (two / "config.toml").exists()
    assert _init(gitlab_server, two / "config.toml", "sim:2", "--take-over") == 0
    assert not set(before) & set(gitlab_server.state.runners)  # replaced: machine one's are gone
    assert len(_slot_runners(gitlab_server)) == 3


def test_init_sets_the_runners_maximum_job_timeouts_and_leaves_sizes_not_listed(
        gitlab_server: GitLabServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`[controller] runner_max_timeout_s`: GitLab cuts every job a runner takes at the
    runner's maximum timeout, which is how the controller knows a pending job's bound
    (docs/controller.md "Where the timeouts come from"). Set on create, and on runners
    that exist, once; a size not listed keeps what an admin set in GitLab."""
    config = tmp_path / "config.toml"
    assert _init(gitlab_server, config) == 0
    by_name = {r.description: r for r in _slot_runners(gitlab_server).values()}
    by_name["runnerctl/gpu-a/gpu0-1"].maximum_timeout = 7200  # an admin's, in GitLab's settings
    settings = tmp_path / "runnerctl.toml"
    settings.write_text("[controller]\nrunner_max_timeout_s = { '1' = 3600, '8' = 172800 }\n")
    capsys.readouterr()
    assert _init(gitlab_server, config, "sim:8", "--config", str(settings)) == 0  # the later --config wins
    assert "retimed     9" in capsys.readouterr().out
    caps = {name.rsplit("/", 1)[1]: r.maximum_timeout for name, r in by_name.items()}
    assert {caps[f"gpu{i}"] for i in range(8)} == {3600} and caps["gpu0-7"] == 172800
    assert caps["gpu0-1"] == 7200 and caps["gpu4-7"] is None
    gitlab_server.requests.clear()
    assert _init(gitlab_server, config, "sim:8", "--config", str(settings)) == 0  # the later --config wins
    assert gitlab_server.changing_requests() == []  # set once


def test_gitlab_refuses_a_maximum_timeout_under_ten_minutes(gitlab_server: GitLabServer) -> None:
    from runnerctl.errors import GitLabError
    from runnerctl.gitlab import PythonGitLab
    from runnerctl.gitlab_port import RunnerScope

    gitlab = PythonGitLab(gitlab_server.url, ADMIN_TOKEN)
    created = gitlab.create_runner(description="x", tags=["gpu"], paused=True, scope=RunnerScope(),
                                   maximum_timeout=600)
    assert gitlab_server.state.runners[created.id].maximum_timeout == 600
    with pytest.raises(GitLabError, match="at least 10 minutes"):
        gitlab.set_maximum_timeout(created.id, 599)
    assert gitlab_server.state.runners[created.id].maximum_timeout == 600
    with pytest.raises(GitLabError, match="Maximum timeout needs to be at least 10 minutes"):
        gitlab.create_runner(description="y", tags=["gpu"], paused=True, scope=RunnerScope(),
                             maximum_timeout=60)


def test_init_notes_a_size_without_a_maximum_timeout(gitlab_server: GitLabServer, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    settings = tmp_path / "runnerctl.toml"
    settings.write_text("[controller]\nrunner_max_timeout_s = { '1' = 7200, '8' = 172800 }\n")
    assert _init(gitlab_server, tmp_path / "config.toml", "sim:8", "--config", str(settings)) == 0
    assert "no entry for 2/4-GPU slots" in capsys.readouterr().out


def test_init_notes_caps_over_the_backfill_bounds(gitlab_server: GitLabServer, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """1-GPU runners capped at 3 h while the planner backfills singles only with jobs of at
    most 2 h: init says those jobs never backfill; caps within the bounds say nothing."""
    settings = tmp_path / "runnerctl.toml"
    settings.write_text("[controller]\nrunner_max_timeout_s = { '1' = 10800, '2' = 10800, "
                        "'4' = 14400, '8' = 172800 }\n")
    assert _init(gitlab_server, tmp_path / "config.toml", "sim:8", "--config", str(settings)) == 0
    out = capsys.readouterr().out
    assert "runner_max_timeout_s 1-GPU is 10800 s, over [controller.planner] backfill_max_s (7200 s)" in out
    assert "runner_max_timeout_s 4-GPU is 14400 s, over [controller.planner] backfill_blocks_max_s" in out
    assert "2-GPU" not in out and "8-GPU is" not in out
    settings.write_text("[controller]\nrunner_max_timeout_s = { '1' = 10800, '2' = 10800, "
                        "'4' = 10800, '8' = 172800 }\n[controller.planner]\nbackfill_max_s = 10800\n")
    assert _init(gitlab_server, tmp_path / "config.toml", "sim:8", "--config", str(settings)) == 0
    assert "note:" not in capsys.readouterr().out
    settings.write_text("[controller]\nrunner_max_timeout_s = { '1' = 86400, '2' = 86400, "
                        "'4' = 86400, '8' = 172800 }\n[controller.planner]\nbackfill_blocks_max_s = 0\n")
    assert _init(gitlab_server, tmp_path / "config.toml", "sim:8", "--config", str(settings)) == 0
    out = capsys.readouterr().out  # blocks' backfill off on purpose: only the singles' note
    assert out.count("note:") == 1 and "1-GPU is 86400 s" in out


def test_init_on_a_one_gpu_host_notes_no_backfill(gitlab_server: GitLabServer, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """One GPU: nothing ever drains, so a long cap on its single hides no backfill."""
    settings = tmp_path / "runnerctl.toml"
    settings.write_text("[controller]\nrunner_max_timeout_s = { '1' = 86400 }\n")
    assert _init(gitlab_server, tmp_path / "config.toml", "sim:1", "--config", str(settings)) == 0
    assert "note:" not in capsys.readouterr().out


def test_a_relative_config_is_written_absolute_and_a_changed_file_says_wrote(
        gitlab_server: GitLabServer, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """gitlab-runner runs the executor's stages in another directory: a relative --config
    there named no file, so every stage ran on the defaults."""
    config = tmp_path / "config.toml"
    settings = tmp_path / "runnerctl.toml"
    settings.write_text("[executor]\ndriver = 'shell'\n")
    monkeypatch.chdir(tmp_path)
    base = ["init", "--gitlab-url", gitlab_server.url, "--token-file", token_file(tmp_path), "--group", "7",
            "--gpu-source", "sim:2", "--host", "gpu-a", "--runner-config", str(config), "--config"]
    assert main([*base, "runnerctl.toml"]) == 0
    written = config.read_text()
    assert f'"--config", "{settings}"' in written and '"--config", "runnerctl.toml"' not in written
    assert capsys.readouterr().out.strip().endswith(f"wrote {config}")
    assert main([*base, "runnerctl.toml"]) == 0
    assert capsys.readouterr().out.strip().endswith(f"{config} already up to date")
    settings.write_text("[executor]\ndriver = 'docker'\n")  # no runner made or retired; the file changes
    assert main([*base, "runnerctl.toml"]) == 0
    assert capsys.readouterr().out.strip().endswith(f"wrote {config}")
