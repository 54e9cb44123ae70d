"""Allow `python -m runnerctl`."""

from runnerctl.cli import entry

entry()
