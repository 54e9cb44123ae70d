"""The docker driver against the real Docker engine that .ci/setup/docker.sh starts."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from runnerctl.executors.contract import stage_command
from runnerctl.executors.gate import classify
from runnerctl.executors.lease import LeaseTable, job_processes, read_leases
from runnerctl.gpus import open_gpu_source
from tests.harness_custom_executor import (
    BUILD_FAILURE,
    SYSTEM_FAILURE,
    TERM_TRAP,
    FakeJob,
    Harness,
    harness_for,
    make_host,
)

IMAGE = "runnerctl-test/busybox:latest"


@pytest.fixture(scope="module")
def engine() -> Iterator[docker.DockerClient]:
    client = docker.from_env()
    client.ping()  # no skip: without dockerd this test fails, as CI must install it
    client.images.get(IMAGE)
    yield client


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return make_host(tmp_path, docker_image=IMAGE)


def _harness(host: Path, gpus: tuple[int, ...]) -> Harness:
    return harness_for(host, gpus, "docker")


def _uuids(host: Path, gpus: tuple[int, ...]) -> list[str]:
    snap = open_gpu_source(f"sim:{host / 'gpus.yaml'}", host="gpu-a").snapshot()
    return [snap.gpu(g).uuid for g in gpus]


def _containers(engine: docker.DockerClient, host: Path, job: int) -> list[Any]:
    """This test's containers for the job (other test runs may use the same job ids)."""
    labels = [f"runnerctl.job={job}", f"runnerctl.state={(host / 'state').resolve()}"]
    return list(engine.containers.list(all=True, filters={"label": labels}))


def test_container_gets_exactly_the_slot_gpus_and_is_removed(engine: docker.DockerClient,
                                                             host: Path) -> None:
    harness = _harness(host, (2, 3))
    job = FakeJob(id=701, image=IMAGE, variables={"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"})
    assert harness.stage("prepare", job).code == 0
    (container,) = _containers(engine, host, 701)
    requests = container.attrs["HostConfig"]["DeviceRequests"]
    assert [r["DeviceIDs"] for r in requests] == [_uuids(host, (2, 3))]
    assert requests[0]["Driver"] == "nvidia"
    (lease, _) = LeaseTable(host / "state").held_by("701")
    assert container.attrs["Config"]["Labels"]["runnerctl.lease"] == lease.token
    assert lease.container == container.id
    body = 'echo "nv=$NVIDIA_VISIBLE_DEVICES"; tr "\\0" "\\n" < /proc/1/environ | grep ^NVIDIA_VISIBLE'
    result = harness.stage("run", job, str(harness.script(job, "build_script", body)), "build_script")
    assert result.code == 0, result.output
    expected = ",".join(_uuids(host, (2, 3)))
    assert f"nv={expected}" in result.output  # the job's own variable changed nothing
    assert f"NVIDIA_VISIBLE_DEVICES={expected}" in result.output  # what the device hook saw
    failing = harness.stage("run", job, str(harness.script(job, "after_script", "exit 4")),
                            "after_script")
    assert failing.code == BUILD_FAILURE and harness.build_exit_code(701) == "4"
    assert harness.stage("cleanup", job).code == 0
    assert _containers(engine, host, 701) == [] and LeaseTable(host / "state").all() == []


def test_each_job_has_a_network_of_its_own_and_a_large_shm(engine: docker.DockerClient, host: Path) -> None:
    """On the default bridge two users' jobs reached each other's open ports (a rendezvous,
    TensorBoard, Jupyter), and /dev/shm was Docker's 64 MiB, too small for a PyTorch
    DataLoader with workers (found by a review as a researcher using docker)."""
    harness = _harness(host, (4,))
    job = FakeJob(id=716, image=IMAGE)
    assert harness.stage("prepare", job).code == 0
    (container,) = _containers(engine, host, 716)
    networks = list(container.attrs["NetworkSettings"]["Networks"])
    assert networks == [container.name] and "bridge" not in networks  # its own, named like it
    assert container.attrs["HostConfig"]["ShmSize"] == 8192 * 1024 * 1024  # [executor] docker_shm_mib
    labels = ["runnerctl.job=716", f"runnerctl.state={(host / 'state').resolve()}"]
    assert len(engine.networks.list(filters={"label": labels})) == 1
    assert harness.stage("cleanup", job).code == 0
    assert engine.networks.list(filters={"label": labels}) == []


