"""Shared fixtures: the HTTP GitLab (runnerctl.sim.gitlab_server) on loopback."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from runnerctl.sim.gitlab_server import GitLabServer
from runnerctl.sim.world import World

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
    """Processes a test starts; killed and reaped after it, with what they started (a
    runner stand-in's job stages would otherwise run on after the test)."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        proc.kill()
        proc.wait()
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        psutil.wait_procs(children, timeout=10)


@pytest.fixture
def lease_world(tmp_path: Path) -> Iterator[World]:
    """A controller against the HTTP GitLab whose runner stand-ins take real lease files,
    which the controller reads running jobs from (`LeaseJobs`), as in production."""
    from runnerctl.settings import ControllerSettings
    from runnerctl.sim.world import PROJECT, build_world

    w = build_world(tmp_path / "store", settings=ControllerSettings(projects=(PROJECT,)),
                    lease_dir=tmp_path / "state")
    yield w
    w.close()


def defaults_toml(directory: Path) -> Path:
    """An empty runnerctl settings file in `directory`: every setting at its default
    (`--config` must name a file that exists)."""
    path = directory / "defaults.toml"
    path.touch()
    return path
