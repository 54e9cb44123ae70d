"""Each benchmark owns one section of benchmarks/RESULTS.md, between its markers, so
one can run again alone and leave the other tables as they are.

RESULTS.md holds the figures of each benchmark's default run: a run with other options
(a quick one) prints its figures and writes nothing (`parse_args`), and every section
says which commit, day and machine measured it."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
_write = True


def parse_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """`parser.parse_args()` with `--no-write`; a run whose options are not all the
    defaults writes nothing to RESULTS.md (quick runs replaced the committed tables)."""
    global _write
    if not any("--no-write" in action.option_strings for action in parser._actions):
        parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md as it is")
    args = parser.parse_args()
    changed = [action.option_strings[0] for action in parser._actions
               if action.dest not in ("help", "no_write") and action.option_strings
               and getattr(args, action.dest) != action.default]
    _write = not args.no_write and not changed
    if changed and not args.no_write:
        print(f"RESULTS.md keeps the default run's figures: this run ({', '.join(changed)}) writes nothing")
    return args


def stamp() -> str:
    """Which commit, day and machine measured a section."""
    root = Path(__file__).resolve().parent.parent

    def git(*words: str) -> str:
        try:
            done = subprocess.run(["git", "-C", str(root), *words], capture_output=True, text=True,
                                  timeout=30, check=False)
        except OSError:
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or "an unknown commit"
    dirty = " with changes not yet committed" if git("status", "--porcelain", "--untracked-files=no") else ""
    day = datetime.datetime.now(datetime.UTC).date().isoformat()
    return (f"_Measured at {commit}{dirty} on {day}: {os.cpu_count()} CPUs ({platform.machine()}), "
            f"Python {platform.python_version()}._")


def write_section(name: str, lines: list[str]) -> None:
    """Put `lines` and the stamp between `<!-- NAME:begin -->` and `<!-- NAME:end -->`,
    replacing what was there, or append the section; nothing after a run with other
    options than the defaults, or with --no-write."""
    if not _write:
        return
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    section = "\n".join([begin, *lines, "", stamp(), end])
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    if begin in text:
        head, rest = text.split(begin, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    RESULTS.write_text(text)
