"""Three GPU hosts sharing one real PostgreSQL store and one simulated GitLab.

Each host is set up as README.md says (init, gitlab-runner's stand-in, serve), the three
`serve` processes start at the same moment on an empty store. Jobs of 1, 2, 4 and 8 GPUs
in both projects all end `success`, each on one host holding exactly its GPUs; the
page's fleet lists all three hosts.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from runnerctl.postgres import PostgresServer
from tests.e2e_fleet import Host, LeaseWatch, SimGitLab, all_final, wait_for

HOSTS = ("gpu-a", "gpu-b", "gpu-c")

SIZES = (1, 2, 4, 8, 1, 2, 4, 8)


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
        jobs = {(project, gitlab.enqueue(project, [f"gpus:{n}"], duration_s=2, user=f"user{i}")): n
                for project in projects for i, n in enumerate(SIZES)}
        final = wait_for("every job to end", lambda: all_final(gitlab, jobs), timeout=420)
    bad = {job: (info["status"], info.get("failure_reason")) for job, info in final.items()
           if info["status"] != "success"}
    assert not bad, (bad, "\n".join(h.logs() for h in hosts))

    held = leases.gpus_of_jobs()
    for (_, job_id), gpus in jobs.items():
        places = held.get(str(job_id), set())
        assert len(places) == gpus and len({host for host, _ in places}) == 1, (job_id, places)

    fleet = wait_for("the fleet on gpu-a's page", lambda: hosts[0].get("/api/fleet"))
    assert {entry["host"] for entry in fleet} >= set(HOSTS)

