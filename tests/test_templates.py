"""Components render into pipelines GitLab accepts, reach the right runners, and bad
inputs are refused by name."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from runnerctl.cli import main
from runnerctl.errors import ConfigError
from runnerctl.layout import slot_tags
from runnerctl.model import Slot
from runnerctl.pipelines import components, load_component, render

ROOT = Path(__file__).resolve().parents[1]
MINIMAL = {"gpu-job": {"command": "python train.py"},
           "optuna-sweep": {"study_name": "lr_search", "command": "python search.py"},
           "python-cache": {}, "hpc-batch-job": {"command": "srun hostname"}}
RENDERED = [
    ("gpu-job", {}), ("gpu-job", {"gpus": "8", "priority": "high", "artifacts": '["logs/", "out/"]'}),
    ("optuna-sweep", {}), ("optuna-sweep", {"workers": "200", "gpus_per_worker": "4"}),
    ("optuna-sweep", {"workers": "1", "command": "python a.py\npython b.py",
                      "service_tags": '["cpu"]', "report_command": 'echo "best: see artifacts"'}),
    ("python-cache", {"lock_file": "uv.lock", "venv_options": "--system-site-packages"}),
    ("hpc-batch-job", {"nodes": "4", "gpus_per_node": "8", "scheduler_parameters": "--partition=gpu"}),
]


def _check_jsonschema(*paths: Path) -> None:
    """GitLab's own CI schema, each file (one YAML document) on its own."""
    result = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema",
                             "vendor.gitlab-ci", *map(str, paths)], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rendered_pipelines_component_headers_and_examples_validate(tmp_path: Path) -> None:
    files = []
    for n, (name, extra) in enumerate(RENDERED):
        out = tmp_path / f"{n}-{name}.gitlab-ci.yml"
        inputs = [f"{k}={v}" for k, v in {**MINIMAL[name], **extra}.items()]
        assert main(["render", name, *sum((["-i", i] for i in inputs), []), "-o", str(out)]) == 0
        assert len(list(yaml.safe_load_all(out.read_text()))) == 1
        files.append(out)
    for name in components():  # the `spec:` header is the component's first document
        header = next(yaml.safe_load_all((ROOT / "templates" / f"{name}.yml").read_text()))
        files.append(tmp_path / f"{name}.header.json")
        files[-1].write_text(json.dumps(header))
    files += sorted((ROOT / "examples").glob("*/.gitlab-ci.yml"))
    _check_jsonschema(*files)


def test_every_component_is_known_and_tested() -> None:
    assert components() == sorted(MINIMAL)
    for name in components():
        header, jobs = yaml.safe_load_all((ROOT / "templates" / f"{name}.yml").read_text())
        assert set(header) == {"spec"} and "inputs" in header["spec"]
        assert isinstance(jobs, dict) and jobs


def _gitlab_tags(job: dict[str, Any]) -> list[str]:
    """The tags GitLab gives a job: `$VAR` in a tag expanded from the job's own variables
    only, never from `rules: variables:` (gitlabhq lib/gitlab/ci/pipeline/seed/build.rb
    `evaluate_runner_tags` reads the seed's variables before rules apply; gitlab issues
    385676, 469521); a variable it does not know stays as written; tags are a set."""
    variables = {k: str(v) for k, v in job.get("variables", {}).items()}
    tags = [re.sub(r"\$(\w+)", lambda m: variables.get(m.group(1), m.group(0)), tag) for tag in job["tags"]]
    return list(dict.fromkeys(tags))


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
@pytest.mark.parametrize(("component", "job", "gpu_input"), [
    ("gpu-job", "gpu-job", "gpus"), ("optuna-sweep", "optuna-worker", "gpus_per_worker"),
    ("hpc-batch-job", "hpc-batch-job", "gpus_per_node")])
def test_gpu_tags_reach_exactly_the_runners_of_that_size(component: str, job: str, gpu_input: str,
                                                         gpus: int) -> None:
    pipeline = yaml.safe_load(render(component, {**MINIMAL[component], gpu_input: str(gpus),
                                                 "priority": "high"}))
    tags = _gitlab_tags(pipeline[job])
    assert tags == [f"gpus:{gpus}", "priority:high"]
    assert "rules" not in pipeline[job]  # a rule's variables never reach `tags`
    for size in (1, 2, 4, 8):  # GitLab: a runner takes a job whose tags it all carries
        runner = set(slot_tags(Slot("gpu-a", tuple(range(size)))))
        assert set(tags) <= runner if size == gpus else not set(tags) <= runner


