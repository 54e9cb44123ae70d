"""The pbs driver: the user's script stages run as OpenPBS / PBS Professional batch jobs.

On the batch contract of executors/batch.py, with OpenPBS's documented behaviour
(openpbs/openpbs doc/man1/qsub.1B, qstat.1B, qdel.1B, qselect.1B, pbs_job_attributes.7B):
- submit with `qsub -V -N <label> -j oe -o <log> -l select=<nodes>:ngpus=<N>`
  (`-l walltime=H:MM:SS` from the job's timeout); qsub prints `<seq>.<server>`. `-V`
  because PBS gives a job no environment of the submitter's otherwise;
- PBS accepts a request no vnode can meet and leaves it queued with the comment "Can
  Never Run: ..." (src/scheduler/constant.h): the driver reads the comment while the job
  waits, deletes the job and fails the stage at once with the scheduler's words;
- state and outcome from `qstat -x -f <id>` (text: `    name = value`, a long value
  going on in lines that start with a tab): `job_state` F is finished. Not `-F json`:
  OpenPBS up to 23.06 prints any value that strtod() reads whole as a bare number
  (src/lib/Libcmds/pbs_json.c, add_json_node; openpbs/openpbs issues 1255 and 2541),
  and `qsub -V` puts every CI variable into `Variable_List`, so `LR: ".001"` made the
  JSON invalid and the stage poll it until GitLab's timeout;
  `Exit_status` is the script's code (a build failure); above 256 a signal (256 + N)
  ended it, i.e. qdel by someone else: a system failure naming the job; negative is
  PBS's own failure (src/include/job.h JOB_EXEC_*), except -29, the walltime (a build
  failure: the job ran past its GitLab timeout); none means it was deleted before it ran;
- the cgroups hook sets CUDA_VISIBLE_DEVICES to the GPUs' UUIDs; the lease records them;
- PBS writes the job's output file only when it ends, so the wrapper's own output file
  (in the shared builds dir) is what the job log streams;
- `qdel <id>` cancels; `qselect -N <label> -u <user>` finds what a killed driver left.
SCHEDULER_PARAMETERS: `-q`, `-A`, `-l walltime=`, `-l place=` and the like pass;
`-l select=`/`ngpus`, `-N`, `-o`, `-e`, `-j`, `-W block=` and `-I` are dropped with a note.
"""

from __future__ import annotations

import pwd

from runnerctl.executors.batch import (
    BatchDriver,
    Outcome,
    Refused,
    Request,
    allowed_options,
    hms,
    run_command,
    wait_for_record,
)
from runnerctl.executors.driver import SystemFailure
from runnerctl.executors.rendezvous import mpirun_launch
from runnerctl.executors.shell import as_user

_VALUED = dict.fromkeys(("-q", "-A", "-P", "-p", "-m", "-M", "-r", "-l"), 1)
"""qsub options a job may add (PBS Professional's qsub): queue, account, project,
priority, mail, rerun, resources but the chunk and GPU ones. Not arrays (`-J`),
attributes (`-W`), variables (`-v`), the output or name, interactive jobs."""
_GPU_RESOURCES = ("select", "ngpus", "nodes")
_WALLTIME = -29  # JOB_EXEC_KILL_WALLTIME (src/include/job.h)


def scheduler_parameters(text: str) -> tuple[list[str], list[str]]:
    """(options passed on, options dropped) from the job's SCHEDULER_PARAMETERS."""
    return allowed_options(text, valued=_VALUED, resource_option="-l", refused_resources=_GPU_RESOURCES)


_UNREACHABLE = ("cannot connect to server", "Connection refused", "Communication failure", "pbs_iff",
                "Connection timed out")
"""qsub errors that say the server did not answer (a system failure); any other refusal
(an unknown queue or resource, a bad value) is its answer to the job's own request."""


