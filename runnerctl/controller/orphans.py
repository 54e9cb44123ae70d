"""Leases whose job is long over in GitLab: found here, freed by the controller.

A job's leases are released by its cleanup stage, or as stale by the next prepare once
its gitlab-runner is gone. One case escapes both: cleanup itself was killed (past
`cleanup_exec_timeout`, say behind a Docker engine that stopped answering) while
gitlab-runner runs on. The lease then holds its GPUs, and every job sent there waits
at the gate and fails, until gitlab-runner restarts. Only GitLab knows that such a job
is over, so the controller asks.

At most one look per `check_s`, taken from the API budget: the running jobs of one
runner that holds leases (`GET /runners/:id/jobs?status=running`), and only when a
leased job is missing there a second request for its `canceling` jobs (charged to the
budget as a debt the next requests repay). A job being
cancelled is still at work: gitlab-runner runs after_script (up to 5 min), uploads and
cleanup before it reports, and GitLab keeps it `canceling` meanwhile
(gitlabhq app/models/concerns/ci/has_status.rb `EXECUTING_STATUSES = running,
canceling`). So a job listed as running or canceling is live, and is never freed. A
suspect that is due for its second look comes first, else runners take turns. A leased
job missing from both lists is a suspect. If it is still missing at a look `orphan_after_s` or more after
the first, it is over for good: gitlab-runner lets no cleanup run that long. The
controller then frees it (`JobSource.free`): the executors' own reaping (processes
carrying the lease's token, containers by label, Slurm jobs), then release. A job
listed as running again stops being a suspect. Any doubt (GitLab failing) frees
nothing.

The same answer names each running job's user as GitLab knows it, which the job's own
variables may not: GitLab lists `.gitlab-ci.yml` variables before its user variables
(gitlabhq lib/gitlab/ci/variables/builder.rb `scoped_variables`: yaml_variables, then
user_variables), so a job that sets GITLAB_USER_LOGIN hands its lease, and its GPU time,
to whomever it names. `users` keeps GitLab's word for the history (`History.confirm`),
and a slot holding a job whose user no one has confirmed gets the next look.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

from runnerctl.controller.demand import FINAL, ApiBudget, due
from runnerctl.errors import GitLabError, PermanentError
from runnerctl.gitlab import GitLabPort

log = logging.getLogger(__name__)
ENDED = FINAL | {"skipped"}
"""A job's statuses once it is over (app/models/concerns/ci/has_status.rb COMPLETED_STATUSES)."""