def test_one_gpu_slot_sees_one_gpu_whatever_the_job_asks(engine: docker.DockerClient,
                                                         host: Path) -> None:
    harness = _harness(host, (6,))
    job = FakeJob(id=706, image=IMAGE, variables={"CUDA_VISIBLE_DEVICES": "0,1,2,3",
                                                  "NVIDIA_VISIBLE_DEVICES": "all"})
    results = harness.run_job(job, 'echo "stage=$NVIDIA_VISIBLE_DEVICES"; '
                                   'tr "\\0" "\\n" < /proc/1/environ | grep ^NVIDIA_VISIBLE')
    assert results["build_script"].code == 0, results["build_script"].output
    (uuid,) = _uuids(host, (6,))
    assert f"NVIDIA_VISIBLE_DEVICES={uuid}\n" in results["build_script"].output  # the container's
    assert results["cleanup"].code == 0 and _containers(engine, host, 706) == []


def test_the_container_sees_its_slots_builds_and_nothing_else(engine: docker.DockerClient,
                                                              host: Path) -> None:
    """The container is root in most images: with the whole builds dir mounted it could
    read another slot's checkout, or plant a link there that a later job's root step
    follows. It gets its slot's dir alone, and its stage scripts read-only."""
    builds = (host / "state" / "builds").resolve()
    (builds / "gpu1").mkdir(parents=True)
    (builds / "gpu1" / "secret").write_text("another job's checkout\n")
    harness = _harness(host, (0,))
    job = FakeJob(id=709, image=IMAGE)
    body = (f"if [ -e {builds}/gpu1/secret ]; then echo LEAKED; fi; "
            "if touch /.runnerctl-scripts/planted 2>/dev/null; then echo WRITABLE; fi; "
            f"touch {builds}/gpu0/mine && echo OWN-OK")
    results = harness.run_job(job, body)
    out = results["build_script"].output
    printed = out.splitlines()  # the log also echoes the command line
    assert results["build_script"].code == 0 and "OWN-OK" in printed, out
    assert "LEAKED" not in printed and "WRITABLE" not in printed
    scripts = host / "state" / "scripts"
    assert scripts.stat().st_mode & 0o777 == 0o700  # no other user of the host lists them
    assert results["cleanup"].code == 0 and list(scripts.iterdir()) == []  # gone with the job


@pytest.mark.parametrize("variables", [{}, {"CI_PROJECT_DIR": "/nowhere"}])
def test_a_link_the_job_planted_is_never_followed_by_a_host_stage(engine: docker.DockerClient, host: Path,
                                                                  tmp_path: Path,
                                                                  variables: dict[str, str]) -> None:
    """The git, cache and artifact stages run on the host as root in the builds dir the
    container writes: a link at `<project dir>.tmp`, where gitlab-runner writes the file
    variables and its env file, made them write root-owned files wherever it pointed
    (found by a review as a job trying to escape). The stage fails instead, and the
    container is frozen while host stages run, so the check cannot be raced. A job's own
    CI_PROJECT_DIR comes after gitlab-runner's in the stage's environment
    (common/build.go GetAllVariables) and turned the check off: the project dir is read
    from RUNNER_TEMP_PROJECT_DIR, which comes after the job's (found by a review as a
    gitlab-runner maintainer)."""
    victim = tmp_path / "victim"
    victim.mkdir()
    written: set[str] = set()
    done = threading.Event()

    def watch() -> None:  # files a stage writes through the link, even for a moment
        while not done.is_set():
            written.update(p.name for p in victim.iterdir())
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    body = f'p=$(pwd); rm -rf "$p.tmp"; ln -s {victim} "$p.tmp"'  # the script starts in the project dir
    try:
        job = FakeJob(id=712, image=IMAGE, cache_paths=["cache/"], variables=variables)
        results = _harness(host, (3,)).run_job(job, body)
    finally:
        done.set()
        watcher.join(timeout=10)
    assert results["build_script"].code == 0, results["build_script"].output
    after = [name for name in results if name.startswith("archive_cache")]
    assert after and results[after[0]].code == SYSTEM_FAILURE, results
    assert "is a symbolic link, made in the job's container" in results[after[0]].output
    assert written == set() and list(victim.iterdir()) == []
    assert _containers(engine, host, 712) == []


