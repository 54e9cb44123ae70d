"""The simulated GitLab as its own process: `runnerctl sim gitlab` builds it here.

A fresh instance with what a first look at a real one would show: the administrator
`root` (GitLab's first user) with a personal access token of scope `api`, and one group
with two projects, of which root is the Owner (a group's creator is). The clock is wall
time plus an offset that `POST /-/sim/clock` moves, so tests can reach GitLab's 1 hour
and 1 day rules without waiting. Everything else is made through GitLab's own API.
"""

from __future__ import annotations

import secrets
from typing import Any

from runnerctl.sim.gitlab_directory import OWNER, Directory
from runnerctl.sim.gitlab_server import GitLabServer
from runnerctl.sim.gitlab_sim_hooks import OffsetClock
from runnerctl.sim.gitlab_state import GitLabState

ADMIN = "root"
GROUP = "ml"
PROJECTS = ("training", "sweeps")
HOURLY_S = 3600.0
KEEP_REQUESTS = 10_000  # the request log of a server left running for days keeps the newest
"""GitLab's StuckBuildsDropWorker cron: `0 * * * *` (config/initializers/1_settings.rb)."""


def standalone(host: str, port: int, *, drop_interval_s: float | None = HOURLY_S,
               legacy_failure_reasons: bool = False,
               drop_silent_running: bool = False,
               verify_skips_contact: bool = False) -> tuple[GitLabServer, dict[str, Any]]:
    """A started server and the line `runnerctl sim gitlab` prints about it."""
    directory = Directory(strict=True)
    directory.add_user(ADMIN, admin=True)
    group = directory.add_group(GROUP)
    directory.group_members[group.full_path][ADMIN] = OWNER
    projects = [directory.add_project(name, group_id=group.id) for name in PROJECTS]
    state = GitLabState(clock=OffsetClock(), directory=directory,
                        legacy_failure_reasons=legacy_failure_reasons,
                        drop_silent_running=drop_silent_running, verify_skips_contact=verify_skips_contact)
    token = "glpat-" + secrets.token_urlsafe(20)
    server = GitLabServer(state, tokens={token: ADMIN}, host=host, port=port, admins=(ADMIN,),
                          drop_interval_s=drop_interval_s, keep_requests=KEEP_REQUESTS)
    state.base_url = server.url
    server.hooks.base_url = server.url
    server.start()
    info = {"url": server.url, "admin_token": token, "admin_user": ADMIN,
            "admin_user_id": directory.users[ADMIN], "group_id": group.id, "group_path": group.full_path,
            "project_ids": [p.id for p in projects],
            "drop_interval_s": drop_interval_s}
    return server, info
