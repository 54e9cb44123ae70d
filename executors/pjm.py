"""The pjm driver: the user's script stages run as Fujitsu PJM batch jobs (executors/batch.py).

Fujitsu Technical Computing Suite's job manager (Fugaku, FX1000/FX700 sites), per its
End-user's Guide and Command Reference (pjsub, pjstat, pjdel; RIKEN-RCCS/fugaku-doc
docs/manual/en/jos, j2ul-2534 and j2ul-2549):
- submit with `pjsub -X --norestart -N <label> -j -o <log> -L node=<nodes> -L gpu=<N>`
  (`-L elapse=H:MM:SS` from the job's timeout; `-X` so the job inherits the driver's
  environment; `--norestart`: a job whose node failed is not run again, its script
  would run twice); success prints `[INFO] PJM 0000 pjsub Job <id> submitted.`;
- pjsub itself rejects a request beyond its resource group's limits (`[ERR.] PJM 0057
  ...`): the stage fails at once with that line, a build failure; a PJM that cannot take
  jobs (0090 no daemon, 0091 internal error, 0068 configuration changed, 0072 accept
  limit) is a system failure;
- `pjstat <id>` lists an unfinished job (ST ACC/QUE/RNA/RNP/RUN/RNE/RNO/HLD/ERR; an
  unknown id is left out without an error); ERR, a job stopped by an error PJM found,
  waits for ever: the stage fails at once, a system failure. JOB_NAME shows only its
  first 10 characters, so jobs are found by name with `--filter jnam=<label>`;
- an ended job's record is `pjstat -H -s <id>` (`KEY : value` lines): STATE EXT with
  its EXIT CODE is the script's result, a SIGNAL NO never a pass; PJM CODE 11, 12 or
  23 (past its elapse limit, its memory limit, the OOM killer) is the job's own doing,
  a build failure; CCL that runnerctl did not ask for (pjdel by an administrator), RJT,
  or another PJM CODE are the system's doing: a system failure naming the job;
- `pjdel <id>` cancels; what a killed driver left is found by name.
SCHEDULER_PARAMETERS: `-L rscgrp=`, `-L elapse=`, `--mpi ...`, `-g` and the like pass;
`-L node=`/`gpu=`, `-N`, `-o`, `-e`, `-j`, `-X` and `--step` are dropped with a note.
"""

from __future__ import annotations

import pwd
import re

from runnerctl.executors.batch import (
    BatchDriver,
    Outcome,
    Refused,
    Request,
    SiteFault,
    allowed_options,
    hms,
    run_command,
    wait_for_record,
)
from runnerctl.executors.driver import SystemFailure
from runnerctl.executors.rendezvous import mpirun_launch
from runnerctl.executors.shell import as_user
from runnerctl.settings import ExecutorSettings

_VALUED = dict.fromkeys(("-L", "--mpi", "-g", "-m", "--mail-list", "-p"), 1)
"""pjsub options a job may add: resources but nodes and GPUs (`-L rscgrp=small`), MPI
settings, group, mail, priority. Not bulk jobs (`--bulk --sparam`), steps, variables
(`-x`, `-X`), the output or name."""
_GPU_RESOURCES = ("node", "gpu", "vnode", "vnode-core")
_SUBMITTED = re.compile(r"\[INFO\] PJM 0000 pjsub Job (\d+) submitted")
_PJM_DOWN = ("PJM 0068 ", "PJM 0072 ", "PJM 0090 ", "PJM 0091 ")
"""pjsub messages of a job manager that cannot take the job now (configuration changed,
accept limit, no daemon, internal error): the system's failure, not the job's request."""
_OWN_LIMIT = {"11": "elapse limit", "12": "memory limit", "23": "memory (OOM killer)"}
"""PJM CODEs of a job ended past its own limits (Command Reference, pjstat END CODE): a
build failure, as Slurm's TIMEOUT and OUT_OF_MEMORY are."""


def scheduler_parameters(text: str) -> tuple[list[str], list[str]]:
    """(options passed on, options dropped) from the job's SCHEDULER_PARAMETERS."""
    return allowed_options(text, valued=_VALUED, resource_option="-L", refused_resources=_GPU_RESOURCES)


