"""gitlab-runner's stop of a stage (SIGTERM), latched from the driver's first moment.

gitlab-runner stops a stage with SIGTERM on a timeout or cancel, then SIGKILL after the
graceful timeout (gitlab-org/gitlab-runner helpers/process/killer_unix.go, driven by
executors/custom/command/command.go). It may come at any moment: also while Python
starts, or between starting the job's process and knowing how to stop it. With
Python's default action the driver then died and left the job running on the GPU.

`STAGE_STOP` records a stop until the driver `arm`s it with what stops the job (once
the process group, container exec or batch job exists); `arm` acts at once if a stop
came before. `python -m runnerctl.executors` installs it before importing anything
else. Stages other than `run` start nothing that outlives them, so they `release` it:
the default action again, taken at once for a stop that came already.

This module imports nothing of runnerctl so that it can be installed first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from types import FrameType

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopLatch:
    """A stop recorded until there is something to stop, then passed on to its handler."""

    def __init__(self) -> None:
        self._handler: Callable[[], None] | None = None
        self._previous: dict[int, object] = {}
        self.pending: int | None = None  # the signal of a stop not yet acted on
        self.stopped_at: float | None = None
        """When (time.monotonic) the armed handler was first called: the driver finishes
        the stop before it returns, as its helper threads end with it."""

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    def install(self) -> None:
        """From now on SIGTERM and SIGINT are recorded here, not the process's end."""
        if not self.installed:
            self._previous = {sig: signal.signal(sig, self._signalled) for sig in _SIGNALS}

    def release(self) -> None:
        """Back to the previous handlers; a stop that came already is taken by them now."""
        pending = self.pending
        self.uninstall()
        if pending is not None:
            os.kill(os.getpid(), pending)

    def uninstall(self) -> None:
        """Back to the previous handlers, forgetting any stop recorded."""
        previous, self._previous = self._previous, {}
        for sig, old in previous.items():
            signal.signal(sig, old)  # type: ignore[arg-type]
        self.pending = None

    def arm(self, handler: Callable[[], None]) -> None:
        """From now on a stop calls `handler`; at once if a stop already came."""
        self._handler = handler  # a signal from here on calls it and leaves pending alone
        pending, self.pending = self.pending, None
        if pending is not None:
            self._stop(handler)

    def disarm(self) -> None:
        """The job is over: a later stop has nothing to stop."""
        self._handler = None
        self.stopped_at = None

    def _stop(self, handler: Callable[[], None]) -> None:
        if self.stopped_at is None:
            self.stopped_at = time.monotonic()
        handler()

    def _signalled(self, signum: int, frame: FrameType | None) -> None:
        if self._handler is None:
            self.pending = signum
        else:
            self._stop(self._handler)  # runs in a signal handler: it only starts things, never waits


STAGE_STOP = StopLatch()
"""The process's latch: one stage per process, as gitlab-runner runs them."""


@contextlib.contextmanager
def on_stop() -> Iterator[StopLatch]:
    """The stop of the job started in this block: enter before starting anything, then `arm`.

    The handler given to `arm` runs in a signal handler while the main thread waits on
    the job, so it must only start things (a signal, a thread), never wait for them.
    """
    installed_here = not STAGE_STOP.installed
    STAGE_STOP.install()
    try:
        yield STAGE_STOP
    finally:
        STAGE_STOP.disarm()
        if installed_here:  # called in-process (tests, a library): leave the handlers as found
            STAGE_STOP.uninstall()
