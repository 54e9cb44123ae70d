"""The sge driver: the user's script stages run as Grid Engine batch jobs (executors/batch.py).

Grid Engine (Son of Grid Engine / Debian's gridengine 8.1.9, `qsub(1)`, `qacct(1)`):
- submit with `qsub -terse -w e -N <label> -l gpu=N` (the consumable's name is the
  site's, `[executor] sge_gpu_resource`; empty: no GPU request, the job's SCHEDULER_PARAMETERS
  name a node type that carries its GPUs): `-w e` makes qsub refuse at once
  ("no suitable queues") a request no queue can ever meet, such as more GPUs than the
  `gpu` consumable of any host; `-terse` prints the bare job id; `-V` passes the
  driver's environment (not the job's CUSTOM_ENV_ variables: `qstat -j` shows env_list to
  every user); `-l h_rt=<the job's timeout>` is the hard time limit; `-r n`: a job is
  never run again after a node failed (its script would run twice);
- Grid Engine counts the `gpu` consumable but hands out no device ids, so the driver
  picks them: the slot's GPUs, which its lease holds, become CUDA_VISIBLE_DEVICES (the
  site's runner slots describe the execution host's GPUs);
- while a job is pending or running `qstat -j <id>` answers 0; after, it does not;
- the truth about an ended job is `qacct -j <id>` (the accounting file, written moments
  after the end): `failed 0` and `exit_status` is the script's code; a job deleted with
  qdel shows `failed 100 : assumedly after job` (exit_status 137), one past its h_rt
  `failed 37`, one past its own s_rt or s_cpu `failed 100` with exit_status 138 or 152
  (both a build failure). A job number may have several records (a rescheduled run,
  `failed 25`; each task of a tightly integrated parallel job; an older job after the
  ids wrapped): only those of the job's own name count, rescheduled runs are waited past,
  and the script's code from the `.rc` file overrules a record of 0 (the batch contract).
  `qsub -sync y` is not used: it returns 0 for a deleted job;
- a script's exit 99 or 100 means requeue or error state to Grid Engine: the wrapper
  exits 1 then, and the stage returns the script's own code from its `.rc` file; a job
  in error state for any other reason fails the stage at once, as a system failure
  (`never_runs`: what is left to go wrong there is the node's);
- `qdel <id>` cancels; `qdel <name>` deletes this user's jobs of that name (reaping).
SCHEDULER_PARAMETERS: `-pe`, `-q`, `-l h_rt=...` and the like pass; `-l gpu=...`, output,
name, working-dir and submission-mode options are dropped with a note.
"""

from __future__ import annotations

import pwd
import shlex

from runnerctl.executors.batch import (
    BatchDriver,
    Outcome,
    Refused,
    Request,
    SiteFault,
    allowed_options,
    run_command,
    wait_for_record,
)
from runnerctl.executors.driver import SystemFailure
from runnerctl.executors.rendezvous import mpirun_launch
from runnerctl.executors.shell import as_user
from runnerctl.settings import ExecutorSettings

_VALUED = {"-q": 1, "-P": 1, "-A": 1, "-l": 1, "-p": 1, "-m": 1, "-M": 1, "-R": 1, "-js": 1, "-pe": 2}
"""qsub options a job may add (qsub(1)): queue, project, account, resources but `gpu`, a
parallel environment (`-pe mpi 4`), priority, mail. Not arrays (`-t`), an options file
(`-@`), the output, name, shell or directory, `-sync`, `-now`."""


_UNREACHABLE = ("unable to contact qmaster", "commlib error", "failed receiving gdi request",
                "unable to send message to qmaster")
