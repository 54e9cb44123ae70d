"""`python -m runnerctl.executors <stage> ...`: what config.toml's custom executor runs."""

import sys

from runnerctl.executors.stop import STAGE_STOP

STAGE_STOP.install()  # first: a SIGTERM while the rest imports is recorded, not the job's orphan

from runnerctl.executors.stages import main  # noqa: E402

raise SystemExit(main(sys.argv[1:]))
