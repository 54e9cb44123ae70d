"""The Grafana dashboards and provisioning files: schema-valid, portable, wired to the variables.

Schema: Grafana's dashboard JSON schema from grafana-foundation-sdk, pinned (see
tests/data/grafana/README.md), validated with the `jsonschema` package. Portable: the
datasource comes from a `datasource` template variable (no `${DS_...}` import
placeholders, no `__inputs`), so the files work both provisioned and imported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
GRAFANA = ROOT / "monitoring" / "grafana"
SCHEMA = ROOT / "tests" / "data" / "grafana" / "dashboard.jsonschema.json"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))


def _panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    found, todo = [], list(board["panels"])
    while todo:
        panel = todo.pop(0)
        todo.extend(panel.get("panels", []))
        found.append(panel)
    return found


def test_fleet_and_host_dashboards_exist() -> None:
    assert {p.name for p in DASHBOARDS} == {"runnerctl-fleet.json", "runnerctl-host.json"}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_validates_against_grafana_schema(path: Path) -> None:
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft7Validator(schema)
    board = json.loads(path.read_text())
    errors = [f"{list(e.path)}: {e.message[:200]}" for e in validator.iter_errors(board)]
    assert not errors, errors


def test_schema_rejects_a_broken_dashboard() -> None:
    """The vendored schema is strict enough to matter: wrong types and unknown keys fail."""
    board = json.loads(DASHBOARDS[0].read_text())
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))
    assert validator.is_valid(board)
    assert not validator.is_valid({**board, "__inputs": [{"name": "DS_PROMETHEUS"}]})
    assert not validator.is_valid({**board, "panels": [{**board["panels"][1], "gridPos": {"h": "8"}}]})
    assert not validator.is_valid({k: v for k, v in board.items() if k != "templating"})


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_takes_its_datasource_from_a_variable(path: Path) -> None:
    text = path.read_text()
    board = json.loads(text)
    assert "${DS_" not in text and "__inputs" not in board
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["Hostname"]["type"] == "query"
    for panel in _panels(board):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], (panel["title"], target["expr"])


def test_panel_ids_are_unique_and_panels_do_not_overlap() -> None:
    for path in DASHBOARDS:
        panels = _panels(json.loads(path.read_text()))
        ids = [p["id"] for p in panels]
        assert len(ids) == len(set(ids)), path.name
        cells: set[tuple[int, int]] = set()
        for panel in panels:
            pos = panel["gridPos"]
            assert pos["x"] + pos["w"] <= 24, (path.name, panel["title"])
            mine = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
                    for y in range(pos["y"], pos["y"] + pos["h"])}
            assert not cells & mine, (path.name, panel["title"])
            cells |= mine


def test_fleet_view_has_the_panels_the_issue_asks_for() -> None:
    fleet = json.loads((GRAFANA / "dashboards" / "runnerctl-fleet.json").read_text())
    kinds = {(p["type"], p["title"]) for p in _panels(fleet)}
    exprs = " ".join(t["expr"] for p in _panels(fleet) for t in p.get("targets", []))
    assert ("state-timeline", "GPU occupancy by host and GPU") in kinds
    for metric in ("runnerctl_gpu_occupancy_seconds_total", "runnerctl_pending_jobs",
                   "runnerctl_job_wait_seconds_bucket", "runnerctl_gpu_foreign_processes"):
        assert metric in exprs, metric


def test_provisioning_points_grafana_at_prometheus_and_the_dashboards() -> None:
    sources = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "runnerctl.yml").read_text())
    assert sources["apiVersion"] == 1
    assert [d["type"] for d in sources["datasources"]] == ["prometheus"]
    providers = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "runnerctl.yml").read_text())
    assert providers["apiVersion"] == 1
    provider = providers["providers"][0]
    assert provider["type"] == "file" and provider["options"]["path"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_table_panels_ask_for_one_row_per_series_not_a_time_series(path: Path) -> None:
    """A Prometheus query defaults to the time-series format (one frame per series, columns
    Time and Value): a table panel then shows values over time, not the labels of each
    series. Its targets must be instant queries in table format."""
    for panel in _panels(json.loads(path.read_text())):
        if panel["type"] != "table":
            continue
        for target in panel["targets"]:
            assert target.get("format") == "table" and target.get("instant") is True, (panel["title"], target)
        hidden = {name for t in panel.get("transformations", []) if t["id"] == "organize"
                  for name, off in t["options"].get("excludeByName", {}).items() if off}
        assert {"Time", "Value"} <= hidden, panel["title"]
