"""Who may read and who may toggle: local accounts, sessions, CSRF and sign-in limits.

Passwords are hashed with Argon2id (argon2-cffi, its default parameters); the hash sits
in the store's `users` table and never leaves the server. The cookie is Starlette's
signed cookie (HttpOnly, SameSite=Lax, optionally Secure) holding a session id (the
session itself lives in the store: runnerctl.web.sessions) and a random CSRF token; the
signing key is a random file in the state dir (0600, runnerctl.private) so sessions
survive a restart of `serve`. Every state-changing request must echo the token in
`X-CSRF-Token` (the double-submit is checked against the signed cookie, so a cross-site
form cannot forge it).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hmac
import ipaddress
import secrets
import threading
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from runnerctl import private
from runnerctl.controller.store import Store
from runnerctl.errors import ConfigError
from runnerctl.private import key_file

ROLES = ("viewer", "operator")
"""viewer: reads (also when the page is not public); operator: pause, drain, resume."""
_HASHER = PasswordHasher()


@functools.cache
def _dummy_hash() -> str:
    """A hash to verify unknown names against (equal work for them). Made when the web
    routes are installed (`ready`), not at import: every CLI command imports this module,
    and a hash takes about 0.1 s."""
    return _HASHER.hash("runnerctl-no-such-user")


def ready() -> None:
    """Make the hash that unknown names are checked against now, so that no sign-in pays
    for it (a first sign-in slower than the others would say the name is unknown)."""
    _dummy_hash()


@dataclasses.dataclass(frozen=True)
class Principal:
    name: str
    role: str
    via: str  # local | gitlab

    @property
    def can_toggle(self) -> bool:
        return self.role == "operator"


def hash_password(password: str) -> str:
    if len(password) < 8:
        raise ConfigError("the password is shorter than 8 characters", hint="choose a longer one")
    return _HASHER.hash(password)


MAX_NAME = 64
"""The longest user name (it is shown on the page and in the log; a 100,000-character one was taken)."""


def add_user(store: Store, name: str, password: str, role: str) -> None:
    if role not in ROLES:
        raise ConfigError(f"unknown role {role!r}; one of {', '.join(ROLES)}")
    if not name or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise ConfigError(f"user name {name!r} must be letters, digits, '-', '_' or '.'")
    if len(name) > MAX_NAME:
        raise ConfigError(f"user name {name[:20]!r}... is {len(name)} characters; at most {MAX_NAME}")
    store.save_user(name, hash_password(password), role, time.time())


def check_password(store: Store, name: str, password: str) -> Principal | None:
    found = store.user(name)
    try:
        _HASHER.verify(found[0] if found else _dummy_hash(), password)
    except (VerificationError, InvalidHashError):
        return None
    return Principal(name, found[1], "local") if found else None


def session_key(state_dir: Path) -> str:
    """The cookie signing key: <state_dir>/web-session.key, made (0600, atomically) on first
    use; an empty or short one is refused (runnerctl.private.key_file)."""
    return key_file(private.state_dir(state_dir) / "web-session.key")


def csrf_token(session: MutableMapping[str, Any]) -> str:
    if not isinstance(session.get("csrf"), str):
        session["csrf"] = secrets.token_urlsafe(32)
    return str(session["csrf"])


def csrf_ok(session: MutableMapping[str, Any], sent: str | None) -> bool:
    expected = session.get("csrf")
    return (isinstance(expected, str) and sent is not None  # bytes: a non-ASCII header is no TypeError
            and hmac.compare_digest(expected.encode(), sent.encode("utf-8", "surrogateescape")))


def client_key(address: str) -> str:
    """Whose attempts the per-client limit adds up: an IPv4 address, or an IPv6 address's
    /64, which one ordinary connection (a home router, a cloud host) gives a client whole;
    counted per address, 30 tries from one /64 were 30 401s and no 429 (found by a review
    as a lab admin behind a reverse proxy)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class SignInLimiter:
    """At most `attempts` sign-ins evaluated per (client, name) in a sliding minute, and
    `PER_CLIENT` times as many per client across all names, only failures counting in the
    end; at most `hashing` password checks at once, a sign-in waiting up to `wait_s` for one.

    An attempt takes its place in the minute *before* the password is checked (`begin`)
    and gives it back when it succeeds (`succeeded`), so forty attempts at the same moment
    evaluate no more than `attempts` of them. The client is the peer address (uvicorn
    replaces it from X-Forwarded-For only for `[web] trusted_proxies`).
    """

    KEYS = 4096
    """(client, name) and (client,) keys kept before the expired ones are dropped."""
    PER_CLIENT = 4
    """Failed sign-ins per client and minute across all names, in multiples of `attempts`:
    a mistyped name or two costs nothing, but a client trying one name after another is
    stopped (429) before it can keep the hashing slots busy for everyone else."""
    PER_NETWORK = 2
    """An IPv6 /64 (`client_key`) is a lab's whole LAN as often as one client: it may fail
    this many times a client's number. A name's own limit stays per address, so one
    machine there cannot lock a colleague's name for the others (a review of the day's
    changes)."""

    def __init__(self, attempts: int, clock: Callable[[], float] = time.monotonic, *,
                 hashing: int = 2, wait_s: float = 2.0) -> None:
        self.attempts, self.clock, self.wait_s = attempts, clock, wait_s
        self._failures: dict[tuple[str, ...], collections.deque[float]] = {}
        self._kept = 0
        self._lock = threading.Lock()
        self.hashing = threading.BoundedSemaphore(max(1, hashing))

    def begin(self, client: str, name: str) -> bool:
        """Take a place for one attempt; False (nothing taken) when the minute is full,
        for this name or for the client."""
        with self._lock:
            if len(self._failures) > max(self.KEYS, 2 * self._kept):  # a name per attempt: bounded
                cutoff = self.clock() - 60.0
                self._failures = {k: w for k, w in self._failures.items() if w and w[-1] >= cutoff}
                self._kept = len(self._failures)
            named, everywhere = self._recent((client, name)), self._recent((client_key(client),))
            allowed = self.PER_CLIENT * self.attempts * (self.PER_NETWORK if "/" in client_key(client) else 1)
            if len(named) >= self.attempts or len(everywhere) >= allowed:
                return False
            named.append(self.clock())
            everywhere.append(self.clock())
            return True

    def succeeded(self, client: str, name: str) -> None:
        """The attempt was right (or never evaluated): it does not count."""
        with self._lock:
            for key in ((client, name), (client_key(client),)):
                window = self._recent(key)
                if window:
                    window.pop()

    def hash_slot(self) -> bool:
        """Wait up to `wait_s` for a password check's slot; True when taken (give it back
        with `hashing.release()`), False when every slot stayed busy."""
        return self.hashing.acquire(timeout=self.wait_s)

    def _recent(self, key: tuple[str, ...]) -> collections.deque[float]:
        window = self._failures.setdefault(key, collections.deque())
        while window and window[0] < self.clock() - 60.0:
            window.popleft()
        return window