def test_as_root_without_a_job_user_says_what_runs_on_the_host(engine: docker.DockerClient,
                                                               tmp_path: Path) -> None:
    """The README said run_as_user and allow_root were the shell and batch drivers'
    settings: a root gitlab-runner with the defaults failed every docker job, naming the
    shell driver (found by a review as a researcher using docker)."""
    host = make_host(tmp_path, docker_image=IMAGE, shell_user=None)
    results = _harness(host, (7,)).run_job(FakeJob(id=715, image=IMAGE), "echo never")
    out = results["prepare"].output
    assert results["prepare"].code == SYSTEM_FAILURE, results
    assert ("the docker driver does not run jobs' git, cache and artifact stages (on the host, in the dir "
            "its container writes) as root: set [executor] run_as_user") in out, out


def test_a_state_dir_reached_through_a_link_still_runs_jobs(engine: docker.DockerClient,
                                                            tmp_path: Path) -> None:
    """config told gitlab-runner the builds dir by the path as set, the container mounted it
    at the resolved one: the script could not cd to its project dir (found by a review as
    a researcher using docker)."""
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    make_host(real, docker_image=IMAGE)
    link.symlink_to(real)
    settings = real / "runnerctl.toml"
    settings.write_text(settings.read_text().replace(str(real / "state"), str(link / "state")))
    results = harness_for(link, (1,), "docker").run_job(FakeJob(id=717, image=IMAGE), "touch mine && pwd")
    assert results["build_script"].code == 0, results["build_script"].output
    assert str(link / "state" / "builds" / "gpu1") in results["build_script"].output


def _derived(engine: docker.DockerClient, name: str, line: str) -> str:
    """An image built here from the local busybox one, with one more Dockerfile line."""
    tag = f"runnerctl-test/{name}:latest"
    engine.images.build(fileobj=io.BytesIO(f"FROM {IMAGE}\n{line}\n".encode()), tag=tag, rm=True)
    return tag


def test_an_images_volume_goes_with_its_container(engine: docker.DockerClient, host: Path) -> None:
    """The container was removed without its anonymous volumes: every job from an image
    with a VOLUME left one behind (found by a review as a researcher using docker)."""
    image = _derived(engine, "with-volume", "VOLUME /data")
    before = {v.name for v in engine.volumes.list()}
    results = _harness(host, (5,)).run_job(FakeJob(id=713, image=image), "echo x > /data/f")
    assert results["build_script"].code == 0 and results["cleanup"].code == 0, results
    assert {v.name for v in engine.volumes.list()} - before == set()


def test_an_entrypoint_that_ends_at_once_is_named(engine: docker.DockerClient, host: Path) -> None:
    """It passed prepare and failed the first script with a raw 409 Conflict."""
    image = _derived(engine, "ends-at-once", 'ENTRYPOINT ["/bin/true"]')
    results = _harness(host, (6,)).run_job(FakeJob(id=714, image=image), "echo never")
    failed = next(r for r in results.values() if r.code == SYSTEM_FAILURE)
    assert "its image's entrypoint ended instead of running the command it is given" in failed.output, results
    assert "409" not in failed.output and _containers(engine, host, 714) == []


