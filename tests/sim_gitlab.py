"""A `runnerctl sim gitlab` server in-process, for the tests of the simulated GitLab."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from runnerctl.sim.gitlab_server import GitLabServer
from runnerctl.sim.gitlab_standalone import standalone

SimGitLab = tuple[GitLabServer, dict[str, Any]]


@contextlib.contextmanager
def running_sim() -> Iterator[SimGitLab]:
    """(server, the JSON line's fields); the drop rules run only when a test asks."""
    server, info = standalone("127.0.0.1", 0, drop_interval_s=None)
    try:
        yield server, info
    finally:
        server.stop()
