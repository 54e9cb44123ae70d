"""A real PostgreSQL for tests, run by runnerctl's own server management.

pytest's tmp_path lives under a 0700 directory the `postgres` user cannot enter, so
the server gets a 0755 directory of its own under /tmp.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runnerctl.postgres import PostgresConfig, PostgresServer


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def running_server() -> Iterator[PostgresServer]:
    base = Path(tempfile.mkdtemp(prefix="runnerctl-pg-"))
    os.chmod(base, 0o755)
    server = PostgresServer(PostgresConfig(base_dir=base, port=free_port()))
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