def test_killed_mid_script_leaves_no_container(engine: docker.DockerClient, host: Path) -> None:
    harness = _harness(host, (4,))
    job = FakeJob(id=702, image=IMAGE)
    assert harness.stage("prepare", job).code == 0
    driver = harness.start("run", job, str(harness.script(job, "build_script", "sleep 300")),
                           "build_script")
    (lease,) = LeaseTable(host / "state").held_by("702")
    deadline = time.monotonic() + 120
    while not job_processes(lease) and time.monotonic() < deadline:  # the script runs
        time.sleep(0.1)
    assert job_processes(lease) and driver.poll() is None
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    assert len(_containers(engine, host, 702)) == 1
    assert harness.stage("cleanup", job).code == 0
    assert _containers(engine, host, 702) == [] and LeaseTable(host / "state").all() == []


def test_gitlab_timeout_stops_the_script_and_after_script_still_runs(
        engine: docker.DockerClient, host: Path) -> None:
    harness = _harness(host, (1,))
    job = FakeJob(id=705, image=IMAGE)
    assert harness.stage("prepare", job).code == 0
    ready = host / "state" / "builds" / "gpu1" / "trap-set"  # the slot's dir, the container's too
    script = harness.script(job, "build_script", f"{TERM_TRAP}; touch {ready}; sleep 300 & wait")
    result = harness.stage("run", job, str(script), "build_script", timeout=240, graceful=300,
                           stop_once=ready)
    assert result.code == BUILD_FAILURE and "stopped by TERM" in result.output  # not gitlab-runner's SIGKILL
    after = harness.stage("run", job, str(harness.script(job, "after_script", "echo tidy")),
                          "after_script")
    assert after.code == 0 and "tidy" in after.output
    harness.stage("cleanup", job)
    assert _containers(engine, host, 705) == []


def test_a_worker_ignoring_sigterm_is_killed_before_the_stage_ends(engine: docker.DockerClient,
                                                                   host: Path) -> None:
    """The SIGKILL after the grace was a thread of the driver, which died with it as soon
    as the exec'd shell ended: a worker that ignored SIGTERM lived on in the container
    beside after_script, holding the GPU until cleanup (found by a review of cancellation)."""
    harness = _harness(host, (2,))
    job = FakeJob(id=706, image=IMAGE)
    assert harness.stage("prepare", job).code == 0
    (lease,) = LeaseTable(host / "state").held_by("706")
    slot = host / "state" / "builds" / "gpu2"  # the slot's dir, the container's too
    ignoring, ready = slot / "ignoring", slot / "trap-set"
    body = (f"(trap '' TERM; touch {ignoring}; sleep 600) & {TERM_TRAP}; "
            f"while [ ! -e {ignoring} ]; do sleep 0.05; done; touch {ready}; wait")
    script = harness.script(job, "build_script", body)
    result = harness.stage("run", job, str(script), "build_script", timeout=240, graceful=300,
                           stop_once=ready)
    assert result.code == BUILD_FAILURE and "stopped by TERM" in result.output
    assert job_processes(lease) == []  # as the stage ended, not once cleanup came
    harness.stage("cleanup", job)
    assert _containers(engine, host, 706) == []


def test_sigterm_as_the_exec_starts_reaches_the_script(engine: docker.DockerClient, host: Path) -> None:
    """SIGTERM between starting the `docker exec` and arming the stop: the script gets it."""
    harness = _harness(host, (5,))
    job = FakeJob(id=710, image=IMAGE)
    assert harness.stage("prepare", job).code == 0
    body = f"{TERM_TRAP}; sleep 300 & wait"
    driver = harness.start("run", job, str(harness.script(job, "build_script", body)),
                           "build_script", stopped_at_start=True)
    out, _ = driver.communicate(timeout=120)
    assert driver.returncode == BUILD_FAILURE and "stopped by TERM" in out, out  # not the SIGKILL
    assert harness.stage("cleanup", job).code == 0
    assert _containers(engine, host, 710) == [] and LeaseTable(host / "state").all() == []


