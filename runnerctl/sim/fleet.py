"""Stand-ins for gitlab-runner and the GPUs around a simulated GitLab (demo, tests).

`SimFleet` plays gitlab-runner for every registered runner: each polls the simulated
GitLab every `check_s` (GitLab hands it a job whose tags its tags cover, or nothing
when it is paused), "runs" the job for its duration and finishes it. Like the
executor's prepare stage it refuses to start on a GPU with a foreign process (S3) and
it records the GPU each job holds, which is what the controller reads instead of lease
files; a job placed on a GPU another job holds counts as a double allocation.

`SimGpus` is a GpuSource whose foreign processes a test or the demo sets in-process.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from runnerctl.controller.observe import LeasedJob
from runnerctl.gpus.sim import count_snapshot
from runnerctl.layout import plan_slots
from runnerctl.model import GpuProcess, GpuSnapshot, ProcessKind, Slot

GIB = 1024**3


class SimGitLabState(Protocol):
    def request_job(self, runner_id: int) -> Any: ...
    def finish_job(self, job_id: int, status: str = ..., *, failure_reason: str | None = ...) -> Any: ...
    def owner(self, job_id: int) -> tuple[str, str] | None: ...
    def job_name(self, job_id: int) -> str: ...
    @property
    def runners(self) -> Mapping[int, Any]: ...
    @property
    def project_timeout_s(self) -> int: ...


class SimGpus:
    """`count` idle GPUs; `foreign[gpu] = (pid, user)` adds a process someone started by hand;
    `busy[gpu]` is the utilization (0-1) of a GPU a CI job runs on (SimFleet sets it);
    a GPU in `mig` is in MIG mode (NVML then reports no utilization for it);
    `host_problem` is the snapshots' (a driver upgraded without a reboot)."""

    def __init__(self, host: str, count: int, clock: Callable[[], float]) -> None:
        self.spec = f"sim:{count}"
        self.host = host
        self.count = count
        self.foreign: dict[int, tuple[int, str]] = {}
        self.unhealthy: set[int] = set()
        self.mig: set[int] = set()
        self.busy: dict[int, float] = {}
        self.host_problem = ""
        self._clock = clock

    def snapshot(self) -> GpuSnapshot:
        base = count_snapshot(self.host, self.count)
        gpus = []
        for gpu in base.gpus:
            if gpu.index in self.foreign:
                pid, user = self.foreign[gpu.index]
                proc = GpuProcess(pid, ProcessKind.COMPUTE, 2 * GIB, user, "python train.py")
                gpu = dataclasses.replace(gpu, processes=(proc,), memory_used_bytes=2 * GIB, utilization=0.9)
            elif gpu.index in self.busy:
                gpu = dataclasses.replace(gpu, utilization=self.busy[gpu.index])
            if gpu.index in self.unhealthy:
                gpu = dataclasses.replace(gpu, xid_errors=1)
            if gpu.index in self.mig:
                gpu = dataclasses.replace(gpu, mig_enabled=True, utilization=None)
            gpus.append(gpu)
        return dataclasses.replace(base, gpus=tuple(gpus), taken_at=self._clock(),
                                   host_problem=self.host_problem)

    def slots(self) -> list[Slot]:
        return plan_slots(count_snapshot(self.host, self.count))


@dataclasses.dataclass
class RunningJob:
    job_id: int
    slot: Slot
    started: float
    ends: float
    timeout_s: float | None = None  # fixed when its runner took it, as GitLab and the lease do
    killed: bool = False  # it ran into its timeout: GitLab fails it


