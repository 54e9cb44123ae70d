"""`runnerctl uninstall` against the simulated GitLab: runnerctl's runners, entries and
units go; the lab's own runner, config.toml entries and files stay byte for byte."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from runnerctl.cli import main
from runnerctl.controller import host_views
from runnerctl.controller.store import Event, Store
from runnerctl.gitlab import PythonGitLab, RunnerScope
from runnerctl.postgres import PostgresServer
from runnerctl.standby import standby_path
from tests.conftest import token_file
from tests.sim_gitlab import SimGitLab, running_sim

OWN_HEAD = 'concurrent = 40\ncheck_interval = 3  # the lab\'s\nlog_level = "warning"\n\n'
OWN_FIRST = ('[[runners]]\n  # CPU jobs, not runnerctl\'s\n  name = "lab/cpu"\n  url = "{url}"\n'
             '  id = {id}\n  token = "glrt-lab-cpu-token"\n  executor = "shell"\n'
             '  [runners.custom_build_dir]\n    enabled = true\n')
OWN_LAST = "[[runners]]\nname='lab/docs'   # odd spacing kept\nexecutor = 'docker'\n" \
           "[runners.docker]\nimage = \"alpine:3\"\n"


@pytest.fixture
def sim() -> Iterator[SimGitLab]:
    with running_sim() as found:
        yield found


def _setup(sim: SimGitLab, tmp: Path, head: str = OWN_HEAD) -> tuple[Path, Path, int]:
    server, info = sim
    scope = RunnerScope("group_type", group_id=info["group_id"])
    lab = PythonGitLab(info["url"], info["admin_token"]).create_runner(
        description="lab/cpu", tags=["cpu"], paused=False, scope=scope)
    config = tmp / "gitlab-runner" / "config.toml"
    config.parent.mkdir()
    config.write_text(head + OWN_FIRST.format(url=info["url"], id=lab.id))
    settings = tmp / "runnerctl.toml"
    settings.write_text(f'[paths]\nstate_dir = "{tmp / "state"}"\nrunner_config = "{config}"\n')
    assert main(["init", "--gitlab-url", info["url"], "--token-file", token_file(tmp, info["admin_token"]),
                 "--group", str(info["group_id"]), "--gpu-source", "sim:8", "--host", "gpu-a",
                 "--config", str(settings)]) == 0
    with config.open("a") as handle:
        handle.write("\n" + OWN_LAST)
    root = tmp / "root"
    assert main(["install", "--root", str(root), "--service", "serve", "--service", "postgres",
                 "--gitlab-url", info["url"], "--config", str(settings)]) == 0
    units = root / "etc" / "systemd" / "system"
    (units / "runnerctl-exporter.service").write_text("[Service]\nExecStart=/usr/bin/lab-exporter\n")
    return config, settings, lab.id


def test_dry_run_lists_everything_and_changes_nothing(sim: SimGitLab, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    server, _ = sim
    config, settings, _ = _setup(sim, tmp_path)
    capsys.readouterr()
    before, runners = config.read_bytes(), dict(server.state.runners)
    server.requests.clear()
    assert main(["uninstall", "--dry-run", "--root", str(tmp_path / "root"), "--config", str(settings)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len([line for line in out if line.startswith("# delete runner ")]) == 16  # 15 slots + stand-by
    assert "# delete runner" not in "\n".join(line for line in out if "lab/" in line)
    assert sum(line.endswith(".service") and line.startswith("# remove ") for line in out) == 2
    assert any(line.startswith("# keep ") and "runnerctl-exporter.service" in line for line in out)
    assert config.read_bytes() == before and server.state.runners.keys() == runners.keys()
    assert server.requests == []  # a dry run contacts nothing


def test_uninstall_removes_only_what_runnerctl_made(sim: SimGitLab, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    server, info = sim
    config, settings, lab_id = _setup(sim, tmp_path)
    root = tmp_path / "root"
    assert len(server.state.runners) == 17
    assert main(["uninstall", "--token-file", token_file(tmp_path, info["admin_token"]), "--root", str(root),
                 "--config", str(settings)]) == 0
    assert [r.description for r in server.state.runners.values()] == ["lab/cpu"]  # runnerctl's 16 gone
    assert lab_id in server.state.runners
    text = config.read_text()
    assert text.startswith(OWN_HEAD) and OWN_FIRST.format(url=info["url"], id=lab_id) in text
    assert OWN_LAST in text and "runnerctl/" not in text  # the lab's entries byte for byte
    assert not standby_path(config).exists()
    units = root / "etc" / "systemd" / "system"
    assert sorted(p.name for p in units.iterdir()) == ["runnerctl-exporter.service"]  # not runnerctl's
    state = root / (tmp_path / "state").relative_to("/")  # install made it below the root
    assert (root / "etc" / "runnerctl" / "serve.env").exists() and state.is_dir()
    out = capsys.readouterr().out
    assert "then: systemctl daemon-reload" in out and "glrt-" not in out
    after = config.read_bytes()
    assert main(["uninstall", "--token-file", token_file(tmp_path, info["admin_token"]), "--root", str(root),
                 "--config", str(settings)]) == 0  # again: nothing left to do, nothing touched
    assert config.read_bytes() == after and len(server.state.runners) == 1


def test_a_runner_id_gitlab_gave_to_another_runner_is_left(sim: SimGitLab, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    server, info = sim
    config, settings, _ = _setup(sim, tmp_path)
    victim = next(r for r in server.state.runners.values() if r.description == "runnerctl/gpu-a/gpu5")
    victim.description = "lab/other"  # renamed in GitLab's page: no longer runnerctl's to delete
    assert main(["uninstall", "--token-file", token_file(tmp_path, info["admin_token"]),
                 "--root", str(tmp_path / "root"), "--config", str(settings)]) == 0
    assert sorted(r.description for r in server.state.runners.values()) == ["lab/cpu", "lab/other"]
    assert "left" in capsys.readouterr().out


def test_the_concurrent_init_raised_goes_back_to_the_labs(sim: SimGitLab, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """init raised `concurrent` from the lab's 4 to its 15 slots; uninstall puts 4 back with
    the lab's comment (gitlab-runner would otherwise run 15 of the lab's jobs at once)."""
    _, info = sim
    head = "concurrent = 4  # the lab's limit\ncheck_interval = 3\n\n"
    config, settings, _ = _setup(sim, tmp_path, head)
    assert "concurrent = 15 # runnerctl init raised it from 4 to 15; the lab's limit\n" in config.read_text()
    root = str(tmp_path / "root")
    capsys.readouterr()
    assert main(["uninstall", "--dry-run", "--root", root, "--config", str(settings)]) == 0
    said = capsys.readouterr().out
    assert f"# set concurrent back to 4 (runnerctl init raised it to 15) in {config}\n" in said
    assert main(["uninstall", "--token-file", token_file(tmp_path, info["admin_token"]), "--root", root,
                 "--config", str(settings)]) == 0
    assert "changed  set concurrent back to 4" in capsys.readouterr().out
    assert config.read_text().startswith("concurrent = 4 # the lab's limit\ncheck_interval = 3\n")


@pytest.fixture(scope="module")
def shared_store(pg_server: PostgresServer) -> str:
    return pg_server.create_database("uninstall_fleet")


def test_uninstall_retires_the_host_in_a_shared_store(sim: SimGitLab, tmp_path: Path, shared_store: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """An uninstalled host left the fleet page showing it `stopped` for ever (found by a
    review as a lab admin running three hosts): its rows go, a `retired` event says so,
    its job history and the other hosts stay; a host that runs again is back."""
    _, info = sim
    _, settings, _ = _setup(sim, tmp_path)
    with settings.open("a") as handle:
        handle.write(f'[controller]\nstore_url = "{shared_store}"\n')
    store = Store.open(url=shared_store)
    for host in ("gpu-a", "gpu-b"):
        store.record(Event(1.0, host, "drain", "gpu0-7", "for pending job 5"))
        host_views.save(store, host=host, at=2.0, interval_s=5.0, tick=1, view={"gpus": [], "queue": []})
    capsys.readouterr()
    assert main(["uninstall", "--dry-run", "--root", str(tmp_path / "root"), "--config", str(settings)]) == 0
    assert "# retire host gpu-a in the shared store" in capsys.readouterr().out
    assert store.hosts() == ["gpu-a", "gpu-b"]
    assert main(["uninstall", "--token-file", token_file(tmp_path, info["admin_token"]),
                 "--root", str(tmp_path / "root"), "--config", str(settings)]) == 0
    assert "retired  host gpu-a in the shared store" in capsys.readouterr().out
    assert store.hosts() == ["gpu-b"] and [r.host for r in host_views.load(store)] == ["gpu-b"]
    assert [e.kind for e in store.events("gpu-a", 5)] == ["retired", "drain"]  # the history stays
    store.record(Event(3.0, "gpu-a", "drain", "gpu0-7", "installed again"))
    assert store.hosts() == ["gpu-a", "gpu-b"]
    store.close()


def test_an_unreachable_shared_store_is_named_and_the_rest_is_done(sim: SimGitLab, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    server, info = sim
    _, settings, _ = _setup(sim, tmp_path)
    with settings.open("a") as handle:
        handle.write('[controller]\nstore_url = "postgresql://nobody:pw@127.0.0.1:1/none?connect_timeout=2"\n')
    capsys.readouterr()
    assert main(["uninstall", "--token-file", token_file(tmp_path, info["admin_token"]),
                 "--root", str(tmp_path / "root"), "--config", str(settings)]) == 0
    out = capsys.readouterr().out
    assert "left     host gpu-a in the shared store: " in out, out
    assert [r.description for r in server.state.runners.values()] == ["lab/cpu"]


def test_init_after_uninstall_of_a_host_with_no_runners_of_the_labs(
        sim: SimGitLab, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """uninstall of runnerctl's every entry left `runners = []` at the top of config.toml:
    init then failed with an AssertionError after creating its runners in GitLab, and a
    [[runners]] added by hand made the file unreadable (found by a review reading the docs)."""
    server, info = sim
    config = tmp_path / "config.toml"
    config.write_text("concurrent = 4  # lab says so\ncheck_interval = 3\n")
    settings = tmp_path / "runnerctl.toml"
    settings.write_text(f'[paths]\nstate_dir = "{tmp_path / "state"}"\nrunner_config = "{config}"\n')
    init = ["init", "--gitlab-url", info["url"], "--token-file", token_file(tmp_path, info["admin_token"]),
            "--group", str(info["group_id"]), "--gpu-source", "sim:8", "--host", "gpu-a",
            "--config", str(settings)]
    assert main(init) == 0
    assert main(["uninstall", "--token-file", token_file(tmp_path, info["admin_token"]),
                 "--root", str(tmp_path / "root"), "--config", str(settings)]) == 0
    assert "runners" not in tomllib.loads(config.read_text())
    with config.open("a") as handle:  # the lab adds a runner of its own by hand
        handle.write('\n[[runners]]\nname = "lab/cpu"\nexecutor = "shell"\n')
    assert [r["name"] for r in tomllib.loads(config.read_text())["runners"]] == ["lab/cpu"]
    config.write_text("runners = []\nconcurrent = 4\ncheck_interval = 3\n")  # as an older uninstall left it
    assert main(init) == 0, capsys.readouterr().err
    doc = tomllib.loads(config.read_text())
    assert doc["check_interval"] == 3 and doc["concurrent"] == 15  # still top-level keys
    assert len([r for r in doc["runners"] if r["name"].startswith("runnerctl/")]) == 15


def test_leftover_links_are_named_and_a_running_serve_refuses(sim: SimGitLab, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`systemctl enable` left a dangling link and `systemctl edit` a drop-in without a
    word; a serve still running went on acting on the runners being deleted (found by a
    review as a systemd expert)."""
    _, info = sim
    _, settings, _ = _setup(sim, tmp_path)
    units = tmp_path / "root" / "etc" / "systemd" / "system"
    (units / "multi-user.target.wants").mkdir()
    wants = units / "multi-user.target.wants" / "runnerctl-serve.service"
    wants.symlink_to(units / "runnerctl-serve.service")
    (units / "runnerctl-serve.service.d").mkdir()
    (units / "runnerctl-serve.service.d" / "override.conf").write_text("[Service]\nNice=5\n")
    args = ["uninstall", "--root", str(tmp_path / "root"), "--config", str(settings)]
    capsys.readouterr()
    assert main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"# left   {units / 'multi-user.target.wants' / 'runnerctl-serve.service'}" in out
    assert f"# left   {units / 'runnerctl-serve.service.d'}" in out
    monkeypatch.setattr("runnerctl.cli.ops.serve_pid", lambda state_dir: 4242)
    assert main([*args, "--token-file", token_file(tmp_path, info["admin_token"])]) == 3
    assert "runnerctl serve runs on" in capsys.readouterr().err
    assert (units / "runnerctl-serve.service").exists()  # nothing done
