"""Components render into pipelines GitLab accepts, and bad inputs are refused by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from runnerctl.cli import main
from runnerctl.errors import ConfigError
from runnerctl.pipelines import components, load_component, render

ROOT = Path(__file__).resolve().parents[1]
MINIMAL = {"gpu-job": {"command": "python train.py"},
           "optuna-sweep": {"study_name": "lr_search", "command": "python search.py"},
           "python-cache": {}}


def _validate(path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema",
                             "vendor.gitlab-ci", str(path)], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_component_is_known_and_tested() -> None:
    assert components() == sorted(MINIMAL)
    for name in components():
        text = (ROOT / "templates" / f"{name}.yml").read_text()
        header = yaml.safe_load(text.split("\n---\n")[0])
        assert set(header) == {"spec"} and "inputs" in header["spec"]


@pytest.mark.parametrize(("name", "extra"), [
    ("gpu-job", {}), ("gpu-job", {"gpus": "8", "priority": "high"}),
    ("optuna-sweep", {}), ("optuna-sweep", {"workers": "200", "gpus_per_worker": "4"}),
    ("optuna-sweep", {"workers": "1", "command": "python a.py\npython b.py"}),
    ("python-cache", {"lock_file": "uv.lock"}),
])
def test_rendered_pipelines_validate(tmp_path: Path, name: str, extra: dict[str, str]) -> None:
    out = tmp_path / ".gitlab-ci.yml"
    inputs = [f"{k}={v}" for k, v in {**MINIMAL[name], **extra}.items()]
    assert main(["render", name, *sum((["-i", i] for i in inputs), []), "-o", str(out)]) == 0
    _validate(out)


def test_examples_validate() -> None:
    _validate(ROOT / "examples" / "optuna-sweep" / ".gitlab-ci.yml")


@pytest.mark.parametrize(("gpus", "tags"), [("1", ["gpus:1", "priority:normal"]),
                                            ("4", ["gpus:4", "priority:normal"])])
def test_gpu_job_tags_reach_exactly_one_runner_size(gpus: str, tags: list[str]) -> None:
    pipeline = yaml.safe_load(render("gpu-job", {"command": "x", "gpus": gpus}))
    assert pipeline["gpu-job"]["tags"] == tags
    assert pipeline["gpu-job"]["retry"]["when"][0] == "runner_system_failure"


def test_sweep_structure() -> None:
    pipeline = yaml.safe_load(render("optuna-sweep", {
        "study_name": "s1", "command": "python search.py", "workers": "6", "n_trials": "60",
        "gpus_per_worker": "2", "storage": "postgresql://db/s1"}))
    assert pipeline["optuna-create-study"]["stage"] == ".pre"
    assert "--skip-if-exists" in pipeline["optuna-create-study"]["script"][0]
    worker = pipeline["optuna-worker"]
    assert worker["parallel"] == 6 and worker["tags"][0] == "gpus:2"
    env = pipeline[".optuna-sweep-env"]["variables"]
    assert env == {"OPTUNA_STORAGE": "postgresql://db/s1", "OPTUNA_STUDY_NAME": "s1",
                   "OPTUNA_N_TRIALS": "60"}
    assert pipeline["optuna-report"]["stage"] == ".post"
    assert pipeline["optuna-report"]["artifacts"]["paths"] == ["optuna-report/"]


def test_storage_defaults_to_the_hosts_shared_postgres() -> None:
    pipeline = yaml.safe_load(render("optuna-sweep", MINIMAL["optuna-sweep"]))
    assert pipeline[".optuna-sweep-env"]["variables"]["OPTUNA_STORAGE"] == "$RUNNERCTL_OPTUNA_STORAGE"


def test_multiline_command_stays_one_script_block() -> None:
    pipeline = yaml.safe_load(render("gpu-job", {"command": "echo one\necho: two"}))
    assert pipeline["gpu-job"]["script"][1] == "echo one\necho: two\n"


def test_python_cache_keys_on_the_lock_file() -> None:
    pipeline = yaml.safe_load(render("python-cache", {"lock_file": "requirements-gpu.txt"}))
    assert pipeline[".runnerctl-python-env"]["cache"]["key"]["files"] == ["requirements-gpu.txt"]


@pytest.mark.parametrize(("name", "given", "needle"), [
    ("optuna-sweep", {"workers": "0"}, "'workers' must be a whole number from 1 to 200"),
    ("optuna-sweep", {"workers": "201"}, "'workers' must be a whole number from 1 to 200"),
    ("optuna-sweep", {"workers": "four"}, "'workers' must be a number"),
    ("optuna-sweep", {"gpus_per_worker": "1.5"}, "'gpus_per_worker' must be a whole number"),
    ("optuna-sweep", {"gpus_per_worker": "-2"}, "'gpus_per_worker' must be a whole number"),
    ("optuna-sweep", {"colour": "red"}, "unknown input 'colour'"),
    ("optuna-sweep", {"direction": "sideways"}, "'direction' must be one of minimize, maximize"),
    ("optuna-sweep", {"study_name": "Bad Name"}, "'study_name' does not match"),
    ("gpu-job", {"gpus": "0"}, "'gpus' must be a whole number from 1 to 64"),
    ("gpu-job", {"gpus": "two"}, "'gpus' must be a number"),
    ("gpu-job", {"priority": "urgent"}, "'priority' must be one of high, normal, low"),
])
def test_bad_inputs_are_refused_by_name(name: str, given: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        render(name, {**MINIMAL[name], **given})


def test_missing_required_input_and_unknown_component() -> None:
    with pytest.raises(ConfigError, match="input 'command' is required"):
        render("gpu-job", {})
    with pytest.raises(ConfigError, match="unknown component 'nope'"):
        load_component("nope")


def test_cli_refusal_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "optuna-sweep", "-i", "study_name=s", "-i", "command=c",
                 "-i", "workers=0"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "workers" in err[0]