"""qsub errors that say the qmaster did not answer (a system failure); any other refusal
is its answer to the job's own request (a build failure)."""
_OVER_LIMIT = {"37"}
"""qacct `failed` codes of a job that ran past its own limits (accounting(5): 37, "qmaster
enforced h_rt, h_cpu, or h_vmem limit"): the job's doing, a build failure, as Slurm's
TIMEOUT and OUT_OF_MEMORY are."""
_SOFT_LIMIT_SIGNALS = {138: "s_rt (SIGUSR1)", 152: "s_cpu (SIGXCPU)"}
"""exit_status of a job ended by a signal Grid Engine sends at the job's own soft limit
(queue_conf(5) RESOURCE LIMITS: SIGUSR1 at s_rt, SIGXCPU at s_cpu; qacct says `failed 100 :
assumedly after job`, as after a qdel, whose signal is SIGKILL, 137): a build failure."""
_RESCHEDULED = "25"
"""qacct `failed` of a run that Grid Engine rescheduled (sge_status(5)): another record
follows when the job has run again; the driver submits with `-r n`, so only an
administrator's forced `qmod -f -rj` does it."""
ACCOUNTING_WAIT_S = 90.0
"""How long an ended job's record may take to reach `qacct`: the qmaster writes it every
`accounting_flush_time` (sge_conf(5): "sensible values range from a few seconds to one
minute"; 15 s by default, the `flush_time`)."""
RESERVED_EXITS = (99, 100)
"""Exit codes of a job script that Grid Engine acts on (queue_conf(5): 99 requeues the job,
100 puts it in error state, where it waits for an administrator): the wrapper ends with
1 instead and the stage reads the script's own code from its `.rc` file."""


def scheduler_parameters(text: str, gpu_resource: str = "gpu") -> tuple[list[str], list[str]]:
    """(options passed on, options dropped) from the job's SCHEDULER_PARAMETERS; a request
    of `gpu_resource`, the driver's own, is dropped (none when it is empty)."""
    return allowed_options(text, valued=_VALUED, resource_option="-l",
                           refused_resources=(gpu_resource,) if gpu_resource else ())


