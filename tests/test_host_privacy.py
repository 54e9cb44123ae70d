"""The host is closed to its other users (issue 14): key files, state dir, leases and the
store are private; a lease token copied by another user does not pass the gate; a lease
file that cannot be read holds its GPU."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runnerctl.cli import main
from runnerctl.controller.observe import LeaseJobs
from runnerctl.controller.store import Store
from runnerctl.errors import ConfigError, ExitCode
from runnerctl.executors.gate import classify
from runnerctl.executors.lease import LEASE_ENV, Lease, LeaseBusy, LeaseTable, is_stale, new_nonce
from runnerctl.postgres import Secrets
from runnerctl.private import write_private
from runnerctl.web.auth import session_key
from tests.gpu_procs import sim_snapshot
from tests.unix_users import run_as, unix_user

__all__ = ["unix_user"]  # the fixture


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _lease(gpu: int, job: str = "77") -> Lease:
    return Lease(gpu=gpu, job_id=job, slot="runnerctl/gpu-a/gpu0", driver="shell", owner_pid=os.getpid(),
                 owner_started=0.0, created_at=time.time() - 1, nonce=new_nonce())


# -- key files -------------------------------------------------------------------------------
@pytest.mark.parametrize("content", ["", "\n", "short-key"], ids=["empty", "newline", "short"])
def test_an_empty_or_short_session_key_is_refused(tmp_path: Path, content: str) -> None:
    (tmp_path / "web-session.key").write_text(content)
    with pytest.raises(ConfigError, match="refusing to sign with it") as caught:
        session_key(tmp_path)
    assert "\n" not in str(caught.value) and "delete it" in str(caught.value)


def test_serve_with_an_empty_key_stops_with_one_line(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "web-session.key").write_text("")
    code = main(["serve", "--gitlab", "sim", "--gpu-source", "sim:2", "--state-dir", str(state),
                 "--listen", "127.0.0.1:0"])
    err = capsys.readouterr().err
    assert code == ExitCode.CONFIG and "web-session.key" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_the_session_key_is_made_private_whole_and_stable(tmp_path: Path) -> None:
    state = tmp_path / "state"
    key = session_key(state)
    assert len(key) >= 64 and session_key(state) == key
    assert _mode(state / "web-session.key") == 0o600
    assert _mode(state) == 0o711
    assert [p.name for p in state.iterdir()] == ["web-session.key"]  # no temp file left


def test_a_full_disk_leaves_no_key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writing fails half way (ENOSPC): the name never holds the partial key."""
    real_fsync = os.fsync

    def full(fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(28, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        session_key(tmp_path)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert len(session_key(tmp_path)) >= 64


def test_an_old_world_readable_key_is_closed(tmp_path: Path) -> None:
    path = tmp_path / "web-session.key"
    path.write_text("k" * 64)
    path.chmod(0o644)
    assert session_key(tmp_path) == "k" * 64 and _mode(path) == 0o600


def test_postgres_passwords_are_key_files_too(tmp_path: Path) -> None:
    secrets = Secrets(tmp_path / "secrets")
    password = secrets.get_or_create("optuna")
    assert len(password) >= 32 and secrets.get("optuna") == password
    assert _mode(tmp_path / "secrets") == 0o700 and _mode(tmp_path / "secrets" / "optuna.password") == 0o600
    (tmp_path / "secrets" / "team.password").write_text("")  # a full disk under an older runnerctl
    with pytest.raises(ConfigError, match="refusing"):
        secrets.get_or_create("team")


# -- who can read what ------------------------------------------------------------------------
@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A dir every user may enter (pytest's tmp dirs are closed to other users)."""
    path = Path(tempfile.mkdtemp(prefix="runnerctl-security-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def test_other_users_read_nothing_in_the_state_dir(open_dir: Path, unix_user: pwd.struct_passwd) -> None:
    state = open_dir / "state"
    state.mkdir(mode=0o755)  # as an older runnerctl left it
    store = Store.open(state_dir=state)
    store.save_user("olga", "$argon2id$hash", "operator", 0.0)
    session_key(state)
    LeaseTable(state).try_acquire((0,), _lease(-1))
    store.close()
    assert _mode(state) == 0o711 and _mode(state / "leases") == 0o700
    for path in (state / "controller.sqlite", state / "web-session.key", state / "leases" / "gpu0.json"):
        assert _mode(path) == 0o600, path
    for path in state.iterdir():
        if path.is_file():
            assert _mode(path) & 0o077 == 0, path  # -wal and -shm too
    probe = run_as(unix_user, ["/bin/sh", "-c", f"ls {open_dir}; ls {state}; cat {state}/controller.sqlite; "
                                              f"cat {state}/web-session.key; cat {state}/leases/gpu0.json; "
                                              f"ls {state}/leases"])
    assert probe.stdout == "state\n"  # the user does reach the dir
    assert probe.stderr.count("Permission denied") == 5, probe.stderr


# -- a copied token ---------------------------------------------------------------------------
def test_a_token_copied_by_another_user_is_foreign(tmp_path: Path, unix_user: pwd.struct_passwd,
                                                   spawned: list[subprocess.Popen[bytes]]) -> None:
    lease = _lease(0)
    job = subprocess.Popen(["sleep", "60"], env={LEASE_ENV: lease.token})
    thief = subprocess.Popen(["sleep", "60"], env={LEASE_ENV: lease.token}, user=unix_user.pw_uid,
                             group=unix_user.pw_gid, extra_groups=[], cwd="/")
    spawned += [job, thief]
    snapshot = sim_snapshot(tmp_path, {0: [job.pid, thief.pid]})
    uses = classify(snapshot, [lease])
    assert [p.pid for p in uses[0].ci] == [job.pid]
    assert [p.pid for p in uses[0].foreign] == [thief.pid]
    LeaseTable(tmp_path / "state").try_acquire((0,), dataclasses.replace(lease, gpu=-1))
    controller = LeaseJobs(tmp_path / "state")  # the controller's gate asks the same question
    controller.running()
    assert [controller.is_ci(0, p) for p in snapshot.gpu(0).processes] == [True, False]
    # nor does the copy keep a dead job's lease alive (it would hold the GPU forever)
    gone = dataclasses.replace(lease, owner_pid=2**22 - 3)
    job.kill()
    job.wait()
    assert is_stale(gone)


def test_a_job_run_as_its_configured_user_is_ci(tmp_path: Path, unix_user: pwd.struct_passwd,
                                                spawned: list[subprocess.Popen[bytes]]) -> None:
    lease = dataclasses.replace(_lease(0), uid=unix_user.pw_uid)
    job = subprocess.Popen(["sleep", "60"], env={LEASE_ENV: lease.token}, user=unix_user.pw_uid,
                           group=unix_user.pw_gid, extra_groups=[], cwd="/")
    root_copy = subprocess.Popen(["sleep", "60"], env={LEASE_ENV: lease.token})
    spawned += [job, root_copy]
    uses = classify(sim_snapshot(tmp_path, {0: [job.pid, root_copy.pid]}), [lease])
    assert [p.pid for p in uses[0].ci] == [job.pid]
    assert [p.pid for p in uses[0].foreign] == [root_copy.pid]


# -- leases fail closed -----------------------------------------------------------------------
CORRUPT = {
    "truncated": lambda good: good[: len(good) // 2],
    "empty": lambda good: b"",
    "binary": lambda good: b"\x00\xff\xfe lease \x80",
    "list": lambda good: b"[]",
    "missing-key": lambda good: json.dumps({k: v for k, v in json.loads(good).items()
                                            if k != "owner_pid"}).encode(),
    "string-pid": lambda good: json.dumps({**json.loads(good), "owner_pid": "1234"}).encode(),
    "null-job": lambda good: json.dumps({**json.loads(good), "job_id": None}).encode(),
    "other-gpu": lambda good: json.dumps({**json.loads(good), "gpu": 5}).encode(),
}


@pytest.mark.parametrize("damage", sorted(CORRUPT))
def test_an_unreadable_lease_holds_its_gpu_and_is_reported(tmp_path: Path, damage: str,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    table = LeaseTable(tmp_path)
    assert table.try_acquire((2,), _lease(-1, job="10")) == []
    path = table.dir / "gpu2.json"
    path.write_bytes(CORRUPT[damage](path.read_bytes()))
    with caplog.at_level(logging.ERROR):
        [held] = table.all()
    assert held.gpu == 2 and held.problem and not is_stale(held)
    assert any("gpu2.json is unreadable" in r.getMessage() for r in caplog.records)
    with pytest.raises(LeaseBusy, match="GPU 2 has an unreadable lease"):
        table.acquire((2, 3), _lease(-1, job="11"), wait_s=0)
    assert table.reclaim_stale() == [] and path.exists()
    uses = classify(sim_snapshot(tmp_path, {2: [os.getpid()]}), table.all())
    assert [p.pid for p in uses[2].foreign] == [os.getpid()]  # nothing passes for its job


def test_a_lease_written_by_a_newer_version_is_read(tmp_path: Path) -> None:
    table = LeaseTable(tmp_path)
    lease = _lease(-1)
    table.try_acquire((1,), lease)
    path = table.dir / "gpu1.json"
    write_private(path, json.dumps({**json.loads(path.read_text()), "priority": "high", "numa": 0}))
    [read] = table.all()
    assert not read.problem and read.token == lease.token and read.gpu == 1
