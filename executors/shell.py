"""The shell driver: each job's stages run as one process group on the host.

It isolates nothing. The driver sets CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES and
RUNNERCTL_LEASE for the script, makes them readonly in the stage's bash and ignores the
job's own `export` of them (gitlab-runner's stage scripts export job variables), but a
job can still start `env CUDA_VISIBLE_DEVICES=0,1 python ...` and reach other GPUs. Use
the docker driver where that matters. What the shell driver does guarantee: the lease
(no second job is prepared on these GPUs) and the gate (no job starts next to a
foreign process).

Jobs run as `[executor] run_as_user` (gitlab-runner must then run as root, as a service
install does), else as gitlab-runner's own user; root is refused unless `[executor]
allow_root = true` says so, because a root job reads every secret on the host and can
leave anything behind. A job run as another user gets its builds and cache dirs owned
by that user, a copy of each stage script it can read and a TMPDIR of its own
(gitlab-runner's sit in directories only root can enter), and its lease records that
user (`uid`), so only that user's processes with its token count as the job.

Stages run in a new session, so a timeout or cancel is forwarded by the driver:
SIGTERM to the job's process group, then SIGKILL after the graceful timeout; reap
(cleanup) kills whatever still carries this job's RUNNERCTL_LEASE token and runs as
the job's user, and nothing else (S4). A stored process group id is never signalled
after the fact: the group may be gone and its id reused.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from runnerctl import __version__
from runnerctl.executors.contract import GRACEFUL_KILL_TIMEOUT_S
from runnerctl.executors.driver import StageContext, SystemFailure, remove_tree
from runnerctl.executors.lease import Lease, LeaseTable, token_processes
from runnerctl.executors.stop import on_stop
from runnerctl.model import slot_key
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
        key = slot_key(ctx.args.slot)
        return {
            "builds_dir": str(Path(ctx.settings.builds_dir) / key),
            "cache_dir": str(Path(ctx.settings.cache_dir) / key),
            "builds_dir_is_shared": False,
            "hostname": ctx.settings.host.name,
            "driver": {"name": "runnerctl shell", "version": __version__},
            "job_env": {"RUNNERCTL_SLOT": ctx.args.slot},
        }

    def prepare(self, ctx: StageContext) -> None:
        user = job_user(ctx.settings, ctx.args.driver)
        key = slot_key(ctx.args.slot)
        for path in (ctx.settings.builds_dir, ctx.settings.cache_dir):
            Path(path).mkdir(parents=True, exist_ok=True)
            if user.pw_uid != os.geteuid():
                own = Path(path) / key
                if own.is_symlink():  # planted by an earlier job: chown would follow it out
                    own.unlink()
                own.mkdir(mode=0o700, exist_ok=True)
                _chown_tree(own, user)
        LeaseTable(ctx.settings.state_dir).update(ctx.lease_token, uid=user.pw_uid)

    def run(self, ctx: StageContext, script: Path, stage: str) -> int:
        user = job_user(ctx.settings, ctx.args.driver)
        env = {**ctx.env, **ctx.gpu_env(ctx.gpu_uuids())}
        switch = user.pw_uid != os.geteuid()
        copy_dir = (Path(tempfile.mkdtemp(prefix=".runnerctl-", dir=ctx.settings.builds_dir))
                    if switch else None)
        try:
            if copy_dir is not None:
                script = _readable_copy(script, copy_dir, user)
                env.update(HOME=user.pw_dir, USER=user.pw_name, LOGNAME=user.pw_name,
                           TMPDIR=str(copy_dir))  # gitlab-runner's TMPDIR is root's own
            token = ctx.lease_token
            with on_stop() as stop:  # a SIGTERM from here on is latched, never lost
                proc = subprocess.Popen(
                    ["bash", "--noprofile", "--norc", "-c", _PRELUDE, str(script)], env=env,
                    start_new_session=True, **as_user(user))
                stop.arm(lambda: _stop_group(proc, token, user.pw_uid))  # before the slow write below
                try:
                    LeaseTable(ctx.settings.state_dir).update(token, pgid=proc.pid)
                except OSError as exc:  # a full disk: the job runs on, watched (reap finds it by its token)
                    print(f"runnerctl: cannot note the job's process group in its lease ({exc.strerror}); "
                          "the job runs on", file=sys.stderr)
                code = proc.wait()
                if stop.stopped_at is not None:  # the timer below dies with this process
                    _finish_stop(proc.pid, token, user.pw_uid, until=stop.stopped_at + KILL_AFTER_S)
                return code
        finally:
            if copy_dir is not None:
                remove_tree(copy_dir, "job's temporary directory")

    def reap(self, lease: Lease, settings: Settings) -> None:
        for proc in token_processes(lease.token, uid=lease.uid):
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                continue


KILL_AFTER_S = max(GRACEFUL_KILL_TIMEOUT_S - 5, 1)
"""SIGKILL this long after a stop's SIGTERM: a little before gitlab-runner's own."""

WHAT_RUNS_AS_USER = {"docker": "jobs' git, cache and artifact stages (on the host, in the dir its "
                              "container writes)"}
"""What the root refusal names for a driver whose jobs run elsewhere but whose helper
stages run on the host as `run_as_user`."""


def job_user(settings: Settings, driver: str = "shell") -> pwd.struct_passwd:
    """The user jobs (`driver`'s host stages) run as; a SystemFailure naming the fix when
    it cannot or must not be."""
    name = settings.executor.run_as_user
    try:
        user = pwd.getpwnam(name) if name else pwd.getpwuid(os.geteuid())
    except KeyError:
        raise SystemFailure(f"[executor] run_as_user {name!r} is no user on this host") from None
    if user.pw_uid == 0 and not settings.executor.allow_root:
        raise SystemFailure(f"the {driver} driver does not run {WHAT_RUNS_AS_USER.get(driver, 'jobs')} as "
                            "root: set [executor] run_as_user to an unprivileged user (or allow_root = "
                            "true to run them as root anyway)")
    if user.pw_uid != os.geteuid() and os.geteuid() != 0:
        raise SystemFailure(f"running jobs as {user.pw_name} needs gitlab-runner to run as root "
                            f"(it runs as uid {os.geteuid()}); or leave [executor] run_as_user empty")
    return user


def as_user(user: pwd.struct_passwd) -> dict[str, Any]:
    """subprocess arguments that run a command as `user` (`job_user`): the shell driver's
    job, and the batch drivers' submit, cancel and reap, so a batch job is the user's
    (with gitlab-runner as root it ran as root on the cluster). Empty for our own user."""
    if user.pw_uid == os.geteuid():
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid,
            "extra_groups": os.getgrouplist(user.pw_name, user.pw_gid)}


def _chown_tree(path: Path, user: pwd.struct_passwd) -> None:
    """`path` and everything in it to `user`, following no symbolic link (a job's own
    files may link anywhere on the host). Each name is changed through its directory's
    open descriptor: by path, a directory the job's user swapped for a link to /etc
    between the walk's look and the chown handed /etc/shadow to that user (found by a
    review as a local user; any job on another slot runs as the same user)."""
    os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)
    for _root, dirs, files, fd in os.fwalk(path, follow_symlinks=False):
        for name in dirs + files:
            os.chown(name, user.pw_uid, user.pw_gid, dir_fd=fd, follow_symlinks=False)


def _readable_copy(script: Path, directory: Path, user: pwd.struct_passwd) -> Path:
    """The stage script in a 0700 dir of the job's user (gitlab-runner's is root's own)."""
    copy = directory / "script"
    copy.write_bytes(script.read_bytes())
    copy.chmod(0o600)
    _chown_tree(directory, user)
    return copy


