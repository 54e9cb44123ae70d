"""`runnerctl render`: a complete .gitlab-ci.yml from one of runnerctl's CI/CD components.

The components in `templates/` follow GitLab's layout (`templates/NAME.yml` or
`templates/NAME/template.yml`: a `spec: inputs` header, `---`, then the jobs, with
`$[[ inputs.NAME ]]` placeholders), so a GitLab with the CI/CD catalog includes them
directly. `render` does the same interpolation locally, for GitLab versions without
components and for checks before a push. Like GitLab, it interpolates parsed YAML
values, not text: a placeholder that is a whole value takes the input's type (number,
array), one inside a string is pasted in, and no input can inject YAML. Inputs are
checked as GitLab checks them (type, options, regex, required) plus runnerctl's own
limits (GPU and worker counts), and every refusal names the input.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import re
import urllib.parse
from importlib.resources.abc import Traversable
from typing import Any

import yaml

from runnerctl.errors import LOCALE_HINT, ConfigError, undecodable

_PLACEHOLDER = re.compile(r"\$\[\[\s*inputs\.([A-Za-z0-9_-]+)\s*\]\]")
LIMITS: dict[str, tuple[int, int]] = {
    "gpus": (1, 64),
    "gpus_per_worker": (1, 64),
    "gpus_per_node": (1, 64),
    "nodes": (1, 10_000),  # the batch drivers' RUNNERCTL_NODES: a whole number from 1
    "workers": (1, 200),  # GitLab's own bound on `parallel:`
    "n_trials": (1, 1_000_000),
}
"""Whole-number inputs and their bounds, beyond what a component spec can say."""
GPU_COUNTS = ("gpus", "gpus_per_worker", "gpus_per_node")
"""Inputs that become a job's `gpus:N` tag: N must be a size runnerctl's runners have."""


@dataclasses.dataclass(frozen=True)
class Component:
    name: str
    inputs: dict[str, dict[str, Any]]
    jobs: dict[str, Any]


def _root() -> Traversable:
    return importlib.resources.files("runnerctl.templates")


def _source(name: str) -> Traversable | None:
    root = _root()
    for candidate in (root.joinpath(f"{name}.yml"), root.joinpath(name, "template.yml")):
        if candidate.is_file():
            return candidate
    return None


def components() -> list[str]:
    """Names of the components, in both of GitLab's layouts."""
    names = []
    for entry in _root().iterdir():
        if entry.name.endswith(".yml"):
            names.append(entry.name.removesuffix(".yml"))
        elif entry.is_dir() and entry.joinpath("template.yml").is_file():
            names.append(entry.name)
    return sorted(names)


def load_component(name: str) -> Component:
    source = _source(name) if re.fullmatch(r"[a-z0-9][a-z0-9_-]*", name) else None
    if source is None:
        raise ConfigError(f"unknown component {name!r}", hint=f"known: {', '.join(components())}")
    header, jobs = yaml.safe_load_all(source.read_text(encoding="utf-8"))
    spec = (header or {}).get("spec") or {}
    inputs = {key: dict(value or {}) for key, value in (spec.get("inputs") or {}).items()}
    return Component(name, inputs, jobs or {})


