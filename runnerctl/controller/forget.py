"""Erase what the store keeps of one person (`runnerctl user forget NAME`).

A student who leaves may ask a lab to erase their data; before this only raw SQL did it
(found by a privacy review). The store names a person in its job history (`username`),
in events (free text: "alice holds GPUs ...", "by alice: ..." on pauses), as the author
of a toggle, in web sessions and in a local account. One transaction removes the rows and
the events that name them as a whole word (`bo` is not `bob`), ends their sessions,
removes their account, and writes `someone` as the author of their pauses and drains,
which stay in force (removing them would resume GPUs an operator held).

What the store does not hold is out of its reach, and `forget` says so: the system
journal (serve's log), backups, Prometheus (job ids on GPU metrics), GitLab itself. A job
of theirs still running comes back: the controller writes its row each tick until the
job ends, so the count of running jobs is reported to run it again afterwards.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from runnerctl.controller.store import Store
from runnerctl.errors import ConfigError

STAND_IN = "someone"
"""Who a forgotten person's pause or drain is by from then on."""


class Forgotten(NamedTuple):
    jobs: int
    running: int
    """Of `jobs`, those still running: their rows come back until they end."""
    events: int
    sessions: int
    account: bool
    toggles: int


def forget(store: Store, name: str, *, dry_run: bool = False) -> Forgotten:
    """Remove (or with `dry_run` only count) what the store keeps of `name`; ConfigError
    for an empty name, which would match every event and every job of no known user."""
    if not name.strip() or name != name.strip():
        raise ConfigError(f"{name!r} is no user name", hint="give the GitLab user name or local account")
    named = re.compile(rf"(?<![\w.-]){re.escape(name)}(?![\w-]|\.\w)")
    with store.transaction() as cur:
        jobs = cur.query("SELECT COUNT(*), COUNT(*) - COUNT(ended_at) FROM job_history WHERE username = ?",
                         (name,))
        events = [int(row[0]) for row in cur.query("SELECT id, subject, detail FROM events")
                  if named.search(str(row[1])) or named.search(str(row[2]))]
        sessions = int(cur.query("SELECT COUNT(*) FROM web_sessions WHERE name = ?", (name,))[0][0])
        account = bool(cur.query("SELECT COUNT(*) FROM users WHERE name = ?", (name,))[0][0])
        toggles = int(cur.query("SELECT COUNT(*) FROM toggles WHERE who = ?", (name,))[0][0])
        if not dry_run:
            cur.execute("DELETE FROM job_history WHERE username = ?", (name,))
            for start in range(0, len(events), 500):
                chunk = events[start:start + 500]
                cur.execute(f"DELETE FROM events WHERE id IN ({', '.join('?' * len(chunk))})", tuple(chunk))
            cur.execute("DELETE FROM web_sessions WHERE name = ?", (name,))
            cur.execute("DELETE FROM users WHERE name = ?", (name,))
            cur.execute("UPDATE toggles SET who = ? WHERE who = ?", (STAND_IN, name))
    return Forgotten(int(jobs[0][0]), int(jobs[0][1]), len(events), sessions, account, toggles)