class Pjm:
    name = "pjm"
    title = "PJM"
    reserved_exits: tuple[int, ...] = ()
    node_launch = mpirun_launch(names='awk \'!seen[$0]++\' "$PJM_O_NODEINF"', job_id="PJM_JOBID")

    def __init__(self) -> None:
        self._seen: dict[str, list[str] | None] = {}  # the row active() just read, for never_runs

    def check(self) -> None:
        result = run_command(["pjstat"])
        if result.returncode != 0:
            raise SystemFailure(f"PJM is not reachable (pjstat failed: {result.stderr.strip()})")

    def filter(self, text: str, site: ExecutorSettings) -> tuple[list[str], list[str]]:
        return scheduler_parameters(text)

    def gpu_exports(self, request: Request) -> str:
        return ""  # PJM sets CUDA_VISIBLE_DEVICES for the job's GPUs

    def submit(self, request: Request) -> str:
        limit = ["-L", f"elapse={hms(request.time_limit_s)}"] if request.time_limit_s else []
        command = ["pjsub", "-X", "--norestart", "-N", request.label, "-j", "-o", str(request.log),
                   "-L", f"node={request.nodes}", "-L", f"gpu={request.gpus}", *limit,
                   *request.options, str(request.wrapper)]
        result = run_command(command, env=request.env, cwd=request.workdir, **request.runas)
        found = _SUBMITTED.search(result.stdout)
        if result.returncode == 0 and found:
            return found.group(1)
        message = (result.stderr.strip() or result.stdout.strip())
        if "[ERR.]" in message and not any(code in message for code in _PJM_DOWN):
            raise Refused(message)
        raise SystemFailure(f"pjsub did not submit the job: {message or f'exit {result.returncode}'}")

    def active(self, job_id: str) -> bool:
        self._seen[job_id] = row = _row(job_id)
        return row != []

    def never_runs(self, job_id: str) -> str | None:
        """ERR: PJM stopped the job for an error it found; it stays until deleted. What the
        job's own request could not get, pjsub rejected already. Reads the row active()
        read a moment before (sites ask for few pjstat calls)."""
        row = self._seen.pop(job_id) if job_id in self._seen else _row(job_id)
        return SiteFault("it is in ERR state (stopped by an error PJM detected; pjstat -v tells which)") \
            if row and row[3:4] == ["ERR"] else None

    def outcome(self, job_id: str) -> Outcome:
        record = wait_for_record(lambda: _history(job_id))
        if record is None:
            raise SystemFailure(f"PJM has no record of job {job_id} (pjstat -H -s)")
        state = record.get("STATE", "")
        pjm_code = record.get("PJM CODE", "0")
        code = record.get("EXIT CODE", "")
        status = int(code) if code.isdigit() else 1
        signal = record.get("SIGNAL NO", "-")
        if signal.isdigit() and int(signal):
            status = 128 + int(signal)  # ended by a signal: never a pass
        if pjm_code in _OWN_LIMIT:
            print(f"runnerctl: PJM job {job_id} ran past its {_OWN_LIMIT[pjm_code]} (PJM CODE {pjm_code})",
                  flush=True)
            return Outcome(status or 1)
        if state == "CCL":
            return Outcome(None, "was cancelled (pjdel by an administrator?)")
        if state != "EXT" or pjm_code not in ("0", "-"):
            return Outcome(None, f"ended {state or 'unknown'} (PJM CODE {pjm_code})")
        return Outcome(status)

    def cancel_command(self, job_id: str) -> list[str]:
        return ["pjdel", job_id]

    def reap(self, label: str, job_id: str | None, user: pwd.struct_passwd) -> None:
        rows = run_command(["pjstat", "--filter", f"jnam={label}"], **as_user(user)).stdout.splitlines()[1:]
        found = {row.split()[0] for row in rows if row.split()[:1] and row.split()[0].isdigit()}
        for job in found | ({job_id} if job_id else set()):
            run_command(["pjdel", job], **as_user(user))


def _row(job_id: str) -> list[str] | None:
    """The job's row in `pjstat <id>` (split); [] when PJM lists it no more, None when
    pjstat failed (unknown counts as active)."""
    result = run_command(["pjstat", job_id])
    if result.returncode != 0:
        return None
    rows = (row.split() for row in result.stdout.splitlines()[1:])
    return next((row for row in rows if row[:1] == [job_id]), [])


def _history(job_id: str) -> dict[str, str] | None:
    result = run_command(["pjstat", "-H", "-s", job_id])
    if result.returncode != 0:
        return None
    record = {}
    for line in result.stdout.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            record[key.strip()] = value.strip()
    return record or None


def PjmDriver() -> BatchDriver:  # noqa: N802 (the registry's constructor name)
    return BatchDriver(Pjm())