def test_an_hpc_batch_job_is_one_node_unless_asked() -> None:
    """The usual HPC job runs on one node, and Grid Engine refuses RUNNERCTL_NODES above 1
    without a parallel environment: the default was 2 (found by a review against the HPC
    seeds)."""
    job = yaml.safe_load(render("hpc-batch-job", MINIMAL["hpc-batch-job"]))["hpc-batch-job"]
    assert str(job["variables"]["RUNNERCTL_NODES"]) == "1" and "image" not in job


def test_the_docs_grid_over_gpu_job_is_a_valid_pipeline(tmp_path: Path) -> None:
    """docs/experiments.md "Grids, re-runs and environments": `parallel: matrix:` under
    the component's job name, merged over it as GitLab merges a local job over an
    included one; every matrix job keeps the GPU tags."""
    command = 'python train.py --batch-size "$BATCH_SIZE" --lr "$LR"'
    pipeline = yaml.safe_load(render("gpu-job", {"command": command}))
    grid = {"BATCH_SIZE": ["128", "256", "512"], "LR": ["0.1", "0.01"]}
    pipeline["gpu-job"]["parallel"] = {"matrix": [grid]}
    path = tmp_path / ".gitlab-ci.yml"
    path.write_text(yaml.safe_dump(pipeline))
    _check_jsonschema(path)
    assert pipeline["gpu-job"]["tags"] == ["gpus:1", "priority:normal"]
    assert command in "\n".join(pipeline["gpu-job"]["script"])


def test_gpu_job_settings() -> None:
    job = yaml.safe_load(render("gpu-job", {"command": "x", "timeout": "2h 30m"}))["gpu-job"]
    assert job["timeout"] == "2h 30m"
    assert job["retry"]["when"][0] == "runner_system_failure"
    assert "job_execution_timeout" not in job["retry"]["when"]  # one that ran out of time is not retried


@pytest.mark.parametrize(("name", "jobs"), [("gpu-job", ["gpu-job"]), ("hpc-batch-job", ["hpc-batch-job"]),
                                            ("optuna-sweep", ["optuna-create-study", "optuna-worker"])])
def test_retries_name_only_reasons_every_gitlab_knows_unless_told(name: str, jobs: list[str]) -> None:
    """They named stuck_pending_no_matching_runners, which a GitLab from before the split of
    stuck_or_timeout_failure does not know: lib/gitlab/ci/config/entry/retry.rb then refuses
    the pipeline, and an included component cannot be edited (found by a review as a GitLab
    CI expert). stuck_or_timeout_failure is known everywhere, and a GitLab that split it
    takes it as every reason it was split into (commit_status.rb failure_reason_aliases)."""
    every_gitlab = {"runner_system_failure", "scheduler_failure", "api_failure", "stuck_or_timeout_failure"}
    pipeline = yaml.safe_load(render(name, MINIMAL[name]))
    for job in jobs:
        assert set(pipeline[job]["retry"]["when"]) == every_gitlab
    split = ["runner_system_failure", "runner_interrupted", "stuck_pending_no_matching_runners"]
    chosen = yaml.safe_load(render(name, {**MINIMAL[name], "retry_when": json.dumps(split)}))
    assert all(chosen[job]["retry"]["when"] == split for job in jobs)
    with pytest.raises(ConfigError, match="'stuck' is not a GitLab failure reason"):
        render(name, {**MINIMAL[name], "retry_when": '["stuck"]'})
    with pytest.raises(ConfigError, match="needs at least one failure reason"):
        render(name, {**MINIMAL[name], "retry_when": "[]"})


