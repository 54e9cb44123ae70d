"""Apply a plan: pauses first, resumes only once every pause went through (S1).

Between the two, the runners' maximum job timeouts for backfill by estimate
(`controller.caps`): a runner is resumed only once its maximum timeout is what the plan
needs, so a job it picks is killed at its drain's deadline; a failed one skips the
resumes as a failed pause does.

One failed action never stops the loop. A failed pause leaves that runner's state
unknown and skips every resume of the tick (a resume must never overlap a runner that
might still be open); a failed resume leaves its runner paused or, if the request timed
out, unknown, and the next tick sends the desired state again. A runner GitLab answers
404 for is gone (`RunnerCache.lost`): nothing more is sent to it until a read finds it,
and the others are not backed off for it. GitLab failures are logged once per kind
(repeats go to debug), and the loop backs off by the error's delay (`Retry-After` for a
429), doubling on repeats up to a cap.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence

from runnerctl.controller.demand import due
from runnerctl.controller.observe import RunnerCache
from runnerctl.controller.plan import Decision, differences
from runnerctl.errors import GitLabError, NotFoundError, PermanentError, TemporaryError
from runnerctl.gitlab import GitLabPort
from runnerctl.layout import slot_tags
from runnerctl.model import Slot
from runnerctl.standby import VERIFY_EVERY_S, Standby

log = logging.getLogger(__name__)
DEFAULT_DELAY_S = 5.0
"""Back-off after a failure that names no delay (a permanent error: 401, 403, 404)."""


@dataclasses.dataclass(frozen=True)
class Action:
    decision: Decision
    ok: bool
    error: str = ""
    cap: bool = False
    """A maximum timeout set (`_cap`), not a pause or resume."""


class GitLabHealth:
    """Logs each kind of failure once, and says when to try GitLab again."""

    def __init__(self, *, backoff_max_s: float = 300.0, logger: logging.Logger = log) -> None:
        self.backoff_max_s = backoff_max_s
        self.retry_at = 0.0
        self.failures = 0
        self.last_error = ""
        self.write_error = ""
        """A pause or resume GitLab refused for good (a token without the `api` scope or
        the role to change runners): kept until one succeeds, whatever reads answer."""
        self._logged: str | None = None
        self._log = logger

    def ready(self, now: float) -> bool:
        return due(now, self.retry_at, self.backoff_max_s)

    def failed(self, exc: GitLabError, now: float, *, write: bool = False) -> None:
        base = exc.delay if isinstance(exc, TemporaryError) else DEFAULT_DELAY_S
        told = isinstance(exc, TemporaryError) and exc.told  # Retry-After: as GitLab said, not doubled
        delay = min(self.backoff_max_s, base if told else base * (2 ** min(self.failures, 10)))
        self.failures += 1
        self.retry_at = now + delay
        self.last_error = str(exc)
        if write and isinstance(exc, PermanentError):
            self.write_error = str(exc)
        kind = f"{type(exc).__name__}:{str(exc).split('(')[0][:60]}"
        if kind != self._logged:
            self._log.warning("GitLab failed: %s; runners stay as they are or paused; retrying in %.0f s",
                              exc, delay)
            self._logged = kind
        else:
            self._log.debug("GitLab failed again: %s; retrying in %.0f s", exc, delay)

    def ok(self, *, write: bool = False) -> None:
        """A request answered; `write`: a pause, resume or cap. While writes are refused
        for good (`write_error`) an answered read changes nothing: the trouble stays,
        said once, backing off (it said "answers again" and logged the refusal anew on
        every tick, 35,000 lines a day, with /healthz green; found by a review as a GitLab
        admin reducing the token's scope)."""
        if write:
            self.write_error = ""
        elif self.write_error:
            return
        if self._logged is not None:
            self._log.warning("GitLab answers again")
        self.failures, self._logged, self.last_error = 0, None, ""


def apply(decisions: Sequence[Decision], *, gitlab: GitLabPort, cache: RunnerCache,
          health: GitLabHealth, now: float,
          on_action: Callable[[Action], None] = lambda a: None,
          caps: Mapping[str, int | None] | None = None) -> list[Action]:
    """Send the plan's pauses, then `caps` (runner name -> maximum timeout to set, None
    clears: `caps.to_send`), then its resumes, but none over a GPU of a runner that may
    still be open behind a 404 (`RunnerCache.may_be_open`)."""
    pauses, resumes = differences([d for d in decisions if d.slot.name in cache.ids
                                   and d.slot.name not in cache.gone], cache.paused)
    done: list[Action] = []
    for decision in pauses:
        done.append(_send(decision, gitlab=gitlab, cache=cache, health=health, now=now))
        on_action(done[-1])
        if not done[-1].ok:
            break  # GitLab is failing: try nothing more this tick
    if any(not a.ok for a in done):
        return done
    by_name = {d.slot.name: d for d in decisions}
    for name, seconds in (caps or {}).items():
        if name not in cache.ids or name not in by_name or name in cache.gone:
            continue
        done.append(_cap(by_name[name], seconds, gitlab=gitlab, cache=cache, health=health, now=now))
        on_action(done[-1])
        if not done[-1].ok:
            return done  # its runner must not open without it
    maybe_open = [d.slot for d in decisions if cache.may_be_open(d.slot.name)]
    for decision in resumes:
        if any(set(decision.slot.gpus) & set(slot.gpus) for slot in maybe_open):
            continue  # S1: a runner over one of its GPUs may still be open in GitLab
        done.append(_send(decision, gitlab=gitlab, cache=cache, health=health, now=now))
        on_action(done[-1])
        if not done[-1].ok:
            break
    return done


def _send(decision: Decision, *, gitlab: GitLabPort, cache: RunnerCache, health: GitLabHealth,
          now: float) -> Action:
    name = decision.slot.name
    try:
        gitlab.set_paused(cache.ids[name], not decision.open)
    except NotFoundError as exc:  # this runner is gone, not GitLab: no back-off for the others
        cache.lost(name)
        return Action(decision, False, str(exc))
    except GitLabError as exc:
        health.failed(exc, now, write=True)
        cache.set(name, None)  # a timed-out request may still have been applied
        return Action(decision, False, str(exc))
    cache.set(name, not decision.open)
    health.ok(write=True)
    return Action(decision, True)


def _cap(decision: Decision, seconds: int | None, *, gitlab: GitLabPort, cache: RunnerCache,
         health: GitLabHealth, now: float) -> Action:
    name = decision.slot.name
    try:
        gitlab.set_maximum_timeout(cache.ids[name], seconds)
    except NotFoundError as exc:  # this runner is gone, not GitLab: no back-off for the others
        cache.lost(name)
        return Action(decision, False, str(exc), cap=True)
    except GitLabError as exc:
        health.failed(exc, now, write=True)
        cache.cap_unknown.add(name)  # a timed-out request may still have been applied
        return Action(decision, False, str(exc), cap=True)
    cache.max_timeout[name] = seconds
    cache.cap_unknown.discard(name)
    health.ok(write=True)
    return Action(decision, True, cap=True)


STANDBY_RETRY_S = 60.0


class StandbyKeeper:
    """Keeps the host's stand-by runner online (see runnerctl/standby.py): a
    `POST /runners/verify` with its own token and its one system_id every
    `VERIFY_EVERY_S`, retried a minute after a failure, and each time
    `GitLabPort.contact_runner` too: GitLab 16 and 17 skip `contacted_at` on a verify with
    a `glrt-` token, and newer GitLab answers it with a 404 that changes nothing. Sent only
    once a verify had left the runner offline, a restarted serve, finding it still online
    from its predecessor's calls, let it go offline for up to 15 minutes (found by the final
    review of the session). Failures are logged once while they last; so is a runner
    still not online."""

    def __init__(self, standby: Standby | None, *, every_s: float = VERIFY_EVERY_S,
                 logger: logging.Logger = log) -> None:
        self.standby = standby
        self.every_s = every_s
        self.verified_at: float | None = None
        self.retry_at = 0.0
        self.error = ""
        self._log = logger

    def due(self, now: float) -> bool:
        if self.standby is None or not due(now, self.retry_at, self.every_s):
            return False
        return self.verified_at is None or due(now, self.verified_at + self.every_s, self.every_s)

    def status(self) -> str:
        if self.standby is None:
            return "none"
        return self.error or ("online" if self.verified_at is not None else "not yet verified")

    def keep_online(self, gitlab: GitLabPort, now: float) -> None:
        standby = self.standby
        if standby is None or not self.due(now):
            return
        try:
            gitlab.heartbeat_runner(standby.token, system_id=standby.system_id)
            gitlab.contact_runner(standby.token)
            info = gitlab.get_runner(standby.id)
        except GitLabError as exc:
            self.retry_at = now + STANDBY_RETRY_S
            self._failed(f"cannot keep the stand-by runner {standby.id} online: {exc}; GitLab may drop "
                         "multi-GPU jobs that wait over an hour (runner deleted or token refused: delete "
                         "runnerctl-standby.json beside config.toml and run `runnerctl init` again)")
            return
        self.verified_at = now
        if info is not None and info.paused:  # by hand in GitLab's UI: it looks idle there
            try:
                gitlab.set_paused(standby.id, False)
            except GitLabError as exc:
                self.retry_at = now + STANDBY_RETRY_S
                self._failed(f"the stand-by runner {standby.id} is paused in GitLab and cannot be "
                             f"unpaused ({exc}): GitLab drops multi-GPU jobs that wait over an hour")
                return
            self._log.warning("the stand-by runner %s was paused in GitLab: unpaused (paused, it does not "
                              "keep GitLab from dropping multi-GPU jobs that wait for a drain)", standby.id)
        if info is not None and info.online is False:
            self._failed(f"GitLab does not count the stand-by runner {standby.id} online, neither after a "
                         "verify nor after DELETE /runners/managers; multi-GPU jobs that wait over an hour "
                         "may be dropped")
            return
        if self.error:
            self._log.warning("the stand-by runner %s is online again", standby.id)
        self.error = ""

    def _failed(self, message: str) -> None:
        if message != self.error:
            self._log.warning("%s", message)
        self.error = message


def retag(slots: Sequence[Slot], *, cache: RunnerCache, gitlab: GitLabPort) -> None:
    """A runner whose tags were changed in GitLab (its UI) gets its slot's back, logged:
    `gpus:4` added to a single let a 4-GPU job start on one GPU, and nothing said so
    (found by a review as a GitLab admin). A failure is logged once per runner and tried
    again at the runner's next read."""
    for slot in slots:
        found = cache.tags.get(slot.name)
        want = slot_tags(slot)
        if found is None or sorted(found) == sorted(want) or slot.name in cache.gone:
            continue
        try:
            gitlab.set_tags(cache.ids[slot.name], want)
        except GitLabError as exc:
            if slot.name not in cache.retag_failing:
                log.warning("runner %s has tags %s in GitLab, not its slot's %s, and setting them back "
                            "failed: %s", slot.name, ", ".join(found), ", ".join(want), exc)
            cache.retag_failing.add(slot.name)
            continue
        cache.retag_failing.discard(slot.name)
        log.warning("runner %s had tags %s in GitLab (changed there): set back to %s", slot.name,
                    ", ".join(found) or "none", ", ".join(want))
        cache.tags[slot.name] = tuple(want)
