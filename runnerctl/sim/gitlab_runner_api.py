"""The runner side of the simulated GitLab: what gitlab-runner (or its stand-in) calls.

Authenticated by the runner token (`glrt-...`) or a job token, never by a user's token,
as in GitLab (lib/api/ci/runner.rb, lib/api/ci/helpers/runner.rb):

- `POST /runners/verify` {token, system_id?}: `authenticate_runner!` finds the runner
  (403 otherwise), heartbeats it and finds or creates its runner manager for
  `system_id` (`<legacy>` without one); answers 200 with `{id, token, token_expires_at}`
  (Entities::Ci::RunnerRegistrationDetails). With `GitLabState.verify_skips_contact`
  (GitLab 16 and 17), a `glrt-` token's verify makes the manager but contacts neither.
- `DELETE /runners/managers` {token, system_id}: deletes that runner manager (204; 404
  "Runner manager not found" when there is none); `DELETE /runners` {token}: unregisters
  the runner (204). Neither heartbeats (`authenticate_runner!(ensure_runner_manager:
  false)`), except `DELETE /runners/managers` under `verify_skips_contact`, whose
  helper heartbeats the runner first.
- `POST /jobs/request` {token, system_id, info{features}, last_update}: the same
  heartbeat; a paused runner gets 204; otherwise 201 with the job
  (lib/api/entities/ci/job_request/response.rb and its JobInfo, GitInfo, RunnerInfo,
  Step entities) or 204 when nothing is pending for it.
- `PUT /jobs/:id` {token, state, failure_reason, exit_code}: `authenticate_job!`: 403
  unless the job token matches and the job is running or canceling, with `Job-Status`;
  then app/services/ci/update_build_state_service.rb: `running` touches the job,
  `success` / `failed` finish it (a canceling job becomes canceled), anything else 400;
  the answer carries `Job-Status`.
- `PATCH /jobs/:id/trace` (`JOB-TOKEN` header, `Content-Range: start-end`): 400 without
  Content-Range, 416 with `Range: 0-size` when `start` is not the current size,
  otherwise 202 with `Job-Status`, `Range` and `X-GitLab-Trace-Update-Interval`
  (app/services/ci/append_build_trace_service.rb).
"""

from __future__ import annotations

import re
from typing import Any

from runnerctl.sim.gitlab_access import ApiError, forbidden
from runnerctl.sim.gitlab_state import GitLabState, SimJob, SimRunner

Answer = tuple[int, Any, dict[str, str]]
LEGACY_SYSTEM_ID = "<legacy>"
TEXT = {"Content-Type": "text/plain"}


