"""Layering, stated in one line: cli / web / exporter -> controller -> gitlab | gpus |
executors -> model / config. Only runnerctl/gitlab.py imports python-gitlab, only
runnerctl/gpus/nvml.py imports pynvml, and nothing low imports the CLI."""

from __future__ import annotations

import ast
from pathlib import Path

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


def test_low_layers_do_not_import_high_ones() -> None:
    low = ("runnerctl/model.py", "runnerctl/errors.py", "runnerctl/settings.py",
           "runnerctl/layout.py", "runnerctl/runner_config.py", "runnerctl/gpus/")
    for path in SOURCES:
        rel = str(path.relative_to(ROOT))
        if not rel.startswith(low):
            continue
        for name in _imports(path):
            assert not name.startswith(("runnerctl.cli", "runnerctl.controller", "runnerctl.web",
                                        "runnerctl.exporter")), (rel, name)


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
