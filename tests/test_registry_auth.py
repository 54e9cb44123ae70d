"""Which registry credentials the docker driver pulls with: gitlab-runner's rules
(helpers/docker/auth/auth.go; the expected paths are its auth_test.go cases)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from runnerctl.executors.driver import Job
from runnerctl.executors.registry_auth import (
    SOURCE_PAYLOAD,
    SOURCE_VARIABLE,
    RegistryCredential,
    for_image,
    from_docker_config,
    image_path,
    registry_path,
)


@pytest.mark.parametrize(("image", "path"), [
    ("tutum.co/user/ubuntu:latest", "tutum.co/user/ubuntu"),
    ("cr.internal:5000/user/ubuntu", "cr.internal:5000/user/ubuntu"),
    ("user/ubuntu", "docker.io/user/ubuntu"), ("index.docker.io/user/ubuntu", "docker.io/user/ubuntu"),
    ("foo.bar:123/asdf/baz:latest", "foo.bar:123/asdf/baz"),
    ("FOO.BAR:123/With/Case", "foo.bar:123/With/Case"), ("DOCKER.io/user/ubuntu", "docker.io/user/ubuntu"),
    ("InDex.DOCKER.io/user/ubuntu", "docker.io/user/ubuntu"),
    ("LOCALHOST/test:xxx", "localhost/test"), ("notLocalhost/test", "docker.io/notLocalhost/test"),
    ("localhost:1234/test", "localhost:1234/test"), ("nginx:1.27", "docker.io/nginx")])
def test_image_paths_are_normalised_as_gitlab_runner_does(image: str, path: str) -> None:
    assert image_path(image) == path


@pytest.mark.parametrize(("server", "path"), [
    ("my.hostname", "my.hostname"), ("my.HOSTNAME/With/Path/CASE", "my.hostname/With/Path/CASE"),
    ("my.hostname:5000/with/tag/image:latest", "my.hostname:5000/with/tag/image"),
    ("https://index.docker.io/v1/", "docker.io"), ("HTTPS://INDEX.DOCKER.IO/V1/blibb", "docker.io"),
    ("https://my.hostname/v1/something", "my.hostname"),
    ("registry.example.com/group/", "registry.example.com/group")])
def test_config_servers_become_registry_paths(server: str, path: str) -> None:
    assert registry_path(server) == path


def _config(**auths: Any) -> str:
    return json.dumps({"auths": auths})


def _basic(user: str, password: str) -> dict[str, str]:
    return {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}


def _none(host: str) -> list[tuple[str, str, str]]:
    return []


def _payload(url: str, password: str = "job-token") -> list[RegistryCredential]:
    return [RegistryCredential("registry", url, "gitlab-ci-token", password)]


def test_the_variable_comes_before_the_users_config_and_the_payload() -> None:
    """AllConfigs: DOCKER_AUTH_CONFIG, then the home config, then the job payload; a
    registry an earlier source named keeps its credentials."""
    variable = _config(**{"reg.example:5050": _basic("lab", "from-variable")})
    found, notes = for_image("reg.example:5050/ml/train:1", variable=variable,
                             home=lambda host: [(host, "me", "from-home")],
                             payload=_payload("reg.example:5050"))
    assert found is not None and (found.source, found.password) == (SOURCE_VARIABLE, "from-variable")
    assert notes == []
    found, _ = for_image("reg.example:5050/ml/train:1", variable="",
                         home=lambda host: [(host, "me", "from-home")],
                         payload=_payload("reg.example:5050"))
    assert found is not None and (found.username, found.password) == ("me", "from-home")
    found, _ = for_image("reg.example:5050/ml/train:1", variable="", home=_none,
                         payload=_payload("reg.example:5050"))
    assert found is not None and (found.source, found.password) == (SOURCE_PAYLOAD, "job-token")
    assert "job-token" not in repr(found)


def test_a_home_entry_for_a_group_does_not_shadow_the_job_token_for_the_host() -> None:
    """gitlab-runner registers every key of its user's config by its path: `reg/team`
    covers that group's images, and the job token still reaches the rest of `reg`
    (docker-py's resolve_authconfig matched keys by host name, found by a review)."""
    def home(host: str) -> list[tuple[str, str, str]]:
        return [("reg.example:5050/team", "robot", "team-secret")]

    team, _ = for_image("reg.example:5050/team/img:1", variable="", home=home,
                        payload=_payload("reg.example:5050"))
    mine, _ = for_image("reg.example:5050/ml/train:1", variable="", home=home,
                        payload=_payload("reg.example:5050"))
    assert team is not None and team.password == "team-secret"
    assert mine is not None and mine.password == "job-token"


def test_the_longest_registry_path_wins_whatever_its_source() -> None:
    """ConfigForImage walks from the image path to its host: a group's entry beats the host's."""
    variable = _config(**{"reg.example": _basic("lab", "host-wide"),
                          "reg.example/ml": _basic("ml", "group")})
    found, _ = for_image("reg.example/ml/train", variable=variable, home=_none, payload=())
    assert found is not None and (found.path, found.password) == ("reg.example/ml", "group")
    found, _ = for_image("reg.example/other/x", variable=variable, home=_none, payload=())
    assert found is not None and found.password == "host-wide"
    assert for_image("elsewhere.example/x", variable=variable, home=_none, payload=_payload("reg.example")) \
        == (None, [])


def test_a_docker_hub_image_matches_the_hubs_usual_key() -> None:
    variable = _config(**{"https://index.docker.io/v1/": {"username": "lab", "password": "hub"}})
    found, _ = for_image("pytorch/pytorch:2.4.0", variable=variable, home=_none, payload=())
    assert found is not None and (found.path, found.password) == ("docker.io", "hub")


def test_what_cannot_be_read_is_named_and_the_rest_still_used() -> None:
    assert from_docker_config("{not json")[0] == [] and "not JSON" in from_docker_config("{not json")[1]
    entries, problem = from_docker_config(json.dumps({"auths": {"a.example": {"auth": "%%%"},
                                                                 "b.example": _basic("u", "p:with:colons")},
                                                       "credsStore": "pass"}))
    assert entries == [("b.example", "u", "p:with:colons")]
    assert "a.example is not base64" in problem and "credsStore are not run" in problem
    found, notes = for_image("a.example/x", variable="[1]", home=_none, payload=_payload("a.example"))
    assert found is not None and found.source == SOURCE_PAYLOAD  # as gitlab-runner: on without it
    assert notes == ["DOCKER_AUTH_CONFIG: it is not a JSON object"]


def test_the_job_carries_its_credentials_from_the_payload(tmp_path: Any) -> None:
    payload = {"id": 9, "credentials": [
        {"type": "registry", "url": "reg.example:5050", "username": "gitlab-ci-token", "password": "glcbt-x"},
        {"type": "registry", "url": 5}],  # malformed: left out
        "variables": [{"key": "DOCKER_AUTH_CONFIG", "value": '{"auths": {}}'}],
        "services": [{"name": "postgres:16", "alias": "db"}, {"alias": "nameless"}]}
    (tmp_path / "response.json").write_text(json.dumps(payload))
    job = Job.from_env({"JOB_RESPONSE_FILE": str(tmp_path / "response.json")})
    assert job.registry_credentials == (RegistryCredential("registry", "reg.example:5050", "gitlab-ci-token",
                                                           "glcbt-x"),)
    assert job.docker_auth_config == '{"auths": {}}' and job.services == ("postgres:16",)
    assert "glcbt-x" not in repr(job) and "auths" not in repr(job)


def test_docker_auth_config_is_the_value_gitlab_runner_resolved(tmp_path: Any) -> None:
    """gitlab-runner takes the last copy of a variable and expands it (spec/variables.go)
    and passes that as CUSTOM_ENV_; the payload's first copy was taken (found by a review)."""
    payload = {"id": 9, "variables": [{"key": "DOCKER_AUTH_CONFIG", "value": "from .gitlab-ci.yml"},
                                      {"key": "DOCKER_AUTH_CONFIG", "value": "the project's secret"}]}
    (tmp_path / "response.json").write_text(json.dumps(payload))
    env = {"JOB_RESPONSE_FILE": str(tmp_path / "response.json")}
    assert Job.from_env(env).docker_auth_config == "the project's secret"
    expanded = {**env, "CUSTOM_ENV_DOCKER_AUTH_CONFIG": '{"auths": {"reg.example:5050": {}}}'}
    assert Job.from_env(expanded).docker_auth_config == '{"auths": {"reg.example:5050": {}}}'
