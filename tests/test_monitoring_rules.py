"""Alert rules and dashboard queries over made-up series, with `promtool test rules`.

tests/test_monitoring_prometheus.py shows that every expression returns data on real
scrapes; this file pins down what they return in the cases a live run cannot stage
cheaply: the same GitLab job seen by several hosts, GPUs unusable for ten minutes,
a GPU count that started no job in the time range, every target down. The dashboards'
expressions are read from the committed JSON and their Grafana variables replaced, as
Grafana would, before promtool evaluates them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ALERTS = ROOT / "monitoring" / "prometheus" / "alerts.yml"
FLEET = ROOT / "monitoring" / "grafana" / "dashboards" / "runnerctl-fleet.json"


def promtool_test(tmp_path: Path, tests: list[dict[str, Any]]) -> None:
    """Run `promtool test rules` on `tests` with the committed alert rules; fail with its output.

    promtool compares an alert's annotations too, word for word; these tests are about
    when an alert fires and with which labels, so the rules are copied without them."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed (apt-get install prometheus, see .ci/setup)"
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(rules))
    path = tmp_path / "tests.yml"
    path.write_text(yaml.safe_dump({"rule_files": [str(tmp_path / "alerts.yml")], "evaluation_interval": "1m",
                                    "tests": tests}))
    done = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def panel_exprs(title: str, hostname: str = ".*", range_: str = "1h") -> list[str]:
    """The expressions of the fleet panel `title`, with `$Hostname` and `$__range` replaced."""
    board = json.loads(FLEET.read_text())
    panel = next(p for p in board["panels"] if p.get("title") == title)
    exprs = [t["expr"].replace("$Hostname", hostname).replace("$__range", range_) for t in panel["targets"]]
    assert not any("$" in e for e in exprs), exprs
    return exprs


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def test_a_gpu_that_is_unknown_or_unhealthy_for_ten_minutes_pages(tmp_path: Path) -> None:
    """A broken NVML makes every GPU of the host `unknown` and closes the host to CI; an
    unhealthy GPU stays closed until an admin reopens it. Neither paged before."""
    host = {"job": "runnerctl", "instance": "a:8080", "Hostname": "a"}
    state = "runnerctl_gpu_occupancy_state"
    inputs = [series(state, "1x30", **host, gpu="0", UUID="u0", state="unknown"),
              series(state, "0x30", **host, gpu="0", UUID="u0", state="idle"),
              series(state, "0x10 1x20", **host, gpu="1", UUID="u1", state="unhealthy"),
              series(state, "1x30", **host, gpu="2", UUID="u2", state="idle"),
              series(state, "0x30", **host, gpu="2", UUID="u2", state="unknown"),
              series(state, "1x5 0x25", **host, gpu="3", UUID="u3", state="unknown")]  # back after 5 min
    alert = "RunnerctlGpuUnusable"
    gpu0 = {"exp_labels": {"severity": "critical", **host, "gpu": "0", "UUID": "u0", "state": "unknown"}}
    gpu1 = {"exp_labels": {"severity": "critical", **host, "gpu": "1", "UUID": "u1", "state": "unhealthy"}}
    promtool_test(tmp_path, [{"interval": "1m", "input_series": inputs, "alert_rule_test": [
        {"eval_time": "9m", "alertname": alert, "exp_alerts": []},
        {"eval_time": "15m", "alertname": alert, "exp_alerts": [gpu0]},
        {"eval_time": "25m", "alertname": alert, "exp_alerts": [gpu0, gpu1]},
    ]}])


def test_a_multi_gpu_job_seen_by_every_host_pages_once(tmp_path: Path) -> None:
    """Every host polls the same GitLab queue, so three hosts report the same 8-GPU job:
    one alert, not one per host."""
    inputs = [series("runnerctl_pending_job_oldest_age_seconds", f"{start}+60x20", job="runnerctl",
                     instance=f"{host}:8080", Hostname=host, gpus="8")
              for host, start in (("a", 10000), ("b", 10000), ("c", 9990))]
    inputs.append(series("runnerctl_pending_job_oldest_age_seconds", "600+60x20", job="runnerctl",
                         instance="a:8080", Hostname="a", gpus="2"))  # waited 10 min: no alert
    promtool_test(tmp_path, [{"interval": "1m", "input_series": inputs, "alert_rule_test": [
        {"eval_time": "10m", "alertname": "RunnerctlMultiGpuJobWaiting",
         "exp_alerts": [{"exp_labels": {"severity": "warning", "gpus": "8"}}]},
    ]}])


