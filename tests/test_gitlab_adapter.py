"""runnerctl.gitlab.PythonGitLab (real python-gitlab) against the HTTP GitLab."""

from __future__ import annotations

import pytest

from runnerctl.errors import PermanentError, TemporaryError
from runnerctl.gitlab import PythonGitLab, RunnerScope
from runnerctl.sim.gitlab_server import Fault, GitLabServer
from tests.conftest import ADMIN_TOKEN


def _client(server: GitLabServer, token: str = ADMIN_TOKEN) -> PythonGitLab:
    return PythonGitLab(server.url, token, timeout=1.0)


def test_create_get_pause_delete(gitlab_server: GitLabServer) -> None:
    gl = _client(gitlab_server)
    created = gl.create_runner(description="runnerctl/h/gpu0-1", tags=["gpus:2", "host:h"],
                               paused=True, scope=RunnerScope("group_type", group_id=42))
    assert "glrt-" not in repr(created)
    runner = gitlab_server.state.runners[created.id]
    assert (runner.group_id, runner.paused, runner.tags) == (42, True, frozenset({"gpus:2", "host:h"}))
    assert created.token == runner.token
    info = gl.get_runner(created.id)
    assert info is not None and info.paused and sorted(info.tags) == ["gpus:2", "host:h"]
    gl.set_paused(created.id, False)
    assert gitlab_server.state.runners[created.id].paused is False
    gl.set_tags(created.id, ["gpus:2"])
    assert gitlab_server.state.runners[created.id].tags == frozenset({"gpus:2"})
    gl.delete_runner(created.id)
    assert gl.get_runner(created.id) is None
    gl.delete_runner(created.id)  # already gone: not an error


def test_running_and_pending_jobs(gitlab_server: GitLabServer) -> None:
    gl = _client(gitlab_server)
    state = gitlab_server.state
    runner = state.create_runner(description="r", tags=["gpu", "gpus:1"])
    running = state.enqueue_job(project_id=5, tags=["gpu"], user="alice")
    state.request_job(runner.id)
    pending = [state.enqueue_job(project_id=5, tags=["gpus:4"]) for _ in range(30)]
    (job,) = gl.running_jobs(runner.id)
    assert (job.id, job.user, job.status) == (running.id, "alice", "running")
    listed = gl.pending_jobs(5)  # 30 jobs: more than one page of 20
    assert sorted(j.id for j in listed) == sorted(j.id for j in pending)
    assert all(j.tags == ("gpus:4",) for j in listed)


def test_verify_runner_token(gitlab_server: GitLabServer) -> None:
    gl = _client(gitlab_server)
    runner = gitlab_server.state.create_runner(description="r", tags=[])
    assert gl.verify_runner_token(runner.token, system_id="s_0123456789ab") is True
    assert gl.verify_runner_token("glrt-forged", system_id="s_0123456789ab") is False


def test_canceling_jobs_of_a_runner(gitlab_server: GitLabServer) -> None:
    gl = _client(gitlab_server)
    state = gitlab_server.state
    runner = state.create_runner(description="r", tags=["gpu"])
    job = state.enqueue_job(project_id=5, tags=["gpu"])
    state.request_job(runner.id)
    job.status = "canceling"
    assert gl.running_jobs(runner.id) == []
    assert [j.id for j in gl.running_jobs(runner.id, status="canceling")] == [job.id]


def test_an_old_gitlab_without_canceling_has_no_canceling_job(gitlab_server: GitLabServer) -> None:
    """GitLab before `canceling` refuses the status value with 400 (Grape `values:`)."""
    gl = _client(gitlab_server)
    runner = gitlab_server.state.create_runner(description="r", tags=["gpu"])
    gitlab_server.faults.append(Fault("GET", r"/runners/\d+/jobs", "400", count=1))
    assert gl.running_jobs(runner.id, status="canceling") == []
    gitlab_server.faults.append(Fault("GET", r"/runners/\d+/jobs", "400", count=1))
    with pytest.raises(PermanentError):
        gl.running_jobs(runner.id)


@pytest.mark.parametrize(
    ("kind", "error", "delay"),
    [("401", PermanentError, None), ("403", PermanentError, None), ("429", TemporaryError, 7.0),
     ("500", TemporaryError, 5.0), ("502", TemporaryError, 5.0), ("drop", TemporaryError, 5.0)],
)
def test_failures_map_to_retry_policy(gitlab_server: GitLabServer, kind: str,
                                      error: type[Exception], delay: float | None) -> None:
    gl = _client(gitlab_server)
    runner = gitlab_server.state.create_runner(description="r", tags=[])
    gitlab_server.faults.append(Fault("PUT", r"^/runners/\d+$", kind, retry_after=7))
    with pytest.raises(error) as caught:
        gl.set_paused(runner.id, True)
    if delay is not None:
        assert isinstance(caught.value, TemporaryError) and caught.value.delay == delay
    assert gitlab_server.state.runners[runner.id].paused is False  # nothing changed
    puts = [r for r in gitlab_server.requests if r.method == "PUT"]
    assert len(puts) == 1  # python-gitlab did not retry on its own
    gl.set_paused(runner.id, True)  # the next call goes through
    assert gitlab_server.state.runners[runner.id].paused is True


