"""Three GPU hosts sharing one real PostgreSQL store and one simulated GitLab.

Each host is set up as README.md says (init, gitlab-runner's stand-in, serve), the three
`serve` processes start at the same moment on an empty store. A 1-GPU job pinned to each
host (its `host:` tag) keeps every host busy while jobs of 1, 2, 4 and 8 GPUs arrive in
both projects, so an 8-GPU job cannot start anywhere without a drain. All end `success`,
each on one host holding exactly its GPUs; for each multi-GPU job at most one host ever
drained (the events in the shared store), exactly one for each 8-GPU job; the page's
fleet lists all three hosts.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from runnerctl.controller.claims import drained_for
from runnerctl.controller.store import Store
from runnerctl.postgres import PostgresServer
from runnerctl.tags import host_tag
from tests.e2e_fleet import Host, LeaseWatch, SimGitLab, all_final, wait_for

HOSTS = ("gpu-a", "gpu-b", "gpu-c")

SIZES = (1, 2, 4, 8)
HOLD_S = 900.0
"""How long each host's pinned 1-GPU job would run: it is cancelled once every 8-GPU job
has a drain (with a fixed 12 s, a slow machine let a host go idle first, and an 8-GPU job
started there without one)."""


def test_three_hosts_started_together_share_the_work(
        tmp_path: Path, spawned: list[subprocess.Popen[bytes]], pg_server: PostgresServer) -> None:
    store_url = pg_server.create_database("e2e_fleet")
    gitlab = SimGitLab(spawned)
    hosts = [Host(name, tmp_path / name, gitlab, store_url=store_url) for name in HOSTS]
    for host in hosts:
        done = host.init()
        assert done.returncode == 0, done.stderr
        host.start_runner(spawned)
    serves = [host.start_serve(spawned) for host in hosts]  # together, on an empty store
    for host, proc in zip(hosts, serves, strict=True):
        wait_for(f"{host.name}'s /healthz", lambda h=host, p=proc: h.healthy() or p.poll() is not None,
                 timeout=180)
        assert proc.poll() is None, host.logs()

    projects = gitlab.info["project_ids"]
    with LeaseWatch(hosts) as leases:
        holders = {(projects[0], gitlab.enqueue(projects[0], ["gpus:1", host_tag(host.name)],
                                                duration_s=HOLD_S, user="holder")): 1 for host in hosts}
        wait_for("a leased GPU on every host", lambda: all(_leased(host) for host in hosts), timeout=120)
        jobs = {(project, gitlab.enqueue(project, [f"gpus:{n}"], duration_s=2, user=f"user{n}")): n
                for project in projects for n in SIZES}
        eights = [job for (_, job), n in jobs.items() if n == 8]
        wait_for("a drain for every 8-GPU job", lambda: set(eights) <= set(_drains(store_url)), timeout=300,
                 every=1.0)
        for project, job in holders:
            gitlab.request("POST", f"/api/v4/projects/{project}/jobs/{job}/cancel")
        jobs |= holders
        final = wait_for("every job to end", lambda: all_final(gitlab, jobs), timeout=420)
    expected = {job: "canceled" if (project, job) in holders else "success" for project, job in jobs}
    bad = {job: (info["status"], info.get("failure_reason")) for job, info in final.items()
           if info["status"] != expected[job]}
    assert not bad, (bad, "\n".join(h.logs() for h in hosts))

    held = leases.gpus_of_jobs()
    for (_, job_id), gpus in jobs.items():
        places = held.get(str(job_id), set())
        assert len(places) == gpus and len({host for host, _ in places}) == 1, (job_id, places)

    drains = _drains(store_url)
    multi = {job: n for (_, job), n in jobs.items() if n > 1}
    assert drains and set(drains) <= set(multi), drains  # real drains, never for a 1-GPU job
    assert all(len(by) == 1 for by in drains.values()), drains  # never two hosts for one job
    assert all(job in drains for job in eights), (drains, eights)  # no host could start them idle

    fleet = wait_for("the fleet on gpu-a's page", lambda: hosts[0].get("/api/fleet"))
    assert {entry["host"] for entry in fleet} >= set(HOSTS)


def _leased(host: Host) -> bool:
    return any((host.state_dir / "leases").glob("gpu*.json"))


def _drains(store_url: str) -> dict[int | None, set[str]]:
    """Job -> the hosts that recorded a real drain for it (event `drain`), from the shared store."""
    store = Store.open(url=store_url)
    try:
        found: dict[int | None, set[str]] = {}
        for host in HOSTS:
            for event in store.events(host, limit=10_000):
                if event.kind == "drain":
                    found.setdefault(drained_for(event.detail), set()).add(host)
        return found
    finally:
        store.close()

