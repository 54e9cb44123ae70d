"""The shell driver: each job's stages run as one process group on the host.

It isolates nothing. The driver sets CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES and
RUNNERCTL_LEASE for the script, makes them readonly in the stage's bash and ignores the
job's own `export` of them (gitlab-runner's stage scripts export job variables), but a
job can still start `env CUDA_VISIBLE_DEVICES=0,1 python ...` and reach other GPUs. Use
the docker driver where that matters. What the shell driver does guarantee: the lease
(no second job is prepared on these GPUs) and the gate (no job starts next to a
foreign process).

Stages run in a new session, so a timeout or cancel is forwarded by the driver:
SIGTERM to the job's process group, then SIGKILL after the graceful timeout; reap
(cleanup) kills whatever still carries this job's RUNNERCTL_LEASE token and runs as
this driver's user, and nothing else (S4). A stored process group id is never signalled
after the fact: the group may be gone and its id reused.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import psutil

from runnerctl import __version__
from runnerctl.executors.contract import GRACEFUL_KILL_TIMEOUT_S
from runnerctl.executors.driver import StageContext, on_stop
from runnerctl.executors.lease import Lease, LeaseTable, token_processes
from runnerctl.settings import Settings

_GUARDED = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "RUNNERCTL_LEASE")
GUARD = (
    "export() { local a; for a in \"$@\"; do case \"${a%%=*}\" in "
    + "|".join(_GUARDED)
    + ") echo \"runnerctl: ignoring the job's ${a%%=*}: this job runs on GPUs "
    "$CUDA_VISIBLE_DEVICES\" >&2;; *) builtin export \"$a\";; esac; done; }\n"
    "readonly " + " ".join(_GUARDED) + "\n"
)
"""Bash that keeps the driver's GPU variables: readonly, and the job's `export` of them ignored."""
_PRELUDE = GUARD + 'source "$0"\n'


class ShellDriver:
    name = "shell"

    def config(self, ctx: StageContext) -> dict[str, Any]:
        key = ctx.args.slot.rsplit("/", 1)[-1]
        return {
            "builds_dir": str(Path(ctx.settings.builds_dir) / key),
            "cache_dir": str(Path(ctx.settings.cache_dir) / key),
            "builds_dir_is_shared": False,
            "hostname": ctx.settings.host.name,
            "driver": {"name": "runnerctl shell", "version": __version__},
            "job_env": {"RUNNERCTL_SLOT": ctx.args.slot},
        }

    def prepare(self, ctx: StageContext) -> None:
        for path in (ctx.settings.builds_dir, ctx.settings.cache_dir):
            Path(path).mkdir(parents=True, exist_ok=True)

    def run(self, ctx: StageContext, script: Path, stage: str) -> int:
        snapshot = ctx.gpu_source().snapshot()
        env = {**ctx.env, **ctx.gpu_env([snapshot.gpu(g).uuid for g in ctx.args.gpus])}
        proc = subprocess.Popen(["bash", "--noprofile", "--norc", "-c", _PRELUDE, str(script)],
                                env=env, start_new_session=True)
        LeaseTable(ctx.settings.state_dir).update(ctx.lease_token, pgid=proc.pid)

        token = ctx.lease_token
        with on_stop(lambda: _stop_group(proc, token)):
            return proc.wait()

    def reap(self, lease: Lease, settings: Settings) -> None:
        for proc in token_processes(lease.token):
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                continue


def _stop_group(proc: subprocess.Popen[bytes], token: str) -> None:
    """SIGTERM the job's group now and SIGKILL it a little before gitlab-runner gives up.

    Runs in a signal handler while the main thread waits on the process (so the group
    exists), and leaves the SIGKILL to a timer. By then the group may be gone and its
    id reused, so the timer kills it only while a process with the job's token is in it.
    """
    _signal_group(proc.pid, signal.SIGTERM)
    timer = threading.Timer(max(GRACEFUL_KILL_TIMEOUT_S - 5, 1), _kill_leftovers,
                            args=(proc.pid, token))
    timer.daemon = True
    timer.start()


def _kill_leftovers(pgid: int, token: str) -> None:
    for leftover in token_processes(token):
        try:
            if os.getpgid(leftover.pid) == pgid:
                _signal_group(pgid, signal.SIGKILL)
            leftover.kill()
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return