def test_a_rate_limit_without_retry_after_waits_a_minute(gitlab_server: GitLabServer) -> None:
    """GitLab's own rate limits (600 `GET /projects/:id/jobs` a minute per user) mostly
    answer 429 with no Retry-After; 5 s later the same minute's limit refused again."""
    gl = _client(gitlab_server)
    gitlab_server.faults.append(Fault("GET", r"^/projects/\d+/jobs$", "429", retry_after=None))
    with pytest.raises(TemporaryError) as caught:
        gl.pending_jobs(1)
    assert caught.value.delay == 60.0 and not caught.value.told
    assert "requested too many times" in str(caught.value)


def test_timeout_is_temporary(gitlab_server: GitLabServer) -> None:
    gl = _client(gitlab_server)
    gitlab_server.faults.append(Fault("GET", r"^/runners/1$", "delay", delay_s=2.0))
    with pytest.raises(TemporaryError, match="did not answer in time"):
        gl.get_runner(1)


def test_wrong_token_is_permanent_and_names_no_token(gitlab_server: GitLabServer) -> None:
    gl = _client(gitlab_server, token="glpat-wrong-secret")
    with pytest.raises(PermanentError) as caught:
        gl.get_runner(1)
    assert "401" in str(caught.value) and "glpat-wrong-secret" not in str(caught.value)


def test_counts_requests_by_status(gitlab_server: GitLabServer) -> None:
    gl = _client(gitlab_server)
    gl.get_runner(12345)
    gitlab_server.state.create_runner(description="r", tags=[])
    gl.get_runner(1)
    assert gl.requests_by_status == {"404": 1, "200": 1}


def test_insufficient_scope_body_names_the_scope() -> None:
    """GitLab's 403 for a token without the endpoint's scope (lib/api/api_guard.rb via
    Rack::OAuth2 Bearer::Forbidden): `error`, `error_description`, `scope`."""
    from runnerctl.gitlab import InsufficientScope, _insufficient_scope

    body = (b'{"error":"insufficient_scope","error_description":"The request requires higher '
            b'privileges than provided by the access token.","scope":"api read_api"}')
    assert _insufficient_scope(body) == ("api", "read_api")
    assert _insufficient_scope(b'{"message":"403 Forbidden"}') is None
    assert _insufficient_scope(b"<html>") is None
    error = InsufficientScope("http://gl", "list runners", ("api", "read_api"))
    assert error.missing == "api" and "missing the `api` scope" in str(error)


@pytest.mark.parametrize(("header", "wait"), [
    ("7", 7.0), (" 120 ", 120.0),
    ("Sun, 29 Nov 2026 00:01:30 GMT", 90.0),  # an HTTP date, as a proxy in front of GitLab may send
    ("Sunday, 29-Nov-26 00:01:30 GMT", 90.0),  # RFC 850's form, which RFC 9110 still accepts
    ("Sat, 28 Nov 2026 23:00:00 GMT", 0.0),  # already past
    ("Mon, 30 Nov 2026 00:00:00 GMT", 3600.0),  # a day ahead: a clock off, an hour at most
    ("soon", None), ("", None), (None, None), ("-5", None),
])
def test_retry_after_is_read_as_seconds_or_an_http_date(header: str | None, wait: float | None) -> None:
    from runnerctl.gitlab import retry_after

    now = 1795910400.0  # Sun, 29 Nov 2026 00:00:00 GMT
    assert retry_after(header, now) == wait


def test_a_retry_after_is_waited_as_said_not_doubled_per_failure(gitlab_server: GitLabServer) -> None:
    """After a spell of 500s a 429 saying `Retry-After: 7` was waited 7 x 2^4 = 112 s
    (found by a review as an operator breaking GitLab); without one, the wait doubles."""
    from runnerctl.controller.act import GitLabHealth

    gl = _client(gitlab_server)
    runner = gitlab_server.state.create_runner(description="r", tags=[])
    health = GitLabHealth(backoff_max_s=300.0)
    waits = []
    for kind in ("500", "500", "500", "500", "429", "429"):  # the fake sends Retry-After with a 429 only
        gitlab_server.faults.append(Fault("PUT", r"^/runners/\d+$", kind, retry_after=7))
        with pytest.raises(TemporaryError) as caught:
            gl.set_paused(runner.id, True)
        health.failed(caught.value, 1000.0)
        waits.append(health.retry_at - 1000.0)
    assert waits == [5.0, 10.0, 20.0, 40.0, 7.0, 7.0]
