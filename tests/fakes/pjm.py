"""Fujitsu PJM stand-in at the command edge: `pjsub`, `pjstat`, `pjdel` (tests/fakes/bin/pjm).

Rules modelled, from Fujitsu Technical Computing Suite "Job Operation Software
End-user's Guide" (EUG) and "Command Reference" (CR) as RIKEN keeps them
(RIKEN-RCCS/fugaku-doc docs/manual/en/jos/j2ul-2534-01enz0.pdf and j2ul-2549-01enz0.pdf);
no live PJM was available to check them against:
- `pjsub -L rscgrp=<group> -L node=<N> -L elapse=<H:MM:SS> -L gpu=<G> [-N <name>]
  [-o <file>] [-j] [-X] [--norestart] [--mpi ...] <script>`; `-L` also takes comma
  lists; on success it prints `[INFO] PJM 0000 pjsub Job <id> submitted.` and exits 0,
  else `[ERR.] PJM <code> pjsub ...` on stderr and exit 1 (CR pjsub): 0057 "rscname=value
  is greater than the upper limit (limit-value)." for a request beyond the resource
  group's limits, 0001 "Unknown option or no option argument: opt."; nothing is queued.
- Only with `-X` does the job inherit pjsub's environment variables.
- In the job: PJM_JOBID, PJM_JOBNAME, PJM_O_WORKDIR, PJM_ELAPSE_LIMIT (seconds), and
  PJM_O_NODEINF, a file naming the job's nodes one a line; GPUs as CUDA_VISIBLE_DEVICES
  indices (a site's custom resource: no Fujitsu source says how it is set).
- `pjstat [<id>...]` lists unfinished jobs: a header, then `JOB_ID JOB_NAME MD ST USER
  START_DATE ELAPSE_LIM NODE_REQUIRE` (START_DATE as `MM/DD HH:MM:SS`, ELAPSE_LIM as
  `HHHH:MM:SS`); JOB_NAME only its first 10 characters (CR pjstat); an id PJM does not
  list is left out with no error; `--filter jnam=<name>` keeps the jobs of that name.
  ST is ACC, QUE, RNA, RUN, RNO while the job lives; ERR, a job stopped by an error PJM
  detected, stays listed until pjdel (EUG: ERROR and HOLD are fixed states).
- `pjstat -H -s <id>` shows an ended job's record as `KEY : value` lines (CR's field
  names): STATE (EXT exited, CCL cancelled, RJT rejected), EXIT CODE, PJM CODE and
  SIGNAL NO; a job not ended is not in it.
- `pjdel <id>` answers `[INFO] PJM 0100 pjdel Accepted job <id>.`; an unknown one
  `[ERR.] PJM 0112 pjdel Job <id> does not exist.`; the job ends as CCL.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import batch_engine as engine  # noqa: E402  (run as a script from tests/fakes/bin/pjm)

_LIVE = {"queued": "QUE", "running": "RUN", "error": "ERR"}
PJM_ERROR = "RUNNERCTL_FAKE_PJM_ERROR"
"""Set: PJM stops every job for an error it detects (ST ERR) instead of running it."""


def _seconds(text: str) -> int:
    total = 0
    for part in text.split(":"):
        total = total * 60 + int(part or 0)
    return total


def pjsub(args: list[str]) -> int:
    parsed = engine.parse(args, flags=("-X", "-j", "--norestart"),
                          valued=("-L", "-N", "-o", "--mpi", "-x", "-g", "-e", "-p", "-m", "--mail-list"),
                          resource="-L")
    if isinstance(parsed, str):
        print(f"[ERR.] PJM 0001 pjsub Unknown option or no option argument: {parsed}.", file=sys.stderr)
        return 1
    given, values, resources, script = parsed
    opts: dict[str, Any] = {"name": values.get("-N", "STDIN"), "out": values.get("-o"),
                            "export": "-X" in given}
    nodes, gpus = int(resources.get("node", "1")), int(resources.get("gpu", "0"))
    if gpus > engine.node_gpus():
        print(f"[ERR.] PJM 0057 pjsub gpu={gpus} is greater than the upper limit ({engine.node_gpus()}).",
              file=sys.stderr)
        return 1
    if nodes > engine.nodes():
        print(f"[ERR.] PJM 0057 pjsub node={nodes} is greater than the upper limit ({engine.nodes()}).",
              file=sys.stderr)
        return 1
    bare = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/")}
    env = dict(os.environ) if opts["export"] else bare
    env["PJM_O_WORKDIR"] = os.getcwd()
    out = opts["out"] or os.path.join(os.getcwd(), f"{opts['name']}.out")
    job_id = engine.new_job({"name": opts["name"], "script": os.path.abspath(script), "env": env,
                             "workdir": os.getcwd(), "log": out, "nodes": nodes, "gpus": gpus,
                             "elapse": _seconds(resources["elapse"]) if "elapse" in resources else 0,
                             "user": os.environ.get("USER", "root")})
    if os.environ.get(PJM_ERROR):
        engine.update(job_id, state="error")
    else:
        engine.start(job_id, "pjm")
    print(f"[INFO] PJM 0000 pjsub Job {job_id} submitted.")
    return 0


def _run(job_id: str) -> int:
    job = engine.read(job_id)
    if job is None:
        return 1
    nodefile = job["log"] + ".nodeinf"
    with open(nodefile, "w") as handle:
        handle.write("".join(f"node{n}\n" for n in range(1, job["nodes"] + 1)))
    status = engine.run(job_id, {"PJM_JOBID": job_id, "PJM_JOBNAME": job["name"],
                                 "PJM_O_NODEINF": nodefile, "PJM_ELAPSE_LIMIT": str(job["elapse"]),
                                 "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in range(job["gpus"]))})
    ended = engine.read(job_id) or job
    state = "CCL" if ended.get("deleted_by") else "EXT"
    engine.update(job_id, state="done", pjm_state=state, exit_code=max(status, 0),
                  signal=-status if status < 0 else None, ended=time.time())
    return 0


def pjstat(args: list[str]) -> int:
    name = args[args.index("--filter") + 1].removeprefix("jnam=") if "--filter" in args else None
    ids = [a for a in args if not a.startswith("-") and a.isdigit()]
    if "-H" in args:
        for job_id in ids:
            job = engine.read(job_id)
            if job is None or job["state"] != "done":
                continue  # not ended (or unknown): not in the history, and no error
            fields = {"JOB ID": job["id"], "JOB NAME": job["name"],
                      "STATE": job.get("pjm_state", "CCL"),
                      "EXIT CODE": job.get("exit_code", "-"), "PJM CODE": 0,
                      "SIGNAL NO": job.get("signal") or "-"}
            print("\n".join(f" {key:<28}: {value}" for key, value in fields.items()))
        return 0
    print("  JOB_ID     JOB_NAME   MD ST  USER     START_DATE      ELAPSE_LIM NODE_REQUIRE")
    for job in engine.all_jobs():
        if job["state"] == "done" or (ids and job["id"] not in ids) or (name and job["name"] != name):
            continue
        lim = job["elapse"]
        print(f"  {job['id']} {job['name'][:10]} NM {_LIVE[job['state']]} {job['user'][:8]} "
              f"{time.strftime('%m/%d %H:%M:%S', time.localtime(job['submitted']))} "
              f"{lim // 3600:04d}:{lim // 60 % 60:02d}:{lim % 60:02d} {job['nodes']}")
    return 0


def pjdel(args: list[str]) -> int:
    for job_id in args:
        job = engine.read(job_id)
        if job is None or job["state"] == "done":
            print(f"[ERR.] PJM 0112 pjdel Job {job_id} does not exist.", file=sys.stderr)
            return 1
        engine.delete(job_id, by=os.environ.get("USER", "root"))
        if job["state"] in ("queued", "error"):
            engine.update(job_id, pjm_state="CCL")
        print(f"[INFO] PJM 0100 pjdel Accepted job {job_id}.")
    return 0


if __name__ == "__main__":
    engine.main({"pjsub": pjsub, "pjstat": pjstat, "pjdel": pjdel, "_run": lambda a: _run(a[0])})
