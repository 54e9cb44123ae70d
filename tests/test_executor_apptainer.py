"""A job's `image:` under the batch drivers runs in Apptainer (executors/apptainer.py),
checked at the command edge with the Apptainer stand-in on the real Slurm."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from runnerctl.executors.apptainer import binds, image_uri
from tests.harness_custom_executor import SYSTEM_FAILURE, FakeJob, harness_for, make_host

FAKES = Path(__file__).parent / "fakes" / "bin"


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return make_host(tmp_path)


def test_image_names_become_apptainer_uris() -> None:
    assert image_uri("pytorch/pytorch:2.3") == "docker://pytorch/pytorch:2.3"
    assert image_uri("/shared/images/train.sif") == "/shared/images/train.sif"
    assert image_uri("oras://registry.example/ml:1") == "oras://registry.example/ml:1"
    # a relative file is the project's, not the builds dir's the batch job starts in
    assert image_uri("images/x.sif", Path("/b/gpu1/ml/exp")) == "/b/gpu1/ml/exp/images/x.sif"
    assert image_uri("./x.sif", Path("/b/p")) == "/b/p/x.sif"
    assert image_uri("/abs/x.sif", Path("/b/p")) == "/abs/x.sif"


def test_a_builds_dir_reached_through_a_link_is_bound_at_both_paths() -> None:
    """A container sees a bind only at its destination: the job's CI_PROJECT_DIR under
    the path it was given (/scratch -> /lustre/scratch) did not exist inside."""
    assert binds(Path("/lustre/scratch/b"), Path("/lustre/scratch/b")) == ("/lustre/scratch/b",)
    assert binds(Path("/lustre/scratch/b"), Path("/scratch/b")) == ("/lustre/scratch/b",
                                                                   "/lustre/scratch/b:/scratch/b")


def test_slurm_job_with_an_image_runs_in_apptainer_with_its_gpus(host: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "apptainer.log"
    monkeypatch.setenv("PATH", f"{FAKES / 'apptainer'}:{os.environ['PATH']}")
    monkeypatch.setenv("RUNNERCTL_FAKE_APPTAINER_LOG", str(log))
    images = tmp_path / "images.json"  # an image that sets every GPU: the host's value would not win
    images.write_text(json.dumps({"docker://pytorch/pytorch:2.3": {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
                                                                   "FROM_IMAGE": "yes"}}))
    monkeypatch.setenv("RUNNERCTL_FAKE_APPTAINER_IMAGE_ENV", str(images))
    harness = harness_for(host, (1,), "slurm")
    job = FakeJob(id=960, image="pytorch/pytorch:2.3", variables={"HF_TOKEN": "hf_secret_of_960"})
    results = harness.run_job(job, 'echo "in=$APPTAINER_CONTAINER image=$FROM_IMAGE '
                                   'cuda=$CUDA_VISIBLE_DEVICES"; exit 4')
    build = results["build_script"]
    assert "in=docker://pytorch/pytorch:2.3 image=yes cuda=" in build.output, build.output
    assert build.output.rsplit("cuda=", 1)[1].split()[0].isdigit()  # Slurm's GPU (output, not echo)
    assert harness.outcomes[960].exit_code == 4
    # nothing of the job is left on the shared file system: its script copy exported
    # HF_TOKEN, its output is unmasked, and every job of the host runs as the same user
    work = host / "state" / "builds" / ".runnerctl"
    assert [p.name for p in work.iterdir() if p.name.startswith("960-")] == []
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
    # the node's lack, not the job's: a system failure, which `retry:` may take up
    assert harness.outcomes[961].failure_reason == "runner_system_failure"
    assert "never ran the script (exit 127" in build.output


def test_an_image_that_never_starts_is_the_sites_failure_but_a_script_exiting_255_is_the_jobs(
        host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Apptainer ends with 255 on any FATAL (sylog.go): an image it cannot pull or open is
    no fault of the script, and `retry: when: runner_system_failure` should apply; a
    script that itself exits 255 is still the job's (found by a review as an HPC user)."""
    monkeypatch.setenv("PATH", f"{FAKES / 'apptainer'}:{os.environ['PATH']}")
    harness = harness_for(host, (1,), "slurm")
    results = harness.run_job(FakeJob(id=962, image="/shared/no-such-image.sif"), "echo never")
    build = results["build_script"]
    assert build.code == SYSTEM_FAILURE, build.output
    assert "FATAL: could not open image" in build.output and "never ran the script" in build.output
    assert "never\n" not in build.output and "Traceback" not in build.output
    results = harness.run_job(FakeJob(id=963, image="pytorch/pytorch:2.3"), "echo ran; exit 255")
    assert results["build_script"].code != SYSTEM_FAILURE and harness.outcomes[963].exit_code == 255


def test_several_nodes_with_an_image_are_refused_saying_how(host: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole batch script ran in the image, where srun and mpirun are not: every
    multi-node job with an image ended "srun: command not found"."""
    monkeypatch.setenv("PATH", f"{FAKES / 'apptainer'}:{os.environ['PATH']}")
    harness = harness_for(host, (1,), "slurm")
    job = FakeJob(id=964, image="pytorch/pytorch:2.3", variables={"RUNNERCTL_NODES": "2"})
    build = harness.run_job(job, "echo never")["build_script"]
    assert build.code != 0 and build.code != SYSTEM_FAILURE
    assert "RUNNERCTL_NODES=2 cannot be used with image: pytorch/pytorch:2.3" in build.output
    assert '"$RUNNERCTL_EACH_NODE" apptainer exec --nv IMAGE COMMAND' in build.output
    assert "submitted" not in build.output


def test_a_linked_builds_dir_and_a_relative_sif_reach_apptainer_as_the_job_sees_them(
        host: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver binds the builds dir at the path the job was given too (a container sees
    only a bind's destination: the job's CI_PROJECT_DIR under /scratch -> /lustre/scratch
    did not exist inside), and a relative SIF is the project's, not the builds dir's the
    batch job starts in (found by a review as an HPC user; a review of the day's changes
    found only the helpers tested, not the driver's use of them)."""
    real = tmp_path / "lustre" / "scratch"
    real.mkdir(parents=True)
    link = tmp_path / "scratch"
    link.symlink_to(real)
    settings = host / "runnerctl.toml"
    settings.write_text(settings.read_text().replace("[executor]", f'builds_dir = "{link}"\n[executor]'))
    log = tmp_path / "apptainer.log"
    monkeypatch.setenv("PATH", f"{FAKES / 'apptainer'}:{os.environ['PATH']}")
    monkeypatch.setenv("RUNNERCTL_FAKE_APPTAINER_LOG", str(log))
    harness = harness_for(host, (1,), "slurm")
    first = harness.run_job(FakeJob(id=965), 'echo "project=$CI_PROJECT_DIR"')["build_script"]
    project = Path(first.output.rsplit("project=", 1)[1].split()[0])
    assert str(project).startswith(str(link)), first.output
    (project / "images").mkdir(parents=True, exist_ok=True)
    (project / "images" / "x.sif").write_text("a SIF")
    build = harness.run_job(FakeJob(id=966, image="images/x.sif"), "pwd; exit 0")["build_script"]
    assert build.code == 0, build.output
    call = json.loads(log.read_text().splitlines()[0])
    assert call["image"] == str(project / "images" / "x.sif")
    assert call["binds"] == [str(real), f"{real}:{link}"], call
