"""Run a rendered pipeline's jobs the way GitLab and gitlab-runner would, locally.

Stages in order (.pre, the declared stages, .post); each job's `extends` merged;
`parallel: N` becomes N processes with CI_NODE_INDEX (1..N) and CI_NODE_TOTAL
(docs.gitlab.com/ci/variables/predefined_variables); job `variables` exported, with
`$VAR` references expanded as the runner does; `script` lines run in one `bash -e`
shell in the project directory. Returns the processes so a test can kill one.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml


def load(text: str) -> dict[str, Any]:
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data


def resolve(pipeline: dict[str, Any], name: str) -> dict[str, Any]:
    job = dict(pipeline[name])
    parents = job.pop("extends", [])
    merged: dict[str, Any] = {}
    for parent in [parents] if isinstance(parents, str) else parents:
        base = resolve(pipeline, parent)
        merged.update(base)
        merged["variables"] = {**base.get("variables", {})}
    merged["variables"] = {**merged.get("variables", {}), **job.pop("variables", {})}
    merged.update(job)
    return merged


def stage_jobs(pipeline: dict[str, Any], stage: str) -> list[str]:
    return [name for name, job in pipeline.items()
            if not name.startswith(".") and isinstance(job, dict) and job.get("stage", "test") == stage]


def start_job(pipeline: dict[str, Any], name: str, *, cwd: Path,
              env: dict[str, str]) -> list[subprocess.Popen[str]]:
    job = resolve(pipeline, name)
    total = int(job.get("parallel", 1))
    script = "\n".join(job["script"])
    procs = []
    for index in range(1, total + 1):
        job_env = {**os.environ, **env, "CI": "true", "GITLAB_CI": "true",
                   "CI_JOB_NAME": f"{name} {index}/{total}" if total > 1 else name,
                   "CI_NODE_INDEX": str(index), "CI_NODE_TOTAL": str(total),
                   "CI_PROJECT_DIR": str(cwd)}
        for key, value in job.get("variables", {}).items():
            job_env[key] = os.path.expandvars(str(value)) if "$" in str(value) else str(value)
        procs.append(subprocess.Popen(["bash", "-e", "-c", script], cwd=cwd, env=job_env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    return procs


def run_pipeline(text: str, *, cwd: Path, env: dict[str, str], timeout: float = 120) -> dict[str, str]:
    """Run every job, stage by stage; returns each job's output; fails on a failed job."""
    pipeline = load(text)
    outputs: dict[str, str] = {}
    for stage in [".pre", *pipeline.get("stages", []), ".post"]:
        running = {name: start_job(pipeline, name, cwd=cwd, env=env)
                   for name in stage_jobs(pipeline, stage)}
        for name, procs in running.items():
            for i, proc in enumerate(procs, 1):
                out, _ = proc.communicate(timeout=timeout)
                outputs[f"{name}#{i}"] = out
                assert proc.returncode == 0, f"job {name} #{i} failed:\n{out}"
    return outputs