def test_sweep_structure() -> None:
    pipeline = yaml.safe_load(render("optuna-sweep", {
        "study_name": "s1", "command": "python search.py", "workers": "6", "n_trials": "60",
        "gpus_per_worker": "2", "storage": "postgresql+psycopg://u@db:5432/s1",
        "direction": "maximize"}))
    assert pipeline["stages"] == ["test"]
    create = pipeline["optuna-create-study"]
    assert create["stage"] == ".pre" and create["tags"] == ["gpu", "gpus:1"]
    assert "--skip-if-exists" in create["script"][0] and "--direction maximize" in create["script"][0]
    worker = pipeline["optuna-worker"]
    assert worker["parallel"] == 6 and worker["extends"] == ".optuna-sweep-env"
    assert pipeline[".optuna-sweep-env"]["variables"] == {
        "OPTUNA_STORAGE": "postgresql+psycopg://u@db:5432/s1", "OPTUNA_STUDY_NAME": "s1",
        "OPTUNA_N_TRIALS": 60}
    report = pipeline["optuna-report"]
    assert report["stage"] == ".post" and report["when"] == "always"
    assert report["artifacts"]["paths"] == ["optuna-report/"]


def test_two_sweeps_in_one_pipeline_keep_their_own_jobs() -> None:
    """GitLab deep-merges the included files by job name (lib/gitlab/ci/config/external/
    processor.rb merge_external_files!, deep_merge!), so a second sweep with the same job
    names replaced the first one's study, trial count and command; job_prefix keeps them
    apart."""
    first = yaml.safe_load(render("optuna-sweep", {**MINIMAL["optuna-sweep"], "study_name": "lr"}))
    second = yaml.safe_load(render("optuna-sweep", {**MINIMAL["optuna-sweep"], "study_name": "depth",
                                                    "job_prefix": "depth"}))
    merged = {**first, **second}
    assert merged[".optuna-sweep-env"]["variables"]["OPTUNA_STUDY_NAME"] == "lr"
    assert merged[".depth-sweep-env"]["variables"]["OPTUNA_STUDY_NAME"] == "depth"
    for job in ("create-study", "worker", "report"):
        assert merged[f"optuna-{job}"]["extends"] == ".optuna-sweep-env"
        assert merged[f"depth-{job}"]["extends"] == ".depth-sweep-env"
    with pytest.raises(ConfigError, match="job_prefix"):
        render("optuna-sweep", {**MINIMAL["optuna-sweep"], "job_prefix": ".hidden"})


def test_storage_defaults_to_the_hosts_shared_postgres() -> None:
    pipeline = yaml.safe_load(render("optuna-sweep", MINIMAL["optuna-sweep"]))
    assert pipeline[".optuna-sweep-env"]["variables"]["OPTUNA_STORAGE"] == "$RUNNERCTL_OPTUNA_STORAGE"


def test_inputs_are_values_not_yaml() -> None:
    """As in GitLab, interpolation fills parsed values: no input can add keys or jobs."""
    pipeline = yaml.safe_load(render("optuna-sweep", {
        **MINIMAL["optuna-sweep"], "command": "echo one\necho: two\n---\nevil: {script: [x]}",
        "report_command": "echo a: b", "image": "registry:5000/img: x"}))
    assert pipeline["optuna-worker"]["script"][1] == "echo one\necho: two\n---\nevil: {script: [x]}\n"
    assert pipeline["optuna-report"]["script"] == ["echo a: b"]
    assert pipeline[".optuna-sweep-env"]["image"] == "registry:5000/img: x"
    assert "evil" not in pipeline


def test_python_cache_keys_on_the_lock_file_and_skips_pip_when_it_matches() -> None:
    pipeline = yaml.safe_load(render("python-cache", {"lock_file": "requirements-gpu.txt"}))
    job = pipeline[".runnerctl-python-env"]
    assert job["cache"]["key"]["files"] == ["requirements-gpu.txt"]
    script = "\n".join(job["before_script"])
    assert 'sha256sum "requirements-gpu.txt"' in script and ".runnerctl-stamp" in script


