"""Shared fixtures: the HTTP GitLab (runnerctl.sim.gitlab_server) on loopback."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from runnerctl.sim.gitlab_server import GitLabServer

ADMIN_TOKEN = "glpat-runnerctl-test"


@pytest.fixture
def gitlab_server() -> Iterator[GitLabServer]:
    with GitLabServer(tokens={ADMIN_TOKEN: "admin"}) as server:
        yield server


def token_file(directory: Path, token: str = ADMIN_TOKEN) -> str:
    """`token` in a 0600 file for `--token-file` (tokens never go on the command line)."""
    path = directory / "gitlab-token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return str(path)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[object]:
    """One real PostgreSQL for the whole run (initdb takes seconds)."""
    from tests.pg import running_server

    with running_server() as server:
        yield server


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; killed and reaped after it."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()