def parse_inputs(pairs: list[str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"input {pair!r} is not KEY=VALUE")
        values[key.strip()] = value
    return values


def resolve_inputs(component: Component, given: dict[str, str]) -> dict[str, Any]:
    """Every input's value: given (converted to its type) or default; all checked."""
    unknown = sorted(set(given) - set(component.inputs))
    if unknown:
        raise ConfigError(f"unknown input {unknown[0]!r} for {component.name}",
                          hint=f"inputs: {', '.join(component.inputs)}")
    resolved: dict[str, Any] = {}
    for name, spec in component.inputs.items():
        if name in given:
            value = _convert(name, given[name], spec.get("type", "string"))
        elif "default" in spec:
            value = spec["default"]
        else:
            raise ConfigError(f"input {name!r} is required for {component.name}")
        _check(name, value, spec)
        resolved[name] = value
    return resolved


def render(name: str, given: dict[str, str]) -> str:
    """The complete pipeline: `stages:` plus the component's jobs, inputs filled in."""
    component = load_component(name)
    jobs = _interpolate(component.jobs, resolve_inputs(component, given))
    stages: list[str] = []
    for job in jobs.values():
        stage = job.get("stage", "test") if isinstance(job, dict) else None
        if isinstance(stage, str) and stage not in (".pre", ".post") and stage not in stages:
            stages.append(stage)
    header = f"# rendered by `runnerctl render {name}`\n"
    top: dict[str, Any] = {"stages": stages or ["test"]}
    if not any(isinstance(key, str) and not key.startswith(".") for key in jobs):
        header += ("# hidden jobs only, no pipeline by itself: append them to one (no `stages:` of\n"
                   "# their own) and have its jobs `extends:` them\n")
        top = {}
    return header + yaml.dump({**top, **jobs}, Dumper=_Dumper, sort_keys=False, width=100,
                              allow_unicode=True)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (scripts) as `|` blocks, the way people write them; no anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value and not value.endswith((" ", "\t")) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _convert(name: str, raw: str, kind: str) -> Any:
    if kind == "number":
        try:
            number = float(raw)
        except ValueError:
            raise ConfigError(f"input {name!r} must be a number, not {raw!r}") from None
        return int(number) if number.is_integer() else number
    if kind == "boolean":
        if raw.lower() not in ("true", "false"):
            raise ConfigError(f"input {name!r} must be true or false, not {raw!r}")
        return raw.lower() == "true"
    if kind == "array":
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = None
        if not isinstance(value, list):
            raise ConfigError(f"input {name!r} must be a JSON array, e.g. [\"a\", \"b\"]")
        return value
    return raw


_PASSWORD_IN_URL = re.compile(r"://[^/@\s]*:[^/@\s]*@")


def _holds_password(url: str) -> bool:
    """A password in the URL's user part (`user:pw@`) or in its query (`?password=pw`,
    which libpq and SQLAlchemy's psycopg dialect both take)."""
    if _PASSWORD_IN_URL.search(url):
        return True
    query = urllib.parse.urlsplit(url).query if "?" in url else ""
    keys = (key for key, _ in urllib.parse.parse_qsl(query, keep_blank_values=True))
    return any(key.strip().lower() == "password" for key in keys)


FAILURE_REASONS = frozenset({
    "always", "unknown_failure", "script_failure", "api_failure", "stuck_or_timeout_failure",
    "runner_system_failure", "missing_dependency_failure", "runner_unsupported", "stale_schedule",
    "job_execution_timeout", "archived_failure", "unmet_prerequisites", "scheduler_failure",
    "data_integrity_failure", "forward_deployment_failure", "user_blocked", "project_deleted",
    "ci_quota_exceeded", "pipeline_loop_detected", "no_matching_runner", "trace_size_exceeded",
    "builds_disabled", "environment_creation_failure", "deployment_rejected",
    "failed_outdated_deployment_job", "job_execution_server_timeout",
    "stuck_pending_with_matching_runners", "stuck_pending_no_matching_runners", "no_updates_running",
    "no_updates_canceling", "server_timeout_running", "server_timeout_canceling",
    "runner_configuration_error", "runner_external_dependency_failure", "runner_interrupted",
    "protected_environment_failure", "insufficient_bridge_permissions",
    "downstream_bridge_project_not_found", "invalid_bridge_trigger", "upstream_bridge_project_not_found",
    "insufficient_upstream_permissions", "bridge_pipeline_is_child_pipeline",
    "downstream_pipeline_creation_failed", "secrets_provider_not_found",
    "reached_max_descendant_pipelines_depth", "ip_restriction_failure", "reached_max_pipeline_hierarchy_size",
    "reached_downstream_pipeline_trigger_rate_limit", "duo_workflow_not_allowed", "job_router_failure",
    "job_token_expired", "id_token_burned_project_path", "downstream_project_trigger_resolved_to_empty"})
"""What `retry:when` may name (lib/gitlab/ci/config/entry/retry.rb: `always` and the job
failure reasons of app/models/concerns/enums/ci/commit_status.rb, the newest GitLab's; an
older GitLab refuses the reasons it does not have yet, such as the split of
`stuck_or_timeout_failure` and `runner_system_failure`, gitlab issue 602133)."""
_DURATION_UNITS = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600),
    **dict.fromkeys(("d", "day", "days"), 86400),
    **dict.fromkeys(("w", "wk", "wks", "week", "weeks"), 7 * 86400),
    **dict.fromkeys(("mo", "mos", "month", "months"), 2_629_746)}
