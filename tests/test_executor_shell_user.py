"""The shell driver runs jobs as a configured unprivileged user and refuses root unless
told (issue 14). CI runs as root, like a gitlab-runner service install; the job user is a
real Unix user made for each test."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from runnerctl.executors.lease import LeaseTable, environ_token
from tests.harness_custom_executor import SYSTEM_FAILURE, FakeJob, harness_for, make_host
from tests.unix_users import unix_user

__all__ = ["unix_user"]  # the fixture


@pytest.fixture
def open_root() -> Iterator[Path]:
    """A host root the job user can reach (pytest's tmp dirs are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="runnerctl-shell-user-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _token_processes(token: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter() if environ_token(p.pid) == token]


def test_root_is_refused_by_default_with_the_fix_named(tmp_path: Path) -> None:
    host = make_host(tmp_path, shell_user=None)
    results = harness_for(host, (3,), "shell").run_job(FakeJob(id=701), "echo should-not-run")
    prepare = results["prepare"]
    assert prepare.code == SYSTEM_FAILURE
    assert "does not run jobs as root" in prepare.output and "run_as_user" in prepare.output
    assert "allow_root = true" in prepare.output and "Traceback" not in prepare.output
    assert "build_script" not in results
    assert LeaseTable(host / "state").all() == []  # the GPU is given back at once


def test_an_unknown_job_user_is_a_system_failure(tmp_path: Path) -> None:
    host = make_host(tmp_path, shell_user="no-such-user-here")
    prepare = harness_for(host, (3,), "shell").stage("prepare", FakeJob(id=702))
    assert prepare.code == SYSTEM_FAILURE and "'no-such-user-here' is no user" in prepare.output


def test_a_job_runs_as_the_configured_user(open_root: Path, unix_user: pwd.struct_passwd) -> None:
    host = make_host(open_root, shell_user=unix_user.pw_name)
    harness = harness_for(host, (5,), "shell")
    harness.workdir.chmod(0o700)  # gitlab-runner's script dir: root's alone
    builds = host / "state" / "builds" / "gpu5"
    job = FakeJob(id=703)
    assert harness.stage("prepare", job).code == 0
    [lease] = LeaseTable(host / "state").held_by("703")
    assert lease.uid == unix_user.pw_uid
    body = (f'cd {builds} && echo "who=$(id -un) home=$HOME cuda=$CUDA_VISIBLE_DEVICES" && echo x > mine.txt '
            f'&& stat -c "owner=%U" mine.txt && mktemp >/dev/null && (setsid sleep 300 >/dev/null 2>&1 &) '
            f"&& ! cat {host / 'state' / 'controller.sqlite'} {host / 'state' / 'leases' / 'gpu5.json'}")
    script = harness.script(job, "build_script", body)
    run = harness.stage("run", job, str(script), "build_script")
    assert run.code == 0, run.output
    assert f"who={unix_user.pw_name} home={unix_user.pw_dir} cuda=5" in run.output
    assert f"owner={unix_user.pw_name}" in run.output
    assert "Permission denied" in run.output  # the job cannot read runnerctl's state
    left = _token_processes(lease.token)
    assert left and all(p.uids().real == unix_user.pw_uid for p in left)  # the setsid'd sleep
    assert [p.name for p in builds.parent.iterdir() if p.name.startswith(".runnerctl-")] == []
    assert harness.stage("cleanup", job).code == 0
    deadline = time.monotonic() + 120
    while _token_processes(lease.token):  # reaped: it ran as the job's user with its token
        assert time.monotonic() < deadline, "cleanup left the job's process running"
        time.sleep(0.05)
    assert LeaseTable(host / "state").all() == []


def test_a_link_planted_as_the_slots_builds_dir_is_not_followed(open_root: Path,
                                                                unix_user: pwd.struct_passwd) -> None:
    """A job (or its container) that replaced its slot's builds dir with a link to a host
    directory once got that directory chowned to the job user by the next prepare, as root."""
    host = make_host(open_root, shell_user=unix_user.pw_name)
    target = open_root / "host-etc"
    target.mkdir()
    (target / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    builds = host / "state" / "builds"
    builds.mkdir(parents=True)
    (builds / "gpu5").symlink_to(target)
    harness = harness_for(host, (5,), "shell")
    assert harness.stage("prepare", FakeJob(id=704)).code == 0
    assert (builds / "gpu5").is_dir() and not (builds / "gpu5").is_symlink()
    assert (builds / "gpu5").stat().st_uid == unix_user.pw_uid
    assert target.stat().st_uid == 0 and (target / "passwd").stat().st_uid == 0  # left as it was
    assert harness.stage("cleanup", FakeJob(id=704)).code == 0


def test_a_directory_swapped_for_a_link_while_the_slot_is_handed_over_is_not_followed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """prepare, as root, hands the slot's files to the job user; a job of that user on
    another slot swapped a directory in it for a link to a root-only one between the
    walk's look and the chown (renameat2 in a loop), and the root-only file was handed
    over. Here the swap happens at the first chown of a file."""
    from runnerctl.executors.shell import _chown_tree

    slot = tmp_path / "gpu5"
    (slot / "d").mkdir(parents=True)
    (slot / "d" / "shadow").write_text("the job's own file")
    victim = tmp_path / "etc"
    victim.mkdir(mode=0o700)
    (victim / "shadow").write_text("root's")
    user = pwd.struct_passwd(("job", "x", 54321, 54321, "", "/", "/bin/sh"))
    real, swapped = os.chown, []

    def racing(path: Any, uid: int, gid: int, *, dir_fd: int | None = None,
               follow_symlinks: bool = True) -> None:
        if not swapped and str(path).endswith("shadow"):
            swapped.append(path)
            (slot / "d").rename(slot / "d.before")
            (slot / "d").symlink_to(victim)
        real(path, uid, gid, dir_fd=dir_fd, follow_symlinks=follow_symlinks)

    monkeypatch.setattr(os, "chown", racing)
    _chown_tree(slot, user)
    assert swapped
    assert (victim / "shadow").stat().st_uid == os.geteuid()
    assert (slot / "d.before" / "shadow").stat().st_uid == 54321
