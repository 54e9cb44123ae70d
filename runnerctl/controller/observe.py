"""What one tick sees: GPUs, this host's runners and their jobs, leases, the gate.

Sources are injected: the GPU source (NVML or simulated), GitLab (through the port),
and a job source telling which slot runs which job (the executor's leases in
production: the lease, not GitLab, is the ground truth of who holds a GPU). Which GPU
processes are CI and which are foreign is one small function (`LeaseJobs.is_ci`, the
executors' own `belongs_to` test), so the simulator and tests can swap it.

Runner pause states are cached: the controller is their only writer, it knows what it
set, and it re-reads one runner per tick from GitLab while the API budget allows (to
notice a change someone made in GitLab's UI). A state it could not read is `None`
(unknown), and the actor then sends the desired state instead of assuming one.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol

import psutil

from runnerctl.controller.demand import ApiBudget
from runnerctl.controller.gate import GateState, GateThresholds, IsCi, step
from runnerctl.gitlab import GitLabPort
from runnerctl.model import GpuProcess, GpuSnapshot
from runnerctl.settings import BATCH_DRIVERS, PathSettings, Settings

log = logging.getLogger(__name__)


GONE_AFTER = 3
"""404 answers in a row after which a runner counts as deleted (`RunnerCache.may_be_open`)."""

Owner = tuple[str, str]
"""(user, link to the job's page); '' where unknown."""


@dataclasses.dataclass(frozen=True)
class LeasedJob:
    """What the executor's lease says of a running job (job history reads it)."""

    slot: str
    gpus: tuple[int, ...]
    user: str = ""
    url: str = ""
    project: str = ""
    pipeline: str = ""
    created_at: float | None = None  # when prepare took the lease: the job holds GPUs since
    timeout_s: float | None = None  # its GitLab timeout, as the lease recorded it
    name: str = ""  # its job name (CI_JOB_NAME), as the lease recorded it
    elsewhere: bool = False
    """It runs on a batch system's node (a batch driver's lease): this host's GPUs, read by
    NVML here or simulated, say nothing of its use."""

    @property
    def ends_by(self) -> float | None:
        """When GitLab kills it at the latest (None: unknown)."""
        return None if self.created_at is None or self.timeout_s is None else self.created_at + self.timeout_s


class JobSource(Protocol):
    def running(self) -> dict[str, tuple[int, ...]]:
        """Slot name -> ids of the jobs running on it now."""
        ...

    def owners(self) -> dict[int, Owner]:
        """Job id -> who started it and its link, for the jobs of the last `running()`."""
        ...

    def leased(self) -> dict[int, LeasedJob]:
        """Job id -> its lease, for the jobs of the last `running()`."""
        ...

    def unreadable(self) -> dict[int, str]:
        """GPU -> why its lease cannot be read, as of the last `running()`: nobody can tell
        whose it is, so it holds the GPU (the gate keeps it closed)."""
        ...

    def free(self, job_id: int) -> tuple[int, ...]:
        """Remove what the job left on this host and release its leases: GitLab says it
        is long over, and its cleanup never finished (controller/orphans.py). Returns
        the GPUs freed."""
        ...


class LeaseJobs:
    """Running jobs from the executor's lease files (no GitLab request needed)."""

    def __init__(self, state_dir: Path, settings: Settings | None = None) -> None:
        from runnerctl.executors.lease import Lease, LeaseTable

        self.table = LeaseTable(state_dir)
        self.settings = settings or Settings(paths=PathSettings(state_dir=str(state_dir)))
        self._leases: dict[int, Lease] = {}
        self._owners: dict[int, Owner] = {}
        self._unreadable: dict[int, str] = {}

    def running(self) -> dict[str, tuple[int, ...]]:
        found: dict[str, set[int]] = {}
        leases = self.table.all()
        self._leases = {lease.gpu: lease for lease in leases}
        self._owners = {}
        self._unreadable = {lease.gpu: lease.problem for lease in leases if lease.problem}
        for lease in leases:
            if lease.problem:
                continue  # no slot, no job: it holds its GPU through `unreadable`
            job = int(lease.job_id) if lease.job_id.isdigit() else -1
            found.setdefault(lease.slot, set()).add(job)
            if job >= 0:
                self._owners[job] = (lease.user, lease.url)
        return {slot: tuple(sorted(jobs)) for slot, jobs in found.items()}

    def owners(self) -> dict[int, Owner]:
        return dict(self._owners)

    def leased(self) -> dict[int, LeasedJob]:
        found: dict[int, LeasedJob] = {}
        for lease in sorted(self._leases.values(), key=lambda le: le.gpu):
            if not lease.job_id.isdigit():
                continue
            job = int(lease.job_id)
            seen = found.get(job)
            gpus = (seen.gpus if seen else ()) + (lease.gpu,)
            found[job] = LeasedJob(lease.slot, gpus, lease.user, lease.url, lease.project,
                                   lease.pipeline_id, lease.created_at, lease.timeout_s, lease.job_name,
                                   elsewhere=lease.driver in BATCH_DRIVERS)
        return found

    def unreadable(self) -> dict[int, str]:
        return dict(self._unreadable)

    def holders(self) -> dict[int, tuple[int, ...]]:
        """GPU -> the job its readable lease names (-1: not a job id), as of the last
        `running()` (the standalone exporter's view of who holds what)."""
        return {gpu: (int(lease.job_id) if lease.job_id.isdigit() else -1,)
                for gpu, lease in self._leases.items() if not lease.problem}

    def free(self, job_id: int) -> tuple[int, ...]:
        """The executors' own cleanup, as their cleanup stage would have done it: reap
        (only what carries the job's lease: S4), then release."""
        from runnerctl.executors.stages import reap

        reap(self.table.held_by(str(job_id)), self.settings)
        return tuple(lease.gpu for lease in self.table.release(str(job_id)))

    def is_ci(self, gpu: int, process: GpuProcess) -> bool:
        """CI = the process belongs to the lease of its GPU (as read by the last
        `running()`, earlier in the same tick), by the very test the executor's prepare
        gate applies (`executors.gate.belongs_to`, through `classify`): its lease token,
        the lease's container or Slurm job cgroup, or its process group. So the
        controller and the executors never disagree on what is foreign.

        A process gone by now counts as CI on a leased GPU: NVML listed it before the leases
        were read, and a job's own process that exited in between was named foreign and
        closed the GPU for the cool-down (found by a review as a concurrency engineer);
        gone, it uses no GPU, and one of another user that is still there stays foreign."""
        from runnerctl.executors.gate import belongs_to

        lease = self._leases.get(gpu)
        return lease is not None and (belongs_to(process.pid, lease) or not psutil.pid_exists(process.pid))


def nothing_is_ci(gpu: int, process: GpuProcess) -> bool:
    """Until leases are wired in (simulated hosts): every GPU process is foreign."""
    return False


class RunnerCache:
    """Last known `paused` of each runner, GitLab's `online` (gitlab-runner contacted
    GitLab lately) and the runner's maximum job timeout (None = unknown or not set),
    refreshed within budget."""

    def __init__(self, runner_ids: Mapping[str, int]) -> None:
        self.ids = dict(runner_ids)
        self.paused: dict[str, bool | None] = {name: None for name in runner_ids}
        self.online: dict[str, bool | None] = {name: None for name in runner_ids}
        self.max_timeout: dict[str, int | None] = {name: None for name in runner_ids}
        self.tags: dict[str, tuple[str, ...] | None] = {name: None for name in runner_ids}
        """The runner's tags as GitLab last said (None: not read yet); `act.retag`
        sets back tags an admin changed in GitLab's UI."""
        self.retag_failing: set[str] = set()  # runners whose tags could not be set back (logged once)
        self.cap_unknown: set[str] = set(runner_ids)  # max_timeout not read yet, or a set failed
        self.gone: set[str] = set()
        """Runners GitLab answered 404 for (deleted, or hidden from the token): nothing is
        sent to them (`act.apply`) until a read finds them again."""
        self.not_found: dict[str, int] = {}
        """Of `gone`: the 404 answers in a row for the runner (`may_be_open`)."""
        self.found = 0
        """Reads that found their runner (the loop's sign that GitLab answers)."""
        self._next = 0
        self._next_unknown = 0

    def sync_all(self, gitlab: GitLabPort) -> None:
        """Read every runner once (start-up; not part of the steady-state budget)."""
        for name in self.ids:
            self._read(gitlab, name)

    def refresh_one(self, gitlab: GitLabPort, budget: ApiBudget) -> None:
        """Re-read one runner: every other read goes to a runner whose state is unknown
        (in turn, when there are several), the rest to every runner in turn, so a runner
        that stays unknown (deleted in GitLab) never keeps the others from being re-read."""
        names = list(self.ids)
        unknown = [n for n in names if self.paused[n] is None]
        if not names or not budget.try_take():
            return
        if unknown and (self._next + self._next_unknown) % 2 == 0:
            name = unknown[self._next_unknown % len(unknown)]
            self._next_unknown += 1
        else:
            name = names[self._next % len(names)]
            self._next += 1
        self._read(gitlab, name)

    def _read(self, gitlab: GitLabPort, name: str) -> None:
        info = gitlab.get_runner(self.ids[name])  # GitLabError: the loop logs once, backs off
        if info is None:  # 404: deleted, or a GitLab hiccup; keep managing it as unknown
            self.lost(name)
            return
        self.gone.discard(name)
        self.not_found.pop(name, None)
        self.found += 1
        before = self.paused.get(name)
        if before is not None and info.paused != before:  # runnerctl writes no state it does not cache
            log.warning("runner %s was %s in GitLab by someone other than runnerctl, which sets it as its "
                        "plan says: to hold runners back, use `runnerctl pause` or the web page",
                        name, "paused" if info.paused else "resumed")
        self.paused[name] = info.paused
        self.online[name] = info.online
        self.max_timeout[name] = info.maximum_timeout
        self.tags[name] = tuple(info.tags)
        self.cap_unknown.discard(name)

    def lost(self, name: str) -> None:
        """GitLab answered 404 for the runner: its state is unknown, and nothing is sent to
        it until a read finds it again (warned once until then)."""
        if name not in self.gone:
            log.warning("runner %s (id %s) not found in GitLab; nothing is sent to it until it is "
                        "found again; if it was deleted, run `runnerctl init`, then restart `runnerctl "
                        "serve` (it reads the runners' ids at its start)", name, self.ids[name])
        self.gone.add(name)
        self.not_found[name] = self.not_found.get(name, 0) + 1
        self.paused[name] = self.online[name] = self.max_timeout[name] = None
        self.cap_unknown.add(name)

    def may_be_open(self, name: str) -> bool:
        """A runner GitLab answered 404 for fewer than `GONE_AFTER` times in a row: maybe
        a hiccup (a proxy, a GitLab restarting), the runner still there and open, so no
        runner sharing a GPU with it may be resumed (S1; `act.apply`) until a read finds it
        (it is then paused like any other) or GitLab says 404 again. A fresh controller
        whose first reads met a short run of 404s resumed a block over a single that was
        open in GitLab (found by the controller's property test)."""
        return name in self.gone and self.not_found.get(name, 0) < GONE_AFTER

    def known_caps(self) -> dict[str, int | None]:
        """Each runner's maximum timeout where it is known (`caps.to_send`)."""
        return {name: cap for name, cap in self.max_timeout.items() if name not in self.cap_unknown}

    def timeout_bound(self, names: Iterable[str], own: Mapping[str, int | None] | None = None) -> int | None:
        """The longest a job started by any of these runners can run: the largest of
        their maximum timeouts, or None when one of them has none (or is unread). `own`:
        the runners' own maximum timeouts to read instead (with backfill by estimate, a
        deadline's maximum timeout is no bound on the jobs the runner takes later)."""
        caps = [self.max_timeout.get(name) if own is None else own.get(name) for name in names]
        return None if not caps or None in caps else max(c for c in caps if c is not None)

    def set(self, name: str, paused: bool | None) -> None:
        if name in self.paused:
            self.paused[name] = paused


def gate_step(snapshot: GpuSnapshot, gate: Mapping[int, GateState], *, now: float, is_ci: IsCi,
              owned: Iterable[int], limits: GateThresholds,
              unreadable: Mapping[int, str] | None = None) -> dict[int, GateState]:
    owned_set, problems = set(owned), unreadable or {}
    return {gpu.index: step(gate.get(gpu.index, GateState()), gpu, now=now, is_ci=is_ci,
                            owned=gpu.index in owned_set, limits=limits,
                            lease_problem=problems.get(gpu.index, ""), host_problem=snapshot.host_problem)
            for gpu in snapshot.gpus}
