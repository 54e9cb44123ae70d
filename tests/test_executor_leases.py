"""GPU leases: all or nothing, never overlapping, stale only when nothing of the job runs."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runnerctl.executors.lease import (
    Lease,
    LeaseBusy,
    LeaseTable,
    earlier_boot,
    is_stale,
    new_nonce,
    process_since_boot,
    process_started,
    read_leases,
)


def _template(job: str, owner: int | None = None) -> Lease:
    pid = owner or os.getpid()
    return Lease(gpu=-1, job_id=job, slot=f"slot-{job}", driver="shell", owner_pid=pid,
                 owner_started=process_started(pid) or 0.0, created_at=time.time(),
                 nonce=new_nonce())


def test_all_or_nothing(tmp_path: Path) -> None:
    table = LeaseTable(tmp_path)
    first = _template("a")
    assert table.try_acquire((0, 1), first) == []
    holders = table.try_acquire((1, 2), _template("b"))
    assert [(h.gpu, h.job_id) for h in holders] == [(1, "a")]
    assert [(lease.gpu, lease.job_id) for lease in read_leases(tmp_path)] == [(0, "a"), (1, "a")]
    retry = _template("a")  # gitlab-runner retries prepare: the job takes its own GPUs again
    replaced = table.acquire((0, 1), retry, wait_s=0)
    assert {lease.token for lease in replaced} == {first.token}
    assert {lease.token for lease in table.all()} == {retry.token} != {first.token}


def test_a_lease_the_host_cannot_read_now_holds_its_gpu_and_is_kept(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Out of file descriptors (EMFILE), a live job's lease was "unreadable", and the log
    told the admin to remove the file: a running job's GPU freed by hand (found by a
    review of a host out of resources). It stays held, and the file is to be kept."""
    import logging
    import resource

    table = LeaseTable(tmp_path)
    assert table.try_acquire((0,), _template("a")) == []
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (3, hard))  # no descriptor left above stdio
    try:
        with caplog.at_level(logging.ERROR):
            lease = table._read(0)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert lease is not None and lease.problem == "cannot be read now: Too many open files"
    assert lease.describe() == ("GPU 0's lease cannot be read now: Too many open files: it stays held, "
                                "and is read again at the next look")
    assert "the file may be fine: keep it" in caplog.text and "remove the file" not in caplog.text
    assert [(held.gpu, held.job_id) for held in table.all()] == [(0, "a")]


def test_a_write_that_fails_part_way_leaves_no_gpu_taken(tmp_path: Path) -> None:
    """All or none: a full disk on the second lease left the first written, its GPU held
    until the job's cleanup (found by a review of a host out of disk space). A file size
    limit that the lease of GPU 9 fits and GPU 10's (one digit more) does not stands in
    for the full disk."""
    import resource

    template = _template("a")
    scratch = LeaseTable(tmp_path / "scratch")
    assert scratch.try_acquire((9,), template) == []
    size = (scratch.dir / "gpu9.json").stat().st_size
    table = LeaseTable(tmp_path / "state")
    assert table.all() == [] and table.try_acquire((0,), _template("b")) == []  # the directory exists
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        with pytest.raises(OSError):
            table.try_acquire((9, 10), template)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert [(lease.gpu, lease.job_id) for lease in table.all()] == [(0, "b")]
    assert sorted(p.name for p in table.dir.iterdir()) == [".lock", "gpu0.json"]  # no temp file left


def test_acquire_waits_with_injected_clock(tmp_path: Path) -> None:
    table = LeaseTable(tmp_path)
    table.try_acquire((3,), _template("a"))
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    try:
        table.acquire((3,), _template("b"), wait_s=5, poll_s=1, sleep=sleep, clock=lambda: now[0])
    except LeaseBusy as exc:
        assert "GPU 3 held by job a" in str(exc)
    else:
        raise AssertionError("a held GPU was leased twice")
    assert slept == [1, 1, 1, 1, 1]


