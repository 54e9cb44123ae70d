"""Each benchmark owns one section of benchmarks/RESULTS.md, between its markers, so
one can run again alone and leave the other tables as they are."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def write_section(name: str, lines: list[str]) -> None:
    """Put `lines` between `<!-- NAME:begin -->` and `<!-- NAME:end -->`, replacing what
    was there, or append the section."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    section = "\n".join([begin, *lines, end])
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    if begin in text:
        head, rest = text.split(begin, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    RESULTS.write_text(text)
