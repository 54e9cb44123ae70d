"""One log line per record: control characters in messages are escaped.

Reasons, user names and job fields come from people (a toggle's reason, a sign-in name,
a webhook); a newline in one would let its author forge a log line of their own. The
formatter escapes every control character of the message (`\\n`, `\\x1b`, ...); a
traceback that follows a record is ours and stays as it is.
"""

from __future__ import annotations

import logging
import os
import re
import sys

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """`text` with control characters written as escapes (`\\n`, `\\x07`)."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


class OneLineFormatter(logging.Formatter):
    def __init__(self, fmt: str, *, journal: bool = False) -> None:
        super().__init__(fmt)
        self.journal = journal

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = one_line(record.message)
        return super().formatMessage(record)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if not self.journal:
            return text
        prefix = f"<{syslog_priority(record.levelno)}>"  # each line: a traceback's too
        return "\n".join(prefix + line for line in text.split("\n"))


def syslog_priority(level: int) -> int:
    """journald's priority for a logging level (sd-daemon(3) `<N>` prefixes: 3 err, 4 warning,
    6 info, 7 debug)."""
    if level >= logging.CRITICAL:
        return 2
    if level >= logging.ERROR:
        return 3
    if level >= logging.WARNING:
        return 4
    return 6 if level >= logging.INFO else 7


def to_journal() -> bool:
    """Whether stderr is connected to journald: systemd sets JOURNAL_STREAM to its
    `device:inode` (systemd.exec(5)); a redirected stderr (a pipe, a file) is another file."""
    expected = os.environ.get("JOURNAL_STREAM", "")
    try:
        found = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return bool(expected) and expected == f"{found.st_dev}:{found.st_ino}"


def configure(level: int, fmt: str) -> None:
    """Like logging.basicConfig(level, format), with the one-line formatter; under systemd,
    each line carries its syslog priority (`<3>`, `<4>`, ...), which journald reads, so
    `journalctl -p err` finds the errors."""
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter(fmt, journal=to_journal()))
    logging.basicConfig(level=level, handlers=[handler])