@pytest.mark.parametrize(("name", "given", "needle"), [
    ("optuna-sweep", {"workers": "0"}, "'workers' must be a whole number from 1 to 200"),
    ("optuna-sweep", {"workers": "201"}, "'workers' must be a whole number from 1 to 200"),
    ("optuna-sweep", {"workers": "1.5"}, "'workers' must be a whole number from 1 to 200"),
    ("optuna-sweep", {"workers": "four"}, "'workers' must be a number"),
    ("optuna-sweep", {"gpus_per_worker": "0"}, "'gpus_per_worker' must be a whole number"),
    ("optuna-sweep", {"gpus_per_worker": "1.5"}, "'gpus_per_worker' must be a whole number"),
    ("optuna-sweep", {"gpus_per_worker": "-2"}, "'gpus_per_worker' must be a whole number"),
    ("optuna-sweep", {"n_trials": "0"}, "'n_trials' must be a whole number"),
    ("optuna-sweep", {"colour": "red"}, "unknown input 'colour'"),
    ("optuna-sweep", {"direction": "sideways"}, "'direction' must be one of minimize, maximize"),
    ("optuna-sweep", {"study_name": "Bad Name"}, "'study_name' does not match"),
    ("optuna-sweep", {"service_tags": "cpu"}, "'service_tags' must be a JSON array"),
    ("optuna-sweep", {"service_tags": "[1]"}, "'service_tags' must be an array of non-empty strings"),
    ("gpu-job", {"gpus": "0"}, "'gpus' must be a whole number from 1 to 64"),
    ("hpc-batch-job", {"gpus_per_node": "3"}, "'gpus_per_node' is 3, but runner blocks hold"),
    ("hpc-batch-job", {"gpus_per_node": "0"}, "'gpus_per_node' must be a whole number from 1 to 64"),
    ("hpc-batch-job", {"gpus_per_node": "-2"}, "'gpus_per_node' must be a whole number"),
    ("hpc-batch-job", {"nodes": "0"}, "'nodes' must be a whole number from 1 to 10000"),
    ("hpc-batch-job", {"nodes": "1.5"}, "'nodes' must be a whole number"),
    ("gpu-job", {"gpus": "two"}, "'gpus' must be a number"),
    ("gpu-job", {"gpus": "nan"}, "'gpus' must be a whole number"),
    ("gpu-job", {"priority": "urgent"}, "'priority' must be one of high, normal, low"),
    ("gpu-job", {"timeout": "forever"}, "'timeout' 'forever' is not a duration"),
    ("optuna-sweep", {"study_name": "lr\n"}, "'study_name' does not match"),  # RE2's $: the end of the text
    ("optuna-sweep", {"storage": "journal+postgresql://u:s3cret@db.lab/u"}, "'storage' holds a password"),
    ("gpu-job", {"job_name": "stages"}, "'job_name' 'stages' is a GitLab CI keyword"),
    ("gpu-job", {"job_name": "workflow"}, "'job_name' 'workflow' is a GitLab CI keyword"),
    ("gpu-job", {"job_name": ".train"}, "starts with '.': GitLab would hide the job"),
    ("gpu-job", {"job_name": "a" * 256}, "'job_name' is 256 characters; GitLab takes at most 255"),
    ("gpu-job", {"stage": " "}, "input 'stage' must not be empty"),
    ("gpu-job", {"image": ""}, "input 'image' must not be empty"),
    # an empty script line passed doing nothing; a newline split the job's key (found fuzzing the CLI)
    ("gpu-job", {"command": " "}, "input 'command' must not be empty"),
    ("optuna-sweep", {"command": ""}, "input 'command' must not be empty"),
    ("gpu-job", {"job_name": "train\nevil"}, "input 'job_name' must be one line"),
    ("gpu-job", {"artifacts": "[]"}, "'artifacts' needs at least one path"),
    ("optuna-sweep", {"storage": "postgresql://u:s3cret@db.lab:5432/u"}, "'storage' holds a password"),
    # libpq and SQLAlchemy also take it as a parameter (found by a review as a researcher sweeping)
    ("optuna-sweep", {"storage": "journal+postgresql://u@db.lab/u?password=s3cret"},
     "'storage' holds a password"),
    ("optuna-sweep", {"storage": "postgresql:///u?user=u&Password=s3cret"}, "'storage' holds a password"),
])
def test_bad_inputs_are_refused_by_name(name: str, given: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)):
        render(name, {**MINIMAL[name], **given})


