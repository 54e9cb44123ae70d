"""Runners' maximum job timeout while they backfill by estimate (`PlanPolicy.backfill_estimated`).

GitLab fixes a job's timeout as a runner picks it: the smaller of the job's own (else its
project's) and the runner's `maximum_timeout`, and kills the job then (gitlabhq
app/models/ci/build_metadata.rb `update_timeout_state`; the simulator's
`timeouts.gitlab_timeout`). A slot the planner opens for backfill by estimate has a
deadline (`Plan.deadlines`: its drain's expected end), so before its runner is resumed
its maximum timeout is set to end there, and set again as time passes whenever it is
off by more than `CAP_SLACK_S`: a job it picks ends by the deadline plus `CAP_SLACK_S`
and one tick. Every other runner that is to be open gets back its own maximum timeout
(`[controller] runner_max_timeout_s` for its size, else none) before it is resumed.
GitLab takes none under 10 minutes (`MIN_RUNNER_TIMEOUT_S`; the planner opens no such
slot with less time left: `controller.backfill`), and `PUT /runners/:id` with
`maximum_timeout` null clears it (lib/api/ci/runners.rb: `declared_params(include_missing:
false)` keeps a key given as null; app/models/ci/runner.rb allows nil).

The controller's loop (`act.apply`) and the simulator both use `to_send`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from runnerctl.settings import MIN_RUNNER_TIMEOUT_S

CAP_SLACK_S = 300.0
"""A deadline's runner gets a new maximum timeout only once the one it has is off by more
than this: about one request per backfill runner per 5 minutes, for a drained job that
may start up to this much later than the drain's expected end."""


def wanted(deadline: float | None, base: int | None, now: float) -> int | None:
    """The maximum timeout a runner should have now: its own (`base`) without a deadline;
    with one, what is left until then (at least GitLab's 10 minutes), never over its own."""
    if deadline is None:
        return base
    cap = max(MIN_RUNNER_TIMEOUT_S, int(deadline - now))
    return cap if base is None else min(cap, base)


def to_send(open_slots: Iterable[str], deadlines: Mapping[str, float], base: Mapping[str, int | None],
            current: Mapping[str, int | None], now: float) -> dict[str, int | None]:
    """Runner name -> the maximum timeout to set before it is (or stays) open; None
    clears it. `current` is what GitLab has (as last read or set; a runner missing from
    it is unknown and always gets one); paused runners keep theirs until they open again."""
    out: dict[str, int | None] = {}
    for name in open_slots:
        want = wanted(deadlines.get(name), base.get(name), now)
        if name not in current:
            out[name] = want
            continue
        have = current[name]
        if name in deadlines:
            if have is None or want is None or abs(have - want) > CAP_SLACK_S:
                out[name] = want
        elif have != want:
            out[name] = want
    return out


__all__ = ["CAP_SLACK_S", "to_send", "wanted"]
