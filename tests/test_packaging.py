"""What pyproject.toml and MANIFEST.in promise: one version, every imported third-party
module declared (or optional, with a one-line error naming its extra), the licence file,
and an sdist that carries the tests and docs."""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib.metadata import packages_distributions, requires
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import runnerctl
from runnerctl.cli import OPTIONAL_MODULES, main, missing_extra

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def _imported_top_level_modules() -> set[str]:
    modules = set()
    for source in [*(ROOT / "runnerctl").rglob("*.py"), *(ROOT / "executors").rglob("*.py")]:
        for node in ast.walk(ast.parse(source.read_text(), filename=str(source))):
            if isinstance(node, ast.Import):
                modules.update(alias.name.partition(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.partition(".")[0])
    return modules - set(sys.stdlib_module_names) - {"runnerctl", "executors"}


def _distribution(module: str) -> str:
    found = packages_distributions().get(module)
    assert found, f"{module} is imported but not installed here: which distribution provides it?"
    return canonicalize_name(found[0])


def test_the_version_is_written_once() -> None:
    project = _pyproject()
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    module, _, name = attr.rpartition(".")
    assert module == "runnerctl" and getattr(runnerctl, name) == runnerctl.__version__
    assert runnerctl.__version__.count(".") == 2


def test_every_imported_module_is_a_declared_dependency_or_an_optional_one() -> None:
    project = _pyproject()["project"]
    core = _names(project["dependencies"])
    undeclared = {}
    for module in sorted(_imported_top_level_modules()):
        if module in OPTIONAL_MODULES:
            continue
        distribution = _distribution(module)
        if distribution not in core:
            undeclared[module] = distribution
    assert undeclared == {}, "add these to [project] dependencies, or to OPTIONAL_MODULES and an extra"


def test_each_optional_module_comes_with_the_extra_its_error_names() -> None:
    extras = _pyproject()["project"]["optional-dependencies"]
    for module, extra in OPTIONAL_MODULES.items():
        declared = _names(extras[extra])
        distribution = _distribution(module)
        # sqlalchemy comes with optuna rather than on its own line
        providers = {d for d in declared if distribution in _names(requires(d) or [])}
        assert distribution in declared or providers, f"{module}: not installed by runnerctl[{extra}]"


def test_a_core_module_missing_is_not_blamed_on_an_extra() -> None:
    assert missing_extra(ModuleNotFoundError("No module named 'psycopg'", name="psycopg")) is None
    assert missing_extra(ValueError("optuna")) is None
    submodule = ModuleNotFoundError("No module named 'optuna.storages'", name="optuna.storages")
    assert missing_extra(submodule) == "optuna is not installed (pip install 'runnerctl[optuna]')"


@pytest.mark.parametrize("module", ["optuna", "sqlalchemy"])
def test_create_study_without_optuna_names_the_extra(
        module: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    for name in [m for m in sys.modules if m == module or m.startswith(f"{module}.")]:
        monkeypatch.delitem(sys.modules, name)
    for name in ["runnerctl.optuna", "runnerctl.optuna_tools"]:
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, module, None)  # `import optuna` now fails as if it were absent
    (tmp_path / "runnerctl.toml").write_text("")
    assert main(["postgres", "--config", str(tmp_path / "runnerctl.toml"), "create-study", "sweep"]) == 1
    out, err = capsys.readouterr()
    assert err == f"runnerctl: error: {module} is not installed (pip install 'runnerctl[optuna]')\n"
    assert out == ""


def test_the_licence_file_is_there_and_shipped() -> None:
    project = _pyproject()["project"]
    assert project["license"] == "MIT"
    assert "LICENSE" in project["license-files"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "the runnerctl authors" in text


def test_the_sdist_carries_the_tests_and_docs() -> None:
    lines = [line.split() for line in (ROOT / "MANIFEST.in").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    grafted = {words[1] for words in lines if words[0] == "graft"}
    assert {"tests", "docs", "examples", "monitoring", "benchmarks"} <= grafted
    assert all((ROOT / d).is_dir() for d in grafted)
    assert ["include", "LICENSE"] == lines[0][:2]
    assert any(words[0] == "global-exclude" and "__pycache__" in words for words in lines)