def test_a_stage_starting_with_a_dot_is_listed_and_only_pre_and_post_are_not() -> None:
    pipeline = yaml.safe_load(render("gpu-job", {**MINIMAL["gpu-job"], "stage": ".train"}))
    assert pipeline["stages"] == [".train"]
    hidden = render("python-cache", {})
    assert "hidden jobs only" in hidden.splitlines()[1] and "stages" not in yaml.safe_load(hidden)
    sweep = render("optuna-sweep", MINIMAL["optuna-sweep"])
    both = yaml.safe_load(sweep + hidden)  # appended as docs/experiments.md says: one pipeline
    assert ".runnerctl-python-env" in both and both["stages"] == yaml.safe_load(sweep)["stages"]


def test_storage_urls_without_a_password_and_variables_are_taken() -> None:
    for url in ("$OPTUNA_URL", "postgresql+psycopg://u@db.lab:5432/u?x=a@b", "sqlite:///s.db",
                "journal:/shared/s.log", "journal+postgresql://db.lab:5432/u"):
        assert render("optuna-sweep", {**MINIMAL["optuna-sweep"], "storage": url})
        assert re.fullmatch(load_component("optuna-sweep").inputs["storage"]["regex"], url)
    assert not re.fullmatch(load_component("optuna-sweep").inputs["storage"]["regex"],
                            "journal+postgresql://u:s3cret@db.lab/u")  # GitLab refuses it too


def test_missing_required_input_and_unknown_component() -> None:
    with pytest.raises(ConfigError, match="input 'command' is required"):
        render("gpu-job", {})
    for name in ("nope", "../templates/gpu-job", "__init__"):
        with pytest.raises(ConfigError, match="unknown component"):
            load_component(name)


def test_cli_refusal_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "optuna-sweep", "-i", "study_name=s", "-i", "command=c",
                 "-i", "workers=0"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'workers'" in err[0]
    assert main(["render", "gpu-job", "-i", "no-equals-sign"]) == 3


def test_the_schema_check_catches_a_broken_pipeline(tmp_path: Path) -> None:
    pipeline = yaml.safe_load(render("optuna-sweep", MINIMAL["optuna-sweep"]))
    pipeline["optuna-worker"]["parallel"] = 201  # above GitLab's limit
    bad = tmp_path / "bad.yml"
    bad.write_text(yaml.safe_dump(pipeline))
    with pytest.raises(AssertionError, match="parallel"):
        _check_jsonschema(bad)


@pytest.mark.parametrize(("name", "key"), [("gpu-job", "gpus"), ("hpc-batch-job", "gpus_per_node"),
                                           ("optuna-sweep", "gpus_per_worker")])
def test_gitlab_itself_refuses_a_gpu_count_no_runner_has(name: str, key: str) -> None:
    """GitLab checks a number input only for being a number (number_input.rb): `gpus: 3`
    in an include made a job no runner takes, dropped after an hour and retried twice,
    three hours to fail (found by a review as a GitLab CI expert). `options` makes GitLab
    refuse it at include time, as `render` does."""
    path = Path(__file__).resolve().parents[1] / "templates" / f"{name}.yml"
    spec = next(yaml.safe_load_all(path.read_text()))["spec"]["inputs"][key]
    assert spec["type"] == "number" and spec["options"] == [1, 2, 4, 8, 16, 32, 64]
    assert spec["default"] in spec["options"]


@pytest.mark.parametrize(("name", "inputs", "said"), [
    ("optuna-sweep", {"study_name": "s", "command": "python t.py", "stage": ".pre"},
     "GitLab's own first or last stage"),
    ("gpu-job", {"command": "python train.py", "stage": ".post"}, "GitLab's own first or last stage"),
    ("optuna-sweep", {"study_name": "s", "command": "python t.py", "service_tags": "[]"},
     "needs at least one tag"),
    ("gpu-job", {"command": "python train.py", "timeout": "1x"}, "is not a duration"),
    ("gpu-job", {"command": "python train.py", "timeout": "90"}, "is not a duration"),
    ("gpu-job", {"command": "python train.py", "timeout": "9999h"}, "longest job timeout"),
    ("gpu-job", {"command": "python train.py", "timeout": "0h"}, "no time at all"),
])
def test_inputs_gitlab_would_refuse_or_run_wrong_are_refused_at_render(name: str, inputs: dict[str, Any],
                                                                        said: str) -> None:
    """`.pre`/`.post` ran the sweep's workers beside create-study (or nothing at all), an
    empty service_tags left create-study for no runner, and a timeout GitLab cannot read
    or over its month failed the pipeline at creation; `90` is 90 seconds to GitLab
    (found by a review as a GitLab CI author)."""
    with pytest.raises(ConfigError, match=re.escape(said)):
        render(name, inputs)