class OrphanAudit:
    def __init__(self, *, check_s: float, orphan_after_s: float) -> None:
        self.check_s = check_s
        self.orphan_after_s = orphan_after_s
        self.suspects: dict[int, float] = {}
        """Leased job id -> when GitLab first did not list it as running."""
        self._next_at = float("-inf")
        self._turn = 0
        self.users: dict[int, str] = {}
        """Job id -> its user as GitLab lists it, from the looks since `take_users`."""
        self._looked: set[int] = set()  # leased jobs whose slot has had a look
        self.doubted: set[int] = set()  # suspects whose end GitLab would not confirm (said once)
        self._ask_again: dict[int, float] = {}  # doubted suspect -> when GitLab is asked again

    def over(self, running: Mapping[str, tuple[int, ...]], runner_ids: Mapping[str, int], *,
             gitlab: GitLabPort, budget: ApiBudget, now: float,
             unconfirmed: Collection[int] = (), projects: Mapping[int, str] | None = None,
             ) -> list[tuple[int, float]] | None:
        """(job, seconds GitLab has not listed it as running or canceling) for each leased
        job to free now, no longer a suspect; None when it did not ask GitLab this time. A GitLabError
        propagates, and nothing is freed."""
        leased = {slot: [job for job in jobs if job >= 0] for slot, jobs in running.items()
                  if slot in runner_ids}
        leased = {slot: jobs for slot, jobs in leased.items() if jobs}
        held = {job for jobs in leased.values() for job in jobs}
        self.suspects = {job: since for job, since in self.suspects.items() if job in held}
        self._looked &= held
        self.doubted &= held
        self._ask_again = {job: at for job, at in self._ask_again.items() if job in self.suspects}
        if not leased or not due(now, self._next_at, self.check_s) or not budget.try_take():
            return None
        self._next_at = now + self.check_s
        slot = self._pick(leased, now, unconfirmed)
        runner = runner_ids[slot]
        jobs = gitlab.running_jobs(runner)
        if not {job.id for job in jobs} >= set(leased[slot]):  # missing: it may be finishing as canceling
            budget.charge()  # part of this look (rare: a lease outliving its job's end)
            jobs = [*jobs, *gitlab.running_jobs(runner, status="canceling")]
        listed = {job.id for job in jobs}
        self._looked.update(leased[slot])
        self.users.update((job.id, job.user) for job in jobs if job.user)
        over = []
        for job in leased[slot]:
            if job in listed:
                self.suspects.pop(job, None)
            elif now - self.suspects.setdefault(job, now) >= self.orphan_after_s:
                project = (projects or {}).get(job, "")
                if now < self._ask_again.get(job, now):
                    continue  # in doubt: asked again orphan_after_s on, not at each look
                if project and not self._ended(gitlab, budget, project, job):
                    if job in self.suspects:
                        self._ask_again[job] = now + self.orphan_after_s
                    continue
                over.append((job, now - self.suspects.pop(job)))
        return over

    def _ended(self, gitlab: GitLabPort, budget: ApiBudget, project: str, job: int) -> bool:
        """Does GitLab say the job is over? Its runner's list is no proof: GitLab lists there
        only jobs of projects where the token's user is Reporter or more, unless an
        administrator (app/finders/ci/runner_jobs_finder.rb `by_permission`), so a running
        job of another project was freed, its processes killed (found by a review as a
        researcher running multi-day jobs). Asked of the job itself (`GET /projects/:id/
        jobs/:job_id`, by the project's path the lease records); a job the token cannot
        read is doubt, said once, and never freed."""
        budget.charge()
        why = "GitLab answers 404 for it (gone, or the token cannot read the project)"
        try:
            found = gitlab.job(project, job)
        except PermanentError as exc:  # 403: a Guest, or no role: as a 404, the token's reach
            found, why = None, f"GitLab refuses it ({exc})"
        except GitLabError as exc:  # GitLab failing: asked again later, nothing freed meanwhile
            log.warning("job %d's lease: GitLab failed on the job itself (%s); asked again in %.0f s",
                        job, exc, self.orphan_after_s)
            return False
        if found is not None and found.status in ENDED:
            return True
        if found is not None:  # still at work: GitLab's runner list left it out
            self.suspects.pop(job, None)
        elif job not in self.doubted:
            self.doubted.add(job)
            log.warning("job %d (project %s) still holds a lease, and its runner's jobs in GitLab do not "
                        "list it, but %s: not freed; give the token Reporter in %s, or stop the job's "
                        "processes and release its lease by hand", job, project, why, project)
        return False

    def shift(self, step: float) -> None:
        """The wall clock stepped by `step` seconds: the times kept move with it."""
        self.suspects = {job: since + step for job, since in self.suspects.items()}
        self._next_at += step

    def take_users(self) -> dict[int, str]:
        """GitLab's user of each job the looks since the last call listed."""
        users, self.users = self.users, {}
        return users

    def _pick(self, leased: Mapping[str, list[int]], now: float, unconfirmed: Collection[int]) -> str:
        due = [job for job, since in sorted(self.suspects.items(), key=lambda item: item[1])
               if now - since >= self.orphan_after_s and now >= self._ask_again.get(job, now)]
        if due:  # the longest-missing suspect gets its second look first
            return next(slot for slot, jobs in leased.items() if due[0] in jobs)
        names = sorted(leased)
        unknown = [slot for slot in names if (set(leased[slot]) & set(unconfirmed)) - self._looked]
        if unknown:  # then a job whose user only its own variables name, once
            return unknown[0]
        self._turn += 1
        return names[self._turn % len(names)]
