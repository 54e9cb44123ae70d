"""`python -m runnerctl.executors <stage> ...`: what config.toml's custom executor runs."""

import sys

from runnerctl.executors.stages import main

raise SystemExit(main(sys.argv[1:]))
