"""Who ran a job and for which project is billed from the job's lease (job history, fair
share), and the lease reads them from the job response. GitLab lists its predefined
variables first (they have the lowest precedence, gitlabhq doc/ci/variables), so a job
that defines CI_PROJECT_PATH or CI_JOB_ID in its YAML adds a later copy: the first is
GitLab's, and it is the one kept. Its user variables (GITLAB_USER_*) come after the YAML's
(lib/gitlab/ci/variables/builder.rb `scoped_variables`), so there the later copy is
GitLab's; a project or pipeline variable can come later still, which is why the
controller bills the user GitLab lists (tests/test_orphans.py)."""

from __future__ import annotations

import json
from pathlib import Path

from runnerctl.executors.driver import Job


def test_a_jobs_own_copy_of_an_identity_variable_changes_nothing(tmp_path: Path) -> None:
    response = tmp_path / "response.json"
    predefined = [{"key": "CI_JOB_ID", "value": "77"}, {"key": "CI_PROJECT_PATH", "value": "mallory/sweep"},
                  {"key": "CI_JOB_NAME", "value": "train"}]
    yaml = [{"key": "GITLAB_USER_LOGIN", "value": "alice"},
            {"key": "CI_PROJECT_PATH", "value": "alice/thesis"}, {"key": "LR", "value": "0.1"}]
    user = [{"key": "GITLAB_USER_ID", "value": "12"}, {"key": "GITLAB_USER_LOGIN", "value": "mallory"}]
    response.write_text(json.dumps({"id": 77, "variables": predefined + yaml + user}))
    job = Job.from_env({"JOB_RESPONSE_FILE": str(response), "CUSTOM_ENV_GITLAB_USER_LOGIN": "alice"})
    assert (job.id, job.user, job.project, job.name) == ("77", "mallory", "mallory/sweep", "train")


def test_the_image_is_the_one_gitlab_runner_expanded(tmp_path: Path) -> None:
    """`image: $CI_REGISTRY_IMAGE/train:latest` reaches the runner as written; gitlab-runner
    expands it (executors/docker/docker.go) and passes the result as CI_JOB_IMAGE
    (common/build.go). Taken from the payload, Apptainer and Docker were handed
    `docker://$CI_REGISTRY_IMAGE/...` (found by a review as an HPC user)."""
    response = tmp_path / "response.json"
    response.write_text(json.dumps({"id": 78, "image": {"name": "$CI_REGISTRY_IMAGE/train:latest"},
                                    "variables": [{"key": "CI_REGISTRY_IMAGE", "value": "reg.lab/ml/exp"}]}))
    env = {"JOB_RESPONSE_FILE": str(response), "CUSTOM_ENV_CI_JOB_IMAGE": "reg.lab/ml/exp/train:latest"}
    assert Job.from_env(env).image == "reg.lab/ml/exp/train:latest"
    assert Job.from_env({"JOB_RESPONSE_FILE": str(response)}).image == "$CI_REGISTRY_IMAGE/train:latest"
    response.write_text(json.dumps({"id": 79}))
    assert Job.from_env({"JOB_RESPONSE_FILE": str(response)}).image is None
