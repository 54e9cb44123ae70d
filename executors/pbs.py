"""The pbs driver: the user's script stages run as OpenPBS / PBS Professional batch jobs.

On the batch contract of executors/batch.py, with OpenPBS's documented behaviour
(openpbs/openpbs doc/man1/qsub.1B, qstat.1B, qdel.1B, qselect.1B, pbs_job_attributes.7B):
- submit with `qsub -V -N <label> -j oe -o <log> -l select=<nodes>:ngpus=<N>`
  (`-l walltime=H:MM:SS` from the job's timeout); qsub prints `<seq>.<server>`. `-V`
  because PBS gives a job no environment of the submitter's otherwise;
- PBS accepts a request no vnode can meet and leaves it queued with the comment "Can
  Never Run: ..." (src/scheduler/constant.h): the driver reads the comment while the job
  waits, deletes the job and fails the stage at once with the scheduler's words; a job
  the server held after MoMs refused it over 20 times ("job held, too many failed
  attempts to run") is deleted too, as a system failure;
- state and outcome from `qstat -x -f <id>` (text: `    name = value`, a long value
  going on in lines that start with a tab): `job_state` F is finished. Not `-F json`:
  OpenPBS up to 23.06 prints any value that strtod() reads whole as a bare number
  (src/lib/Libcmds/pbs_json.c, add_json_node; openpbs/openpbs issues 1255 and 2541),
  and `qsub -V` puts the submitting environment into `Variable_List` (once every CI
  variable too), so `LR=.001` there made the JSON invalid and the stage poll it until
  GitLab's timeout;
  `Exit_status` is the script's code (a build failure); above 256 a signal (256 + N)
  ended it, i.e. qdel by someone else: a system failure naming the job; negative is
  PBS's own failure (src/include/job.h JOB_EXEC_*), except -24 to -29, the job past its
  own walltime, mem, vmem, cput or ncpus (a build failure, as Slurm's TIMEOUT and
  OUT_OF_MEMORY); none means it was deleted before it ran;
- the cgroups hook sets CUDA_VISIBLE_DEVICES to the GPUs' UUIDs; the lease records them;
- PBS writes the job's output file only when it ends, so the wrapper's own output file
  (in the shared builds dir) is what the job log streams;
- `qdel <id>` cancels; `qselect -N <label> -u <user>` finds what a killed driver left.
SCHEDULER_PARAMETERS: `-q`, `-A`, `-l walltime=`, `-l place=` and the like pass; chunk
resources (`-l ncpus=16`, `-l mem=64gb`, or inside the job's own `-l select=1:ncpus=16`) go
into the driver's chunk, `select=<nodes>:ngpus=<N>:ncpus=16:mem=64gb`, per node; the
select's count and GPUs, `-N`, `-o`, `-e`, `-j`, `-W block=` and `-I` are dropped with a note.
"""

from __future__ import annotations

import pwd

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

_VALUED = dict.fromkeys(("-q", "-A", "-P", "-p", "-m", "-M", "-r", "-l"), 1)
"""qsub options a job may add (PBS Professional's qsub): queue, account, project,
priority, mail, rerun, resources but the chunk and GPU ones. Not arrays (`-J`),
attributes (`-W`), variables (`-v`), the output or name, interactive jobs."""
_GPU_RESOURCES = ("select", "ngpus", "nodes", "naccelerators", "nchunk")
_CHUNK_RESOURCES = frozenset({"ncpus", "mem", "vmem", "mpiprocs", "ompthreads", "arch", "vntype", "vnode",
                              "aoe", "eoe", "hbmem", "accelerator", "accelerator_model",
                              "accelerator_memory", "accelerator_group"})
"""Resources PBS takes only inside a chunk once `select` is given: the ATR_DFLAG_CVTSLT
ones of src/lib/Libattr/master_resc_def_all.xml (but the GPU and chunk counts). Beside a
`select` the server refuses the job (src/server/req_quejob.c, PBSE_INVALJOBRESC:
'"-lresource=" cannot be used with "select" or "place", resource is: ncpus'), and the
driver always gives one, so a job's `-l ncpus=16`, `-l mem=64gb` or the same inside its
own `-l select=1:ncpus=16:mem=64gb` go into the driver's chunk (one per node)."""
_OVER_LIMIT = {-24: "ncpus (burst)", -25: "ncpus (sum)", -26: "vmem", -27: "mem", -28: "cput",
               -29: "walltime"}
"""Exit_status of a job the MoM killed for going past one of its own limits
(src/include/job.h JOB_EXEC_KILL_*, set in src/resmom/mom_main.c job_over_limit): the
job's doing, a build failure, as Slurm's TIMEOUT and OUT_OF_MEMORY are."""


