"""OpenPBS stand-in at the command edge: `qsub`, `qstat`, `qdel`, `qselect` (tests/fakes/bin/pbs).

Rules modelled, from openpbs/openpbs:
- `qsub` prints the job id `<seq>.<server>` (doc/man1/qsub.1B); `-l select=N:ngpus=G`
  asks for N chunks of G GPUs (doc/man1/qsub.1B "selection statement"); `-N` names the
  job, `-o` is the output path, `-j oe` joins stderr into it, `-l walltime=` the limit.
- A chunk-level resource (`ncpus`, `mem`, ...: ATR_DFLAG_CVTSLT in
  src/lib/Libattr/master_resc_def_all.xml) asked for job-wide beside a `select` makes the
  server refuse the job (src/server/req_quejob.c, PBSE_INVALJOBRESC; the words from
  src/lib/Liblog/pbs_messages.c and src/server/reply_send.c); qsub prints them and exits
  with the error number, PBSE_INVALJOBRESC 15109 (src/include/pbs_error.h), as a process
  status 15109 % 256 = 5 (src/cmds/qsub.c, main: exit_qsub(rc) with rc from do_submit).
- Only with `-V` does the job get qsub's environment (doc/man1/qsub.1B, -V); without it
  the job starts with a bare one. The job starts in the owner's home directory, not
  the submission directory (PBS_O_WORKDIR names that one).
- A request no vnode can meet is accepted and never runs: the scheduler puts
  "Can Never Run: Insufficient amount of resource: ngpus ..." in the job's `comment`
  (src/scheduler/constant.h NEVER_RUN_PREFIX) and the job stays queued (Q).
- The output file is staged out when the job ends, not written while it runs (PBS
  spools it on the MoM), so a driver that wants live output must write its own file.
- `qstat -f <id>` prints `    name = value` lines, a long one wrapped with a newline and
  a tab (src/cmds/qstat.c, prt_attr); `-F json` prints {"Jobs": {"<id>": {...}}}
  (doc/man1/qstat.1B), where OpenPBS up to 23.06 writes any value that strtod() reads
  whole as a bare number, `.001` and `005` included, which is no JSON
  (src/lib/Libcmds/pbs_json.c, add_json_node; openpbs/openpbs issues 1255 and 2541);
- `Variable_List` holds the job's environment from `-V` (doc/man1/qsub.1B);
  `job_state` Q, R, F; a finished job is shown only with `-x` (without: "Job has
  finished, use -x or -H", exit 35); an unknown id answers "Unknown Job Id" (exit 153,
  src/lib/Liblog/pbs_messages.c msg_unkjobid).
- `Exit_status` (doc/man1/pbs_job_attributes.7B): the script's exit code; 256 + N when
  a signal N ended it (qdel sends SIGTERM); negative for PBS's own failures
  (src/include/job.h JOB_EXEC_*, e.g. -29 JOB_EXEC_KILL_WALLTIME); a job deleted
  before it ran has none.
- The cgroups hook sets CUDA_VISIBLE_DEVICES to the assigned GPUs' UUIDs
  (src/hooks/cgroups/pbs_cgroups.PY); PBS_JOBID, PBS_JOBNAME, PBS_NODEFILE are set.
- A job no MoM will run (an execjob_prologue hook that rejects it, a node without its
  directory) is tried again until its run_count passes 20, then the server holds it
  (job_state H, Hold_Types s) with the comment "job held, too many failed attempts to
  run" (src/server/req_runjob.c check_failed_attempts; test/tests/functional/
  pbs_hook_execjob_prologue.py), and it waits for an administrator's qrls.
- `qdel <id>` ends the job (doc/man1/qdel.1B); `qselect -N <name> [-u <user>]` lists the
  ids of unfinished jobs with that name (doc/man1/qselect.1B).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import batch_engine as engine  # noqa: E402  (run as a script from tests/fakes/bin/pbs)

SERVER = "fakepbs"
_PBSE_INVALJOBRESC = 15109
_CHUNK_LEVEL = {"mem", "ncpus", "naccelerators", "arch", "nchunk", "vntype", "mpiprocs", "ompthreads",
                "vmem", "vnode", "aoe", "eoe", "accelerator", "accelerator_model", "accelerator_memory",
                "accelerator_group", "hbmem"}  # ATR_DFLAG_CVTSLT (master_resc_def_all.xml)
_STATE = {"queued": "Q", "running": "R", "done": "F", "held": "H"}
MOM_REJECTS = "RUNNERCTL_FAKE_PBS_MOM_REJECTS"
"""Set: every MoM refuses to run the job (a failing execjob_prologue hook, a node without
the job's working directory), so the server holds it after its attempts run out."""
_HELD = "job held, too many failed attempts to run"


def qsub(args: list[str]) -> int:
    parsed = engine.parse(args, flags=("-V",), valued=("-N", "-o", "-j", "-l", "-W"), resource="-l")
    if isinstance(parsed, str):
        print(f"qsub: invalid option -- '{parsed.lstrip('-')}'", file=sys.stderr)
        return 2
    given, values, resources, script = parsed
    opts: dict[str, Any] = {"name": values.get("-N", "STDIN"), "out": values.get("-o"),
                            "export": "-V" in given, "resources": resources}
    script = os.path.abspath(script)
    beside = sorted(_CHUNK_LEVEL & set(resources)) if "select" in resources else []
    if beside:
        print(f'qsub: "-lresource=" cannot be used with "select" or "place", resource is: {beside[0]}',
              file=sys.stderr)
        return _PBSE_INVALJOBRESC % 256
    chunks, gpus = _select(opts["resources"].get("select", "1"))
    comment = ""
    if gpus > engine.node_gpus() or chunks > engine.nodes():
        comment = (f"Can Never Run: Insufficient amount of resource: ngpus (R: {chunks * gpus} "
                   f"A: {engine.node_gpus()} T: {engine.nodes() * engine.node_gpus()})")
    home = os.environ.get("HOME", "/")
    env = dict(os.environ) if opts["export"] else {"PATH": "/usr/bin:/bin", "HOME": home}
    env["PBS_O_WORKDIR"] = os.getcwd()
    out = opts["out"] or os.path.join(os.getcwd(), f"{opts['name']}.o")
    job_id = engine.new_job({"name": opts["name"], "script": script, "env": env, "workdir": home,
                             "out": out, "log": out + ".spool", "comment": comment,
                             "chunks": chunks, "gpus": gpus,
                             "walltime": opts["resources"].get("walltime", ""),
                             "select": opts["resources"].get("select", "1")})
    if not comment and os.environ.get(MOM_REJECTS):
        engine.update(job_id, state="held", comment=_HELD, run_count=21)
    elif not comment:
        engine.start(job_id, "pbs")
    print(f"{job_id}.{SERVER}")
    return 0


def _select(text: str) -> tuple[int, int]:
    """(chunks, GPUs per chunk) of `select=N:ngpus=G:...`."""
    parts = text.split(":")
    chunks = int(parts[0]) if parts[0].isdigit() else 1
    gpus = 0
    for part in parts:
        key, _, value = part.partition("=")
        if key == "ngpus":
            gpus = int(value)
    return chunks, gpus


def _run(job_id: str) -> int:
    job = engine.read(job_id)
    if job is None:
        return 1
    nodefile = job["log"] + ".nodes"
    with open(nodefile, "w") as handle:
        handle.write("".join(f"node{n}\n" for n in range(1, job["chunks"] + 1)))
    uuids = ",".join(f"GPU-fake0000-0000-0000-0000-{job_id}{g:04d}" for g in range(job["gpus"]))
    status = engine.run(job_id, {"PBS_JOBID": f"{job_id}.{SERVER}", "PBS_JOBNAME": job["name"],
                                 "PBS_NODEFILE": nodefile, "CUDA_VISIBLE_DEVICES": uuids})
    exit_status = status if status >= 0 else 256 - status
    if os.path.exists(job["log"]):
        shutil.copyfile(job["log"], job["out"])  # stage-out at the end
    engine.update(job_id, state="done", exit_status=exit_status, ended=time.time())
    return 0


def _job(job_id: str) -> dict[str, Any] | None:
    return engine.read(job_id.split(".")[0])


def qstat(args: list[str]) -> int:
    if "-B" in args:  # server status
        print(f"Server             Max   Tot   Que   Run   Hld   Wat   Trn   Ext Status\n{SERVER} 0 "
              f"{len(engine.all_jobs())} 0 0 0 0 0 0 Active")
        return 0
    history = "-x" in args
    ids = [a for a in args if not a.startswith("-") and a not in ("json",)]
    as_json = "-F" in args
    jobs: dict[str, Any] = {}
    for job_id in ids:
        job = _job(job_id)
        if job is None:
            print(f"qstat: Unknown Job Id {job_id}", file=sys.stderr)
            return 153
        if job["state"] == "done" and not history:
            print(f"qstat: {job_id} Job has finished, use -x or -H to obtain historical job "
                  "information", file=sys.stderr)
            return 35
        attrs: dict[str, Any] = {"Job_Name": job["name"], "job_state": _STATE[job["state"]],
                                 **({"Hold_Types": "s", "run_count": job["run_count"]}
                                    if job["state"] == "held" else {}),
                                 "comment": job["comment"],
                                 "Resource_List": {"select": job["select"], "walltime": job["walltime"]}}
        if job["state"] == "done" and "exit_status" in job:
            attrs["Exit_status"] = job["exit_status"]
        attrs["Variable_List"] = dict(job["env"])  # with -V, all of qsub's environment
        jobs[f"{job['id']}.{SERVER}"] = attrs
    if as_json:
        print(_json({"timestamp": int(time.time()), "pbs_version": "fake", "pbs_server": SERVER,
                     "Jobs": jobs}))
    else:
        for full, attrs in jobs.items():
            print(f"Job Id: {full}")
            for key, value in attrs.items():
                if key == "Variable_List":
                    _line(f"    {key} = " + ",".join(f"{k}={v}" for k, v in value.items()))
                elif isinstance(value, dict):
                    for sub, val in value.items():
                        _line(f"    {key}.{sub} = {val}")
                else:
                    _line(f"    {key} = {value}")
    return 0


def _line(text: str, width: int = 80) -> None:
    """One attribute of qstat -f: past `width`, it goes on in lines that start with a tab."""
    print(text[:width] + "".join(f"\n\t{text[i:i + width - 8]}" for i in range(width, len(text), width - 8)))


def _json(value: Any) -> str:
    """JSON as OpenPBS 23.06 writes it: a string that strtod() reads whole goes out bare."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str) and value.strip():
        try:
            float(value)
        except ValueError:
            return json.dumps(value)
        return value
    return json.dumps(value)


def qdel(args: list[str]) -> int:
    for job_id in args:
        job = _job(job_id)
        if job is None:
            print(f"qdel: Unknown Job Id {job_id}", file=sys.stderr)
            return 153
        if job["state"] == "done":
            print(f"qdel: Job has finished {job_id}", file=sys.stderr)
            return 35
        engine.delete(job["id"], by=os.environ.get("USER", "root"))
    return 0


def qselect(args: list[str]) -> int:
    name = args[args.index("-N") + 1] if "-N" in args else None
    for job in engine.all_jobs():
        if job["state"] != "done" and (name is None or job["name"] == name):
            print(f"{job['id']}.{SERVER}")
    return 0


if __name__ == "__main__":
    engine.main({"qsub": qsub, "qstat": qstat, "qdel": qdel, "qselect": qselect,
                 "_run": lambda a: _run(a[0])})
