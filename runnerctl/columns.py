"""Text columns for a terminal, measured as it draws them: a CJK character or an emoji
takes two cells (Unicode East Asian Width W or F), so a Japanese name padded by its
character count pushed the rest of its row out of line."""

from __future__ import annotations

import unicodedata


def cells(text: str) -> int:
    """Terminal cells `text` takes (combining marks none, wide characters two)."""
    return sum(_width(ch) for ch in text)


def fit(text: str, width: int) -> str:
    """`text` cut to at most `width` cells and padded with spaces to exactly that many."""
    out, used = [], 0
    for ch in text:
        w = _width(ch)
        if used + w > width:
            break
        out.append(ch)
        used += w
    return "".join(out) + " " * (width - used)


def pad(text: str, width: int) -> str:
    """`text` padded with spaces to `width` cells; a longer one whole."""
    return text + " " * max(0, width - cells(text))


def _width(ch: str) -> int:
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