_DURATION_PART = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]+)\s*")
_DURATION_JOINS = re.compile(r"\s*(?:,|\band\b|\bwith\b|\bplus\b)\s*")
"""What ChronicDuration reads between parts and drops (`2 hours and 30 minutes`)."""
MAX_JOB_TIMEOUT_S = 2_629_746
"""GitLab's longest job timeout, a month (lib/gitlab/ci/config/entry/timeout.rb: `duration:
{ limit: ChronicDuration.output(Project::MAX_BUILD_TIMEOUT) }`; Rails' 1.month, 30.44 days)."""


def duration_s(text: str) -> float | None:
    """Seconds of a job `timeout` in the words GitLab reads (ChronicDuration: `90m`, `2h 30m`,
    `1.5h`, `3 hours`); None for text it would not take. A bare number, which GitLab reads
    as seconds, is refused here too: `timeout: 90` meant 90 minutes to the one who wrote it."""
    text = _DURATION_JOINS.sub(" ", text)
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != re.sub(r"\s+", "", text):
        return None
    if any(unit not in _DURATION_UNITS for _, unit in parts):
        return None
    return sum(float(n) * _DURATION_UNITS[unit] for n, unit in parts)


KEYWORDS = ("after_script", "before_script", "cache", "default", "image", "include", "services", "stages",
            "types", "variables", "workflow")
"""Top-level keys GitLab reads as keywords, not jobs (lib/gitlab/ci/config/entry/root.rb); a
job of such a name would replace the keyword."""
MAX_JOB_NAME = 255
"""GitLab refuses longer job names: "name is too long (maximum is 255 characters)" (the job
entry's length validation, gitlab merge request 73559)."""
_NOT_BLANK = ("stage", "image", "job_name", "command")
"""Inputs GitLab refuses or runs as nothing when blank (an empty `command` is an empty
script line: the job passed without doing anything)."""


def _check_shape(name: str, value: Any) -> None:
    """What GitLab would refuse or misread in a value: a blank name, a job named like a
    keyword, hidden (.name) or too long, an empty list of artifacts."""
    if name in _NOT_BLANK and isinstance(value, str) and not value.strip():
        raise ConfigError(f"input {name!r} must not be empty")
    if name == "job_name" and isinstance(value, str):
        if undecodable(value):
            raise ConfigError("input 'job_name' is not valid text in this locale", hint=LOCALE_HINT)
        if any(not c.isprintable() for c in value):  # a newline made a key over two lines
            raise ConfigError("input 'job_name' must be one line without control characters")
        if value in KEYWORDS:
            raise ConfigError(f"input 'job_name' {value!r} is a GitLab CI keyword, not a job name")
        if value.startswith("."):
            raise ConfigError(f"input 'job_name' {value!r} starts with '.': GitLab would hide the job")
        if len(value) > MAX_JOB_NAME:
            raise ConfigError(f"input 'job_name' is {len(value)} characters; GitLab takes at most "
                              f"{MAX_JOB_NAME}")
    if name == "stage" and value in (".pre", ".post"):
        raise ConfigError(f"input 'stage' {value!r} is GitLab's own first or last stage: the jobs would run "
                          "beside the ones this component puts there (a pipeline of only .pre and .post "
                          "jobs is not even created)", hint="name a stage of your own, e.g. test or train")
    if name == "service_tags" and value == []:
        raise ConfigError("input 'service_tags' needs at least one tag: runnerctl's runners take no "
                          "untagged job, so the job would wait until GitLab drops it")
    if name == "timeout" and isinstance(value, str):
        seconds = duration_s(value)
        if seconds is None:
            raise ConfigError(f"input 'timeout' {value!r} is not a duration with units", hint="e.g. 90m, "
                              "2h 30m, 1.5h (a bare number is seconds to GitLab)")
        if seconds <= 0:
            raise ConfigError(f"input 'timeout' {value!r} is no time at all")
        if seconds > MAX_JOB_TIMEOUT_S:
            raise ConfigError(f"input 'timeout' {value!r} is over GitLab's longest job timeout, a month")
    if name == "artifacts" and value == []:
        raise ConfigError("input 'artifacts' needs at least one path (GitLab refuses an empty list)")
    if name == "retry_when" and isinstance(value, list):
        unknown = [v for v in value if v not in FAILURE_REASONS]
        if not value:
            raise ConfigError("input 'retry_when' needs at least one failure reason (GitLab refuses "
                              "an empty list)")
        if unknown:
            raise ConfigError(f"input 'retry_when' {unknown[0]!r} is not a GitLab failure reason",
                              hint="for example runner_system_failure, scheduler_failure, api_failure, "
                                   "stuck_or_timeout_failure; docs/experiments.md, Retries")