class RunnerApi:
    def __init__(self, state: GitLabState) -> None:
        self.state = state
        self.traces: dict[int, int] = {}  # job id -> trace bytes received

    def handles(self, method: str, path: str) -> bool:
        if path in ("/runners", "/runners/managers"):
            return method == "DELETE"  # GET /runners is the user API's
        return (path in ("/runners/verify", "/jobs/request")
                or re.fullmatch(r"/jobs/\d+(/trace)?", path) is not None)

    def route(self, method: str, path: str, body: dict[str, Any], headers: dict[str, str],
              raw: bytes) -> Answer:
        if method == "POST" and path == "/runners/verify":
            runner = self._runner(body)
            created = runner.token.startswith("glrt-")  # made by POST /user/runners
            self.state.heartbeat(runner, str(body.get("system_id") or LEGACY_SYSTEM_ID),
                                 contact=not (self.state.verify_skips_contact and created))
            return 200, {"id": runner.id, "token": runner.token,
                         "token_expires_at": runner.token_expires_at}, {}
        if method == "POST" and path == "/jobs/request":
            return self._request(body)
        if method == "DELETE" and path == "/runners/managers":
            runner = self._runner(body)
            if not body.get("system_id"):
                raise ApiError(400, {"error": "system_id is missing"})
            if self.state.verify_skips_contact:
                self.state.heartbeat(runner)
            if self.state.managers.pop((runner.id, str(body["system_id"])), None) is None:
                raise ApiError(404, {"message": "404 Runner manager not found Not Found"})
            return 204, None, {}
        if method == "DELETE" and path == "/runners":
            self.state.delete_runner(self._runner(body).id)
            return 204, None, {}
        match = re.fullmatch(r"/jobs/(\d+)(/trace)?", path)
        if match and method == "PUT" and not match.group(2):
            return self._update(int(match.group(1)), body)
        if match and method == "PATCH" and match.group(2):
            return self._trace(int(match.group(1)), headers, raw, body)
        raise ApiError(404, {"error": "404 Not Found"})

    def _runner(self, body: dict[str, Any]) -> SimRunner:
        runner = self.state.runner_by_token(str(body.get("token") or ""))
        if runner is None:
            raise forbidden()
        return runner

    def _request(self, body: dict[str, Any]) -> Answer:
        runner = self._runner(body)
        info = body.get("info")
        info = info if isinstance(info, dict) else {}
        features = info.get("features")
        features = features if isinstance(features, dict) else {}
        system_id = str(body.get("system_id") or LEGACY_SYSTEM_ID)
        self.state.heartbeat(runner, system_id, {str(k): bool(v) for k, v in features.items()})
        job = self.state.request_job(runner.id, system_id=system_id,
                                     cancel_gracefully=bool(features.get("cancel_gracefully")))
        if job is None:
            return 204, None, {"X-GitLab-Last-Update": str(len(self.state.jobs))}
        self.traces[job.id] = 0
        return 201, self.job_payload(job, runner), {}

    def _job(self, job_id: int, token: str) -> SimJob:
        """lib/api/ci/helpers/runner.rb `authenticate_job!`."""
        job = self.state.jobs.get(job_id)
        if job is None or not token or job.token != token:
            raise forbidden()
        if job.status not in ("running", "canceling"):
            raise ApiError(403, {"message": "403 Forbidden - Job is not processing on runner"},
                           {"Job-Status": job.status})
        runner = self.state.runners.get(job.runner_id) if job.runner_id else None
        if runner is not None:  # heartbeat_runner: true
            self.state.heartbeat(runner, job.system_id)
        return job

    def _update(self, job_id: int, body: dict[str, Any]) -> Answer:
        job = self._job(job_id, str(body.get("token") or ""))
        state = str(body.get("state") or "")
        exit_code = body.get("exit_code")
        if state == "running":
            self.state.touch_job(job.id)
        elif state in ("success", "failed"):
            reason = str(body.get("failure_reason") or "unknown_failure")
            self.state.finish_job(job.id, state,
                                  failure_reason=reason if reason in FAILURE_REASONS else "unknown_failure",
                                  exit_code=int(exit_code) if isinstance(exit_code, (int, str)) and
                                  str(exit_code).lstrip("-").isdigit() else None)
        else:
            return 400, "400", {**TEXT, "Job-Status": job.status}
        return 200, "200", {**TEXT, "Job-Status": job.status, "X-GitLab-Trace-Update-Interval": "30"}

    def _trace(self, job_id: int, headers: dict[str, str], raw: bytes, body: dict[str, Any]) -> Answer:
        token = headers.get("job-token") or str(body.get("token") or "")
        job = self._job(job_id, token)
        content_range = headers.get("content-range")
        if content_range is None:
            raise ApiError(400, {"message": "400 Missing header Content-Range"})
        size = self.traces.get(job.id, 0)
        match = re.fullmatch(r"(\d+)-(\d+)", content_range.strip())
        if match is None or int(match.group(1)) != size:
            raise ApiError(416, {"message": "416 Range Not Satisfiable"}, {"Range": f"0-{size}"})
        size += len(raw)
        self.traces[job.id] = size
        self.state.touch_job(job.id)
        return 202, None, {"Job-Status": job.status, "Range": f"0-{size}",
                           "X-GitLab-Trace-Update-Interval": "3"}

    def job_payload(self, job: SimJob, runner: SimRunner) -> dict[str, Any]:
        """The job as `POST /jobs/request` answers it (Entities::Ci::JobRequest::Response)."""
        s = self.state
        project = s.directory.project(job.project_id)
        path = project.path_with_namespace if project else f"p{job.project_id}"
        timeout = runner.job_timeout(s.project_timeout_s)
        repo = f"{s.base_url}/{path}.git"
        sha = f"{job.pipeline_id:040x}"
        variables = {
            "CI": "true", "GITLAB_CI": "true", "CI_SERVER_URL": s.base_url, "CI_JOB_ID": str(job.id),
            "CI_JOB_NAME": job.name, "CI_JOB_STAGE": job.stage, "CI_JOB_URL": s.web_url(job),
            "CI_PIPELINE_ID": str(job.pipeline_id),
            "CI_PROJECT_ID": str(job.project_id), "CI_PROJECT_PATH": path, "CI_COMMIT_SHA": sha,
            "CI_COMMIT_REF_NAME": job.ref, "CI_RUNNER_ID": str(runner.id),
            "CI_RUNNER_DESCRIPTION": runner.description, "CI_RUNNER_TAGS": ",".join(sorted(runner.tags)),
            "GITLAB_USER_LOGIN": job.user, "CI_REPOSITORY_URL": repo,
        }
        listed = [{"key": k, "value": v, "public": True, "masked": False} for k, v in variables.items()]
        listed.append({"key": "CI_JOB_TOKEN", "value": job.token, "public": False, "masked": True})
        steps: list[dict[str, Any]] = [{"name": "script", "script": list(job.script), "timeout": timeout,
                                        "when": "on_success", "allow_failure": False}]
        if job.after_script:
            steps.append({"name": "after_script", "script": list(job.after_script), "timeout": timeout,
                          "when": "always", "allow_failure": True})
        return {
            "id": job.id, "token": job.token, "allow_git_fetch": True,
            "job_info": {"id": job.id, "name": job.name, "stage": job.stage, "project_id": job.project_id,
                         "project_name": project.path if project else path,
                         "time_in_queue_seconds": int((job.started_at or s.clock()) - job.created_at),
                         "project_jobs_running_on_instance_runners_count": "+Inf"},
            "git_info": {"repo_url": repo, "ref": job.ref, "sha": sha, "before_sha": "0" * 40,
                         "ref_type": "branch",
                         "refspecs": [f"+refs/heads/{job.ref}:refs/remotes/origin/{job.ref}"],
                         "depth": 20, "repo_object_format": "sha1"},
            "runner_info": {"timeout": timeout, "runner_session_url": None},
            "variables": listed, "steps": steps, "image": None, "services": [], "artifacts": [],
            "cache": [], "credentials": [], "dependencies": [],
            "features": {"trace_sections": True, "failure_reasons": FAILURE_REASONS},
        }


FAILURE_REASONS = ["unknown_failure", "script_failure", "api_failure", "stuck_or_timeout_failure",
                   "runner_system_failure", "missing_dependency_failure", "runner_unsupported",
                   "stale_schedule", "job_execution_timeout", "archived_failure", "unmet_prerequisites",
                   "scheduler_failure", "data_integrity_failure", "runner_configuration_error",
                   "runner_external_dependency_failure", "runner_interrupted"]
"""Failure reasons a runner may report (app/models/concerns/enums/ci/commit_status.rb; the job
payload's `features.failure_reasons`, app/models/ci/build.rb `features`); any other value is
stored as `unknown_failure` (update_build_state_service.rb `failure_reason`)."""
