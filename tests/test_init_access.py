"""`init` and `doctor` check the token's scope and role first, against the simulated
GitLab that enforces them as GitLab does (lib/api/api.rb, lib/api/user_runners.rb,
lib/api/ci/runners.rb; app/policies/group_policy.rb): a token lacking one changes
nothing, and the one-line error names what is missing."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import tomlkit

from runnerctl.cli import main
from runnerctl.errors import ExitCode
from runnerctl.gitlab import InsufficientScope, PythonGitLab
from runnerctl.sim.gitlab_server import GitLabServer
from tests.conftest import ADMIN_TOKEN, defaults_toml, token_file


def _token(server: GitLabServer, user: str, scopes: list[str]) -> str:
    """A personal access token made as an administrator would: GitLab's own API."""
    headers = {"PRIVATE-TOKEN": ADMIN_TOKEN}
    user_id = server.state.directory.add_user(user)
    made = httpx.post(f"{server.url}/api/v4/users/{user_id}/personal_access_tokens", headers=headers,
                      json={"name": "runnerctl", "scopes": scopes}, timeout=10)
    assert made.status_code == 201, made.text
    return str(made.json()["token"])


def _init(server: GitLabServer, tmp_path: Path, token: str, *scope: str) -> int:
    secret = token_file(tmp_path, token)
    return main(["init", "--gitlab-url", server.url, "--token-file", secret, *scope, "--gpu-source", "sim:8",
                 "--host", "gpu-a", "--runner-config", str(tmp_path / "config.toml"),
                 "--config", str(defaults_toml(tmp_path))])


