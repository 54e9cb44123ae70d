"""The docker driver pulling from a real registry: Debian's docker-registry (the
distribution registry) with htpasswd users, as .ci/setup/registry.sh installs it, on a
loopback port the engine treats as an insecure registry. Users: `gitlab-ci-token` with
the token of job 721 (what GitLab's registry takes from a job:
lib/gitlab/ci/build/credentials/registry/gitlab_registry.rb) and `lab`."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.harness_custom_executor import SYSTEM_FAILURE, FakeJob, Harness, harness_for, make_host
from tests.pg import free_port

IMAGE = "runnerctl-test/busybox:latest"
USERS = {"gitlab-ci-token": "glcbt-job721", "lab": "lab-pass"}
START_S = 60.0


@dataclasses.dataclass
class Registry:
    host: str
    engine: docker.DockerClient

    def push(self, source: str, name: str) -> str:
        """`source` pushed as <registry>/lab/<name>, and that tag removed here again, so a
        job naming it must pull it from the registry."""
        ref = f"{self.host}/lab/{name}"
        self.engine.images.get(source).tag(ref)
        for line in self.engine.images.push(ref, auth_config={"username": "lab", "password": "lab-pass"},
                                            stream=True, decode=True):
            assert "error" not in line, line
        self.engine.images.remove(ref)
        return ref


def _v2_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    for program in ("docker-registry", "htpasswd"):  # no skip: CI must install them
        assert shutil.which(program), f"{program} is missing: run .ci/setup/registry.sh"
    root = tmp_path_factory.mktemp("registry")
    lines = [subprocess.run(["htpasswd", "-Bbn", user, password], check=True, capture_output=True,
                            text=True).stdout.strip() for user, password in USERS.items()]
    (root / "htpasswd").write_text("\n".join(lines) + "\n")
    port = free_port()
    (root / "config.yml").write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
        f"auth:\n  htpasswd:\n    realm: runnerctl-test\n    path: {root / 'htpasswd'}\n")
    with (root / "registry.log").open("wb") as log:
        proc = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_S
        while _v2_status(f"http://127.0.0.1:{port}/v2/") != 401:  # up, and asking for credentials
            assert proc.poll() is None and time.monotonic() < deadline, (root / "registry.log").read_text()
            time.sleep(0.1)
        engine = docker.from_env()
        engine.images.get(IMAGE)
        yield Registry(f"127.0.0.1:{port}", engine)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _host(tmp_path: Path, *, policy: str = "") -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    host = make_host(tmp_path, docker_image=IMAGE)
    if policy:
        with (host / "runnerctl.toml").open("a") as settings:  # [executor] is its last table
            settings.write(f'docker_pull_policy = "{policy}"\n')
    return host


def _harness(host: Path) -> Harness:
    return harness_for(host, (1,), "docker")


def _auth_config(user: str, password: str, host: str) -> str:
    basic = base64.b64encode(f"{user}:{password}".encode()).decode()
    return json.dumps({"auths": {host: {"auth": basic}}})


def test_gitlab_registry_credentials_of_the_payload_pull_a_private_image(registry: Registry,
                                                                          tmp_path: Path) -> None:
    """The image in the project's own registry: gitlab-runner pulls it with the payload's
    credentials (gitlab-ci-token and the job token); the driver pulled without any."""
    image = registry.push(IMAGE, "busybox:payload")
    job = FakeJob(id=721, image=image, registry=registry.host)
    results = _harness(_host(tmp_path)).run_job(job, "echo ran-from-the-registry")
    assert results["build_script"].code == 0, results
    assert "ran-from-the-registry" in results["build_script"].output
    prepare = results["prepare"].output
    assert f"with credentials from job payload (GitLab Registry) ({registry.host})" in prepare
    assert "glcbt-job721" not in prepare


def test_without_credentials_the_pull_fails_naming_what_to_give(registry: Registry, tmp_path: Path) -> None:
    image = registry.push(IMAGE, "busybox:nocreds")
    result = _harness(_host(tmp_path)).stage("prepare", FakeJob(id=722, image=image))  # another registry's
    assert result.code == SYSTEM_FAILURE
    assert f"cannot pull image {image}" in result.output
    hint = f"no credentials for {registry.host}/lab/busybox: give the job a DOCKER_AUTH_CONFIG"
    assert hint in result.output


def test_docker_auth_config_comes_before_the_payload(registry: Registry, tmp_path: Path) -> None:
    """auth.go AllConfigs: DOCKER_AUTH_CONFIG first; the payload's credentials for the same
    registry are then not used (a wrong password there fails the pull)."""
    image = registry.push(IMAGE, "busybox:variable")
    wrong = FakeJob(id=721, image=image, registry=registry.host,
                    variables={"DOCKER_AUTH_CONFIG": _auth_config("lab", "wrong", registry.host)})
    result = _harness(_host(tmp_path / "a")).stage("prepare", wrong)
    assert result.code == SYSTEM_FAILURE and "from $DOCKER_AUTH_CONFIG" in result.output, result.output
    right = FakeJob(id=723, image=image, variables={"DOCKER_AUTH_CONFIG": _auth_config("lab", "lab-pass",
                                                                                       registry.host)})
    results = _harness(_host(tmp_path / "b")).run_job(right, "echo pulled")
    assert results["build_script"].code == 0 and "pulled" in results["build_script"].output, results
    assert "lab-pass" not in results["prepare"].output


def test_always_sees_a_new_push_of_the_same_tag(registry: Registry, tmp_path: Path) -> None:
    """With if-not-present (the default) a host keeps running the `:latest` it pulled first;
    `docker_pull_policy = "always"` asks the registry at every job."""
    marked = []
    for mark in ("one", "two"):
        tag = f"runnerctl-test/marked-{mark}:latest"
        dockerfile = io.BytesIO(f"FROM {IMAGE}\nENV MARK={mark}\n".encode())
        registry.engine.images.build(fileobj=dockerfile, tag=tag, rm=True)
        marked.append(tag)
    image = registry.push(marked[0], "marked:latest")
    job = FakeJob(id=724, image=image, variables={"DOCKER_AUTH_CONFIG": _auth_config("lab", "lab-pass",
                                                                                     registry.host)})
    first = _harness(_host(tmp_path / "a")).run_job(job, "echo mark=$MARK")
    assert "mark=one" in first["build_script"].output, first
    registry.push(marked[1], "marked:latest")  # a new :latest in the registry
    registry.engine.images.get(marked[0]).tag(image)  # and the host still has the first
    kept = _harness(_host(tmp_path / "b")).run_job(job, "echo mark=$MARK")["build_script"].output
    assert "mark=one" in kept
    fresh = _harness(_host(tmp_path / "c", policy="always")).run_job(job, "echo mark=$MARK")
    assert "mark=two" in fresh["build_script"].output, fresh