def test_job_wait_panel_leaves_out_gpu_counts_that_started_no_job(tmp_path: Path) -> None:
    """A GPU count with no job started in the range has no increase in any bucket, and its
    quantile was NaN (a bar reading NaN); only counts that started a job are shown."""
    host = {"Hostname": "a"}
    bucket = "runnerctl_job_wait_seconds_bucket"
    inputs = [series(bucket, "3x70", **host, gpus="2", le="10.0"),  # 2-GPU jobs: none started this hour
              series(bucket, "5x70", **host, gpus="2", le="+Inf"),
              series("runnerctl_job_wait_seconds_count", "5x70", **host, gpus="2"),
              series(bucket, "0+1x70", **host, gpus="1", le="10.0"),  # one 1-GPU job a minute, all under 10 s
              series(bucket, "0+1x70", **host, gpus="1", le="+Inf"),
              series("runnerctl_job_wait_seconds_count", "0+1x70", **host, gpus="1")]
    median, p90 = panel_exprs("Job wait by GPUs asked (median, time range)")
    promtool_test(tmp_path, [{"interval": "1m", "input_series": inputs, "promql_expr_test": [
        {"expr": median, "eval_time": "70m", "exp_samples": [{"labels": '{gpus="1"}', "value": 5}]},
        {"expr": p90, "eval_time": "70m", "exp_samples": [{"labels": '{gpus="1"}', "value": 9}]},
    ]}])


@pytest.mark.parametrize(("hostname", "expected"), [(".*", 2), ("gpu-c", 1), ("gpu-x", 0)])
def test_hosts_answering_counts_hosts_of_the_selection(tmp_path: Path, hostname: str, expected: int) -> None:
    """Host gpu-c runs serve and the exporter (two targets, one host); gpu-d runs serve;
    gpu-e's serve is down (its series went stale). The stat counts hosts, follows the
    `$Hostname` selection and shows 0, not "No data", when no host answers."""
    age = "runnerctl_reconcile_last_success_age_seconds"
    inputs = [series(age, "1x10", job="runnerctl", instance="gpu-c:8080", Hostname="gpu-c"),
              series(age, "1x10", job="runnerctl-exporter", instance="gpu-c:9835", Hostname="gpu-c"),
              series(age, "1x10", job="runnerctl", instance="gpu-d:8080", Hostname="gpu-d"),
              series(age, "1x3 stale", job="runnerctl", instance="gpu-e:8080", Hostname="gpu-e"),
              series("up", "1x10", job="runnerctl", instance="gpu-c:8080"),
              series("up", "1x10", job="runnerctl-exporter", instance="gpu-c:9835"),
              series("up", "1x10", job="runnerctl", instance="gpu-d:8080"),
              series("up", "1x3 0x6", job="runnerctl", instance="gpu-e:8080")]
    (expr,) = panel_exprs("Hosts answering", hostname=hostname)
    promtool_test(tmp_path, [{"interval": "1m", "input_series": inputs, "promql_expr_test": [
        {"expr": expr, "eval_time": "8m", "exp_samples": [{"labels": "{}", "value": expected}]},
    ]}])


def test_hosts_answering_is_0_when_every_target_is_down(tmp_path: Path) -> None:
    inputs = [series("runnerctl_reconcile_last_success_age_seconds", "1x3 stale", job="runnerctl",
                     instance="gpu-c:8080", Hostname="gpu-c"),
              series("up", "1x3 0x6", job="runnerctl", instance="gpu-c:8080")]
    (expr,) = panel_exprs("Hosts answering")
    promtool_test(tmp_path, [{"interval": "1m", "input_series": inputs, "promql_expr_test": [
        {"expr": expr, "eval_time": "8m", "exp_samples": [{"labels": "{}", "value": 0}]},
    ]}])


def test_a_clock_off_the_shared_stores_for_ten_minutes_warns(tmp_path: Path) -> None:
    """/healthz failed for a host whose clock is off the store's (its claims expire early or
    late for the other hosts), and no alert said so (found by a review as an on-call
    engineer)."""
    host = {"job": "runnerctl", "instance": "a:8080", "Hostname": "a"}
    name = "runnerctl_reconcile_trouble_seconds"
    inputs = [series(name, "0+60x30", **host, part="clock"), series(name, "0x30", **host, part="gitlab"),
              series(name, "0x30", **{**host, "instance": "b:8080", "Hostname": "b"}, part="clock")]
    off = {"exp_labels": {"severity": "warning", **host, "part": "clock"}}
    promtool_test(tmp_path, [{"interval": "1m", "input_series": inputs, "alert_rule_test": [
        {"eval_time": "9m", "alertname": "RunnerctlClockOff", "exp_alerts": []},
        {"eval_time": "15m", "alertname": "RunnerctlClockOff", "exp_alerts": [off]},
    ]}])
