"""A real PostgreSQL for tests, run by runnerctl's own server management.

pytest's tmp_path lives under a 0700 directory the `postgres` user cannot enter, so
the server gets a 0755 directory of its own under /tmp.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runnerctl.postgres import PostgresConfig, PostgresServer

_GIVEN: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, for a server a test starts, below the kernel's
    ephemeral range. A port from bind(0) lies in that range, where any outgoing
    connection (ten serves' PostgreSQL connections, say) may take it before the server
    binds it ("Address already in use"); no port is handed out twice in one run."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(1000):
        port = random.randrange(10000, low) if low > 11000 else 0
        if port in _GIVEN:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            port = int(sock.getsockname()[1])
        _GIVEN.add(port)
        return port
    raise AssertionError("no free loopback port below the ephemeral range")


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
