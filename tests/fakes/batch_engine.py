"""The job table and job runner behind the PBS and PJM stand-ins (tests/fakes/pbs.py, pjm.py).

Neither OpenPBS nor Fujitsu PJM installs here, so their commands are stood in at the
command edge. What both share lives here: jobs are JSON files under
$RUNNERCTL_FAKE_BATCH (one directory per test), each runs detached from the submitting
command in its own session (as a batch job outlives qsub/pjsub), and a delete sends
SIGTERM to the job's session the way a MoM/PJM agent ends a job. The cluster's shape
comes from RUNNERCTL_FAKE_NODES (default 2) and RUNNERCTL_FAKE_NODE_GPUS (default 8).
The rules particular to each system, with their sources, are in the scheduler's module.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

STATE_ENV = "RUNNERCTL_FAKE_BATCH"


def parse(args: list[str], *, flags: tuple[str, ...], valued: tuple[str, ...], resource: str
          ) -> tuple[set[str], dict[str, str], dict[str, str], str] | str:
    """qsub/pjsub-style command line: (flags given, valued options, resources, script).

    Returns the offending word instead when the line is not valid.
    """
    given: set[str] = set()
    values: dict[str, str] = {}
    resources: dict[str, str] = {}
    i = 0
    while i < len(args) - 1:
        word = args[i]
        if word in flags:
            given.add(word)
            i += 1
            continue
        if word not in valued:
            return word
        if word == resource:
            for part in args[i + 1].split(","):
                key, _, value = part.partition("=")
                resources[key.strip()] = value.strip()
        else:
            values[word] = args[i + 1]
        i += 2
    return (given, values, resources, args[-1]) if i == len(args) - 1 else "(no script)"


def state_dir() -> Path:
    path = Path(os.environ[STATE_ENV])
    path.mkdir(parents=True, exist_ok=True)
    return path


def nodes() -> int:
    return int(os.environ.get("RUNNERCTL_FAKE_NODES", "2"))


def node_gpus() -> int:
    return int(os.environ.get("RUNNERCTL_FAKE_NODE_GPUS", "8"))


@contextlib.contextmanager
def locked() -> Iterator[Path]:
    root = state_dir()
    with (root / "lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield root
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def new_job(fields: dict[str, Any]) -> str:
    with locked() as root:
        counter = root / "next"
        number = int(counter.read_text()) if counter.exists() else 1000
        counter.write_text(str(number + 1))
        job = {"id": str(number), "state": "queued", "submitted": time.time(), **fields}
        _write(root, job)
    return str(number)


def read(job_id: str) -> dict[str, Any] | None:
    path = state_dir() / f"job-{job_id}.json"
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (FileNotFoundError, ValueError):
        return None


def all_jobs() -> list[dict[str, Any]]:
    found = (read(p.stem.removeprefix("job-")) for p in state_dir().glob("job-*.json"))
    return sorted((j for j in found if j), key=lambda j: int(j["id"]))


def update(job_id: str, **fields: Any) -> dict[str, Any] | None:
    with locked() as root:
        job = read(job_id)
        if job is None:
            return None
        job.update(fields)
        _write(root, job)
        return job


def _write(root: Path, job: dict[str, Any]) -> None:
    tmp = root / f"job-{job['id']}.tmp"
    tmp.write_text(json.dumps(job))
    os.replace(tmp, root / f"job-{job['id']}.json")


def start(job_id: str, module: str) -> None:
    """Run the job detached (`python -m <module> _run <id>`), as the batch system would."""
    subprocess.Popen([sys.executable, str(Path(__file__).with_name(f"{module}.py")), "_run", job_id],
                     start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, env=os.environ.copy())


def run(job_id: str, extra_env: dict[str, str]) -> int:
    """The job's life on its node: run the script in a session of its own; returns its wait status.

    The return is the Popen returncode: negative -N when a signal N ended the script.
    """
    job = read(job_id)
    if job is None or job["state"] != "queued":
        return 0
    env = {**job["env"], **extra_env}
    with open(job["log"], "ab") as log:
        proc = subprocess.Popen(["bash", job["script"]], cwd=job["workdir"], env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        started = update(job_id, state="running", pgid=proc.pid, started=time.time())
        if started and started.get("deleted_by"):  # deleted between our read and our start
            os.killpg(proc.pid, signal.SIGTERM)
        return proc.wait()


def delete(job_id: str, by: str) -> dict[str, Any] | None:
    """End a job: a queued one is dropped, a running one's session gets SIGTERM."""
    job = update(job_id, deleted_by=by)
    if job is None:
        return None
    if job["state"] == "running" and job.get("pgid"):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(job["pgid"]), signal.SIGTERM)
    elif job["state"] in ("queued", "held", "error"):
        update(job_id, state="done", ended=time.time())
    return job


def main(commands: dict[str, Callable[[list[str]], int]]) -> None:
    """Dispatch `<fake>.py <command> args...` (`_run <id>` is the job itself)."""
    command, rest = sys.argv[1], sys.argv[2:]
    sys.exit(commands[command](rest))
