"""One log line per record: control characters in messages are escaped.

Reasons, user names and job fields come from people (a toggle's reason, a sign-in name,
a webhook); a newline in one would let its author forge a log line of their own. The
formatter escapes every control character of the message (`\\n`, `\\x1b`, ...); a
traceback that follows a record is ours and stays as it is.
"""

from __future__ import annotations

import logging
import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """`text` with control characters written as escapes (`\\n`, `\\x07`)."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


class OneLineFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = one_line(record.message)
        return super().formatMessage(record)


def configure(level: int, fmt: str) -> None:
    """Like logging.basicConfig(level, format), with the one-line formatter."""
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter(fmt))
    logging.basicConfig(level=level, handlers=[handler])
