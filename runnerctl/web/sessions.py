"""Sessions that end when they should: the cookie names a session the store keeps.

The signed cookie holds only a random session id and the CSRF token; the store keeps
the SHA-256 of the id with who signed in, how and until when (`web_sessions`). So a
session ends at once, for every copy of its cookie, when the user signs out, and
every session of a local account ends when the account is removed or saved again (new
password or role: `Store.save_user`). A local account's role is read from `users` on
every request. A "Sign in with GitLab" session keeps the role GitLab gave it, read
again every `[web] gitlab_role_check_s` in the background with the controller's GitLab
token (`recheck`); a session whose role could not be confirmed for two such periods
counts as a viewer, and without a way to re-check it ends after one period.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, MutableMapping
from typing import Any

from runnerctl.controller.store import Store, WebSession
from runnerctl.web.auth import ROLES, Principal

Recheck = Callable[[WebSession], None]
"""Starts reading a GitLab session's role again (returns at once; updates the store)."""


def _key(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class Sessions:
    def __init__(self, store: Store, *, max_age_s: float, recheck_s: float, clock: Callable[[], float],
                 recheck: Recheck | None = None) -> None:
        self.store, self.max_age_s, self.recheck_s, self.clock = store, max_age_s, recheck_s, clock
        self.recheck = recheck

    def sign_in(self, cookie: MutableMapping[str, Any], who: Principal, *,
                gitlab_id: int | None = None) -> None:
        """A fresh session (new id, new CSRF token) for the signed-in user, against fixation."""
        self.sign_out(cookie)
        session_id, now = secrets.token_urlsafe(32), self.clock()
        self.store.save_session(WebSession(_key(session_id), who.name, who.via, who.role, gitlab_id, now, now,
                                           now + self.max_age_s))
        cookie.update(sid=session_id, csrf=secrets.token_urlsafe(32))

    def sign_out(self, cookie: MutableMapping[str, Any]) -> None:
        session_id = cookie.get("sid")
        if isinstance(session_id, str):
            self.store.end_session(_key(session_id))
        cookie.clear()

    def principal(self, cookie: MutableMapping[str, Any]) -> Principal | None:
        """Who this cookie's session belongs to now; None when it ended (or never was)."""
        session_id = cookie.get("sid")
        if not isinstance(session_id, str):
            return None
        now = self.clock()
        found = self.store.web_session(_key(session_id), now)
        if found is None:
            return None
        if found.via == "local":
            account = self.store.user(found.name)
            return Principal(found.name, account[1], "local") if account else None
        age = now - found.checked_at
        if age >= self.recheck_s:
            if self.recheck is None:  # nothing can confirm the role: sign in again
                self.store.end_session(found.key)
                return None
            self.recheck(found)
        role = found.role if found.role in ROLES and age < 2 * self.recheck_s else "viewer"
        return Principal(found.name, role, found.via)