def _matches(regex: str, value: str) -> bool:
    """As GitLab matches an input's `regex` (RE2, string_input.rb): there `$` is the end of
    the text, where Python's also matches before a last newline (`lr\n` passed ^[a-z_]*$)."""
    found = re.search(regex, value)
    return found is not None and not (regex.endswith("$") and found.end() != len(value))


def _check(name: str, value: Any, spec: dict[str, Any]) -> None:
    _check_shape(name, value)
    if name == "storage" and isinstance(value, str) and _holds_password(value):
        raise ConfigError("input 'storage' holds a password, which would be committed with the pipeline: "
                          "put the URL into a masked CI/CD variable and pass its name "
                          "(-i storage='$OPTUNA_URL')")
    regex = spec.get("regex")
    if regex is not None and not _matches(regex, str(value)):
        raise ConfigError(f"input {name!r} does not match {regex}: {value!r}")
    if name in LIMITS:
        low, high = LIMITS[name]
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ConfigError(f"input {name!r} must be a whole number from {low} to {high}, "
                              f"not {value!r}")
    if name in GPU_COUNTS and isinstance(value, int) and value & (value - 1):
        raise ConfigError(f"input {name!r} is {value}, but runner blocks hold 1, 2, 4, 8, ... GPUs: "
                          f"no runner would take the job", hint="ask for a power of two (only a "
                          f"whole host of {value} usable GPUs has a gpus:{value} runner; write that "
                          f"job's tag by hand)")
    options = spec.get("options")  # after the GPU checks: their words say more
    if options is not None and value not in options:
        raise ConfigError(f"input {name!r} must be one of {', '.join(map(str, options))}, "
                          f"not {value!r}")
    if spec.get("type") == "array" and not all(isinstance(i, str) and i for i in value):
        raise ConfigError(f"input {name!r} must be an array of non-empty strings")
    if isinstance(value, str) and "\x00" in value:
        raise ConfigError(f"input {name!r} holds a NUL byte")


def _interpolate(node: Any, values: dict[str, Any]) -> Any:
    """GitLab's rules: a whole-value placeholder keeps the input's type, others paste text."""
    if isinstance(node, dict):
        return {_interpolate(key, values): _interpolate(value, values) for key, value in node.items()}
    if isinstance(node, list):
        return [_interpolate(item, values) for item in node]
    if not isinstance(node, str):
        return node
    whole = _PLACEHOLDER.fullmatch(node)
    if whole:
        return values[whole.group(1)]
    return _PLACEHOLDER.sub(lambda match: _text(values[match.group(1)]), node)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return json.dumps(value)
    return str(value)
