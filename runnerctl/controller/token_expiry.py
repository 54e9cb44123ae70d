"""The GitLab token's expiry: read from GitLab now and then, and said before the day.

Since GitLab 16.0 every personal, group and project access token has an expiry date (365
days when none is given), and GitLab refuses it with 401 `invalid_token` from the start of
that day (lib/api/api_guard.rb; PersonalAccessToken's `active` scope, gitlab-org/gitlab MR
93504). A serve whose token expired can neither pause nor resume a runner: multi-GPU jobs
stop being composed, with nothing said before. So serve reads `GET
/personal_access_tokens/self` at its first tick and every `CHECK_S` after, and from
`WARN_DAYS` before the day it logs the date (once a day), names it on `/healthz` under
`notices` (a notice, not a failure: the host still works), and the exporter serves
`runnerctl_gitlab_token_expiry_timestamp_seconds` for the alert
`RunnerctlGitLabTokenExpiring`. An OAuth token, or a GitLab without the endpoint, says
nothing and is not asked again until the next check.
"""

from __future__ import annotations

import datetime
import math

from runnerctl.controller.demand import due
from runnerctl.gitlab import GitLabPort

CHECK_S = 6 * 3600.0
"""How often serve reads the token's expiry from GitLab (one request)."""
WARN_DAYS = 14
"""From how many days before its expiry the token is named on /healthz and in the log."""
ROTATE = ("make a new token (scope api) and put it in serve's environment, then restart serve "
          "(docs/operations.md, \"Rotating the GitLab token\")")


class TokenExpiry:
    def __init__(self, *, check_s: float = CHECK_S, warn_days: int = WARN_DAYS) -> None:
        self.check_s, self.warn_days = check_s, warn_days
        self.checked = -math.inf
        self.expires_at: float | None = None
        """The start of the expiry day, UTC, in seconds since the epoch; None: never, or not known."""

    def due(self, now: float) -> bool:
        return due(now, self.checked + self.check_s, self.check_s)

    def read(self, gitlab: GitLabPort, now: float) -> None:
        """Ask GitLab; a GitLabError propagates (the read fails like any other GitLab read)
        and the next tick that talks to GitLab asks again, not `check_s` later."""
        info = gitlab.token_info()
        day = None if info is None else info.expires_on
        self.expires_at = None if day is None else datetime.datetime.combine(
            day, datetime.time(), tzinfo=datetime.UTC).timestamp()
        self.checked = now

    def notice(self, now: float) -> str:
        """What to tell an admin now; "" while the day is further than `warn_days`."""
        if self.expires_at is None:
            return ""
        left_s = self.expires_at - now
        if left_s > self.warn_days * 86400:
            return ""
        day = datetime.datetime.fromtimestamp(self.expires_at, datetime.UTC).date().isoformat()
        if left_s <= 0:
            return f"the GitLab token expired on {day}: {ROTATE}"
        days = math.ceil(left_s / 86400)
        return (f"the GitLab token expires on {day} (in {days} day{'s' if days != 1 else ''}); GitLab "
                f"refuses it from then on and no runner is paused or resumed: {ROTATE}")