def test_container_processes_are_ci_for_the_controller(engine: docker.DockerClient,
                                                       host: Path) -> None:
    harness = _harness(host, (0,))
    job = FakeJob(id=707, image=IMAGE)
    assert harness.stage("prepare", job).code == 0
    driver = harness.start("run", job, str(harness.script(job, "build_script", "sleep 300")),
                           "build_script")
    try:
        (container,) = _containers(engine, host, 707)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(container.top()["Processes"]) < 3:
            time.sleep(0.2)
        pids = [int(p[1]) for p in container.top()["Processes"]]  # host pids: keepalive, sh, sleep
        colleague = subprocess.Popen(["sleep", "60"])
        procs = "".join(f"  - {{gpu: 0, pid: {pid}}}\n" for pid in [*pids, colleague.pid])
        (host / "gpus.yaml").write_text(f"host: gpu-a\ngpus: 8\nprocesses:\n{procs}")
        snapshot = open_gpu_source(f"sim:{host / 'gpus.yaml'}", host="gpu-a").snapshot()
        use = classify(snapshot, read_leases(host / "state"))[0]
        assert sorted(p.pid for p in use.ci) == sorted(pids)  # by token or container cgroup
        assert [p.pid for p in use.foreign] == [colleague.pid]
        colleague.kill()
        colleague.wait()
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
        harness.stage("cleanup", job)
    assert _containers(engine, host, 707) == []


def test_next_prepare_reaps_the_container_of_a_dead_runner(engine: docker.DockerClient,
                                                           host: Path) -> None:
    """gitlab-runner dies after prepare: no cleanup comes; the next job's prepare tidies."""
    harness = _harness(host, (5,))
    exe, argv = stage_command("prepare", harness.args)
    runner = f"import subprocess,sys; sys.exit(subprocess.call({[exe, *argv]!r}))"
    assert subprocess.run([sys.executable, "-c", runner], env=harness.env(FakeJob(id=708, image=IMAGE)),
                          timeout=60, check=False).returncode == 0
    assert len(_containers(engine, host, 708)) == 1  # left behind, idle
    nxt = FakeJob(id=709, image=IMAGE)
    assert harness.stage("prepare", nxt).code == 0
    assert _containers(engine, host, 708) == []
    assert [lease.job_id for lease in LeaseTable(host / "state").all()] == ["709"]
    harness.stage("cleanup", nxt)
    assert _containers(engine, host, 709) == []


def test_unpullable_image_is_a_system_failure(engine: docker.DockerClient, host: Path) -> None:
    harness = _harness(host, (5,))
    job = FakeJob(id=703, image="runnerctl-test/does-not-exist:1")
    result = harness.stage("prepare", job)
    assert result.code == SYSTEM_FAILURE
    assert "cannot pull image runnerctl-test/does-not-exist:1" in result.output
    assert LeaseTable(host / "state").all() == []  # given back at once


def test_services_that_are_not_started_are_named_in_the_job_log(engine: docker.DockerClient,
                                                                host: Path) -> None:
    """gitlab-runner's docker executor starts a job's `services:`; this driver does not, and
    the job went on as if it had (its script then failed to reach them, unexplained)."""
    job = FakeJob(id=718, image=IMAGE, services=["postgres:16", "redis:7"])
    results = _harness(host, (3,)).run_job(job, "echo ran")
    assert results["build_script"].code == 0, results
    warning = "WARNING: this job's services (postgres:16, redis:7) are not started"
    assert warning in results["prepare"].output