class GridEngine:
    name = "sge"
    title = "Grid Engine"
    reserved_exits: tuple[int, ...] = RESERVED_EXITS
    node_launch = mpirun_launch(names='if [ -n "${PE_HOSTFILE-}" ]; then awk \'{print $1}\' "$PE_HOSTFILE"; '
                                      "else hostname; fi", job_id="JOB_ID")

    def __init__(self) -> None:
        self.labels: dict[str, str] = {}  # job id -> the name it was submitted under

    def check(self) -> None:
        result = run_command(["qstat"])
        if result.returncode != 0:
            raise SystemFailure(f"Grid Engine is not reachable (qstat failed: {result.stderr.strip()}): "
                                "start sge_qmaster/sge_execd")

    def filter(self, text: str, site: ExecutorSettings) -> tuple[list[str], list[str]]:
        return scheduler_parameters(text, site.sge_gpu_resource)

    def gpu_exports(self, request: Request) -> str:
        ids = ",".join(str(g) for g in request.gpu_ids)
        return f"export CUDA_VISIBLE_DEVICES={shlex.quote(ids)}\n"

    def submit(self, request: Request) -> str:
        if request.nodes > 1:
            raise Refused("on Grid Engine, ask for several hosts with a parallel environment in "
                          "SCHEDULER_PARAMETERS (e.g. -pe mpi 2), not RUNNERCTL_NODES")
        limit = ["-l", f"h_rt={request.time_limit_s}"] if request.time_limit_s else []
        resource = request.site.sge_gpu_resource
        gpus = ["-l", f"{resource}={request.gpus}"] if resource else []
        command = ["qsub", "-terse", "-w", "e", "-r", "n", "-V", "-S", "/bin/bash", "-N", request.label,
                   "-o", str(request.log), "-j", "y", "-wd", str(request.workdir),
                   *gpus, *limit, *request.options, str(request.wrapper)]
        result = run_command(command, env=request.env, cwd=request.workdir, **request.runas)
        if result.returncode != 0:
            message = " ".join(result.stdout.split() + result.stderr.split())
            if any(words in message for words in _UNREACHABLE):
                raise SystemFailure(f"qsub could not submit the job: {message}")
            if "no suitable queues" in message:
                raise Refused(f"{message} (no queue offers {' '.join(gpus + request.options)})"
                              .replace(" )", ")"))
            if resource and f'unknown resource "{resource}"' in message:
                raise SystemFailure(f"{message}: this Grid Engine has no consumable {resource!r} (qconf -sc "
                                    "lists them): set [executor] sge_gpu_resource in runnerctl.toml")
            raise Refused(message)  # the qmaster's answer to the job's own request
        job_id = result.stdout.strip().split(".")[0]
        self.labels[job_id] = request.label
        return job_id

    def active(self, job_id: str) -> bool:
        result = run_command(["qstat", "-j", job_id])
        if result.returncode == 0:
            return True
        return "do not exist" not in result.stdout + result.stderr  # unknown counts as active

    def never_runs(self, job_id: str) -> str | None:
        """A job in error state (Eqw) waits for an administrator's `qmod -cj`, for ever
        as far as the CI job goes. The site's doing (a system failure): what qsub -w e can
        refuse in the job's request it refused already, the script's own 100 is masked, and
        what is left fails on the node (the working directory or output file the driver
        gives, the shell, a prolog: sge_status(5))."""
        result = run_command(["qstat", "-j", job_id])
        for line in result.stdout.splitlines():
            if line.startswith("error reason"):
                return SiteFault(f"it is in error state ({' '.join(line.partition(':')[2].split())})")
        return None

    def outcome(self, job_id: str) -> Outcome:
        name = self.labels.get(job_id)
        records = wait_for_record(lambda: _ended_runs(job_id, name), ACCOUNTING_WAIT_S)
        if records is None:
            seen = _qacct(job_id, name)
            if seen:  # only rescheduled runs: the last one never ended
                return Outcome(None, "was rescheduled by Grid Engine (qacct failed 25) and its next run "
                                     f"left no record in {ACCOUNTING_WAIT_S:.0f} s")
            raise SystemFailure(f"Grid Engine has no accounting record of job {job_id} after "
                                f"{ACCOUNTING_WAIT_S:.0f} s (qacct -j): deleted before it ran, or qacct "
                                "reads another accounting file than the qmaster writes")
        record = records[-1]
        failed = record.get("failed", "0")
        status = record.get("exit_status", "1").split()[0]
        code = int(status) if status.isdigit() else 1
        if failed.split()[0] in _OVER_LIMIT or (failed.split()[0] == "100" and code in _SOFT_LIMIT_SIGNALS):
            limit = _SOFT_LIMIT_SIGNALS.get(code, "limit")
            print(f"runnerctl: Grid Engine job {job_id} ran past its {limit}: qacct failed {failed}, "
                  f"exit_status {code}", flush=True)
            return Outcome(code=code or 1)
        if failed.split()[0] != "0":
            return Outcome(None, f"was deleted or killed by Grid Engine (qdel by an administrator?): "
                                 f"qacct failed {failed}, exit_status {code}")
        # a parallel job's record may be a task's (qacct -j does not say whose); the script's
        # own code confirms a 0
        return Outcome(code, confirm=record.get("granted_pe", "NONE") != "NONE")

    def cancel_command(self, job_id: str) -> list[str]:
        return ["qdel", job_id]

    def reap(self, label: str, job_id: str | None, user: pwd.struct_passwd) -> None:
        if job_id:
            run_command(["qdel", job_id], **as_user(user))
        run_command(["qdel", label], **as_user(user))  # submitted just before the driver was killed


def _qacct(job_id: str, name: str | None = None) -> list[dict[str, str]]:
    """The job's records in `qacct -j` (one per run, and one per task of a tightly integrated
    parallel job), in the file's order; with `name`, only those of a job of that name: a job
    number comes again after the ids wrap or the qmaster's spool was made anew
    (accounting(5)), and such an older record is no record of this job."""
    result = run_command(["qacct", "-j", job_id])
    if result.returncode != 0:
        return []
    records: list[dict[str, str]] = []
    for line in result.stdout.splitlines():
        if line.startswith("====="):
            records.append({})
            continue
        key, _, value = line.partition(" ")
        if key and value.strip() and records:
            records[-1][key] = value.strip()
    return [r for r in records if "exit_status" in r and (name is None or r.get("jobname") == name)]


def _ended_runs(job_id: str, name: str | None) -> list[dict[str, str]] | None:
    """The job's records once one is of a run that was not rescheduled; None before."""
    records = _qacct(job_id, name)
    ended = [r for r in records if r.get("failed", "0").split()[0] != _RESCHEDULED]
    return ended or None


def SgeDriver() -> BatchDriver:  # noqa: N802 (the registry's constructor name)
    return BatchDriver(GridEngine())
