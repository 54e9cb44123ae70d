"""`runnerctl render`: a complete .gitlab-ci.yml from one of runnerctl's CI/CD components.

The components in `templates/` follow GitLab's layout (a `spec: inputs` header, `---`,
then the jobs, with `$[[ inputs.NAME ]]` placeholders), so a GitLab with the CI/CD
catalog includes them directly. `render` does the same interpolation locally, for
GitLab versions without components and for checks before a push. Inputs are checked
as GitLab checks them (type, options, regex, required) plus runnerctl's own limits
(GPU counts and worker counts), and every refusal names the input.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import re
from typing import Any

import yaml

from runnerctl.errors import ConfigError

_PLACEHOLDER = re.compile(r"\$\[\[\s*inputs\.([A-Za-z0-9_-]+)\s*\]\]")
LIMITS: dict[str, tuple[int, int]] = {
    "gpus": (1, 64),
    "gpus_per_worker": (1, 64),
    "workers": (1, 200),  # GitLab's own bound on `parallel:`
    "n_trials": (1, 1_000_000),
}
"""Whole-number inputs and their bounds, beyond what a component spec can say."""


@dataclasses.dataclass(frozen=True)
class Component:
    name: str
    inputs: dict[str, dict[str, Any]]
    body: str


def components() -> list[str]:
    root = importlib.resources.files("runnerctl.templates")
    return sorted(p.name.removesuffix(".yml") for p in root.iterdir() if p.name.endswith(".yml"))


def load_component(name: str) -> Component:
    known = components()
    if name not in known:
        raise ConfigError(f"unknown component {name!r}", hint=f"known: {', '.join(known)}")
    text = importlib.resources.files("runnerctl.templates").joinpath(f"{name}.yml").read_text()
    header, _, body = text.partition("\n---\n")
    spec = (yaml.safe_load(header) or {}).get("spec", {})
    return Component(name, dict(spec.get("inputs") or {}), body)


def parse_inputs(pairs: list[str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"input {pair!r} is not KEY=VALUE")
        values[key.strip()] = value
    return values


def resolve_inputs(component: Component, given: dict[str, str]) -> dict[str, Any]:
    unknown = sorted(set(given) - set(component.inputs))
    if unknown:
        raise ConfigError(f"unknown input {unknown[0]!r} for {component.name}",
                          hint=f"inputs: {', '.join(component.inputs)}")
    resolved: dict[str, Any] = {}
    for name, spec in component.inputs.items():
        spec = spec or {}
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
    values = resolve_inputs(component, given)
    body = _interpolate(component.body, values)
    try:
        jobs = yaml.safe_load(body) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"the inputs of {name} do not give valid YAML: {exc}") from None
    stages = []
    for job in jobs.values():
        stage = job.get("stage", "test") if isinstance(job, dict) else None
        if stage and not stage.startswith(".") and stage not in stages:
            stages.append(stage)
    header = f"# rendered by `runnerctl render {name}`\n"
    return header + yaml.dump({"stages": stages or ["test"], **jobs}, Dumper=_Dumper,
                              sort_keys=False, width=100)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (scripts) as `|` blocks, the way people write them."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
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


def _check(name: str, value: Any, spec: dict[str, Any]) -> None:
    options = spec.get("options")
    if options is not None and value not in options:
        raise ConfigError(f"input {name!r} must be one of {', '.join(map(str, options))}, "
                          f"not {value!r}")
    regex = spec.get("regex")
    if regex is not None and not re.search(regex, str(value)):
        raise ConfigError(f"input {name!r} does not match {regex}: {value!r}")
    if name in LIMITS:
        low, high = LIMITS[name]
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ConfigError(f"input {name!r} must be a whole number from {low} to {high}, "
                              f"not {value!r}")
    if isinstance(value, str) and "\x00" in value:
        raise ConfigError(f"input {name!r} holds a NUL byte")


def _interpolate(body: str, values: dict[str, Any]) -> str:
    """Fill placeholders; a multi-line value keeps the indentation of its placeholder."""
    lines = []
    for line in body.splitlines():
        indent = line[: len(line) - len(line.lstrip())]

        def fill(match: re.Match[str], indent: str = indent) -> str:
            value = values[match.group(1)]
            text = json.dumps(value) if isinstance(value, list) else str(value)
            text = "true" if value is True else "false" if value is False else text
            return text.replace("\n", "\n" + indent)

        lines.append(_PLACEHOLDER.sub(fill, line))
    return "\n".join(lines) + "\n"