def test_stopped_engine_is_a_system_failure(host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{host / 'no-docker.sock'}")
    harness = _harness(host, (6,))
    result = harness.stage("prepare", FakeJob(id=704, image=IMAGE))
    assert result.code == SYSTEM_FAILURE and "Docker engine is not reachable" in result.output
    assert LeaseTable(host / "state").all() == []


def test_a_pause_that_fails_on_a_running_container_refuses_the_host_stage(
        engine: docker.DockerClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed pause was taken for "not running" whatever its cause: where the engine
    cannot freeze (no freezer in its cgroup setup), host stages ran beside the job's
    live processes, the race the pause is there to close, and nobody was told."""
    from types import SimpleNamespace

    from runnerctl.executors import docker as driver
    from runnerctl.executors.driver import SystemFailure

    def no_freezer(self: Any, container: str) -> None:
        raise docker.errors.APIError("freezer not supported")

    running = engine.containers.run(IMAGE, ["sleep", "300"], detach=True, labels={"runnerctl.test": "pause"})
    ended = engine.containers.run(IMAGE, ["true"], detach=True, labels={"runnerctl.test": "pause"})
    try:
        ended.wait(timeout=60)
        monkeypatch.setattr(docker.api.client.APIClient, "pause", no_freezer)
        with pytest.raises(SystemFailure, match="cannot pause the job's container for the host stage"):
            with driver._frozen(SimpleNamespace(lease=SimpleNamespace(container=running.id))):  # type: ignore[arg-type]
                pytest.fail("the host stage ran beside the job's live processes")
        with driver._frozen(SimpleNamespace(lease=SimpleNamespace(container=ended.id))):  # type: ignore[arg-type]
            pass  # nothing in it can move: the stage runs
        monkeypatch.undo()
        running.pause()  # paused by an admin: nothing moves, and it stays paused
        with driver._frozen(SimpleNamespace(lease=SimpleNamespace(container=running.id))):  # type: ignore[arg-type]
            pass
        running.reload()
        assert running.status == "paused"
    finally:
        for c in (running, ended):
            c.remove(force=True)


def test_an_old_gitlab_runner_and_a_job_set_project_dir_refuse_the_host_stage(tmp_path: Path) -> None:
    """Without RUNNER_TEMP_PROJECT_DIR (gitlab-runner before 15.5) the check reads
    CI_PROJECT_DIR, which a job's own variable replaces: then it cannot tell where to look."""
    from runnerctl.executors import docker as driver
    from runnerctl.executors.contract import DriverArgs
    from runnerctl.executors.driver import Job, StageContext, SystemFailure
    from runnerctl.settings import PathSettings, Settings

    settings = Settings(paths=PathSettings(state_dir=str(tmp_path / "state")))
    slot = Path(settings.builds_dir) / "gpu0"
    (slot / "p").mkdir(parents=True)
    (slot / "p.tmp").symlink_to(tmp_path)

    def ctx(env: dict[str, str], set_by_job: frozenset[str]) -> StageContext:
        job = Job("7", "1", "g/p", "ann", None, set_by_job=set_by_job)
        return StageContext(args=DriverArgs("runnerctl/gpu-a/gpu0", (0,), "sim:1", "", "docker"),
                            settings=settings, env=env, job=job)

    old = {"CUSTOM_ENV_CI_PROJECT_DIR": str(slot / "p")}
    with pytest.raises(SystemFailure, match="is a symbolic link"):  # the runner's own value
        driver._refuse_planted_links(ctx(old, frozenset({"CI_JOB_ID"})), "archive_cache")
    with pytest.raises(SystemFailure, match="sets CI_PROJECT_DIR and this gitlab-runner does not say"):
        driver._refuse_planted_links(ctx({"CUSTOM_ENV_CI_PROJECT_DIR": "/nowhere"},
                                         frozenset({"CI_PROJECT_DIR"})), "archive_cache")
    new = {"CUSTOM_ENV_CI_PROJECT_DIR": "/nowhere", "CUSTOM_ENV_RUNNER_TEMP_PROJECT_DIR": f"{slot / 'p'}.tmp"}
    with pytest.raises(SystemFailure, match="is a symbolic link"):
        driver._refuse_planted_links(ctx(new, frozenset({"CI_PROJECT_DIR"})), "archive_cache")