class Pbs:
    name = "pbs"
    title = "PBS"
    reserved_exits: tuple[int, ...] = ()
    node_launch = mpirun_launch(names='awk \'!seen[$0]++\' "$PBS_NODEFILE"', job_id="PBS_JOBID")

    def check(self) -> None:
        result = run_command(["qstat", "-B"])
        if result.returncode != 0:
            raise SystemFailure(f"PBS is not reachable (qstat -B failed: {result.stderr.strip()})")

    def filter(self, text: str) -> tuple[list[str], list[str]]:
        return scheduler_parameters(text)

    def gpu_exports(self, request: Request) -> str:
        return ""  # the cgroups hook sets CUDA_VISIBLE_DEVICES (GPU UUIDs)

    def submit(self, request: Request) -> str:
        limit = ["-l", f"walltime={hms(request.time_limit_s)}"] if request.time_limit_s else []
        command = ["qsub", "-V", "-N", request.label, "-j", "oe", "-o", str(request.log),
                   "-l", f"select={request.nodes}:ngpus={request.gpus}", *limit, *request.options,
                   str(request.wrapper)]
        result = run_command(command, env=request.env, cwd=request.workdir, **request.runas)
        if result.returncode != 0:
            message = result.stderr.strip() or result.stdout.strip()
            if any(words in message for words in _UNREACHABLE):
                raise SystemFailure(f"qsub could not submit the job: {message}")
            raise Refused(message)  # the server's answer to the job's own request
        return result.stdout.strip()

    def active(self, job_id: str) -> bool:
        job = _qstat(job_id)
        return job is None or job.get("job_state") != "F"  # unknown counts as active

    def never_runs(self, job_id: str) -> str | None:
        job = _qstat(job_id) or {}
        comment = str(job.get("comment", ""))
        return comment if job.get("job_state") == "Q" and comment.startswith("Can Never Run") else None

    def outcome(self, job_id: str) -> Outcome:
        job = wait_for_record(lambda: _finished(job_id))
        if job is None:
            raise SystemFailure(f"PBS has no record of job {job_id} (qstat -x -f)")
        if "Exit_status" not in job:
            return Outcome(None, "was deleted before it ran (qdel by an administrator?)")
        status = int(job["Exit_status"]) if job["Exit_status"].lstrip("-").isdigit() else -1
        if status == _WALLTIME:
            print(f"runnerctl: PBS job {job_id} ran past its walltime", flush=True)
            return Outcome(1)
        if status < 0:
            return Outcome(None, f"failed in PBS (Exit_status {status}, JOB_EXEC code)")
        if status > 256:
            return Outcome(None, f"was killed by signal {status - 256} (qdel by an administrator?)")
        return Outcome(status)

    def cancel_command(self, job_id: str) -> list[str]:
        return ["qdel", job_id]

    def reap(self, label: str, job_id: str | None, user: pwd.struct_passwd) -> None:
        found = run_command(["qselect", "-N", label, "-u", user.pw_name], **as_user(user)).stdout.split()
        for job in {*found, *([job_id] if job_id else [])}:
            run_command(["qdel", job], **as_user(user))


def _qstat(job_id: str) -> dict[str, str] | None:
    """The job's attributes from `qstat -x -f` (None: no such job, or qstat failed)."""
    result = run_command(["qstat", "-x", "-f", job_id])
    if result.returncode != 0:
        return None
    return _attributes(result.stdout)


def _attributes(text: str) -> dict[str, str] | None:
    """`    name = value` lines of qstat -f, with the tab-led lines a long value goes on in."""
    attrs: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        if line.startswith("\t") and key is not None:
            attrs[key] += line[1:]
            continue
        name, sep, value = line.strip().partition(" = ")
        key = name if sep else None
        if key is not None:
            attrs[key] = value
    return attrs if "job_state" in attrs else None


def _finished(job_id: str) -> dict[str, str] | None:
    job = _qstat(job_id)
    return job if job is not None and job.get("job_state") == "F" else None


def PbsDriver() -> BatchDriver:  # noqa: N802 (the registry's constructor name)
    return BatchDriver(Pbs())
