"""The four custom executor stages, shared by every driver: leases, gate, exit codes.

gitlab-runner starts `python -m runnerctl.executors <stage> <DriverArgs...> [script stage]`
(executors/contract.py). prepare takes the GPU leases and passes the gate or fails as a
system failure naming GPU, pid and user; run maps the script's exit code; cleanup
always reaps and releases, and its own failures never change the job's result.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from runnerctl.errors import RunnerctlError
from runnerctl.executors.contract import (
    ENV_BUILD_EXIT_CODE_FILE,
    ENV_SYSTEM_FAILURE,
    BadArguments,
    exit_code,
    parse_stage_argv,
)
from runnerctl.executors.driver import Driver, Job, StageContext, SystemFailure, load_registry
from runnerctl.executors.gate import Unusable, wait_until_free
from runnerctl.executors.lease import (
    Lease,
    LeaseBusy,
    LeaseTable,
    new_nonce,
    process_since_boot,
    process_started,
)
from runnerctl.executors.stop import STAGE_STOP
from runnerctl.settings import GATE_WAIT_MAX_S, Settings, load_settings


def main(argv: list[str]) -> int:
    env = dict(os.environ)
    failure = exit_code(env, ENV_SYSTEM_FAILURE, 2)
    try:
        stage, args, rest = parse_stage_argv(argv)
    except BadArguments as exc:  # config.toml edited by hand: the host's fault, not the job's
        STAGE_STOP.release()
        print(f"runnerctl: config.toml's arguments for this stage: {exc}; run `runnerctl init` "
              "again to write them", file=sys.stderr)
        return failure
    if stage != "run":
        STAGE_STOP.release()  # nothing of theirs outlives them: SIGTERM ends them as it comes
    try:
        ctx = StageContext(args=args, settings=load_settings(Path(args.config)), env=env,
                           job=Job.from_env(env))
        registry = load_registry()
        if args.driver not in registry:
            raise SystemFailure(f"the {args.driver} driver is not available on this host")
        driver = registry[args.driver]()
        if stage == "config":
            print(json.dumps(driver.config(ctx)))
            return 0
        if stage == "prepare":
            prepare(ctx, driver)
            return 0
        if stage == "run":
            if len(rest) != 2:
                raise SystemFailure("run needs <script path> <stage name> after its arguments")
            return run(ctx, driver, Path(rest[0]), rest[1])
        cleanup(ctx)
        return 0
    except (SystemFailure, RunnerctlError, OSError) as exc:
        print(f"runnerctl: {exc}", file=sys.stderr)
        return failure
    except Exception as exc:  # a case no check foresaw: one line, a system failure, no traceback
        print(f"runnerctl: unexpected {type(exc).__name__} in {stage}: {exc}", file=sys.stderr)
        return failure


def prepare(ctx: StageContext, driver: Driver) -> None:
    """Lease every GPU of the slot, then the gate, then the driver; one deadline for both waits."""
    leases = LeaseTable(ctx.settings.state_dir)
    owner = os.getppid()
    template = Lease(gpu=-1, job_id=ctx.job.id, slot=ctx.args.slot, driver=ctx.args.driver,
                     owner_pid=owner, owner_started=process_started(owner) or 0.0,
                     owner_since_boot=process_since_boot(owner) or "",
                     created_at=time.time(), pipeline_id=ctx.job.pipeline_id,
                     project=ctx.job.project, user=ctx.job.user, url=ctx.job.url, nonce=new_nonce(),
                     timeout_s=ctx.job.timeout_s, job_name=ctx.job.name)
    wait_s = min(ctx.settings.executor.gate_wait_s, GATE_WAIT_MAX_S)  # past it, prepare's own end
    if wait_s < ctx.settings.executor.gate_wait_s:  # (900 s) came first and the gate's message was lost
        print(f"runnerctl: [executor] gate_wait_s {ctx.settings.executor.gate_wait_s:g} is over "
              f"{GATE_WAIT_MAX_S:g} s, gitlab-runner's prepare would end first: waiting "
              f"{GATE_WAIT_MAX_S:g} s",
              file=sys.stderr)
    deadline = time.monotonic() + wait_s
    try:
        replaced = leases.acquire(ctx.args.gpus, template, wait_s=wait_s)
    except LeaseBusy as exc:
        held = "are held" if any(h.problem for h in exc.holders) else "are leased to another job"
        raise SystemFailure(f"GPUs {_gpus(ctx)} {held}: {exc}") from None  # no job holds an unreadable lease
    ctx = dataclasses.replace(ctx, lease=dataclasses.replace(template, gpu=ctx.args.gpus[0]))
    reap(replaced, ctx.settings)  # what a dead job, or this job's earlier attempt, left
    foreign = wait_until_free(ctx.gpu_source(), ctx.args.gpus, leases.all,
                              wait_s=max(deadline - time.monotonic(), 0.0))
    if foreign:
        leases.release(ctx.job.id)
        why = ("no job runs on a GPU that cannot be read or used" if isinstance(foreign[0], Unusable)
               else f"waited {wait_s:.0f} s; no job runs on a GPU someone else uses")
        raise SystemFailure("; ".join(f.describe() for f in foreign) + f" ({why})")
    try:
        driver.prepare(ctx)
    except BaseException:
        cleanup(ctx)  # give the GPUs back now, not only when cleanup_exec comes
        raise


def run(ctx: StageContext, driver: Driver, script: Path, stage: str) -> int:
    held = LeaseTable(ctx.settings.state_dir).held_by(ctx.job.id)
    if not set(ctx.args.gpus) <= {lease.gpu for lease in held}:
        raise SystemFailure(f"job {ctx.job.id} holds no lease on GPUs {_gpus(ctx)}: prepare "
                            "did not run, or cleanup already released them")
    code = driver.run(dataclasses.replace(ctx, lease=held[0]), script, stage)
    if code == 0:
        return 0
    if code < 0:  # Popen's -N: killed by signal N; GitLab shows the code as a shell reports it
        code = 128 - code
    exit_file = ctx.env.get(ENV_BUILD_EXIT_CODE_FILE)
    if exit_file:
        Path(exit_file).write_text(f"{code}\n")
    return ctx.build_failure_code


def cleanup(ctx: StageContext) -> None:
    """Reap what the job left, then release its leases; never changes the job's result."""
    table = LeaseTable(ctx.settings.state_dir)
    reap(table.held_by(ctx.job.id), ctx.settings)
    table.release(ctx.job.id)


def reap(leases: list[Lease], settings: Settings) -> None:
    """Let each lease's driver remove what its job left (once per job, not once per GPU)."""
    registry = load_registry()
    done = set()
    for lease in leases:
        if lease.token in done or lease.driver not in registry:
            continue
        done.add(lease.token)
        try:
            registry[lease.driver]().reap(lease, settings)
        except Exception as exc:  # any kind, reported: the lease is still released
            print(f"runnerctl: cleaning up job {lease.job_id}: {exc}", file=sys.stderr)


def _gpus(ctx: StageContext) -> str:
    return ",".join(str(g) for g in ctx.args.gpus)
