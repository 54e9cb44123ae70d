"""The batch-driver contract every scheduler driver shares (slurm, sge, pbs, pjm).

HPC sites hand GPUs out through a batch system, so a CI job's script stages become one
batch job each, the way Jacamar CI does it, plus what Jacamar leaves to its users:

- submit: the stage script is copied into the builds dir (shared with the compute
  nodes) and submitted through a wrapper that sends its output to a file there, records
  the GPU set the job got and the script's exit code. The job's `SCHEDULER_PARAMETERS`
  are filtered by the scheduler (its GPU, output and naming options dropped, each drop
  logged); the job's GitLab timeout (`runner_info.timeout`) becomes the batch job's time limit;
- refuse at once what can never run (more GPUs than any node has): the scheduler's
  refusal (or its "can never run" verdict) ends the stage now as a build failure with the
  scheduler's message, instead of a job pending until GitLab's timeout;
- wait and stream: the output file is tailed into the job log while the job runs;
- the outcome comes from the scheduler's accounting, not from the wrapper alone: the
  script's exit code is a build failure; a job the scheduler ended (deleted by an
  administrator, node failure, preemption) is a system failure naming the batch job;
- cancel: SIGTERM from gitlab-runner (a cancel or timeout in GitLab) cancels the batch
  job at once;
- reap by label: every batch job carries a name unique to the prepare (`runnerctl-<job>-
  <nonce>`), so cleanup, a later prepare and the controller cancel what a killed driver
  left, and nothing of anyone else's;
- the GPU set the scheduler assigned is written to the lease (`batch_gpus`), so the lease
  names the GPUs the job really got, not only the slot's.

A `Scheduler` says how one batch system does each of these; `BatchDriver` is the rest.
git, cache and artifact stages run on the host like the shell driver.
"""

from __future__ import annotations

import dataclasses
import errno
import math
import os
import pwd
import shlex
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from runnerctl.executors.apptainer import binds, run_line
from runnerctl.executors.contract import AFTER_SCRIPT_TIMEOUT_S, USER_SCRIPT_STAGES, parse_duration
from runnerctl.executors.driver import StageContext, SystemFailure
from runnerctl.executors.lease import Lease, LeaseTable
from runnerctl.executors.rendezvous import BadNodes, NodeLaunch, nodes_requested, setup_bash
from runnerctl.executors.shell import GUARD, ShellDriver, as_user, job_user
from runnerctl.executors.stop import STAGE_STOP, on_stop
from runnerctl.settings import ExecutorSettings, Settings

POLL_S = 0.5
"""How often the job's state and output are read: logs stay live, the scheduler stays idle."""
STATE_FAST_FOR_S = 60.0
"""For how long from its submission a job's state is asked every POLL_S (a job that
ends or fails at once is seen at once)."""
STATE_EVERY_S = 10.0
"""How often a job's state is asked after that; the script's exit code, read every
POLL_S, ends the wait sooner."""
ACCOUNTING_WAIT_S = 30.0
"""How long a finished job's accounting record may take to appear."""
CANCELLED_EXIT = 143
"""What a stage cancelled from GitLab returns (128 + SIGTERM), as gitlab-runner expects."""
COMMAND_TIMEOUT_S = 60


class Refused(Exception):
    """The scheduler will never run this request (e.g. more GPUs than any node has)."""


class SiteFault(str):
    """A `never_runs` reason that is the cluster's doing, not the job's request (a prolog
    that failed, a working directory a node lacks): a system failure, not a build failure."""


@dataclasses.dataclass(frozen=True)
class Request:
    """One batch job, as the driver asks for it."""

    label: str  # job name, unique per prepare
    wrapper: Path  # the script submitted
    log: Path  # the scheduler's own output file (the script's output goes to `output`)
    workdir: Path
    gpus: int  # per node
    nodes: int
    time_limit_s: int | None
    options: list[str]  # the job's SCHEDULER_PARAMETERS, filtered
    env: dict[str, str]
    gpu_ids: tuple[int, ...]  # the slot's GPUs, for schedulers that hand out no ids
    site: ExecutorSettings = ExecutorSettings()  # `[executor]`, for a site's resource names
    runas: dict[str, Any] = dataclasses.field(default_factory=dict)  # as_user's: submit as the job user
    # (every submit also runs in `workdir`: gitlab-runner's own directory may be root's alone)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a batch job ended, from the scheduler's accounting."""

    code: int | None  # the script's exit code; None when the scheduler ended it
    failure: str | None = None  # why the scheduler ended it: a system failure
    confirm: bool = False  # the record may be a task's, not the job's: 0 passes only if the script said 0


