"""Shared fixtures: the HTTP GitLab (runnerctl.sim.gitlab_server) on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from runnerctl.sim.gitlab_server import GitLabServer

ADMIN_TOKEN = "glpat-runnerctl-test"


@pytest.fixture
def gitlab_server() -> Iterator[GitLabServer]:
    with GitLabServer(tokens={ADMIN_TOKEN: "admin"}) as server:
        yield server


@pytest.fixture(scope="session")
def pg_server() -> Iterator[object]:
    """One real PostgreSQL for the whole run (initdb takes seconds)."""
    from tests.pg import running_server

    with running_server() as server:
        yield server
