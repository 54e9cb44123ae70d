"""The simulated GitLab over HTTP keeps GitLab's rules: scopes, roles, error bodies, runner API.

Each test names the gitlabhq/gitlabhq rule it checks; the server is the one `runnerctl
sim gitlab` runs (strict directory: unknown groups and projects do not exist).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from runnerctl.sim.gitlab_server import GitLabServer
from runnerctl.sim.gitlab_sim_hooks import SimHooks
from runnerctl.sim.gitlab_state import GitLabState
from tests.sim_gitlab import SimGitLab, running_sim


@pytest.fixture
def gl() -> Iterator[SimGitLab]:
    with running_sim() as (server, info):
        yield server, info


def _api(info: dict[str, Any], token: str | None = None) -> httpx.Client:
    headers = {"PRIVATE-TOKEN": token or info["admin_token"]}
    return httpx.Client(base_url=info["url"] + "/api/v4", headers=headers, timeout=5.0)


def _token(info: dict[str, Any], *scopes: str, user_id: int | None = None) -> str:
    with _api(info) as admin:
        made = admin.post(f"/users/{user_id or info['admin_user_id']}/personal_access_tokens",
                          json={"name": "t", "scopes": list(scopes)})
    assert made.status_code == 201, made.text
    return str(made.json()["token"])


def _user(info: dict[str, Any], name: str) -> int:
    with _api(info) as admin:
        made = admin.post("/users", json={"username": name, "name": name, "email": f"{name}@x"})
    assert made.status_code == 201, made.text
    return int(made.json()["id"])


def _runner(info: dict[str, Any], tags: list[str], **extra: Any) -> dict[str, Any]:
    with _api(info) as admin:
        made = admin.post("/user/runners", json={"runner_type": "group_type", "group_id": info["group_id"],
                                                 "tag_list": tags, **extra})
    assert made.status_code == 201, made.text
    return dict(made.json())


def _enqueue(info: dict[str, Any], tags: list[str], **extra: Any) -> int:
    made = httpx.post(info["url"] + "/-/sim/jobs", json={"project_id": info["project_ids"][0], "tags": tags,
                                                         "duration_s": 5, "user": "alice", **extra})
    assert made.status_code == 201, made.text
    return int(made.json()["id"])


def _request(info: dict[str, Any], runner_token: str, *, graceful: bool = True) -> httpx.Response:
    return httpx.post(info["url"] + "/api/v4/jobs/request",
                      json={"token": runner_token, "system_id": "s_0123456789ab",
                            "info": {"features": {"cancel_gracefully": graceful}}, "last_update": "x"})


# -- scopes (lib/api/api.rb, user_runners.rb, ci/runners.rb, api_guard.rb) ----------------

def test_create_runner_scope_only_creates_runners(gl: SimGitLab) -> None:
    _, info = gl
    token = _token(info, "create_runner")
    with _api(info, token) as client:
        made = client.post("/user/runners", json={"runner_type": "group_type", "group_id": info["group_id"],
                                                  "tag_list": ["gpu"]})
        assert made.status_code == 201
        refused = client.get("/runners", params={"type": "group_type"})
        assert refused.status_code == 403
        assert refused.json() == {"error": "insufficient_scope", "scope": "api read_api", "error_description":
                                  "The request requires higher privileges than provided by the access token."}
        assert "insufficient_scope" in refused.headers["WWW-Authenticate"]
        assert client.put(f"/runners/{made.json()['id']}", json={"paused": True}).status_code == 403


def test_manage_runner_covers_runners_by_id_only(gl: SimGitLab) -> None:
    _, info = gl
    runner = _runner(info, ["gpu"])
    token = _token(info, "manage_runner")
    with _api(info, token) as client:
        assert client.put(f"/runners/{runner['id']}", json={"paused": True}).status_code == 200
        assert client.get(f"/runners/{runner['id']}/jobs", params={"status": "running"}).status_code == 200
        assert client.get("/runners").status_code == 403
        assert client.get(f"/projects/{info['project_ids'][0]}/jobs").status_code == 403
        assert client.post("/user/runners", json={"runner_type": "group_type",
                                                  "group_id": info["group_id"]}).status_code == 403


def test_read_api_reads_and_never_writes(gl: SimGitLab) -> None:
    _, info = gl
    runner = _runner(info, ["gpu"])
    token = _token(info, "read_api")
    with _api(info, token) as client:
        jobs = client.get(f"/projects/{info['project_ids'][0]}/jobs", params={"scope[]": "pending"})
        assert jobs.status_code == 200
        assert client.get(f"/groups/{info['group_id']}/projects").status_code == 200
        denied = client.put(f"/runners/{runner['id']}", json={"paused": True})
        assert denied.status_code == 403 and denied.json()["scope"] == "api manage_runner"
        scopes = client.get("/personal_access_tokens/self").json()["scopes"]
        assert scopes == ["read_api"]


def test_read_user_reads_the_user_but_not_group_members(gl: SimGitLab) -> None:
    _, info = gl
    token = _token(info, "read_user")
    with _api(info, token) as client:
        assert client.get("/user").json()["username"] == "root"
        members = client.get(f"/groups/{info['group_id']}/members/all/{info['admin_user_id']}")
        assert members.status_code == 403 and members.json()["error"] == "insufficient_scope"


def test_unknown_token_and_no_token_are_401(gl: SimGitLab) -> None:
    _, info = gl
    with _api(info, "glpat-nope") as client:
        assert client.get("/user").json() == {"message": "401 Unauthorized"}
    assert httpx.get(info["url"] + "/api/v4/user").status_code == 401


# -- admins and roles (group_policy.rb, project_policy.rb, users.rb) ---------------------

def test_admin_only_endpoints(gl: SimGitLab) -> None:
    _, info = gl
    bob = _user(info, "bob")
    token = _token(info, "api", user_id=bob)
    with _api(info, token) as client:
        assert client.get("/runners/all").json() == {"message": "403 Forbidden"}
        assert client.post(f"/users/{bob}/personal_access_tokens",
                           json={"name": "x", "scopes": ["api"]}).status_code == 403
        instance = client.post("/user/runners", json={"runner_type": "instance_type"})
        assert instance.json() == {"message": "403 Forbidden - Insufficient permissions"}


@pytest.mark.parametrize(("level", "group_ok", "project_ok"), [(40, False, True), (50, True, True),
                                                                 (30, False, False)])
def test_group_runners_need_owner_project_runners_maintainer(
        gl: SimGitLab, level: int, group_ok: bool, project_ok: bool) -> None:
    _, info = gl
    carol = _user(info, "carol")
    with _api(info) as admin:
        assert admin.post(f"/groups/{info['group_id']}/members",
                          json={"user_id": carol, "access_level": level}).status_code == 201
    with _api(info, _token(info, "api", user_id=carol)) as client:
        group = client.post("/user/runners", json={"runner_type": "group_type", "group_id": info["group_id"]})
        project = client.post("/user/runners", json={"runner_type": "project_type",
                                                     "project_id": info["project_ids"][1]})
        expected = (201 if group_ok else 403, 201 if project_ok else 403)
        assert (group.status_code, project.status_code) == expected
        listed = client.get("/runners", params={"type": "group_type"}).json()
        assert len(listed) == (1 if group_ok else 0)
        level_seen = client.get(f"/groups/{info['group_id']}/members/all/{carol}").json()["access_level"]
        assert level_seen == level


def test_error_shapes(gl: SimGitLab) -> None:
    _, info = gl
    with _api(info) as admin:
        assert admin.post("/user/runners", json={}).json()["error"].startswith("runner_type is missing")
        missing = admin.post("/user/runners", json={"runner_type": "group_type", "group_id": 999999})
        assert missing.json() == {"message": "400 Bad request - Missing/invalid group"}
        assert admin.get("/runners/424242").json() == {"message": "404 Runner Not Found"}
        assert admin.get("/projects/424242/jobs").json() == {"message": "404 Project Not Found"}
        assert admin.get("/no/such/route").json() == {"error": "404 Not Found"}


def test_group_projects_with_subgroups(gl: SimGitLab) -> None:
    server, info = gl
    directory = server.state.directory
    sub = directory.add_group("vision", parent_id=info["group_id"])
    deep = directory.add_project("detect", group_id=sub.id)
    with _api(info) as admin:
        direct = {p["id"] for p in admin.get(f"/groups/{info['group_id']}/projects").json()}
        every = {p["id"] for p in admin.get(f"/groups/{info['group_id']}/projects",
                                            params={"include_subgroups": "true"}).json()}
    assert direct == set(info["project_ids"]) and every == direct | {deep.id}


# -- runner API (lib/api/ci/runner.rb) -------------------------------------------------

def test_job_request_run_and_success(gl: SimGitLab) -> None:
    _, info = gl
    runner = _runner(info, ["gpus:2"])
    assert _request(info, runner["token"]).status_code == 204
    job_id = _enqueue(info, ["gpus:2"], duration_s=7)
    got = _request(info, runner["token"])
    assert got.status_code == 201
    job = got.json()
    assert job["id"] == job_id and job["steps"][0]["script"] == ["sleep 7"]
    assert job["job_info"]["project_id"] == info["project_ids"][0] and job["git_info"]["ref"] == "main"
    assert {v["key"]: v["value"] for v in job["variables"]}["GITLAB_USER_LOGIN"] == "alice"
    url = f"{info['url']}/api/v4/jobs/{job_id}"
    patched = httpx.patch(url + "/trace", content=b"hello", headers={"JOB-TOKEN": job["token"],
                                                                     "Content-Range": "0-4"})
    assert patched.status_code == 202
    assert (patched.headers["Job-Status"], patched.headers["Range"]) == ("running", "0-5")
    assert httpx.patch(url + "/trace", content=b"x", headers={"JOB-TOKEN": job["token"],
                                                              "Content-Range": "0-0"}).status_code == 416
    assert httpx.put(url, json={"token": "wrong", "state": "success"}).status_code == 403
    done = httpx.put(url, json={"token": job["token"], "state": "success", "exit_code": 0})
    assert done.status_code == 200 and done.headers["Job-Status"] == "success"
    with _api(info) as admin:
        seen = admin.get(f"/projects/{info['project_ids'][0]}/jobs/{job_id}").json()
    assert (seen["status"], seen["runner"]["id"]) == ("success", runner["id"])
    late = httpx.put(url, json={"token": job["token"], "state": "failed"})
    assert late.status_code == 403 and late.headers["Job-Status"] == "success"


def test_failed_job_keeps_the_runners_failure_reason(gl: SimGitLab) -> None:
    _, info = gl
    runner = _runner(info, ["gpu"])
    job_id = _enqueue(info, ["gpu"])
    job = _request(info, runner["token"]).json()
    httpx.put(f"{info['url']}/api/v4/jobs/{job_id}", json={"token": job["token"], "state": "failed",
                                                           "failure_reason": "runner_system_failure"})
    with _api(info) as admin:
        seen = admin.get(f"/projects/{info['project_ids'][0]}/jobs/{job_id}").json()
    assert (seen["status"], seen["failure_reason"]) == ("failed", "runner_system_failure")


def test_cancel_goes_through_canceling_on_a_graceful_runner(gl: SimGitLab) -> None:
    _, info = gl
    runner = _runner(info, ["gpu"])
    job_id = _enqueue(info, ["gpu"], after_script_s=3)
    job = _request(info, runner["token"]).json()
    assert job["steps"][1]["name"] == "after_script" and job["steps"][1]["script"] == ["sleep 3"]
    project = info["project_ids"][0]
    with _api(info) as admin:
        cancel = admin.post(f"/projects/{project}/jobs/{job_id}/cancel")
        assert cancel.status_code == 201 and cancel.json()["status"] == "canceling"
    url = f"{info['url']}/api/v4/jobs/{job_id}"
    trace = httpx.patch(url + "/trace", content=b"", headers={"JOB-TOKEN": job["token"],
                                                              "Content-Range": "0-0"})
    assert trace.headers["Job-Status"] == "canceling"
    final = httpx.put(url, json={"token": job["token"], "state": "failed",
                                 "failure_reason": "script_failure"})
    assert final.headers["Job-Status"] == "canceled"


def test_stuck_job_is_dropped_over_http_after_an_hour(gl: SimGitLab) -> None:
    _, info = gl
    runner = _runner(info, ["gpus:8"], paused=True)
    _request(info, runner["token"])  # online, but paused
    job_id = _enqueue(info, ["gpus:8"])
    assert httpx.post(info["url"] + "/-/sim/clock", json={"advance_s": 3601}).status_code == 200
    assert httpx.post(info["url"] + "/-/sim/drop").json() == {"dropped": [job_id]}
    with _api(info) as admin:
        seen = admin.get(f"/projects/{info['project_ids'][0]}/jobs/{job_id}").json()
    assert (seen["status"], seen["failure_reason"]) == ("failed", "stuck_pending_no_matching_runners")


def test_verify_creates_a_runner_manager_per_system_id(gl: SimGitLab) -> None:
    _, info = gl
    runner = _runner(info, ["gpu"])
    for system_id in ("s_a", "s_a", None):
        body = {"token": runner["token"], **({"system_id": system_id} if system_id else {})}
        assert httpx.post(info["url"] + "/api/v4/runners/verify", json=body).status_code == 200
    assert httpx.post(info["url"] + "/api/v4/runners/verify", json={"token": "glrt-x"}).status_code == 403
    with _api(info) as admin:
        managers = admin.get(f"/runners/{runner['id']}/managers").json()
        detail = admin.get(f"/runners/{runner['id']}").json()
    assert sorted(m["system_id"] for m in managers) == ["<legacy>", "s_a"]
    assert all(m["status"] == "online" for m in managers) and detail["online"] is True


def test_sim_hook_refuses_bad_input(gl: SimGitLab) -> None:
    _, info = gl
    hook = info["url"] + "/-/sim/jobs"
    assert httpx.post(hook, json={"project_id": "x", "tags": []}).status_code == 400
    assert httpx.post(hook, json={"project_id": 1, "tags": ["gpu"], "duration_s": -1}).status_code == 400
    assert httpx.post(hook, json={"project_id": 999999, "tags": ["gpu"]}).status_code == 404
    broken = httpx.post(hook, content=b"{not json", headers={"Content-Type": "application/json"})
    assert broken.status_code == 400


def test_a_failing_stuck_jobs_run_is_logged_once_and_the_timer_goes_on(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    state = GitLabState()
    calls: list[int] = []

    def broken() -> list[Any]:
        calls.append(1)
        raise RuntimeError("boom")

    monkeypatch.setattr(state, "drop_stuck_jobs", broken)
    cron = SimHooks(state, threading.RLock(), 0.01)
    cron.start()
    try:
        end = time.monotonic() + 60
        while cron.drop_errors < 3 and time.monotonic() < end:
            time.sleep(0.01)
        assert cron.drop_errors >= 3 and cron.alive()
        assert cron.handle("GET", "/-/sim/health", {})[1]["drop_errors"] >= 3
    finally:
        cron.stop()
    assert len([r for r in caplog.records if "stuck-jobs run failed" in r.getMessage()]) == 1


def test_tokens_made_in_process_are_checked_like_any(gitlab_server: GitLabServer) -> None:
    token = gitlab_server.add_token("admin", ["create_runner"])
    with httpx.Client(base_url=gitlab_server.url + "/api/v4", headers={"PRIVATE-TOKEN": token}) as client:
        assert client.post("/user/runners", json={"runner_type": "instance_type"}).status_code == 201
        assert client.get("/runners/all").json()["error"] == "insufficient_scope"


def test_a_runner_manager_can_be_deleted_with_the_runner_token(gl: SimGitLab) -> None:
    _, info = gl
    runner = _runner(info, ["gpu"])
    verify = info["url"] + "/api/v4/runners/verify"
    httpx.post(verify, json={"token": runner["token"], "system_id": "s_doctor"})
    managers = info["url"] + "/api/v4/runners/managers"
    gone = httpx.request("DELETE", managers, json={"token": runner["token"], "system_id": "s_doctor"})
    assert gone.status_code == 204
    again = httpx.request("DELETE", managers, json={"token": runner["token"], "system_id": "s_doctor"})
    assert again.status_code == 404
    with _api(info) as admin:
        assert admin.get(f"/runners/{runner['id']}/managers").json() == []
        assert len(admin.get("/runners", params={"type": "group_type"}).json()) == 1
    unregister = httpx.request("DELETE", info["url"] + "/api/v4/runners", json={"token": runner["token"]})
    assert unregister.status_code == 204
    with _api(info) as admin:
        assert admin.get(f"/runners/{runner['id']}").status_code == 404


def test_project_and_group_listings_show_what_the_caller_may_see(gl: SimGitLab) -> None:
    server, info = gl
    elsewhere = server.state.directory.add_project("elsewhere")
    dana = _user(info, "dana")
    with _api(info) as admin:
        admin.post(f"/groups/{info['group_id']}/members", json={"user_id": dana, "access_level": 30})
        assert {p["id"] for p in admin.get("/projects").json()} == {*info["project_ids"], elsewhere.id}
    with _api(info, _token(info, "read_api", user_id=dana)) as client:
        assert {p["id"] for p in client.get("/projects").json()} == set(info["project_ids"])
        assert client.get("/projects", params={"min_access_level": 40}).json() == []
        assert [g["id"] for g in client.get("/groups").json()] == [info["group_id"]]


@pytest.mark.parametrize("verify_skips_contact", [False, True])
def test_which_runner_call_marks_a_glrt_runner_contacted(gl: SimGitLab, verify_skips_contact: bool) -> None:
    """GitLab 16 and 17 (`verify_skips_contact`): a verify with a `glrt-` token leaves the
    runner never contacted, while `DELETE /runners/managers` heartbeats it before it
    finds no manager (404); newer GitLab is the other way round."""
    server, info = gl
    server.state.verify_skips_contact = verify_skips_contact
    runner = _runner(info, ["gpu"])
    assert runner["token"].startswith("glrt-")
    verify = httpx.post(info["url"] + "/api/v4/runners/verify",
                        json={"token": runner["token"], "system_id": "s_a"})
    assert verify.status_code == 200
    with _api(info) as admin:
        after_verify = admin.get(f"/runners/{runner['id']}").json()
        managers = admin.get(f"/runners/{runner['id']}/managers").json()
    assert after_verify["online"] is not verify_skips_contact
    assert after_verify["status"] == ("never_contacted" if verify_skips_contact else "online")
    assert [(m["system_id"], m["contacted_at"] is None) for m in managers] == [("s_a", verify_skips_contact)]
    server.state.runners[runner["id"]].contacted_at = None
    gone = httpx.request("DELETE", info["url"] + "/api/v4/runners/managers",
                         json={"token": runner["token"], "system_id": "r_nobody"})
    assert (gone.status_code, gone.json()) == (404, {"message": "404 Runner manager not found Not Found"})
    with _api(info) as admin:
        assert admin.get(f"/runners/{runner['id']}").json()["online"] is verify_skips_contact
        assert len(admin.get(f"/runners/{runner['id']}/managers").json()) == 1


def test_a_groups_runner_list_needs_owner_and_shows_them_to_an_administrator(gl: SimGitLab) -> None:
    """lib/api/ci/runners.rb `GET /groups/:id/runners` (`read_group_runners`: Owner) and
    `GET /projects/:id/runners` (Maintainer); `GET /runners` shows an administrator only
    runners of groups they are a member of (ci_owned_runners)."""
    server, info = gl
    runner = _runner(info, ["gpu"])
    dana = _user(info, "dana")
    with _api(info) as admin:
        admin.post(f"/groups/{info['group_id']}/members", json={"user_id": dana, "access_level": 30})
        listed = admin.get(f"/groups/{info['group_id']}/runners", params={"type": "group_type"}).json()
        assert [r["id"] for r in listed] == [runner["id"]]
        project = admin.get(f"/projects/{info['project_ids'][0]}/runners").json()
        assert [r["id"] for r in project] == [runner["id"]]  # its group's runner serves it
        assert admin.get(f"/groups/{info['group_id']}/runners", params={"type": "project_type"}).json() == []
    directory = server.state.directory
    directory.group_members[directory.groups[info["group_id"]].full_path].pop("root")
    with _api(info) as admin:
        assert admin.get("/runners", params={"type": "group_type"}).json() == []  # no member now
        assert len(admin.get(f"/groups/{info['group_id']}/runners").json()) == 1
    with _api(info, _token(info, "api", user_id=dana)) as developer:
        assert developer.get(f"/groups/{info['group_id']}/runners").status_code == 403
        assert developer.get(f"/projects/{info['project_ids'][0]}/runners").status_code == 403


def test_a_runners_jobs_are_listed_only_for_projects_the_caller_reads(gl: SimGitLab) -> None:
    """app/finders/ci/runner_jobs_finder.rb `by_permission`: `GET /runners/:id/jobs` shows an
    administrator every job, anyone else only jobs of projects where they are Reporter or
    more; `GET /projects/:id/jobs/:job_id` takes the project's URL-encoded path as `:id`."""
    server, info = gl
    runner = _runner(info, ["gpu"])
    erin = _user(info, "erin")
    state = server.state
    outside = state.directory.add_project("outside")  # erin is no member of it
    mine, theirs = (state.enqueue_job(project_id=info["project_ids"][0], tags=["gpu"]) for _ in range(2))
    for _ in (mine, theirs):
        state.request_job(runner["id"])
    theirs.project_id = outside.id  # as a project runner enabled on another project runs its jobs
    with _api(info) as admin:
        admin.post(f"/groups/{info['group_id']}/members", json={"user_id": erin, "access_level": 50})
        assert {j["id"] for j in admin.get(f"/runners/{runner['id']}/jobs").json()} == {mine.id, theirs.id}
        path = state.directory.projects[info["project_ids"][0]].path_with_namespace.replace("/", "%2F")
        assert admin.get(f"/projects/{path}/jobs/{mine.id}").json()["status"] == "running"
    with _api(info, _token(info, "api", user_id=erin)) as owner:
        assert [j["id"] for j in owner.get(f"/runners/{runner['id']}/jobs").json()] == [mine.id]
        assert owner.get(f"/projects/{outside.id}/jobs/{theirs.id}").status_code == 404


def test_a_server_left_running_keeps_only_its_newest_requests() -> None:
    """`runnerctl sim gitlab` runs for days behind `serve`: its request log must not grow
    without end (about 5 MB a day), while a test's server keeps every request."""
    with GitLabServer(tokens={"glpat-keep": "admin"}, keep_requests=5) as server, \
            httpx.Client(base_url=server.url + "/api/v4", headers={"PRIVATE-TOKEN": "glpat-keep"},
                         timeout=5.0) as api:
        for page in range(1, 31):
            assert api.get("/projects", params={"page": page}).status_code == 200
        kept = [int(r.query["page"][0]) for r in server.requests]
    assert len(kept) <= 10 and kept[-1] == 30 and kept == sorted(kept)
    with running_sim() as (standalone_server, _info):
        assert standalone_server.keep_requests is not None