def test_release_touches_only_that_job(tmp_path: Path) -> None:
    table = LeaseTable(tmp_path)
    table.try_acquire((0,), _template("a"))
    table.try_acquire((1,), _template("b"))
    assert [lease.gpu for lease in table.release("a")] == [0]
    assert [lease.job_id for lease in table.all()] == ["b"]


def test_stale_only_when_owner_and_group_are_gone(tmp_path: Path) -> None:
    owner = subprocess.Popen(["sleep", "30"])
    group = subprocess.Popen(["sleep", "30"], start_new_session=True)
    lease = Lease(**{**_template("a", owner.pid).__dict__, "gpu": 0, "pgid": group.pid})
    assert not is_stale(lease)
    owner.kill()
    owner.wait()
    assert not is_stale(lease)  # the job's processes still run
    group.kill()
    group.wait()
    assert is_stale(lease)
    reused = Lease(**{**lease.__dict__, "owner_pid": os.getpid(), "owner_started": 1.0})
    assert is_stale(reused)  # same pid, other process: not the owner


def test_a_live_owner_stays_the_owner_when_the_clock_is_stepped(monkeypatch: pytest.MonkeyPatch) -> None:
    """psutil's create_time is the boot's wall-clock time plus the start, so an NTP step or
    `date -s` moves it: compared by it, every live gitlab-runner looked dead after a step,
    and between two stages a job's GPUs could be leased to another job. The owner is now
    told by boot id and start in clock ticks, which no step moves."""
    owner = subprocess.Popen(["sleep", "30"])
    try:
        lease = Lease(**{**_template("a", owner.pid).__dict__, "gpu": 0,
                         "owner_since_boot": process_since_boot(owner.pid) or ""})
        assert lease.owner_since_boot and not is_stale(lease)
        stepped = psutil.Process.create_time
        monkeypatch.setattr(psutil.Process, "create_time", lambda self: stepped(self) - 1.0)  # 1 s back
        assert not is_stale(lease)
        assert is_stale(Lease(**{**lease.__dict__, "owner_since_boot": "other-boot:1"}))  # a reused pid
        older = Lease(**{**lease.__dict__, "owner_since_boot": ""})  # written by runnerctl before it
        monkeypatch.undo()
        assert not is_stale(older)
    finally:
        owner.kill()
        owner.wait()
    assert is_stale(lease)


def test_a_lease_from_before_a_reboot_is_stale_though_its_pgid_is_in_use_again() -> None:
    """After a power loss the shell job's process group id belonged to some new process,
    so the lease looked alive and held its GPUs until the orphan audit (found by a review
    as a disaster-recovery engineer)."""
    reused = os.getpgid(0)  # a group that exists now
    lease = Lease(**{**_template("a", 999_999).__dict__, "gpu": 0, "pgid": reused,
                     "owner_since_boot": "a-boot-before-this-one:12345"})
    assert is_stale(lease)
    this = process_since_boot(os.getpid())
    assert this is not None
    assert not is_stale(Lease(**{**lease.__dict__, "owner_since_boot": this.partition(":")[0] + ":1"}))


def test_a_boot_id_that_cannot_be_read_counts_no_lease_of_an_earlier_boot() -> None:
    """Out of descriptors, the boot id read as "", unlike every lease's: the live job's
    process group counted as gone and its lease could be taken (found by a review)."""
    lease = Lease(**{**_template("a", 999_999).__dict__, "gpu": 0, "owner_since_boot": "some-boot:12345"})
    assert earlier_boot(lease, "another-boot") and not earlier_boot(lease, "some-boot")
    assert not earlier_boot(lease, "")  # unknown: no claim that its processes are gone
    older = Lease(**{**lease.__dict__, "owner_since_boot": ""})  # written before boot ids
    assert not earlier_boot(older, "another-boot")


@settings(max_examples=int(os.environ.get("LEASE_EXAMPLES", "50")), deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["prepare", "run", "cleanup", "kill", "orphan"]),
                          st.integers(0, 5),
                          st.sampled_from([(0,), (1,), (0, 1), (2, 3), (0, 1, 2, 3), (4, 5, 6, 7),
                                           tuple(range(8)), (7,)])),
                max_size=40))
