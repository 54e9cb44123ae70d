"""A job's `image:` under the batch drivers runs in Apptainer (executors/apptainer.py),
checked at the command edge with the Apptainer stand-in on the real Slurm."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from runnerctl.executors.apptainer import image_uri
from tests.harness_custom_executor import FakeJob, harness_for, make_host

FAKES = Path(__file__).parent / "fakes" / "bin"


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return make_host(tmp_path)


def test_image_names_become_apptainer_uris() -> None:
    assert image_uri("pytorch/pytorch:2.3") == "docker://pytorch/pytorch:2.3"
    assert image_uri("/shared/images/train.sif") == "/shared/images/train.sif"
    assert image_uri("oras://registry.example/ml:1") == "oras://registry.example/ml:1"


def test_slurm_job_with_an_image_runs_in_apptainer_with_its_gpus(host: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "apptainer.log"
    monkeypatch.setenv("PATH", f"{FAKES / 'apptainer'}:{os.environ['PATH']}")
    monkeypatch.setenv("RUNNERCTL_FAKE_APPTAINER_LOG", str(log))
    harness = harness_for(host, (1,), "slurm")
    job = FakeJob(id=960, image="pytorch/pytorch:2.3")
    results = harness.run_job(job, 'echo "in=$APPTAINER_CONTAINER cuda=$CUDA_VISIBLE_DEVICES"; exit 4')
    build = results["build_script"]
    assert "in=docker://pytorch/pytorch:2.3 cuda=" in build.output, build.output
    assert build.output.rsplit("cuda=", 1)[1].split()[0].isdigit()  # Slurm's GPU (output, not echo)
    assert harness.outcomes[960].exit_code == 4
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls and all("--nv" in call["flags"] for call in calls)  # build_script, after_script
    assert calls[0]["image"] == "docker://pytorch/pytorch:2.3"


def test_a_node_without_apptainer_fails_the_stage_saying_so(host: Path, monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")  # no apptainer, no singularity
    harness = harness_for(host, (1,), "slurm")
    results = harness.run_job(FakeJob(id=961, image="/shared/train.sif"), "echo never")
    build = results["build_script"]
    assert "image: /shared/train.sif needs apptainer or singularity on this node" in build.output
    assert harness.outcomes[961].exit_code == 127