def _stop_group(proc: subprocess.Popen[bytes], token: str, uid: int) -> None:
    """SIGTERM the job's group now and SIGKILL it a little before gitlab-runner gives up.

    Runs in a signal handler while the main thread waits on the process (so the group
    exists), and leaves the SIGKILL to a timer. By then the group may be gone and its
    id reused, so the timer kills it only while a process with the job's token is in it.
    """
    _signal_group(proc.pid, signal.SIGTERM)
    timer = threading.Timer(KILL_AFTER_S, _kill_leftovers, args=(proc.pid, token, uid))
    timer.daemon = True
    timer.start()


def _finish_stop(pgid: int, token: str, uid: int, *, until: float) -> None:
    """After a stop, once the stage's bash has exited: what of the job lives on (a worker
    that ignores SIGTERM, one that left the group with setsid) gets SIGTERM, and SIGKILL
    at `until`, before the driver returns. The timer of `_stop_group` dies with the
    driver, and gitlab-runner goes on to after_script and the uploads while such a
    worker held the GPU until cleanup (found by a review of cancellation)."""
    left = []
    for leftover in token_processes(token, uid=uid):
        with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
            if os.getpgid(leftover.pid) != pgid:  # the group had its SIGTERM
                leftover.terminate()
            left.append(leftover)
    _, alive = psutil.wait_procs(left, timeout=max(0.0, until - time.monotonic()))
    for leftover in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            leftover.kill()
    psutil.wait_procs(alive, timeout=5)


def _kill_leftovers(pgid: int, token: str, uid: int) -> None:
    for leftover in token_processes(token, uid=uid):
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
