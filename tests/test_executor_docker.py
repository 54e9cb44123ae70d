"""The docker driver against the real Docker engine that .ci/setup/docker.sh starts."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from runnerctl.executors.lease import LeaseTable
from runnerctl.gpus import open_gpu_source
from tests.harness_custom_executor import SYSTEM_FAILURE, FakeJob, Harness, harness_for, make_host

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


def _containers(engine: docker.DockerClient, job: int) -> list[object]:
    return engine.containers.list(all=True, filters={"label": f"runnerctl.job={job}"})


def test_container_gets_exactly_the_slot_gpus_and_is_removed(engine: docker.DockerClient,
                                                             host: Path) -> None:
    harness = _harness(host, (2, 3))
    job = FakeJob(id=701, image=IMAGE, variables={"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"})
    assert harness.stage("prepare", job).code == 0
    (container,) = _containers(engine, 701)
    requests = container.attrs["HostConfig"]["DeviceRequests"]
    assert [r["DeviceIDs"] for r in requests] == [_uuids(host, (2, 3))]
    assert requests[0]["Driver"] == "nvidia"
    assert container.attrs["Config"]["Labels"]["runnerctl.lease"] == "701@runnerctl/gpu-a/gpu2-3"
    body = 'echo "nv=$NVIDIA_VISIBLE_DEVICES"; tr "\\0" "\\n" < /proc/1/environ | grep ^NVIDIA_VISIBLE'
    script = harness.script(job, "build_script", body)
    result = harness.stage("run", job, str(script), "build_script")
    assert result.code == 0, result.output
    expected = ",".join(_uuids(host, (2, 3)))
    assert f"nv={expected}" in result.output  # the job's own variable changed nothing
    assert f"NVIDIA_VISIBLE_DEVICES={expected}" in result.output  # what the device hook saw
    failing = harness.stage("run", job, str(harness.script(job, "after_script", "exit 4")),
                            "after_script")
    assert failing.code == 1 and (harness.workdir / "exit-701").read_text().strip() == "4"
    assert harness.stage("cleanup", job).code == 0
    assert _containers(engine, 701) == [] and LeaseTable(host / "state").all() == []


def test_killed_mid_script_leaves_no_container(engine: docker.DockerClient, host: Path) -> None:
    harness = _harness(host, (4,))
    job = FakeJob(id=702, image=IMAGE)
    assert harness.stage("prepare", job).code == 0
    driver = harness.start("run", job, str(harness.script(job, "build_script", "sleep 300")),
                           "build_script")
    time.sleep(1.5)
    assert driver.poll() is None
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    assert len(_containers(engine, 702)) == 1
    assert harness.stage("cleanup", job).code == 0
    assert _containers(engine, 702) == [] and LeaseTable(host / "state").all() == []


def test_gitlab_timeout_stops_the_container(engine: docker.DockerClient, host: Path) -> None:
    harness = _harness(host, (1,))
    job = FakeJob(id=705, image=IMAGE)
    assert harness.stage("prepare", job).code == 0
    started = time.monotonic()
    result = harness.stage("run", job, str(harness.script(job, "build_script", "sleep 300")),
                           "build_script", timeout=2, graceful=40)
    assert result.code == 1 and time.monotonic() - started < 35
    (container,) = _containers(engine, 705)
    container.reload()
    assert container.status != "running"  # stopped (exited, or already being removed)
    harness.stage("cleanup", job)
    assert _containers(engine, 705) == []


def test_unpullable_image_is_a_system_failure(engine: docker.DockerClient, host: Path) -> None:
    harness = _harness(host, (5,))
    job = FakeJob(id=703, image="runnerctl-test/does-not-exist:1")
    result = harness.stage("prepare", job)
    assert result.code == SYSTEM_FAILURE
    assert "cannot pull image runnerctl-test/does-not-exist:1" in result.output
    assert LeaseTable(host / "state").all() == []  # given back at once


def test_stopped_engine_is_a_system_failure(host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{host / 'no-docker.sock'}")
    harness = _harness(host, (6,))
    result = harness.stage("prepare", FakeJob(id=704, image=IMAGE))
    assert result.code == SYSTEM_FAILURE and "Docker engine is not reachable" in result.output
