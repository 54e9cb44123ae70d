"""The slurm driver: the user's script stages run as Slurm batch jobs.

For HPC sites whose GPUs Slurm hands out: each script stage is copied into the builds
dir (which HPC sites share with their compute nodes) and submitted with
`sbatch --gres=gpu:N` (N = the slot's size) plus the job's SCHEDULER_PARAMETERS, as
HPC users of GitLab expect; `--nodes` and `srun` inside pass through. Options that
would change the GPU request (`--gres`, `--gpus*`, `-G`, `--tres-per-*`) or the driver's
own bookkeeping (output file, job name, working dir) are dropped with a note in the job
log. Slurm sets CUDA_VISIBLE_DEVICES for the allocation; the batch wrapper keeps it
readonly and ignores the job's own `export` of it.

The driver streams the job's output file into the job log while it runs and maps the
result: the script's exit code is a build failure, a node or boot failure is a system
failure. On SIGTERM from gitlab-runner (a cancel or timeout in GitLab) it scancels the
job at once; reap scancels it too, also after the driver itself was killed. git, cache
and artifact stages run on the host like the shell driver.
"""

from __future__ import annotations

import os
import pwd
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from runnerctl.executors.contract import USER_SCRIPT_STAGES
from runnerctl.executors.driver import StageContext, SystemFailure, on_stop
from runnerctl.executors.lease import Lease, LeaseTable
from runnerctl.executors.shell import GUARD, ShellDriver
from runnerctl.settings import Settings

POLL_S = 0.5
"""How often the job's state and output are read: logs stay live, slurmctld stays idle."""
_DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE"}
_INFRASTRUCTURE = {"NODE_FAIL", "BOOT_FAIL"}
"""End states that are the cluster's fault, not the script's: system failures."""
_DROPPED_LONG = ("--gres", "--gpus", "--gpus-per-node", "--gpus-per-task", "--gpus-per-socket",
                 "--tres-per-task", "--tres-per-node", "--output", "--error", "--job-name",
                 "--chdir", "--wrap")
_DROPPED_SHORT = ("-G", "-o", "-e", "-J", "-D")
_FLAGS = ("--parsable",)


def scheduler_parameters(text: str) -> tuple[list[str], list[str]]:
    """(options passed to sbatch, options dropped) from the job's SCHEDULER_PARAMETERS."""
    kept: list[str] = []
    dropped: list[str] = []
    words = shlex.split(text)
    i = 0
    while i < len(words):
        word = words[i]
        name = word.split("=", 1)[0]
        if word in _FLAGS:
            dropped.append(word)
        elif name in _DROPPED_LONG:
            takes_next = "=" not in word and i + 1 < len(words)
            dropped.extend(words[i:i + 1 + takes_next])
            i += takes_next
        elif word[:2] in _DROPPED_SHORT:
            takes_next = len(word) == 2 and i + 1 < len(words)
            dropped.extend(words[i:i + 1 + takes_next])
            i += takes_next
        else:
            kept.append(word)
        i += 1
    return kept, dropped