def test_random_interleavings_never_overlap(ops: list[tuple[str, int, tuple[int, ...]]]) -> None:
    """prepare/run/cleanup/kill of 6 jobs over 8 GPUs in any order: no GPU ever has two
    jobs, a job holds all of its GPUs or none, a job runs only on GPUs it holds (the check
    the run stage makes), a killed job's GPUs are reclaimed, and an orphaned job's (its
    gitlab-runner died, its processes still run) are not."""
    import tempfile

    table = LeaseTable(Path(tempfile.mkdtemp()))
    dead_owner = subprocess.Popen(["true"])
    dead_owner.wait()
    live_group = subprocess.Popen(["sleep", "60"], start_new_session=True)
    wanted: dict[str, tuple[int, ...]] = {}
    orphans: set[str] = set()
    running: dict[int, str] = {}  # GPU -> job whose run stage is on it
    generation = dict.fromkeys(range(6), 0)  # GitLab gives a retried job a new id
    try:
        for action, job_no, gpus in ops:
            job = f"job{job_no}.{generation[job_no]}"
            if action == "prepare" and job not in wanted:
                if table.try_acquire(gpus, _template(job)) == []:
                    wanted[job] = gpus
            elif action == "run":
                held = {lease.gpu for lease in table.held_by(job)}
                if job in wanted and set(wanted[job]) <= held:  # else the stage refuses to run
                    for gpu in wanted[job]:
                        assert running.get(gpu, job) == job, f"GPU {gpu}: {running[gpu]} and {job}"
                        running[gpu] = job
            elif action == "cleanup" and job not in orphans:
                table.release(job)
                wanted.pop(job, None)
                running = {g: j for g, j in running.items() if j != job}
            elif action in ("kill", "orphan") and job in wanted and job not in orphans:
                pgid = live_group.pid if action == "orphan" else None
                for token in {lease.token for lease in table.held_by(job)}:
                    table.update(token, owner_pid=dead_owner.pid, owner_started=-1.0, pgid=pgid)
                if action == "orphan":  # no cleanup will come, and its processes run on
                    orphans.add(job)
                    continue
                wanted.pop(job)
                running = {g: j for g, j in running.items() if j != job}  # its processes died
                generation[job_no] += 1
            leases = table.all()
            gpus_seen = [lease.gpu for lease in leases]
            assert len(gpus_seen) == len(set(gpus_seen))
            for job_id, gpus_held in wanted.items():
                assert sorted(lease.gpu for lease in leases if lease.job_id == job_id) == sorted(gpus_held)
    finally:
        live_group.kill()
        live_group.wait()


def test_the_controller_reads_who_runs_each_job_from_the_leases(tmp_path: Path) -> None:
    """`LeaseJobs` gives the web page a job's user and link even for a job the controller
    never saw pending (1-GPU jobs); leases written before the link field still load."""
    from runnerctl.controller.observe import LeaseJobs

    table = LeaseTable(tmp_path)
    url = "https://gitlab.example/ml/train/-/jobs/41"
    lease = Lease(**{**vars(_template("41")), "user": "carol", "url": url})
    table.try_acquire((2, 3), lease)
    jobs = LeaseJobs(tmp_path)
    assert jobs.running() == {"slot-41": (41,)}
    assert jobs.owners() == {41: ("carol", url)}
    table.release("41")
    assert jobs.running() == {} and jobs.owners() == {}


def test_a_lease_is_kept_while_its_scheduler_cannot_be_asked(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail closed: a batch job nobody can ask about (no squeue on PATH, a driver this host
    lacks) counts as running, so its GPUs are not leased to another job (a mutation that
    took either for "inactive" went unnoticed; found by a review as a mutation tester)."""
    from runnerctl.executors.lease import batch_active, slurm_active

    monkeypatch.setenv("PATH", str(tmp_path))  # no squeue here
    assert slurm_active("12")
    assert batch_active("nosuch:12")
    assert not slurm_active(None) and not batch_active("")
    lease = Lease(**{**_template("a", 999_999).__dict__, "gpu": 0, "slurm_job": "12"})
    assert not is_stale(lease)  # its owner is gone, but Slurm may still run the job
