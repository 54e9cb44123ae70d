"""The slurm driver: the user's script stages run as Slurm batch jobs.

For HPC sites whose GPUs Slurm hands out: each script stage is submitted with
`sbatch --gres=gpu:N` (N = the slot's size) plus the job's SCHEDULER_PARAMETERS (as HPC
users of GitLab expect; `--nodes` and `srun` inside pass through), runnerctl's own GPU
request last so it wins. Slurm sets CUDA_VISIBLE_DEVICES for the allocation; the batch
wrapper keeps it readonly and ignores the job's own `export` of it. The driver streams
the job's output file into the job log while it runs, maps the exit code, and cancels
the Slurm job when gitlab-runner sends SIGTERM (a cancel or timeout in GitLab) and in
cleanup, also after the driver itself was killed. git, cache and artifact stages run
on the host like the shell driver.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from runnerctl.executors.contract import USER_SCRIPT_STAGES
from runnerctl.executors.driver import StageContext, SystemFailure, on_stop
from runnerctl.executors.lease import LeaseTable
from runnerctl.executors.shell import GUARD, ShellDriver

POLL_S = 0.5
"""How often the job's state and output are read: logs stay live, slurmctld stays idle."""
_DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE"}


class SlurmDriver:
    name = "slurm"

    def __init__(self) -> None:
        self._host = ShellDriver()

    def config(self, ctx: StageContext) -> dict[str, Any]:
        return {**self._host.config(ctx), "driver": {"name": "runnerctl slurm", "version": "1"}}

    def prepare(self, ctx: StageContext) -> None:
        self._host.prepare(ctx)
        if subprocess.run(["sinfo", "-h"], capture_output=True, check=False).returncode != 0:
            raise SystemFailure("Slurm is not reachable (sinfo failed): start slurmctld/slurmd")

    def run(self, ctx: StageContext, script: Path, stage: str) -> int:
        if stage not in USER_SCRIPT_STAGES and not stage.startswith("step_"):
            return self._host.run(ctx, script, stage)
        work = Path(ctx.settings.builds_dir).resolve() / ".runnerctl"
        work.mkdir(parents=True, exist_ok=True)
        base = work / f"{ctx.job.id}-{stage}"
        rc_file, out_file = base.with_suffix(".rc"), base.with_suffix(".out")
        for stale in (rc_file, out_file):
            stale.unlink(missing_ok=True)
        wrapper = base.with_suffix(".sbatch")
        wrapper.write_text("#!/bin/bash\n" + GUARD + f"( source {shlex.quote(str(script))} ); rc=$?\n"
                           f"echo $rc > {shlex.quote(str(rc_file))}\nexit $rc\n")
        job_id = self._submit(ctx, wrapper, out_file)
        cancelled = False

        def cancel() -> None:
            nonlocal cancelled
            cancelled = True
            subprocess.Popen(["scancel", job_id])

        with on_stop(cancel):
            self._follow(job_id, out_file)
        if rc_file.exists():
            return int(rc_file.read_text().strip() or 1)
        return 143 if cancelled else _exit_code(job_id)

    def cleanup(self, ctx: StageContext) -> None:
        try:
            for lease in LeaseTable(ctx.settings.state_dir).held_by(ctx.job.id):
                if lease.slurm_job:
                    subprocess.run(["scancel", lease.slurm_job], check=False, capture_output=True)
            subprocess.run(["scancel", "--name", _name(ctx)], check=False, capture_output=True)
        finally:
            self._host.cleanup(ctx)

    def _submit(self, ctx: StageContext, wrapper: Path, out_file: Path) -> str:
        user = shlex.split(ctx.env.get("CUSTOM_ENV_SCHEDULER_PARAMETERS", ""))
        snapshot = ctx.gpu_source().snapshot()
        env = {**ctx.env, **ctx.gpu_env([snapshot.gpu(g).uuid for g in ctx.args.gpus])}
        env.pop("CUDA_VISIBLE_DEVICES")  # Slurm sets it for the allocation, on its node
        env.pop("NVIDIA_VISIBLE_DEVICES")
        command = ["sbatch", "--parsable", *user, f"--job-name={_name(ctx)}",
                   f"--gres=gpu:{len(ctx.args.gpus)}", f"--output={out_file}",
                   f"--chdir={Path(ctx.settings.builds_dir).resolve()}", str(wrapper)]
        result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        if result.returncode != 0:
            raise SystemFailure(f"sbatch refused the job: {result.stderr.strip()}")
        job_id = result.stdout.strip().split(";")[0]
        LeaseTable(ctx.settings.state_dir).update(ctx.job.id, slurm_job=job_id)
        print(f"runnerctl: Slurm job {job_id} submitted", flush=True)
        return job_id

    def _follow(self, job_id: str, out_file: Path) -> None:
        offset = 0
        while True:
            state = _state(job_id)
            offset = _stream(out_file, offset)
            if state is None or state in _DONE:
                time.sleep(POLL_S)  # the output file may trail the state by a moment
                _stream(out_file, offset)
                return
            time.sleep(POLL_S)


def _name(ctx: StageContext) -> str:
    return f"runnerctl-{ctx.job.id}"


def _state(job_id: str) -> str | None:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                         text=True, check=False).stdout.strip()
    return out or None


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
