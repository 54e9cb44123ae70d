"""One custom executor stage whose SIGTERM lands in the driver's worst moment.

gitlab-runner stops a stage with SIGTERM at any time (gitlab-org/gitlab-runner
helpers/process/killer_unix.go, executors/custom/command/command.go). The worst time is
right after the driver started the job's process (a process group, a `docker exec`, a
batch job) and before it armed its stop handler. This runs the stage as
`python -m runnerctl.executors` does, but sends the driver its own SIGTERM exactly
then: each time a StopLatch is armed, the signal comes first.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

from runnerctl.executors import stop
from runnerctl.executors.stages import main

_arm = stop.StopLatch.arm


def _stopped_then_armed(self: stop.StopLatch, handler: Callable[[], None]) -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # delivered before the next bytecode: before arming
    _arm(self, handler)


stop.StopLatch.arm = _stopped_then_armed  # type: ignore[method-assign]
raise SystemExit(main(sys.argv[1:]))
