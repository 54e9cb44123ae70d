"""The slurm driver: the user's script stages run as Slurm batch jobs (executors/batch.py).

Each script stage is submitted with `sbatch --gres=gpu:N --no-requeue` (N = the slot's
size) plus the job's SCHEDULER_PARAMETERS; `--nodes`, `--time`, `--partition` and `srun` inside pass
through. Options that would change the GPU request (`--gres`, `--gpus*`, `-G`,
`--tres-per-*`) or the driver's own bookkeeping (output file, job name, working dir)
are dropped with a note in the job log. Slurm sets CUDA_VISIBLE_DEVICES for the
allocation; the wrapper records it in the lease and keeps it readonly.

sbatch refuses at once a request no node can meet ("Requested node configuration is not
available"), and a SCHEDULER_PARAMETERS the controller rejects (an unknown partition or
feature, a bad `--time`): a build failure with sbatch's words, since the job's own
variables asked for it; only a controller that does not answer is a system failure.

`--no-requeue`: Slurm requeues a job after a node failure (JobRequeue=1, the default),
on preemption (PreemptMode=REQUEUE) or at an administrator's `scontrol requeue`, and "the
batch script is initiated from its beginning" (sbatch(1)): the stage ran the script twice
and passed on the second run. Not requeued, such a job ends NODE_FAIL or PREEMPTED, and
an administrator's requeue is refused; `--requeue` is dropped from SCHEDULER_PARAMETERS.

The outcome comes from `scontrol show job` (JobState, ExitCode=RC:SIG; kept MinJobAge
seconds after the end; each field's first occurrence, as a job's own text such as its
`--wckey` is printed after them): COMPLETED/FAILED/TIMEOUT/OUT_OF_MEMORY carry the
script's code (a build failure), as does DEADLINE (the job's own `--deadline`); CANCELLED
when runnerctl did not cancel it (an administrator's scancel), NODE_FAIL, BOOT_FAIL and
PREEMPTED are the cluster's doing (a system failure naming the job).
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
    run_command,
    wait_for_record,
)
from runnerctl.executors.driver import SystemFailure
from runnerctl.executors.rendezvous import NodeLaunch
from runnerctl.executors.shell import as_user
from runnerctl.settings import ExecutorSettings

_DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE"}
_SCRIPT_ENDS = {"COMPLETED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "DEADLINE"}
"""End states that carry the script's own exit code: build results."""
_ONE_VALUE = ("--partition", "-p", "--account", "-A", "--qos", "-q", "--time", "-t", "--time-min",
              "--mem", "--mem-per-cpu", "--mem-per-gpu", "--constraint", "-C", "--cpus-per-task", "-c",
              "--cpus-per-gpu", "--ntasks", "-n", "--ntasks-per-node", "--reservation", "--mail-type",
              "--mail-user", "--exclude", "-x", "--nodelist", "-w", "--tmp", "--licenses",
              "-L", "--wckey", "--begin", "--deadline", "--hint", "--signal")
_VALUED = dict.fromkeys(_ONE_VALUE, 1)
"""sbatch options a job may add (sbatch(1)): where, on whose account, how long, with what
memory and CPUs. Not the GPUs, nodes or arrays (`--gres`, `--gpus*`, `--tres*`, `-N`,
`--array`), another cluster (`-M`), the output, name or directory, `--wrap`, requeueing, nor
`--comment` (free text in `scontrol show job`, where `ExitCode=0:0` in it read as the result)."""
_FLAGS = ("--exclusive", "--no-requeue")
_NEVER = {"BadConstraints", "PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit",
          "QOSMaxWallDurationPerJobLimit", "AssocMaxWallDurationPerJobLimit", "PartitionInactive",
          "MaxMemPerLimit", "InvalidAccount", "InvalidQOS", "AccountNotAllowed", "QOSNotAllowed",
          "QOSMaxGRESPerJob", "QOSMaxNodePerJobLimit", "QOSMaxCpuPerJobLimit", "QOSMaxMemoryPerJob",
          "AssocMaxGRESPerJob", "AssocMaxNodePerJobLimit", "AssocMaxCpuPerJobLimit", "AssocMaxMemPerJob",
          "QOSMinGRES", "JobHoldMaxRequeue", "ReservationDeleted", "launch failed requeued held",
          "job requeued in held state"}
"""squeue reasons (%r) for a pending job that can never start as asked (slurm's
job_reason_string): among them a `--time` (the driver's default is the GitLab timeout)
over the partition's MaxTime, its QOS's or its association's: sbatch(1), "the job will
be left in a PENDING state (possibly indefinitely)" unless EnforcePartLimits refuses it
at submit; a per-job limit the request is over; and a job held after a failed launch
(a Prolog that failed: slurm.conf(5), "requeued in a held state"): the node is drained
and the job waits for an administrator, so the stage fails rather than hold its slot
until GitLab's timeout. Matched on the reason's first part: squeue prints details after a
comma. Limits of a group or a user (AssocGrpGRES, QOSMaxGRESPerUser), Resources,
Priority, a node or partition down and an administrator's or user's hold (JobHeldAdmin,
JobHeldUser) do wait."""
_SITE_HOLDS = {"launch failed requeued held", "job requeued in held state", "JobHoldMaxRequeue"}
"""Of those, the cluster's doing (a Prolog or a node that failed the launch): a system
failure; the others are the job's own request (a build failure)."""
_UNREACHABLE = ("Unable to contact slurm controller", "Socket timed out", "temporarily unavailable",
                "temporarily unable", "Zero Bytes were transmitted", "Communication connection failure")
