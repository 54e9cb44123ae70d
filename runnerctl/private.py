"""Files only runnerctl's own user may read: the state dir, secrets, the store, leases.

Other people have shell accounts on the hosts runnerctl runs on. So the state dir is
0711 (others may pass through it to the builds and cache dirs of jobs that run as them,
and PostgreSQL's own user to its data dir, but may not list it), everything private in it
is 0700 (dirs) or 0600 (files), and a secret is written whole or not at all: a temporary
file created 0600, flushed to disk, then renamed over the name. A key file that is empty
or short (a full disk at first start, a hand edit) is refused, never used.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from runnerctl.errors import ConfigError

STATE_DIR_MODE = 0o711
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
SERVE_LOCK = "serve.lock"
"""In the state dir: the lock `serve` holds while it runs, with its pid
(controller/serve.hold_state_dir); the exporter reads it (`serve_pid`)."""
KEY_MIN_CHARS = 32
"""A generated key has 64 URL-safe characters (384 bits); anything under 32 is refused."""


def state_dir(path: Path) -> Path:
    """Create the state dir (0711), or close an existing one of ours that others may list."""
    return _dir(path, STATE_DIR_MODE)


def private_dir(path: Path) -> Path:
    """A dir (0700): leases, the PostgreSQL passwords."""
    return _dir(path, PRIVATE_DIR_MODE)


def _dir(path: Path, mode: int) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=mode)
    info = path.stat()
    # tighten only a dir we own that is not a shared one (/tmp has the sticky bit)
    if info.st_uid == os.geteuid() and not info.st_mode & stat.S_ISVTX and stat.S_IMODE(info.st_mode) & ~mode:
        path.chmod(stat.S_IMODE(info.st_mode) & mode)
    return path


def create_private_file(path: Path) -> None:
    """Make sure `path` exists as a 0600 file (before SQLite creates it with the umask's mode)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, PRIVATE_FILE_MODE)
    try:
        if os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, PRIVATE_FILE_MODE)
    finally:
        os.close(fd)


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` (0600) atomically: readers see the old file or the whole new one."""
    write_atomic(path, text, mode=PRIVATE_FILE_MODE)


def write_atomic(path: Path, text: str, *, mode: int) -> None:
    """Write `text` (UTF-8) to `path` with `mode` (whatever the umask) atomically: readers,
    and a full disk, leave the old file or the whole new one, and no temp file behind.
    The temp file is a new one under a random name (O_EXCL, O_NOFOLLOW): a link planted
    at a name in a directory others can write is never followed."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            os.fchmod(fd, mode)
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def key_file(path: Path, *, min_chars: int = KEY_MIN_CHARS) -> str:
    """The secret in `path`, generated (0600, atomically) when the file does not exist; the
    caller makes its dir (`state_dir`, `private_dir`).

    An existing key that is empty or shorter than `min_chars` is an error, not a key:
    anyone could forge what it signs.
    """
    if not path.exists():
        write_private(path, secrets.token_urlsafe(48) + "\n")
    try:
        key = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the key file {path}: {exc}",
                          hint="delete it to have a new one made") from None
    if len(key) < min_chars:
        raise ConfigError(f"the key file {path} holds {len(key)} characters, fewer than {min_chars}: "
                          "refusing to sign with it", hint="delete it to have a new one made")
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        path.chmod(PRIVATE_FILE_MODE)  # an older runnerctl's, or a copied file
    return key


def serve_pid(state_dir: Path) -> int | None:
    """The pid of the `runnerctl serve` running on `state_dir`, None when none does: the
    pid its lock file names, if that process is still a runnerctl serve. Reads only, and
    takes no lock (one taken even for a moment would make a serve starting then refuse)."""
    try:
        fd = os.open(state_dir / SERVE_LOCK, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        text = handle.read(32).decode(errors="replace").strip()
    if not text.isdigit():
        return None
    try:
        argv = Path(f"/proc/{text}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    return int(text) if b"runnerctl" in b" ".join(argv) and b"serve" in argv else None