def scheduler_parameters(text: str) -> tuple[list[str], list[str]]:
    """(options passed on, options dropped) from the job's SCHEDULER_PARAMETERS. Of a
    dropped `-l select=...`, the first chunk's resources but the GPUs and the count pass
    on as `-l name=value,...` (submit puts them into its own chunk)."""
    kept, dropped = allowed_options(text, valued=_VALUED, resource_option="-l",
                                    refused_resources=_GPU_RESOURCES)
    left: list[str] = []
    i = 0
    while i < len(dropped):
        word = dropped[i]
        separate = word == "-l" and i + 1 < len(dropped)
        value = dropped[i + 1] if separate else word[2:] if word.startswith("-l") else ""
        if not any(item.startswith("select=") for item in value.split(",")):
            left.append(word)
            i += 1
            continue
        taken, refused = [], []  # one -l may hold several resources: `select=1:ncpus=16,walltime=1:00:00`
        for item in value.split(","):
            if item.startswith("select="):
                chunk, rest = _chunk_of(item)
                taken += chunk
                refused += [rest] if rest else []
            elif item.partition("=")[0] in _GPU_RESOURCES:
                refused.append(item)
            else:
                taken.append(item)
        if taken:
            kept += ["-l", ",".join(taken)]
        if refused:
            left += ["-l", ",".join(refused)] if separate else [f"-l{','.join(refused)}"]
        i += 2 if separate else 1
    return kept, left


def _chunk_of(select: str) -> tuple[list[str], str]:
    """(`name=value` of the first chunk's own resources, what of `select=` is not taken)."""
    first, plus, others = select.removeprefix("select=").partition("+")
    parts = first.split(":")
    taken = [part for part in parts if part.partition("=")[0] in _CHUNK_RESOURCES]
    rest = [part for part in parts if part not in taken]
    return taken, ("select=" + ":".join(rest) + plus + others) if rest or plus else ""


def _chunk(request: Request) -> tuple[str, list[str]]:
    """(the `select=` statement, the other options): the job's chunk-level resources go
    into the driver's chunk after its node count and GPUs (a name given twice: its last
    value in `options`, where those of the job's own select come last)."""
    chunk: dict[str, str] = {}
    rest: list[str] = []
    words = iter(request.options)
    for word in words:
        attached = word.startswith("-l") and word != "-l"
        value = word[2:] if attached else next(words, "") if word == "-l" else None
        if value is None:
            rest.append(word)
            continue
        pairs = [pair.partition("=") for pair in value.split(",")]
        chunk.update((name, value) for name, _, value in pairs if name in _CHUNK_RESOURCES)
        job_wide = ["".join(pair) for pair in pairs if pair[0] not in _CHUNK_RESOURCES]
        if job_wide:
            rest += ["-l", ",".join(job_wide)]
    own = "".join(f":{name}={value}" for name, value in chunk.items())
    return f"select={request.nodes}:ngpus={request.gpus}{own}", rest


_HELD_AFTER_FAILURES = "job held, too many failed attempts to run"
"""The comment of a job the server held (Hold_Types s) after MoMs refused to run it over 20
times (src/server/req_runjob.c check_failed_attempts: a failing execjob_prologue hook, a
node without the job's directory): it waits for an administrator, a system failure."""
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

    def filter(self, text: str, site: ExecutorSettings) -> tuple[list[str], list[str]]:
        return scheduler_parameters(text)

    def gpu_exports(self, request: Request) -> str:
        return ""  # the cgroups hook sets CUDA_VISIBLE_DEVICES (GPU UUIDs)

    def submit(self, request: Request) -> str:
        limit = ["-l", f"walltime={hms(request.time_limit_s)}"] if request.time_limit_s else []
        select, options = _chunk(request)
        command = ["qsub", "-V", "-N", request.label, "-j", "oe", "-o", str(request.log),
                   "-l", select, *limit, *options, str(request.wrapper)]
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
        if job.get("job_state") == "H" and comment.startswith(_HELD_AFTER_FAILURES):
            return SiteFault(comment)  # no MoM would run it: the cluster's doing
        return comment if job.get("job_state") == "Q" and comment.startswith("Can Never Run") else None

    def outcome(self, job_id: str) -> Outcome:
        job = wait_for_record(lambda: _finished(job_id))
        if job is None:
            raise SystemFailure(f"PBS has no record of job {job_id} (qstat -x -f)")
        if "Exit_status" not in job:
            return Outcome(None, "was deleted before it ran (qdel by an administrator?)")
        status = int(job["Exit_status"]) if job["Exit_status"].lstrip("-").isdigit() else -1
        if status in _OVER_LIMIT:
            print(f"runnerctl: PBS job {job_id} ran past its {_OVER_LIMIT[status]} limit", flush=True)
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
