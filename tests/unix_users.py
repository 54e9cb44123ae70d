"""A real unprivileged Unix user for a test (CI runs as root; `useradd` is there).

The privacy tests play "another person with a shell account on the GPU server": files
must be unreadable to that user, a lease token they copy must not count, and the shell
driver runs jobs as such a user. Each test gets a fresh user, removed afterwards.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import subprocess
from collections.abc import Iterator

import psutil
import pytest


@pytest.fixture
def unix_user() -> Iterator[pwd.struct_passwd]:
    """A new user with a home dir; fails (never skips) when not root or without useradd."""
    assert os.geteuid() == 0, "these tests create Unix users: run them as root (CI does)"
    name = f"rctl{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True)
    try:
        user = pwd.getpwnam(name)
        yield user
    finally:
        for proc in psutil.process_iter():  # what the test started as that user, by pid
            with contextlib.suppress(psutil.Error):
                if proc.uids().real == user.pw_uid:
                    proc.kill()
        subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)


def run_as(user: pwd.struct_passwd, argv: list[str], *, env: dict[str, str] | None = None,
           timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run `argv` as `user` (no shell in between); its output as text."""
    return subprocess.run(argv, user=user.pw_uid, group=user.pw_gid, extra_groups=[],
                          env=env or {"PATH": "/usr/bin:/bin", "HOME": user.pw_dir},
                          capture_output=True, text=True, timeout=timeout, check=False, cwd="/")
