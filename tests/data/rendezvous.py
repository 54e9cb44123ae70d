"""A torchrun-style rendezvous over TCP, no framework: run once per node by RUNNERCTL_EACH_NODE.

Rank 0 listens on MASTER_ADDR:MASTER_PORT and waits for WORLD_SIZE - 1 peers; each peer
connects (retrying until rank 0 is up) and sends its NODE_RANK and node name; rank 0
prints every rank it met and sends the sum of the ranks back, which each peer prints.
"""

from __future__ import annotations

import os
import socket
import time

rank, world = int(os.environ["NODE_RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
name = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
if rank == 0:
    server = socket.create_server((addr, port))
    server.settimeout(60)
    peers = [server.accept()[0] for _ in range(world - 1)]
    met = sorted([f"{rank}:{name}"] + [p.recv(256).decode() for p in peers])
    total = sum(int(m.split(":")[0]) for m in met)
    for peer in peers:
        peer.sendall(str(total).encode())
    print(f"rendezvous world={world} met={','.join(met)} sum={total}", flush=True)
else:
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    conn.sendall(f"{rank}:{name}".encode())
    print(f"rank {rank} got sum={conn.recv(64).decode()}", flush=True)