class SlurmDriver:
    name = "slurm"

    def __init__(self) -> None:
        self._host = ShellDriver()

    def config(self, ctx: StageContext) -> dict[str, Any]:
        return {**self._host.config(ctx), "driver": {"name": "runnerctl slurm", "version": "1"}}

    def prepare(self, ctx: StageContext) -> None:
        self._host.prepare(ctx)
        try:
            ok = subprocess.run(["sinfo", "-h"], capture_output=True, timeout=30,
                                check=False).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if not ok:
            raise SystemFailure("Slurm is not reachable (sinfo failed): start slurmctld/slurmd")

    def run(self, ctx: StageContext, script: Path, stage: str) -> int:
        if stage not in USER_SCRIPT_STAGES and not stage.startswith("step_"):
            return self._host.run(ctx, script, stage)
        work = Path(ctx.settings.builds_dir).resolve() / ".runnerctl"
        work.mkdir(parents=True, exist_ok=True)
        base = work / f"{ctx.job.id}-{stage}"
        rc_file, out_file, copy = (base.with_suffix(s) for s in (".rc", ".out", ".sh"))
        for stale in (rc_file, out_file):
            stale.unlink(missing_ok=True)
        copy.write_bytes(script.read_bytes())  # gitlab-runner's TMPDIR is not on the compute node
        wrapper = base.with_suffix(".sbatch")
        wrapper.write_text("#!/bin/bash\n" + GUARD + f"( source {shlex.quote(str(copy))} ); rc=$?\n"
                           f"echo $rc > {shlex.quote(str(rc_file))}\nexit $rc\n")
        job_id = self._submit(ctx, wrapper, out_file)
        cancelled = False

        def cancel() -> None:
            nonlocal cancelled
            cancelled = True
            subprocess.Popen(["scancel", job_id])

        with on_stop(cancel):
            state = self._follow(job_id, out_file)
        if state in _INFRASTRUCTURE:
            raise SystemFailure(f"Slurm job {job_id} ended {state}")
        if rc_file.exists():
            return int(rc_file.read_text().strip() or 1)
        return 143 if cancelled else _exit_code(job_id)

    def reap(self, lease: Lease, settings: Settings) -> None:
        try:
            if lease.slurm_job:
                subprocess.run(["scancel", lease.slurm_job], check=False, capture_output=True,
                               timeout=30)
            # a job submitted just before the driver was killed, not yet recorded
            subprocess.run(["scancel", "--name", _name(lease), "--user", _whoami()], check=False,
                           capture_output=True, timeout=30)
        finally:
            self._host.reap(lease, settings)

    def _submit(self, ctx: StageContext, wrapper: Path, out_file: Path) -> str:
        user, dropped = scheduler_parameters(ctx.env.get("CUSTOM_ENV_SCHEDULER_PARAMETERS", ""))
        if dropped:
            print(f"runnerctl: ignoring SCHEDULER_PARAMETERS {' '.join(dropped)}: the runner "
                  f"sets GPUs, output and job name", flush=True)
        snapshot = ctx.gpu_source().snapshot()
        env = {**ctx.env, **ctx.gpu_env([snapshot.gpu(g).uuid for g in ctx.args.gpus])}
        env.pop("CUDA_VISIBLE_DEVICES")  # Slurm sets it for the allocation, on its node
        env.pop("NVIDIA_VISIBLE_DEVICES")
        if ctx.lease is None:
            raise SystemFailure(f"job {ctx.job.id} holds no lease")
        command = ["sbatch", "--parsable", *user, f"--job-name={_name(ctx.lease)}",
                   f"--gres=gpu:{len(ctx.args.gpus)}", f"--output={out_file}",
                   f"--chdir={Path(ctx.settings.builds_dir).resolve()}", str(wrapper)]
        result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        if result.returncode != 0:
            raise SystemFailure(f"sbatch refused the job: {result.stderr.strip()}")
        job_id = result.stdout.strip().split(";")[0]
        LeaseTable(ctx.settings.state_dir).update(ctx.lease_token, slurm_job=job_id)
        print(f"runnerctl: Slurm job {job_id} submitted", flush=True)
        return job_id

    def _follow(self, job_id: str, out_file: Path) -> str | None:
        offset = 0
        while True:
            state = _state(job_id)
            offset = _stream(out_file, offset)
            if state is None or state in _DONE:
                time.sleep(POLL_S)  # the output file may trail the state by a moment
                _stream(out_file, offset)
                return state or _final_state(job_id)
            time.sleep(POLL_S)


def _name(lease: Lease) -> str:
    """Unique per prepare, so a cancel by name never reaches another runner's job."""
    return f"runnerctl-{lease.job_id}-{lease.nonce}"


def _whoami() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def _state(job_id: str) -> str | None:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                         text=True, check=False).stdout.strip()
    return out or None


def _final_state(job_id: str) -> str | None:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True,
                         check=False).stdout
    for field in out.split():
        if field.startswith("JobState="):
            return field.split("=", 1)[1]
    return None


def _exit_code(job_id: str) -> int:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True,
                         check=False).stdout
    for field in out.split():
        if field.startswith("ExitCode="):
            return int(field.split("=", 1)[1].split(":")[0]) or 1
    return 1


def _stream(path: Path, offset: int) -> int:
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return offset
    if data:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    return offset + len(data)