def test_values_gitlab_takes_are_rendered() -> None:
    """A decimal timeout and any failure reason of GitLab's list render; the report job
    downloads none of the workers' artifacts."""
    text = render("gpu-job", {"command": "python train.py", "timeout": "1.5h",
                              "retry_when": '["missing_dependency_failure"]'})
    job = next(v for k, v in yaml.safe_load(text).items() if isinstance(v, dict) and "script" in v)
    assert job["timeout"] == "1.5h" and job["retry"]["when"] == ["missing_dependency_failure"]
    sweep = yaml.safe_load(render("optuna-sweep", {"study_name": "s", "command": "python t.py"}))
    report = next(v for k, v in sweep.items() if k.endswith("-report"))
    assert report["dependencies"] == []


@pytest.mark.parametrize("timeout", ["1h30m", "30 minutes", "2 hrs", "1 day", "1.5h", "1 month",
                                     "2 hours and 30 minutes", "1 hour, 30 minutes", "730h"])
def test_timeouts_in_the_words_gitlab_reads_render(timeout: str) -> None:
    """ChronicDuration's words, months and joins included, up to Rails' month (found by a
    review of the day's changes: `1 month` and `2 hours and 30 minutes` were refused)."""
    job = yaml.safe_load(render("gpu-job", {"command": "x", "timeout": timeout}))["gpu-job"]
    assert job["timeout"] == timeout


def test_render_over_a_file_on_a_full_disk_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    """`render -o` emptied the file, then wrote what fitted: on a full disk a hand-written
    .gitlab-ci.yml was cut to its first 4096 bytes of the new render (found by a review of
    a host out of disk space). A file size limit stands in for the full disk, in a child
    process so that pytest's own files are not limited."""
    own = tmp_path / ".gitlab-ci.yml"
    own.write_text("# my own pipeline\ntrain:\n  script: [python train.py]\n")
    own.chmod(0o640)
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (256, resource.RLIM_INFINITY)); "
            "from runnerctl.cli import main; sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", code, "render", "gpu-job", "-i", "command=python train.py",
                           "-o", str(own)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0 and f"cannot write {own}: File too large" in done.stderr, done
    assert own.read_text() == "# my own pipeline\ntrain:\n  script: [python train.py]\n"
    assert [p.name for p in tmp_path.iterdir()] == [".gitlab-ci.yml"]  # no temp file left
    assert main(["render", "gpu-job", "-i", "command=python train.py", "-o", str(own)]) == 0
    assert "python train.py" in own.read_text() and own.stat().st_mode & 0o777 == 0o640  # its mode kept


def test_render_through_a_link_writes_its_target_and_keeps_the_link(tmp_path: Path) -> None:
    """Written to a temp file and renamed, `-o` replaced a link (a .gitlab-ci.yml kept
    elsewhere, or /dev/stdout) with a file of its own and left the target as it was
    (found by a review of the day's diff)."""
    kept = tmp_path / "pipelines" / "train.yml"
    kept.parent.mkdir()
    kept.write_text("# old\n")
    link, sink = tmp_path / ".gitlab-ci.yml", tmp_path / "sink"
    link.symlink_to(kept)
    sink.symlink_to("/dev/null")
    assert main(["render", "gpu-job", "-i", "command=python train.py", "-o", str(link)]) == 0
    assert link.is_symlink() and "python train.py" in kept.read_text()
    assert main(["render", "gpu-job", "-i", "command=python train.py", "-o", str(sink)]) == 0
    assert sink.is_symlink() and Path("/dev/null").is_char_device()


def test_render_to_dev_stdout_writes_into_the_pipe() -> None:
    """/dev/stdout resolves to a pipe (`/proc/PID/fd/1 -> pipe:[N]`): written as it is,
    never created nor replaced (found by a review of the day's fixes)."""
    done = subprocess.run([sys.executable, "-m", "runnerctl", "render", "gpu-job", "-i",
                           "command=python train.py", "-o", "/dev/stdout"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "python train.py" in done.stdout
