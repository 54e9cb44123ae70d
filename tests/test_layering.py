"""Layering, stated in one line: cli -> web | exporter | sim -> controller -> registration |
optuna -> executors | postgres -> settings | gitlab | gpus | layout -> model | errors (LAYERS
below is the contract; every unit sits in one layer). Only runnerctl/gitlab.py imports python-gitlab, only
runnerctl/gpus/nvml.py imports pynvml, and nothing low imports the CLI."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([*ROOT.joinpath("runnerctl").rglob("*.py"), *ROOT.joinpath("executors").rglob("*.py")])


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _importers(prefix: str) -> set[str]:
    return {
        str(path.relative_to(ROOT))
        for path in SOURCES
        if any(name == prefix or name.startswith(prefix + ".") for name in _imports(path))
    }


def test_sources_found() -> None:
    assert len(SOURCES) > 10


def test_only_one_module_talks_to_gitlab() -> None:
    assert _importers("gitlab") <= {"runnerctl/gitlab.py"}


def test_only_one_module_is_an_http_client() -> None:
    """GitLab (API and OAuth alike) is reached through runnerctl/gitlab.py only. The simulated
    GitLab's webhook sender is GitLab calling out (issue 13), not runnerctl calling GitLab; the
    gitlab-runner stand-in (`runnerctl sim runner`) plays the separate gitlab-runner program,
    which has its own client of GitLab's runner API."""
    clients = set().union(*(_importers(m) for m in ("requests", "urllib.request", "httpx", "http.client")))
    assert clients <= {"runnerctl/gitlab.py", "runnerctl/sim/gitlab_hooks.py",
                       "runnerctl/sim/runner_api.py"}, clients


def test_only_one_module_talks_to_nvml() -> None:
    assert _importers("pynvml") == {"runnerctl/gpus/nvml.py"}


# The layers, highest first. A unit (a package or a top-level module) imports only units of
# lower layers; units of one layer are independent of each other, except the pairs in SIBLINGS.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("runnerctl.__main__",),
    ("runnerctl.cli",),
    ("runnerctl.web", "runnerctl.exporter", "runnerctl.sim", "runnerctl.report"),
    ("runnerctl.controller",),
    ("runnerctl.registration", "runnerctl.uninstall", "runnerctl.optuna", "runnerctl.optuna_tools",
     "runnerctl.optuna_journal"),
    ("executors", "runnerctl.postgres", "runnerctl.install", "runnerctl.access", "runnerctl.standby"),
    ("runnerctl.settings", "runnerctl.private", "runnerctl.logline", "runnerctl.runner_config",
     "runnerctl.layout", "runnerctl.gpus", "runnerctl.gitlab", "runnerctl.pipelines"),
    ("runnerctl", "runnerctl.model", "runnerctl.errors", "runnerctl.tags", "runnerctl.gitlab_port",
     "runnerctl.stats", "runnerctl.columns"),
)
SIBLINGS = {("runnerctl.optuna", "runnerctl.optuna_tools"), ("runnerctl.optuna_tools", "runnerctl.optuna"),
            ("runnerctl.optuna", "runnerctl.optuna_journal")}
RANK = {unit: len(LAYERS) - i for i, layer in enumerate(LAYERS) for unit in layer}


def _unit(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "executors" or parts[:2] == ["runnerctl", "executors"]:
        return "executors"  # runnerctl.executors is the installed name of executors/
    if parts[0] != "runnerctl":
        return None
    return ".".join(parts[:2])


def layer_violations(sources: dict[str, Path]) -> list[str]:
    """Every import that breaks the layers, as 'file: unit -> unit'; sources maps a
    module's dotted name to its file."""
    found = []
    for module, path in sorted(sources.items()):
        me = _unit(module)
        assert me in RANK, f"{module} is in no layer: add its unit to LAYERS"
        for name in sorted(_imports(path)):
            other = _unit(name)
            if other is None or other == me:
                continue
            assert other in RANK, f"{other} (imported by {module}) is in no layer: add it to LAYERS"
            if RANK[other] < RANK[me] or (me, other) in SIBLINGS:
                continue
            found.append(f"{path.name}: {me} -> {other}")
    return found


def _modules() -> dict[str, Path]:
    return {".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
            for path in SOURCES if "runnerctl/executors" not in path.as_posix()}


def test_every_unit_keeps_to_its_layer() -> None:
    """cli -> web | exporter | sim -> controller -> ... -> model | errors, executors/ and
    gitlab.py included (issue 15: an import from executors into the controller passed)."""
    assert layer_violations(_modules()) == []


def test_the_layer_contract_fails_on_a_forbidden_import(tmp_path: Path) -> None:
    """The contract itself: an executor reaching up into the controller, or the GitLab door
    into the CLI, is caught."""
    upward = tmp_path / "upward.py"
    upward.write_text("from runnerctl.controller import loop\nimport runnerctl.cli\n")
    modules = {**_modules(), "executors.upward": upward, "runnerctl.gitlab_extra": upward}
    with pytest.raises(AssertionError, match="no layer"):
        layer_violations(modules)
    del modules["runnerctl.gitlab_extra"]
    assert layer_violations(modules) == ["upward.py: executors -> runnerctl.cli",
                                         "upward.py: executors -> runnerctl.controller"]
    sideways = tmp_path / "sideways.py"
    sideways.write_text("from runnerctl.web import view\n")
    assert layer_violations({**_modules(), "runnerctl.exporter.sideways": sideways}) == [
        "sideways.py: runnerctl.exporter -> runnerctl.web"]


def test_controller_does_not_import_the_exporter() -> None:
    """cli -> exporter -> controller: the loop feeds stats, the exporter reads them."""
    assert not {p for p in _importers("runnerctl.exporter") if p.startswith("runnerctl/controller/")}


def test_only_the_exporter_and_stats_build_metrics() -> None:
    """Metrics are custom collectors in runnerctl/exporter/, never objects on the global registry."""
    users = _importers("prometheus_client")
    assert users and all(p.startswith("runnerctl/exporter/") for p in users), users


def test_controller_and_sim_do_not_import_the_web_page() -> None:
    """The page hangs on the app through `create_app(extend=...)`; the controller knows nothing of it."""
    for path in SOURCES:
        rel = str(path.relative_to(ROOT))
        if rel.startswith(("runnerctl/controller/", "runnerctl/sim/", "runnerctl/gpus/", "executors/")):
            assert not any(n.startswith(("runnerctl.web", "runnerctl.cli")) for n in _imports(path)), rel


def test_web_does_not_import_the_cli_or_python_gitlab() -> None:
    for path in ROOT.joinpath("runnerctl", "web").rglob("*.py"):
        names = _imports(path)
        assert not any(n.startswith("runnerctl.cli") or n == "gitlab" for n in names), path