class SimFleet:
    def __init__(self, gitlab: SimGitLabState, runner_ids: Mapping[str, int], slots: list[Slot],
                 gpus: SimGpus, *, check_s: float = 3.0,
                 duration_of: Callable[[int], float] = lambda job_id: 60.0,
                 on_change: Callable[[str, RunningJob, float], None] = lambda kind, job, now: None,
                 lease_dir: Path | None = None,
                 utilization_of: Callable[[int], float] = lambda job_id: 0.9) -> None:
        self.gitlab = gitlab
        self.runner_ids = dict(runner_ids)
        self.slots = {s.name: s for s in slots if s.name in runner_ids}
        self.gpus = gpus
        self.check_s = check_s
        self.duration_of = duration_of
        self.utilization_of = utilization_of  # what its GPUs show while a job runs
        self.on_change = on_change
        self.jobs: dict[str, RunningJob] = {}  # slot name -> its running job
        self.holder: dict[int, int] = {}  # GPU -> job id
        self.started: dict[int, float] = {}
        self.finished: dict[int, float] = {}
        self.double_allocations = 0
        self.foreign_collisions = 0
        self._next_poll = 0.0
        self._leases = None if lease_dir is None else _lease_table(lease_dir)

    def running(self) -> dict[str, tuple[int, ...]]:
        return {name: (job.job_id,) for name, job in self.jobs.items()}

    def owners(self) -> dict[int, tuple[str, str]]:
        """What the executor's lease would say: GITLAB_USER_LOGIN and CI_JOB_URL."""
        found = {j.job_id: self.gitlab.owner(j.job_id) for j in self.jobs.values()}
        return {job_id: owner for job_id, owner in found.items() if owner}

    def leased(self) -> dict[int, LeasedJob]:
        """What the executor's lease would say (the simulated GitLab has the job's user)."""
        found = {}
        for job in self.jobs.values():
            user, url = self.gitlab.owner(job.job_id) or ("", "")
            found[job.job_id] = LeasedJob(job.slot.name, job.slot.gpus, user, url, created_at=job.started,
                                          timeout_s=job.timeout_s, name=self.gitlab.job_name(job.job_id))
        return found

    def unreadable(self) -> dict[int, str]:
        return {}  # the stand-ins' jobs are known here, whatever their lease files say

    def free(self, job_id: int) -> tuple[int, ...]:
        """The controller reaps a job GitLab says is over: it stops here, unfinished."""
        gpus: tuple[int, ...] = ()
        for name, job in list(self.jobs.items()):
            if job.job_id == job_id:
                del self.jobs[name]
                gpus += tuple(g for g in job.slot.gpus if self.holder.pop(g, None) == job_id)
                for g in gpus:
                    self.gpus.busy.pop(g, None)
        if self._leases is not None:
            self._leases.release(str(job_id))
        return gpus

    def step(self, now: float) -> None:
        """Finish jobs that are done; on the poll beat, every idle runner polls GitLab."""
        for name, job in list(self.jobs.items()):
            if job.ends <= now:
                self._finish(name, job, now)
        if now < self._next_poll:
            return
        self._next_poll = now + self.check_s
        for name, slot in self.slots.items():
            if name in self.jobs or any(g in self.gpus.foreign for g in slot.gpus):
                continue  # busy, or the executor's gate would refuse to start here
            job = self.gitlab.request_job(self.runner_ids[name])
            if job is not None:
                self._start(slot, int(job.id), now)

    def _start(self, slot: Slot, job_id: int, now: float) -> None:
        if any(g in self.holder for g in slot.gpus):
            self.double_allocations += 1
        if any(g in self.gpus.foreign for g in slot.gpus):
            self.foreign_collisions += 1
        runner = self.gitlab.runners.get(self.runner_ids[slot.name])
        # fixed as it starts, as GitLab does (build_metadata.rb update_timeout_state)
        timeout = None if runner is None else float(runner.job_timeout(self.gitlab.project_timeout_s))
        if self._leases is not None:  # as the executor's prepare stage does (S2)
            self._take_leases(slot, job_id, now, timeout)
        duration = self.duration_of(job_id)
        killed = timeout is not None and duration > timeout  # GitLab fails it at its timeout
        run_s = timeout if killed and timeout is not None else duration
        job = RunningJob(job_id, slot, now, now + run_s, timeout, killed)
        self.jobs[slot.name] = job
        for g in slot.gpus:
            self.holder[g] = job_id
            self.gpus.busy[g] = self.utilization_of(job_id)
        self.started[job_id] = now
        self.on_change("start", job, now)

    def _finish(self, name: str, job: RunningJob, now: float) -> None:
        del self.jobs[name]
        for g in job.slot.gpus:
            if self.holder.get(g) == job.job_id:
                del self.holder[g]
                self.gpus.busy.pop(g, None)
        self.finished[job.job_id] = now
        if self._leases is not None:
            self._leases.release(str(job.job_id))
        if job.killed:  # gitlab-runner reports the timeout (common/network.go: JobExecutionTimeout)
            self.gitlab.finish_job(job.job_id, "failed", failure_reason="job_execution_timeout")
        else:
            self.gitlab.finish_job(job.job_id, "success")
        self.on_change("finish", job, now)

    def _take_leases(self, slot: Slot, job_id: int, now: float, timeout: float | None) -> None:
        from runnerctl.controller.history import project_of  # CI_PROJECT_PATH, from the job's page
        from runnerctl.executors.lease import Lease, process_since_boot, process_started

        assert self._leases is not None
        me = os.getpid()
        user, url = self.gitlab.owner(job_id) or ("", "")
        template = Lease(gpu=-1, job_id=str(job_id), slot=slot.name, driver="sim", owner_pid=me,
                         owner_started=process_started(me) or 0.0,
                         owner_since_boot=process_since_boot(me) or "", created_at=now, timeout_s=timeout,
                         project=project_of(url), user=user, url=url, job_name=self.gitlab.job_name(job_id))
        if self._leases.try_acquire(slot.gpus, template):
            self.double_allocations += 1  # the real prepare would wait here


def _lease_table(state_dir: Path) -> Any:
    from runnerctl.executors.lease import LeaseTable

    return LeaseTable(state_dir)
