"""What a build writes its log to, and what it ends with, for `runnerctl sim runner`.

`Trace` is the part of gitlab-runner's common/trace.go JobTrace a build uses: the log,
and the cancel and abort functions the trace calls when GitLab answers `canceling` or
`canceled` (network/trace.go). `JobTrace` (runner_api.py) sends it to GitLab;
`LocalTrace` keeps it in memory for a build with no GitLab. `MaskingTrace` writes masked
variables' values as `[MASKED]` (common/buildlogger/internal/masker). `Outcome` is what
the final `PUT /jobs/:id` says.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Protocol


class Trace(Protocol):
    """What a build writes to and hangs its cancel and abort on (common/trace.go JobTrace)."""

    def write(self, text: str) -> None: ...

    def set_cancel(self, fn: Callable[[], None] | None) -> None: ...

    def set_abort(self, fn: Callable[[], None] | None) -> None: ...


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What gitlab-runner sends in the final `PUT /jobs/:id`."""

    state: str  # success | failed
    failure_reason: str | None = None
    exit_code: int = 0
    message: str = ""


class MaskingTrace:
    """common/buildlogger/internal/masker: masked variables' values read `[MASKED]` in the log."""

    def __init__(self, trace: Trace, phrases: set[str]) -> None:
        self._trace = trace
        self._phrases = sorted(phrases, key=len, reverse=True)

    def write(self, text: str) -> None:
        for phrase in self._phrases:
            text = text.replace(phrase, "[MASKED]")
        self._trace.write(text)

    def set_cancel(self, fn: Callable[[], None] | None) -> None:
        self._trace.set_cancel(fn)

    def set_abort(self, fn: Callable[[], None] | None) -> None:
        self._trace.set_abort(fn)


class LocalTrace:
    """A trace kept in memory, for a build with no GitLab (the executor tests' harness)."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._lock = threading.Lock()
        self._cancel: Callable[[], None] | None = None
        self._abort: Callable[[], None] | None = None

    def write(self, text: str) -> None:
        with self._lock:
            self._parts.append(text)

    def text(self) -> str:
        with self._lock:
            return "".join(self._parts)

    def set_cancel(self, fn: Callable[[], None] | None) -> None:
        self._cancel = fn

    def set_abort(self, fn: Callable[[], None] | None) -> None:
        self._abort = fn

    def cancel(self) -> bool:
        """network/trace.go Cancel: consumes the cancel function (steps only, once they run)."""
        fn, self._cancel = self._cancel, None
        if fn is not None:
            fn()
        return fn is not None
