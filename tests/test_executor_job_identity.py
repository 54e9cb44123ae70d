"""Who ran a job and for which project is billed from the job's lease (job history, fair
share), and the lease reads them from the job response. GitLab lists its predefined
variables first (they have the lowest precedence, gitlabhq doc/ci/variables), so a job
that defines GITLAB_USER_LOGIN or CI_PROJECT_PATH in its YAML adds a later copy: the
first is GitLab's, and it is the one kept."""

from __future__ import annotations

import json
from pathlib import Path

from runnerctl.executors.driver import Job


def test_a_jobs_own_copy_of_an_identity_variable_changes_nothing(tmp_path: Path) -> None:
    response = tmp_path / "response.json"
    gitlab = [{"key": "CI_JOB_ID", "value": "77"}, {"key": "GITLAB_USER_LOGIN", "value": "mallory"},
              {"key": "CI_PROJECT_PATH", "value": "mallory/sweep"},
              {"key": "CI_JOB_NAME", "value": "train"}]
    yaml = [{"key": "GITLAB_USER_LOGIN", "value": "alice"},
            {"key": "CI_PROJECT_PATH", "value": "alice/thesis"}, {"key": "LR", "value": "0.1"}]
    response.write_text(json.dumps({"id": 77, "variables": gitlab + yaml}))
    job = Job.from_env({"JOB_RESPONSE_FILE": str(response), "CUSTOM_ENV_GITLAB_USER_LOGIN": "alice"})
    assert (job.id, job.user, job.project, job.name) == ("77", "mallory", "mallory/sweep", "train")