class Scheduler(Protocol):
    name: str  # driver name: slurm, sge, pbs, pjm
    title: str  # for messages: "Slurm", "Grid Engine"
    node_launch: NodeLaunch  # node names and the per-node launcher (executors/rendezvous.py)
    reserved_exits: tuple[int, ...]  # script exit codes the scheduler acts on (sge: 99, 100)

    def check(self) -> None:
        """Raise SystemFailure when the batch system cannot be reached."""

    def filter(self, text: str, site: ExecutorSettings) -> tuple[list[str], list[str]]:
        """(options kept, options dropped) from the job's SCHEDULER_PARAMETERS."""

    def gpu_exports(self, request: Request) -> str:
        """Bash that sets CUDA_VISIBLE_DEVICES in the job, where the scheduler does not."""

    def submit(self, request: Request) -> str:
        """Submit; return the job id. Refused for impossible requests, SystemFailure else."""

    def active(self, job_id: str) -> bool:
        """True while the job is pending or running (unknown counts as active)."""

    def never_runs(self, job_id: str) -> str | None:
        """The scheduler's reason when a pending job can never run, else None."""

    def outcome(self, job_id: str) -> Outcome:
        """The ended job's result from accounting."""

    def cancel_command(self, job_id: str) -> list[str]:
        """The command that cancels the job (run without waiting: from a signal handler)."""

    def reap(self, label: str, job_id: str | None, user: pwd.struct_passwd) -> None:
        """Cancel this job and every job of `user` named `label`, as `user` (`as_user`)."""