def test_create_runner_scope_alone_fails_before_anything_then_api_succeeds(
        gitlab_server: GitLabServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    group = gitlab_server.state.directory.add_group("ml")
    narrow = _token(gitlab_server, "admin", ["create_runner", "manage_runner"])
    gitlab_server.requests.clear()
    assert _init(gitlab_server, tmp_path, narrow, "--group", str(group.id)) == ExitCode.GITLAB
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing the `api` scope" in err[0] and "nothing was changed" in err[0]
    assert gitlab_server.changing_requests() == [] and not gitlab_server.state.runners
    assert not (tmp_path / "config.toml").exists()
    wide = _token(gitlab_server, "admin", ["api"])
    assert _init(gitlab_server, tmp_path, wide, "--group", str(group.id)) == 0
    written = tomlkit.parse((tmp_path / "config.toml").read_text()).unwrap()["runners"]
    assert len(written) == 15 and all(e["id"] in gitlab_server.state.runners for e in written)


def test_a_group_maintainer_is_told_owner_is_needed(gitlab_server: GitLabServer, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    directory = gitlab_server.state.directory
    group = directory.add_group("ml")
    token = _token(gitlab_server, "mia", ["api"])
    directory.group_members[group.full_path]["mia"] = 40
    assert _init(gitlab_server, tmp_path, token, "--group", str(group.id)) == ExitCode.GITLAB
    err = capsys.readouterr().err
    assert f"the role Owner of group {group.id} (user mia has Maintainer)" in err
    assert not gitlab_server.state.runners
    directory.group_members[group.full_path]["mia"] = 50
    assert _init(gitlab_server, tmp_path, token, "--group", str(group.id)) == 0


def test_an_owner_refused_by_the_instances_runner_registration_setting_is_told_of_it(
        gitlab_server: GitLabServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Admin area > Settings > CI/CD > Runners, "Members of the group can register runners"
    off: group_policy.rb prevents `create_runner` for every non-admin, Owners included, and
    the error had told the Owner to become Owner."""
    directory = gitlab_server.state.directory
    group = directory.add_group("ml")
    token = _token(gitlab_server, "olga", ["api"])
    directory.group_members[group.full_path]["olga"] = 50
    gitlab_server.state.runner_registrars = frozenset({"project"})
    assert _init(gitlab_server, tmp_path, token, "--group", str(group.id)) == ExitCode.GITLAB
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "403" in err[0], err
    assert "'Members of the group can register runners' (Admin area > Settings > CI/CD > Runners)" in err[0]
    assert not gitlab_server.state.runners
    gitlab_server.state.runner_registrars = frozenset({"group", "project"})
    assert _init(gitlab_server, tmp_path, token, "--group", str(group.id)) == 0


def test_a_project_developer_is_told_maintainer_is_needed(gitlab_server: GitLabServer, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Project runners need Maintainer (app/policies/project_policy.rb: `maintainer`
    enables `create_runner`); the role is read with `GET /projects/:id/members/all/:user_id`
    (lib/api/members.rb), where a membership inherited from the group counts too."""
    directory = gitlab_server.state.directory
    group = directory.add_group("ml")
    project = directory.add_project("train", group_id=group.id)
    token = _token(gitlab_server, "dev", ["api"])
    directory.project_members[project.id]["dev"] = 30
    gitlab_server.requests.clear()
    assert _init(gitlab_server, tmp_path, token, "--project", str(project.id)) == ExitCode.GITLAB
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"the role Maintainer of project {project.id} (user dev has Developer)" in err[0]
    assert gitlab_server.changing_requests() == [] and not gitlab_server.state.runners
    assert not (tmp_path / "config.toml").exists()
    directory.group_members[group.full_path]["dev"] = 40  # Maintainer through the group
    assert _init(gitlab_server, tmp_path, token, "--project", str(project.id)) == 0
    runners = gitlab_server.state.runners.values()
    assert runners and {r.runner_type for r in runners} == {"project_type"}


def test_a_refused_scope_midway_is_named(gitlab_server: GitLabServer) -> None:
    """A 403 insufficient_scope from any request names the scope, e.g. demand polling
    with a create_runner token."""
    gl = PythonGitLab(gitlab_server.url, _token(gitlab_server, "admin", ["create_runner"]))
    with pytest.raises(InsufficientScope, match="missing the `api` scope"):
        gl.pending_jobs(5)


def test_doctor_names_the_missing_scope(gitlab_server: GitLabServer, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    group = gitlab_server.state.directory.add_group("ml")
    assert _init(gitlab_server, tmp_path, ADMIN_TOKEN, "--group", str(group.id)) == 0
    capsys.readouterr()
    reader = _token(gitlab_server, "admin", ["read_api"])
    code = main(["doctor", "--gpu-source", "sim:8", "--host", "gpu-a", "--runner-config",
                 str(tmp_path / "config.toml"), "--config", str(defaults_toml(tmp_path)),
                 "--token-file", token_file(tmp_path, reader)])
    out = capsys.readouterr().out
    assert code == 1 and "missing the `api` scope (the token has: read_api)" in out


def test_doctor_leaves_no_runner_manager_behind(gitlab_server: GitLabServer, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`POST /runners/verify` records a manager under its system_id (lib/api/ci/helpers/
    runner.rb): doctor uses gitlab-runner's own id, or does not verify at all."""
    assert _init(gitlab_server, tmp_path, ADMIN_TOKEN) == 0
    doctor = ["doctor", "--gpu-source", "sim:8", "--host", "gpu-a", "--runner-config",
              str(tmp_path / "config.toml"), "--config", str(defaults_toml(tmp_path)),
              "--token-file", token_file(tmp_path)]
    main(doctor)
    assert "[skip] runner tokens not verified" in capsys.readouterr().out
    assert not gitlab_server.state.managers  # gitlab-runner never ran here: no manager at all
    (tmp_path / ".runner_system_id").write_text("s_00aa11bb22cc")
    main(doctor)
    assert "runner tokens valid (15/15), verified as gitlab-runner's own manager" in capsys.readouterr().out
    assert {system_id for _, system_id in gitlab_server.state.managers} == {"s_00aa11bb22cc"}


def test_instance_runners_without_an_administrator_name_admin_mode(
        gitlab_server: GitLabServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With Admin Mode on, an administrator's token without the `admin_mode` scope is not an
    administrator's (GitLab MR 107925, lib/api/api_guard.rb: with the Admin Mode setting on,
    every admin endpoint needs the scope):
    the error says so, not only "be an administrator" to one who is."""
    token = _token(gitlab_server, "sam", ["api"])
    assert _init(gitlab_server, tmp_path, token) == ExitCode.GITLAB
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the role an administrator (instance runners)" in err[0], err
    assert "admin_mode scope" in err[0]
    assert not gitlab_server.state.runners
