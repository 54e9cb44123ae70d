"""`python -m runnerctl.executors <stage> ...`: what config.toml's custom executor runs.

SIGQUIT is ignored (below). An import that fails (a broken install: a missing or
shadowed dependency) ends the stage as a system failure naming it. Python's own exit 1
would be BUILD_FAILURE_EXIT_CODE to gitlab-runner (executors/custom/command/command.go),
the user's script failing, which GitLab never retries (found by a review as a
gitlab-runner maintainer)."""

import os
import signal
import sys

# gitlab-runner's graceful stop is SIGQUIT ("exit as soon as the running builds finish"),
# and its docs have systemd send it (KillSignal=SIGQUIT, docs/configuration/init.md) to
# every process of the unit, the stages and a shell job's processes included: the driver
# died of it (exit -3, a system failure) and left a docker job running unwatched. Ignored
# here, and so by the shell driver's jobs, which inherit it (docs/executors.md).
signal.signal(signal.SIGQUIT, signal.SIG_IGN)

try:
    from runnerctl.executors.stop import STAGE_STOP

    STAGE_STOP.install()  # first: a SIGTERM while the rest imports is recorded, not the job's orphan

    from runnerctl.executors.stages import main
except Exception as exc:  # noqa: BLE001 - whatever broke, the host is at fault, not the job
    code = os.environ.get("SYSTEM_FAILURE_EXIT_CODE", "2")
    print(f"runnerctl: the stage driver cannot start on this host ({type(exc).__name__}: {exc}); "
          f"reinstall runnerctl here", file=sys.stderr, flush=True)
    raise SystemExit(int(code) if code.isascii() and code.isdigit() else 2) from None

raise SystemExit(main(sys.argv[1:]))
