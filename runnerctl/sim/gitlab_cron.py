"""GitLab's hourly cron that fails waiting jobs, run against the simulator's hosts.

GitLab's `StuckCiJobsWorker` runs on the hour (`0 * * * *`, gitlabhq
`config/initializers/1_settings.rb`, `app/workers/stuck_ci_jobs_worker.rb`) and calls
`Ci::StuckBuilds::DropPendingService`: a job pending over 1 hour with no online, unpaused
runner whose tags cover it is dropped, and any job pending over 1 day. The rule itself
is `GitLabState.drop_stuck_jobs` (the one model of GitLab); this module shows that model
what GitLab would see at the cron's instant:

- every runner the policy registers, paused as it is then, online: gitlab-runner polls
  every `check_interval` whether the runner is paused or not, and GitLab records the
  contact before it refuses a paused runner (`authenticate_runner!` before the `active?`
  check in lib/api/ci/runner.rb `POST /jobs/request`). Runners alike in tags and paused
  state are one runner here: the rule only asks whether one exists;
- with `standby`, the host's stand-by runner (runnerctl/standby.py): unpaused, every tag
  of the host's slots, last contacted at the controller's last verify
  (`VERIFY_EVERY_S`);
- the jobs pending for over an hour (no other can be dropped), tagged `gpus:N` and
  `priority:P` as the templates tag them, created at their submit time: one of each
  kind, for GitLab's answer for a pending job depends only on its tags and project
  (`GitLabState.drop_stuck_jobs` asks once per tag set and project) and on whether it
  waited over a day; the answer for the one shown holds for every job of its kind
  (tens of thousands of jobs wait over an hour on the speed benchmark's large trace).

A fresh model per cron: GitLab's decision depends only on the state at that instant,
and the simulator's own queue stays the one record of who waits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from runnerctl.layout import slot_tags, standby_name, standby_tags
from runnerctl.sim.gitlab_state import OUTDATED_AFTER_S, STUCK_AFTER_S, GitLabState
from runnerctl.sim.hosts import SimHost
from runnerctl.standby import VERIFY_EVERY_S
from runnerctl.tags import gpus_tag, priority_tag

CRON_S = 3600.0
"""The worker runs on the hour."""
PROJECT = 1


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def job_tags(gpus: int, priority: str) -> list[str]:
    """The tags a trace job carries in GitLab (templates: `gpus:N` plus its priority)."""
    return [gpus_tag(gpus), priority_tag(priority)]


def drop_stuck(hosts: Sequence[SimHost], pending: Iterable[tuple[int, float, int, str]], now: float, *,
               standby: bool) -> list[tuple[int, str]]:
    """(job id, failure reason) of each pending job GitLab's cron fails at `now`;
    `pending` holds (job id, submit time, GPUs, priority)."""
    old = [job for job in pending if now - job[1] > STUCK_AFTER_S]
    if not old:
        return []
    clock = _Clock(now)
    state = GitLabState(clock=clock)
    for host in hosts:
        slots = [runner.slot for runner in host.runners]
        if standby and slots:
            clock.now = now - now % VERIFY_EVERY_S  # its last verify
            keep = state.create_runner(description=standby_name(slots[0].host), tags=standby_tags(slots))
            state.heartbeat(keep, "r_simulated00")
            clock.now = now
        seen: set[tuple[tuple[str, ...], bool]] = set()
        for runner in host.runners:
            key = (tuple(slot_tags(runner.slot)), runner.open)
            if key not in seen:
                seen.add(key)
                state.heartbeat(state.create_runner(description=runner.slot.name, tags=key[0],
                                                    paused=not runner.open))
    kinds = [(gpus, priority, now - submit > OUTDATED_AFTER_S) for _, submit, gpus, priority in old]
    shown: dict[tuple[int, str, bool], int] = {}  # kind -> GitLab's id of the job shown
    for (job_id, submit, gpus, priority), kind in zip(old, kinds, strict=True):
        if kind not in shown:
            clock.now = submit
            job = state.enqueue_job(project_id=PROJECT, tags=job_tags(gpus, priority), name=f"job {job_id}")
            shown[kind] = job.id
    clock.now = now
    reasons = {dropped.id: str(dropped.failure_reason) for dropped in state.drop_stuck_jobs()}
    return [(job[0], reasons[shown[kind]]) for job, kind in zip(old, kinds, strict=True)
            if shown[kind] in reasons]