"""sbatch errors that say the controller did not answer (a system failure); any other
refusal is the controller's answer to the job's own request (a build failure)."""


def scheduler_parameters(text: str) -> tuple[list[str], list[str]]:
    """(options passed to sbatch, options dropped) from the job's SCHEDULER_PARAMETERS."""
    return allowed_options(text, valued=_VALUED, flags=_FLAGS)


class Slurm:
    name = "slurm"
    title = "Slurm"
    reserved_exits: tuple[int, ...] = ()
    node_launch = NodeLaunch(
        names='scontrol show hostnames "$SLURM_JOB_NODELIST"',
        address='scontrol show node "$1" | grep -o "NodeAddr=[^ ]*" | cut -d= -f2',
        job_id="SLURM_JOB_ID",
        launch='srun --nodes="$WORLD_SIZE" --ntasks="$WORLD_SIZE" --ntasks-per-node=1',
        rank="SLURM_NODEID")

    def check(self) -> None:
        if run_command(["sinfo", "-h"]).returncode != 0:
            raise SystemFailure("Slurm is not reachable (sinfo failed): start slurmctld/slurmd")

    def filter(self, text: str, site: ExecutorSettings) -> tuple[list[str], list[str]]:
        return scheduler_parameters(text)

    def gpu_exports(self, request: Request) -> str:
        return ""  # Slurm sets CUDA_VISIBLE_DEVICES for the allocation

    def submit(self, request: Request) -> str:
        limit = [f"--time={-(-request.time_limit_s // 60)}"] if request.time_limit_s else []
        command = ["sbatch", "--parsable", "--no-requeue", *limit, f"--nodes={request.nodes}",
                   *request.options, f"--job-name={request.label}", f"--gres=gpu:{request.gpus}",
                   f"--output={request.log}", f"--chdir={request.workdir}", str(request.wrapper)]
        result = run_command(command, env=request.env, cwd=request.workdir, **request.runas)
        if result.returncode != 0:
            message = result.stderr.strip()
            if any(words in message for words in _UNREACHABLE):
                raise SystemFailure(f"sbatch could not submit the job: {message}")
            raise Refused(f"{message} (sbatch {' '.join(command[2:-1])})")
        return result.stdout.strip().split(";")[0]

    def active(self, job_id: str) -> bool:
        result = run_command(["squeue", "-h", "-j", job_id, "-o", "%T"])
        if result.returncode != 0 and "Invalid job id" not in result.stderr:
            return True
        return result.stdout.strip() not in _DONE | {""}

    def never_runs(self, job_id: str) -> str | None:
        reason = run_command(["squeue", "-h", "-j", job_id, "-o", "%r"]).stdout.strip()
        first = reason.split(",")[0].strip()
        if first not in _NEVER:
            return None
        said = f"pending for reason {reason}"
        return SiteFault(said) if first in _SITE_HOLDS else said

    def outcome(self, job_id: str) -> Outcome:
        fields = wait_for_record(lambda: _job_fields(job_id))
        if fields is None:
            raise SystemFailure(f"Slurm has no record of job {job_id} (scontrol show job)")
        state = fields.get("JobState", "")
        rc, _, sig = fields.get("ExitCode", "1:0").partition(":")
        code = int(rc) if rc.isdigit() else 1
        if sig.isdigit() and int(sig):
            code = 128 + int(sig)
        if state in _SCRIPT_ENDS:
            if state in ("TIMEOUT", "OUT_OF_MEMORY", "DEADLINE"):
                print(f"runnerctl: Slurm job {job_id} ended {state}", flush=True)
                return Outcome(code=code or 1)
            return Outcome(code=code)
        if state == "CANCELLED":
            return Outcome(None, "was cancelled outside runnerctl (scancel by an administrator?)")
        return Outcome(None, f"ended {state or 'in an unknown state'}")

    def cancel_command(self, job_id: str) -> list[str]:
        return ["scancel", job_id]

    def reap(self, label: str, job_id: str | None, user: pwd.struct_passwd) -> None:
        if job_id:
            run_command(["scancel", job_id], **as_user(user))
        # a job submitted just before the driver was killed, not yet recorded
        run_command(["scancel", "--name", label, "--user", user.pw_name], **as_user(user))


def _job_fields(job_id: str) -> dict[str, str] | None:
    out = run_command(["scontrol", "show", "job", job_id]).stdout
    fields: dict[str, str] = {}
    for name, _, value in (f.partition("=") for f in out.split() if "=" in f):
        fields.setdefault(name, value)  # the first: a job's own text (its --wckey) comes later
    return fields if fields.get("JobState") in _DONE else None


def SlurmDriver() -> BatchDriver:  # noqa: N802 (the registry's constructor name)
    return BatchDriver(Slurm())
