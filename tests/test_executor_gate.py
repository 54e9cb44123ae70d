"""CI or foreign: what the gate and the controller see on a GPU (S3), without signalling (S4)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from runnerctl.executors.gate import classify, wait_until_free
from runnerctl.executors.lease import LEASE_ENV, Lease, new_nonce
from runnerctl.gpus import open_gpu_source
from tests.gpu_procs import sim_snapshot


def _lease(gpu: int, **fields: object) -> Lease:
    base = Lease(gpu=gpu, job_id="900", slot="runnerctl/gpu-a/gpu0-1", driver="shell",
                 owner_pid=os.getpid(), owner_started=0.0, created_at=time.time() - 1,
                 nonce=new_nonce())
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]


def test_token_counts_only_on_the_gpus_its_lease_holds(tmp_path: Path,
                                                       spawned: list[subprocess.Popen[bytes]]) -> None:
    lease = _lease(0)
    ci = subprocess.Popen(["sleep", "60"], env={LEASE_ENV: lease.token})
    guessed = subprocess.Popen(["sleep", "60"], env={LEASE_ENV: f"{lease.job_id}@{lease.slot}:"})
    spawned += [ci, guessed]
    uses = classify(sim_snapshot(tmp_path, {0: [ci.pid, guessed.pid], 1: [ci.pid]}), [lease])
    assert [p.pid for p in uses[0].ci] == [ci.pid] and uses[0].lease == lease
    assert [p.pid for p in uses[0].foreign] == [guessed.pid]  # no nonce, no pass
    assert [p.pid for p in uses[1].foreign] == [ci.pid]  # a job on a GPU it does not hold
    assert uses[2].ci == uses[2].foreign == ()


def test_process_group_of_the_lease_is_ci_but_not_older_processes(
        tmp_path: Path, spawned: list[subprocess.Popen[bytes]]) -> None:
    group = subprocess.Popen(["bash", "-c", "sleep 60 & wait"], start_new_session=True)
    spawned.append(group)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not psutil.Process(group.pid).children():
        time.sleep(0.05)
    (child,) = psutil.Process(group.pid).children()  # no token in its environment
    snapshot = sim_snapshot(tmp_path, {0: [child.pid]})
    assert [p.pid for p in classify(snapshot, [_lease(0, pgid=group.pid)])[0].ci] == [child.pid]
    later = _lease(0, pgid=group.pid, created_at=time.time() + 60)  # a reused group id
    assert [p.pid for p in classify(snapshot, [later])[0].foreign] == [child.pid]
    # after a reboot every process is newer than the lease: the boot id tells it is not the job's
    before_reboot = _lease(0, pgid=group.pid, created_at=0.0, owner_since_boot="a-boot-before-this-one:7")
    assert [p.pid for p in classify(snapshot, [before_reboot])[0].foreign] == [child.pid]


@pytest.mark.parametrize(("entry", "gpu", "said"), [
    ("{index: 1, lost: true}", 1, "GPU 1 fell off the bus"),
    ("{index: 1, mig: true}", 1, "GPU 1 is in MIG mode"),
    ("{index: 1, processes_known: false}", 1, "GPU 1 has processes NVML cannot list"),
    ("{index: 1}", 2, "GPU 2 is not on this host (NVML lists GPUs 0, 1)")])
def test_a_gpu_no_job_may_use_is_refused_at_once(tmp_path: Path, entry: str, gpu: int, said: str) -> None:
    """The gate looked only at processes: a lost GPU, a MIG one, or one whose processes
    NVML cannot list passed as free, and a GPU not on the host was a KeyError (found by a
    review as an NVML expert). Waiting would change none of them."""
    (tmp_path / "gpus.yaml").write_text(f"host: gpu-a\ngpus:\n  - {{index: 0}}\n  - {entry}\n")
    source = open_gpu_source(f"sim:{tmp_path / 'gpus.yaml'}", host="gpu-a")
    now = [0.0]
    found = wait_until_free(source, (0, gpu), lambda: [], wait_s=600,
                            sleep=lambda s: now.__setitem__(0, now[0] + s), clock=lambda: now[0])
    assert len(found) == 1 and found[0].describe().startswith(said), found
    assert now[0] == 0.0  # at once: no wait


def test_gate_waits_then_names_gpu_pid_and_user(tmp_path: Path,
                                                spawned: list[subprocess.Popen[bytes]]) -> None:
    colleague = subprocess.Popen(["sleep", "60"], user="nobody")
    spawned.append(colleague)
    sim_snapshot(tmp_path, {1: [colleague.pid]})
    source = open_gpu_source(f"sim:{tmp_path / 'gpus.yaml'}", host="gpu-a")
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    found = wait_until_free(source, (0, 1), lambda: [_lease(0), _lease(1)], wait_s=10, poll_s=2,
                            sleep=sleep, clock=lambda: now[0])
    assert now[0] == 10
    assert [f.describe() for f in found] == [f"GPU 1 is used by pid {colleague.pid} of user nobody"]
    assert colleague.poll() is None  # only read, never signalled
    assert wait_until_free(source, (0,), lambda: [], wait_s=10, sleep=sleep,
                           clock=lambda: now[0]) == []


def test_a_job_process_whose_group_leader_left_is_still_the_jobs(
        tmp_path: Path, spawned: list[subprocess.Popen[bytes]]) -> None:
    """A process the job double-forked (a daemonised data loader) has init as its parent
    but keeps the job's process group: it is CI by its group id, not only by an ancestor
    whose pid is the group's (a mutation that dropped the group id test went unnoticed;
    found by a review as a mutation tester)."""
    ready = tmp_path / "orphan.pid"
    daemon = f"(sleep 60 & echo $! > {ready}.new; mv {ready}.new {ready}) & wait; sleep 60"
    group = subprocess.Popen(["bash", "-c", daemon], start_new_session=True, env={})
    spawned.append(group)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not ready.exists():
            time.sleep(0.05)
        orphan = int(ready.read_text())
        assert group.pid not in [p.pid for p in psutil.Process(orphan).parents()]  # the leader is no ancestor
        snapshot = sim_snapshot(tmp_path, {0: [orphan]})
        assert [p.pid for p in classify(snapshot, [_lease(0, pgid=group.pid)])[0].ci] == [orphan]
    finally:
        os.killpg(group.pid, 9)


def test_an_unreadable_lease_or_a_gone_process_vouches_for_nothing(
        tmp_path: Path, spawned: list[subprocess.Popen[bytes]]) -> None:
    """Fail closed: a lease that could not be read makes no process CI, its token or group
    notwithstanding, and a process that is gone is not the job's (mutations of each went
    unnoticed; found by a review as a mutation tester)."""
    from runnerctl.executors.gate import belongs_to

    lease = _lease(0)
    ci = subprocess.Popen(["sleep", "60"], env={LEASE_ENV: lease.token})
    gone = subprocess.Popen(["true"], env={LEASE_ENV: lease.token})
    spawned += [ci, gone]
    gone.wait()
    assert belongs_to(ci.pid, lease)
    assert not belongs_to(ci.pid, dataclasses.replace(lease, problem="not JSON", pgid=ci.pid))
    assert not belongs_to(gone.pid, dataclasses.replace(lease, pgid=gone.pid))


def test_the_gate_reads_the_leases_again_at_every_look(tmp_path: Path,
                                                       spawned: list[subprocess.Popen[bytes]]) -> None:
    """A process whose lease is written while the gate waits (the job's own, taken a moment
    late) stops counting as foreign at the next look; read once, the gate waited out its
    whole time and failed the job (a mutation that did so went unnoticed; found by a review
    as a mutation tester)."""
    lease = _lease(1)
    job = subprocess.Popen(["sleep", "60"], env={LEASE_ENV: lease.token})
    spawned.append(job)
    sim_snapshot(tmp_path, {1: [job.pid]})
    source = open_gpu_source(f"sim:{tmp_path / 'gpus.yaml'}", host="gpu-a")
    now = [0.0]
    looks: list[int] = []

    def leases() -> list[Lease]:
        looks.append(1)
        return [lease] if len(looks) > 1 else []

    found = wait_until_free(source, (1,), leases, wait_s=600, poll_s=2,
                            sleep=lambda s: now.__setitem__(0, now[0] + s), clock=lambda: now[0])
    assert found == [] and now[0] == 2  # free at the second look, not after 600 s


def test_another_users_process_in_a_freed_group_number_or_a_look_alike_cgroup_is_foreign(
        tmp_path: Path, spawned: list[subprocess.Popen[bytes]]) -> None:
    """Found by a review as a local user: a user who forked until a process of theirs had
    a finished job's group id counted as that job on its GPUs (and kept the lease alive),
    and a cgroup of their own named like the container's (`systemd-run --user --scope
    --unit=docker-<id>`) counted as inside the container."""
    from runnerctl.executors.lease import cgroup_is_of, group_alive

    theirs = subprocess.Popen(["sleep", "60"], user="nobody", start_new_session=True)
    spawned.append(theirs)
    lease = _lease(0, pgid=theirs.pid)  # the job ran as this process's user
    snapshot = sim_snapshot(tmp_path, {0: [theirs.pid]})
    assert [p.pid for p in classify(snapshot, [lease])[0].foreign] == [theirs.pid]
    assert not group_alive(theirs.pid, lease.uid)
    as_theirs = _lease(0, pgid=theirs.pid, uid=psutil.Process(theirs.pid).uids().real)
    assert [p.pid for p in classify(snapshot, [as_theirs])[0].ci] == [theirs.pid]
    assert group_alive(theirs.pid, as_theirs.uid)

    box = _lease(0, container="c0ffee" * 10 + "abcd", slurm_job="12")
    cid = box.container
    inside = [f"0::/system.slice/docker-{cid}.scope", f"4:memory:/docker/{cid}",
              f"4:memory:/process_api/e51c/docker/{cid}",
              "0::/system.slice/slurmstepd.scope/job_12/step_0/user/task_0",
              "4:memory:/slurm/uid_5/job_12/step_0"]
    outside = [f"0::/user.slice/user-1000.slice/user@1000.service/app.slice/docker-{cid}.scope",
               f"0::/user.slice/user-1000.slice/user@1000.service/docker/{cid}",
               "0::/user.slice/user-1000.slice/user@1000.service/job_12/x",
               f"0::/system.slice/docker-{cid}0.scope", f"4:memory:/docker/{cid}-x/y",
               "0::/system.slice/slurmstepd.scope/job_123/step_0", f"0::/notdocker/{cid}"]
    assert [line for line in inside if not cgroup_is_of(line, box)] == []
    assert [line for line in outside if cgroup_is_of(line, box)] == []


def test_a_gate_wait_longer_than_prepare_is_cut_to_what_prepare_holds(tmp_path: Path) -> None:
    """gitlab-runner ends prepare at 900 s: a longer `gate_wait_s` (an older runnerctl took
    it) lost the gate's message naming the GPU's user in a plain timeout; it is cut to
    600 s and said (found by a review of the day's changes)."""
    from tests.harness_custom_executor import FakeJob, harness_for, make_host

    host = make_host(tmp_path, gate_wait_s=3600)
    prepare = harness_for(host, (2,), "shell").stage("prepare", FakeJob(id=4701))
    assert prepare.code == 0, prepare.output
    assert "gate_wait_s 3600 is over 600 s, gitlab-runner's prepare would end first: waiting 600 s" \
        in prepare.output