class BatchDriver:
    """A Driver for any Scheduler: user script stages become batch jobs."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.name = scheduler.name
        self._host = ShellDriver()

    def config(self, ctx: StageContext) -> dict[str, Any]:
        return {**self._host.config(ctx), "driver": {"name": f"runnerctl {self.name}", "version": "1"}}

    def prepare(self, ctx: StageContext) -> None:
        self._host.prepare(ctx)
        self.scheduler.check()

    def run(self, ctx: StageContext, script: Path, stage: str) -> int:
        if stage not in USER_SCRIPT_STAGES and not stage.startswith("step_"):
            return self._host.run(ctx, script, stage)
        lease = ctx.lease
        if lease is None:
            raise SystemFailure(f"job {ctx.job.id} holds no lease")
        user = job_user(ctx.settings, ctx.args.driver)  # the batch job runs as the user who submits it
        runas = as_user(user)
        paths = _Paths(Path(ctx.settings.builds_dir).resolve() / ".runnerctl", f"{ctx.job.id}-{stage}",
                       user if runas else None)
        try:
            return self._run(ctx, lease, paths, user, runas, script, stage)
        finally:
            paths.remove()

    def _run(self, ctx: StageContext, lease: Lease, paths: _Paths, user: pwd.struct_passwd,
             runas: dict[str, Any], script: Path, stage: str) -> int:
        paths.write(paths.copy, script.read_bytes())  # gitlab-runner's TMPDIR is not on the node
        cancelled = False
        with on_stop() as stop:  # a SIGTERM from here on is latched, never lost
            try:
                request = self._request(ctx, lease, paths, user, runas, stage)
                setup = self.scheduler.gpu_exports(request) + setup_bash(
                    self.scheduler.node_launch, nodefile=paths.nodes, each_node=paths.each_node)
                given = Path(os.path.abspath(ctx.settings.builds_dir))
                project = ctx.env.get("CUSTOM_ENV_CI_PROJECT_DIR")
                wrapper = wrapper_script(paths, setup, image=ctx.job.image,
                                         binds=binds(request.workdir, given),
                                         base=Path(project) if project else None,
                                         reserved=self.scheduler.reserved_exits)
                paths.write(paths.wrapper, wrapper.encode())
                job_id = self.scheduler.submit(request)
            except (BadNodes, BadParameters) as exc:  # the job's own variables: a build failure
                print(f"runnerctl: {exc}", flush=True)
                return 1
            except Refused as exc:
                print(f"runnerctl: {self.scheduler.title} refused the job: {exc}", flush=True)
                return 1

            def cancel() -> None:
                nonlocal cancelled
                cancelled = True
                subprocess.Popen(self.scheduler.cancel_command(job_id), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, **runas)

            stop.arm(cancel)  # before the slow write below
            table = LeaseTable(ctx.settings.state_dir)
            table.update(lease.token, batch_job=f"{self.name}:{job_id}",
                         **({"slurm_job": job_id} if self.name == "slurm" else {}))
            print(f"runnerctl: {self.scheduler.title} job {job_id} submitted", flush=True)
            verdict = self._follow(job_id, paths, lambda gpus: table.update(lease.token, batch_gpus=gpus))
        if verdict is not None:
            subprocess.run(self.scheduler.cancel_command(job_id), capture_output=True, check=False,
                           timeout=COMMAND_TIMEOUT_S, **runas)
            if isinstance(verdict, SiteFault):
                raise SystemFailure(f"{self.scheduler.title} job {job_id} can never run: {verdict}")
            print(f"runnerctl: {self.scheduler.title} job {job_id} can never run: {verdict}",
                  flush=True)
            return 1
        _stream(paths.log, 0)
        if cancelled:
            return CANCELLED_EXIT
        outcome = self.scheduler.outcome(job_id)
        own = _rc_written(paths.rc)  # the script's code, as the wrapper wrote it on the node
        if outcome.code == 0 and outcome.confirm and own is None:  # the file may lag on the shared FS
            own = wait_for_record(lambda: _rc_written(paths.rc), RC_WAIT_S)
        if own and _never_started(paths.rc):  # the site's node or registry, not the job's script
            raise SystemFailure(f"{self.scheduler.title} job {job_id}: the image {ctx.job.image} never "
                                f"ran the script (exit {own}; apptainer's own message is above)")
        return stage_code(self.scheduler, job_id, outcome, own)

    def reap(self, lease: Lease, settings: Settings) -> None:
        try:
            job = (lease.batch_job or "").partition(":")[2] or lease.slurm_job
            try:  # the user prepare recorded (the batch jobs are theirs)
                user = pwd.getpwuid(lease.uid)
            except (KeyError, OverflowError):  # a lease that could not be read (uid -1)
                user = pwd.getpwuid(os.geteuid())
            self.scheduler.reap(label(lease), job, user)
        finally:
            try:
                _remove_job_files(Path(settings.builds_dir).resolve() / ".runnerctl", lease.job_id)
            finally:
                self._host.reap(lease, settings)

    def _request(self, ctx: StageContext, lease: Lease, paths: _Paths, user: pwd.struct_passwd,
                 runas: dict[str, Any], stage: str) -> Request:
        site = ctx.settings.executor
        kept, dropped = self.scheduler.filter(ctx.env.get("CUSTOM_ENV_SCHEDULER_PARAMETERS", ""), site)
        if dropped:
            print(f"runnerctl: ignoring SCHEDULER_PARAMETERS {' '.join(dropped)}: the runner sets GPUs, "
                  f"nodes, output and job name, and passes only the options docs/hpc.md lists for "
                  f"{self.scheduler.title}", flush=True)
        # the job's variables reach it through its script's own exports (gitlab-runner's shell
        # writes them: shells/abstract.go exportVariables); their CUSTOM_ENV_ copies in the batch
        # job's environment were shown to every user of the cluster (Grid Engine's `qstat -j`
        # env_list, PBS's Variable_List to its operators), CI_JOB_TOKEN and masked ones included
        env = {**{k: v for k, v in ctx.env.items() if not k.startswith("CUSTOM_ENV_")},
               **ctx.gpu_env(ctx.gpu_uuids())}
        env.pop("CUDA_VISIBLE_DEVICES")  # the scheduler's (or gpu_exports') choice, on its node
        env.pop("NVIDIA_VISIBLE_DEVICES")
        workdir = Path(ctx.settings.builds_dir).resolve()
        nodes = nodes_requested(ctx.env)
        if nodes > 1 and ctx.job.image:
            raise BadNodes(f"RUNNERCTL_NODES={nodes} cannot be used with image: {ctx.job.image}: the node "
                           "launcher (srun, mpirun) is on the nodes, not in the image; leave image: out "
                           "and start the image on each node: \"$RUNNERCTL_EACH_NODE\" apptainer exec --nv "
                           "IMAGE COMMAND (docs/hpc.md)")
        if runas:  # the job's environment, as the shell driver gives it
            env.update(HOME=user.pw_dir, USER=user.pw_name, LOGNAME=user.pw_name)
        return Request(label=label(lease), wrapper=paths.wrapper, log=paths.log, workdir=workdir,
                       gpus=len(ctx.args.gpus), nodes=nodes,
                       time_limit_s=time_limit(ctx.env, ctx.job.timeout_s, stage), options=kept, env=env,
                       gpu_ids=ctx.args.gpus, site=site, runas=runas)

    def _follow(self, job_id: str, paths: _Paths, record_gpus: Any, *,
                clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep) -> str | None:
        """Stream the output until the job ends; the scheduler's reason if it can never run.

        The output is read every POLL_S; the scheduler is asked that often only for the
        job's first STATE_FAST_FOR_S, then every STATE_EVERY_S, and at once when the
        script's exit code appears (then every 4 POLL_S while the scheduler still counts the
        job, as in an epilog): asked every half second for a week-long job, squeue
        or qstat ran about 170,000 times a day per job against the site's controller
        (found by a review as a researcher running multi-day jobs)."""
        offset = 0
        gpus_seen = False
        started, ask_at, active, ending = clock(), clock(), True, False
        while True:
            now = clock()
            ended_now = not ending and _rc_written(paths.rc) is not None
            ending = ending or ended_now or STAGE_STOP.stopped_at is not None  # cancelled: seen soon
            asked = now >= ask_at or ended_now
            if asked:  # then every POLL_S while the script's end is near (an epilog may run on)
                active = self.scheduler.active(job_id)
                fast = now - started < STATE_FAST_FOR_S or ending
                ask_at = now + (POLL_S if fast else STATE_EVERY_S) * (4 if ending else 1)
            offset = _stream(paths.output, offset)
            if not gpus_seen and (gpus := _gpus_written(paths.gpus)) is not None:
                gpus_seen = True
                record_gpus(gpus)
            if not active:
                sleep(POLL_S)  # the output file may trail the state by a moment
                _stream(paths.output, offset)
                if not gpus_seen and (gpus := _gpus_written(paths.gpus)) is not None:
                    record_gpus(gpus)
                return None
            if offset == 0 and not gpus_seen and asked:
                reason = self.scheduler.never_runs(job_id)
                if reason:
                    return reason
            sleep(POLL_S)


@dataclasses.dataclass(frozen=True)
class _Paths:
    work: Path
    base: str
    owner: pwd.struct_passwd | None = None  # the job user, when not the driver's own

    def __post_init__(self) -> None:
        """The directory is the submitting user's alone (the batch job runs as that user):
        the scripts export the job's CI_JOB_TOKEN and variables, the output is unmasked."""
        self.work.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not stat.S_ISDIR(os.lstat(self.work).st_mode):
            raise SystemFailure(f"{self.work} is not a directory")
        if self.owner is not None:
            os.chown(self.work, self.owner.pw_uid, self.owner.pw_gid, follow_symlinks=False)
        self.work.chmod(0o700)
        for stale in (self.rc, self.output, self.log, self.gpus, self.started):
            stale.unlink(missing_ok=True)

    def write(self, path: Path, data: bytes) -> None:
        """A new 0600 file of the owner's. The directory is the job user's: what was at
        `path` goes first and a link planted there is never followed (O_EXCL|O_NOFOLLOW)."""
        path.unlink(missing_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            raise SystemFailure(f"{path.name} was made again as the driver wrote it") from None
        with os.fdopen(fd, "wb") as handle:
            if self.owner is not None:
                os.fchown(fd, self.owner.pw_uid, self.owner.pw_gid)
            handle.write(data)

    def _p(self, suffix: str) -> Path:
        return self.work / f"{self.base}{suffix}"

    copy = property(lambda self: self._p(".sh"))
    wrapper = property(lambda self: self._p(".batch"))
    output = property(lambda self: self._p(".out"))
    log = property(lambda self: self._p(".log"))
    rc = property(lambda self: self._p(".rc"))
    gpus = property(lambda self: self._p(".gpus"))
    nodes = property(lambda self: self._p(".nodes"))
    each_node = property(lambda self: self._p(".each-node"))
    started = property(lambda self: self._p(".started"))

    def remove(self) -> None:
        """The stage's files: its script copy exports the job's variables, its output is
        unmasked, and every job of the host runs as the same user (found by a review as
        an HPC user: a later job of any project could read them)."""
        _unlink_all([getattr(self, name) for name in ("copy", "wrapper", "output", "log", "rc", "gpus",
                                                       "nodes", "each_node", "started")])


NOSTART = "nostart"
RC_WAIT_S = 30.0
"""How long a script's own exit code may take to show on the submit host's shared file system."""


def stage_code(scheduler: Scheduler, job_id: str, outcome: Outcome, own: int | None) -> int:
    """The stage's exit code from the scheduler's record and the script's own code (`own`,
    None where the wrapper wrote none). A record of 0 never passes a script that exited
    otherwise, nor, where the record may be a parallel task's (`confirm`), a script that
    said nothing: killed before it could (a Grid Engine task's record read first passed a
    failed job; found by reviews as a Grid Engine admin and of the day's changes)."""
    said = f"{scheduler.title} job {job_id}"
    if outcome.failure is not None:
        raise SystemFailure(f"{said} {outcome.failure}")
    if outcome.code == 1 and own in scheduler.reserved_exits:
        return own  # the wrapper ended with 1 for a code the scheduler acts on
    if outcome.code == 0 and own:
        print(f"runnerctl: {scheduler.title} records job {job_id} as ended with 0, but its script exited "
              f"{own} (a parallel task's or an older job's record read first?)", flush=True)
        return own
    if outcome.code == 0 and outcome.confirm and own is None:
        raise SystemFailure(f"{said}: the record of 0 may be a parallel task's, and the job's script wrote "
                            "no exit code (killed before it ended?)")
    return 1 if outcome.code is None else outcome.code


def wrapper_script(paths: _Paths, setup: str, *, image: str | None, binds: Sequence[str],
                   base: Path | None = None, reserved: Sequence[int] = ()) -> str:
    """The batch script: output to the shared file, GPU set recorded, the stage run, its
    code recorded (with `nostart` after it when the image's container never ran the
    script); it exits 1 for a code in `reserved` (one the scheduler would act on)."""
    q = shlex.quote
    mask = f"case $rc in {'|'.join(map(str, reserved))}) exit 1 ;; esac\n" if reserved else ""
    return ("#!/bin/bash\n"
            f"exec >>{q(str(paths.output))} 2>&1\n"
            f"{setup}"
            f"echo \"${{CUDA_VISIBLE_DEVICES-}}\" > {q(str(paths.gpus))}\n"
            + run_line(image=image, script=paths.copy, binds=binds, guard=GUARD, started=paths.started,
                       base=base)
            + f'echo "$rc${{runnerctl_nostart:+ {NOSTART}}}" > {q(str(paths.rc))}\n{mask}exit $rc\n')


def label(lease: Lease) -> str:
    """Unique per prepare, so a cancel by name never reaches another runner's job."""
    return f"runnerctl-{lease.job_id}-{lease.nonce}"


def time_limit(env: dict[str, str] | Any, job: int | None, stage: str = "build_script") -> int | None:
    """The stage's time limit in gitlab-runner, as the batch job's: the job's GitLab timeout
    (`job`: the payload's `runner_info.timeout`, `Job.timeout_s`; not the CI_JOB_TIMEOUT the
    job sees, which a job's own variable of that name would replace: common/build.go puts
    GetDefaultVariables before the job's), for `build_script` and `step_*` cut to the job's
    `RUNNER_SCRIPT_TIMEOUT` when set; for `after_script` its own 5 minutes
    (`RUNNER_AFTER_SCRIPT_TIMEOUT` when set, never over the job's timeout). A stage timeout
    longer than the job's is ignored (build.go getStageTimeoutContexts keeps the default).
    gitlab-runner ends the stage then, so a longer limit would only keep the batch job
    waiting longer for a slot."""
    job = job if job is not None and job > 0 else None
    after = stage == "after_script"
    variable = "CUSTOM_ENV_RUNNER_AFTER_SCRIPT_TIMEOUT" if after else "CUSTOM_ENV_RUNNER_SCRIPT_TIMEOUT"
    own = parse_duration(str(env.get(variable, "")).strip())
    if own is not None and job is not None and own > job:
        own = None  # longer than the job's timeout: gitlab-runner keeps the default
    own = own or (AFTER_SCRIPT_TIMEOUT_S if after else None)  # 0 or malformed: ignored, as gitlab-runner does
    if own is None:
        return job
    limit = max(1, math.ceil(own))
    return limit if job is None else min(job, limit)


def hms(seconds: int) -> str:
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class BadParameters(ValueError):
    """SCHEDULER_PARAMETERS that cannot be split into words (an unclosed quote)."""


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise BadParameters(f"SCHEDULER_PARAMETERS cannot be split into words ({exc}): {text!r}") from None


def allowed_options(text: str, *, valued: Mapping[str, int], flags: Sequence[str] = (),
                    resource_option: str = "", refused_resources: Sequence[str] = ()
                    ) -> tuple[list[str], list[str]]:
    """(kept, dropped) words of the job's SCHEDULER_PARAMETERS: only the options a site
    needs (partition, account, memory, queue) pass, everything else is dropped.

    A list of what may pass, not of what may not: the submit commands read more than any
    list of dangers says (getopt's abbreviations `--gpus-per-no=8`, clustered short
    options `-sG8`, arrays `--array=0-63` or `-t 1-64`, other clusters `-M`, an options
    file `-@`, and a bare word or `--` that ends option parsing, so the runner's own
    `--gres` and output file would become the script's arguments). `valued`: option ->
    how many values follow it (`-pe smp 4`: 2); an option with one value may also carry
    it attached (`--partition=gpu`, `-pgpu`; `-lselect=...`). `flags` pass alone. The
    value of `resource_option` (`-l`, `-L`) is dropped with it when it names one of
    `refused_resources` (`gpu=2`, `select=2:ngpus=4`, `node=4,gpu=8`). A dropped option
    takes the word after it along when that is no option (most likely its value)."""
    words = _words(text)
    kept: list[str] = []
    dropped: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        name, values = _option(word, words[i + 1:], valued)
        if word in flags:
            kept.append(word)
        elif name and values is not None and not (name == resource_option and any(
                _resource_names(v) & set(refused_resources) for v in values)):
            taken = 1 + (len(values) if name == word else 0)
            kept.extend(words[i:i + taken])
            i += taken - 1
        else:
            takes = name == word and i + 1 < len(words) and not words[i + 1].startswith("-")
            dropped.extend(words[i:i + 1 + takes])
            i += takes
        i += 1
    return kept, dropped


def _option(word: str, rest: list[str], valued: Mapping[str, int]) -> tuple[str, list[str] | None]:
    """(the allowed option `word` names, its values) or ("", None); values None when they
    are missing."""
    if word in valued:
        count = valued[word]
        return word, rest[:count] if len(rest) >= count else None
    if word.startswith("--"):
        name, equals, value = word.partition("=")
        return (name, [value]) if equals and valued.get(name) == 1 else ("", None)
    if len(word) > 2 and valued.get(word[:2]) == 1:
        return word[:2], [word[2:]]
    return "", None


def _resource_names(value: str) -> set[str]:
    """`select=2:ngpus=4`, `node=4,gpu=8` -> {"select", "ngpus", "node", "gpu"}."""
    return {part.split("=", 1)[0].strip() for part in value.replace(",", ":").split(":")}


def run_command(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run a scheduler command; one that cannot start or hangs is the cluster's failure."""
    try:
        return subprocess.run(command, capture_output=True, text=True, check=False,
                              timeout=COMMAND_TIMEOUT_S, **kwargs)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SystemFailure(f"{command[0]} failed: {exc}") from None


def wait_for_record(read: Any, deadline_s: float = ACCOUNTING_WAIT_S) -> Any:
    """Poll `read()` until it returns something (accounting lags the job's end)."""
    deadline = time.monotonic() + deadline_s
    while True:
        found = read()
        if found is not None or time.monotonic() >= deadline:
            return found
        time.sleep(POLL_S)


STREAM_CHUNK = 1 << 20
"""Bytes of the job's output copied into the job log at a time."""


_REFUSED: set[Path] = set()
"""The files found replaced, said once each in the job log (one stage per process)."""


def _open_plain(path: Path) -> BinaryIO | None:
    """`path` opened for reading if it is a regular file and no link, else None. The batch
    job can replace its files: a link could point at the runner host's config.toml, a
    device at /dev/zero. A file not there yet is normal; one replaced is said in the job
    log, once."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a link
        _refuse(path, "the batch job made it a link" if exc.errno == errno.ELOOP else str(exc.strerror))
        return None
    handle: BinaryIO = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        handle.close()
        _refuse(path, "the batch job made it no regular file")
        return None
    return handle


def _refuse(path: Path, why: str) -> None:
    if path not in _REFUSED:
        _REFUSED.add(path)
        print(f"runnerctl: not reading {path.name}: {why}", flush=True)


def _stream(path: Path, offset: int) -> int:
    """Copy what the batch job wrote to `path` since `offset` into the job log."""
    handle = _open_plain(path)
    if handle is None:
        return offset
    with handle:
        handle.seek(offset)
        while data := handle.read(STREAM_CHUNK):
            sys.stdout.buffer.write(data)
            offset += len(data)
    sys.stdout.flush()
    return offset


def _remove_job_files(work: Path, job_id: str) -> None:
    """Whatever a stage of the job left (a driver killed before its own removal): names
    only, so a link is removed, never followed."""
    try:
        entries = list(os.scandir(work))
    except FileNotFoundError:  # no stage of a batch driver ran here
        return
    except OSError as exc:
        print(f"runnerctl: could not list {work} to remove job {job_id}'s batch files: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return
    _unlink_all([Path(e.path) for e in entries
                 if e.name.startswith(f"{job_id}-") and not e.is_dir(follow_symlinks=False)])


def _unlink_all(paths: Sequence[Path]) -> None:
    """Remove each file that is there; one that cannot go is said in the job's log, and
    neither stops the others nor changes the stage's result (the removal runs in a
    `finally`: raising there replaced the stage's exit code with a traceback)."""
    failed = []
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            failed.append(f"{path.name} ({exc.strerror or exc})")
    if failed:
        print(f"runnerctl: could not remove {', '.join(failed)} in {paths[0].parent}; they hold the "
              "job's script and output: remove them by hand", file=sys.stderr)


def _rc_written(path: Path) -> int | None:
    """The script's exit code as the wrapper wrote it on the node, None if it did not."""
    handle = _open_plain(path)
    if handle is None:
        return None
    with handle:
        text = (handle.read(32).decode(errors="replace").split() or [""])[0]
    return int(text) if text.isascii() and text.isdigit() else None


def _never_started(path: Path) -> bool:
    """Did the wrapper write that the image's container never ran the script?"""
    handle = _open_plain(path)
    if handle is None:
        return False
    with handle:
        return handle.read(32).decode(errors="replace").split()[1:] == [NOSTART]


def _gpus_written(path: Path) -> str | None:
    """The GPU set the wrapper wrote on the node (one short line), None before it did."""
    handle = _open_plain(path)
    if handle is None:
        return None
    with handle:
        return handle.read(4096).decode(errors="replace").strip()
