"""`runnerctl init` and `status` as a user runs them: a real subprocess each time."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from tests.conftest import token_file

ROOT = Path(__file__).resolve().parents[1]
KEYS = json.loads((ROOT / "tests" / "data" / "gitlab_runner_config_keys.json").read_text())


def runnerctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "RUNNERCTL_CONFIG": "/nonexistent/runnerctl.toml", **(env or {})}
    full_env.pop("RUNNERCTL_GITLAB_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "runnerctl", *args], capture_output=True,
                          text=True, env=full_env, timeout=60, check=False)


def _dry_run(tmp_path: Path, executor: str) -> tomlkit.TOMLDocument:
    result = runnerctl("init", "--gpu-source", "sim:8", "--dry-run", "--gitlab-url",
                       "https://gitlab.example.com", "--executor", executor,
                       "--runner-config", str(tmp_path / "config.toml"), "--host", "gpu-a")
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "config.toml").exists()  # a dry run writes nothing
    body = result.stdout.split("# config.toml for", 1)[1].split("\n", 1)[1]
    return tomlkit.parse(body)


def _check_keys(table: dict[str, Any], allowed: str) -> None:
    for key, value in table.items():
        if isinstance(value, dict):
            _check_keys(value, f"{allowed}.{key}")
        else:
            assert key in KEYS[allowed], f"{allowed}: {key} is not a gitlab-runner config key"


@pytest.mark.parametrize("executor", ["custom", "docker", "shell"])
def test_dry_run_prints_only_gitlab_runner_keys(tmp_path: Path, executor: str) -> None:
    doc = _dry_run(tmp_path, executor).unwrap()
    runners = doc.pop("runners")
    _check_keys(doc, "global")
    sizes: dict[int, int] = {}
    for entry in runners:
        _check_keys(entry, "runners")
        assert entry["executor"] == executor
        assert entry["token"].startswith("<")  # a placeholder, never a token
        gpus = next(e for e in entry["environment"] if e.startswith("NVIDIA_VISIBLE_DEVICES="))
        size = gpus.count(",") + 1
        sizes[size] = sizes.get(size, 0) + 1
    assert sizes == {1: 8, 2: 4, 4: 2, 8: 1}
    assert doc["concurrent"] >= 8


def test_custom_entries_carry_the_gpu_set_in_args(tmp_path: Path) -> None:
    runners = _dry_run(tmp_path, "custom").unwrap()["runners"]
    quad = next(r for r in runners if r["name"] == "runnerctl/gpu-a/gpu4-7")
    custom = quad["custom"]
    for stage in ("config", "prepare", "run", "cleanup"):
        args = custom[f"{stage}_args"]
        assert args[args.index("--gpus") + 1] == "4,5,6,7"
        assert args[args.index("--gpu-source") + 1] == "sim:8"
        assert custom[f"{stage}_exec"] == sys.executable
    assert quad["builds_dir"] and quad["cache_dir"]


def test_docker_entries_name_gpus_by_uuid(tmp_path: Path) -> None:
    runners = _dry_run(tmp_path, "docker").unwrap()["runners"]
    pair = next(r for r in runners if r["name"] == "runnerctl/gpu-a/gpu2-3")
    gpus = pair["docker"]["gpus"]
    assert gpus.startswith('"device=GPU-') and gpus.endswith('"') and gpus.count("GPU-") == 2


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _assert_one_line_error(result: subprocess.CompletedProcess[str], needle: str) -> None:
    assert result.returncode not in (0, None)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert needle in lines[0]
    assert "Traceback" not in result.stderr


def test_unreachable_gitlab_is_one_line_and_config_untouched(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("# mine\nconcurrent = 2\n")
    before = config.read_bytes()
    result = runnerctl("init", "--gpu-source", "sim:2", "--gitlab-url",
                       f"http://127.0.0.1:{_closed_port()}", "--token-file", token_file(tmp_path, "glpat-x"),
                       "--runner-config", str(config))
    _assert_one_line_error(result, "cannot reach GitLab")
    assert config.read_bytes() == before


def test_malformed_config_is_refused_untouched(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("concurrent = 4\n[[runners]\n")
    before = config.read_bytes()
    result = runnerctl("init", "--gpu-source", "sim:2", "--gitlab-url", "http://127.0.0.1:1",
                       "--token-file", token_file(tmp_path, "x"), "--runner-config", str(config))
    _assert_one_line_error(result, "not valid TOML")
    assert result.returncode == 3
    assert config.read_bytes() == before


def test_nvml_without_driver_is_one_clear_line(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("concurrent = 4\n")
    before = config.read_bytes()
    result = runnerctl("init", "--gpu-source", "nvml", "--gitlab-url", "http://127.0.0.1:1",
                       "--token-file", token_file(tmp_path, "x"), "--runner-config", str(config),
                       env={"LD_LIBRARY_PATH": str(tmp_path)})
    _assert_one_line_error(result, "NVML")
    assert result.returncode == 5
    assert config.read_bytes() == before


def test_status_sim_json(tmp_path: Path) -> None:
    result = runnerctl("status", "--gpu-source", "sim:8", "--json", "--host", "gpu-a",
                       "--runner-config", str(tmp_path / "config.toml"))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [g["state"] for g in report["gpus"]] == ["idle"] * 8
    assert len(report["slots"]) == 15
    assert not any(s["registered"] for s in report["slots"])


def test_status_says_unknown_where_nvml_cannot_list_the_processes(tmp_path: Path) -> None:
    """It said "idle" for a GPU whose processes NVML cannot list (found by a review)."""
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("host: gpu-a\ngpus:\n  - {index: 0}\n  - {index: 1, processes_known: false}\n")
    result = runnerctl("status", "--gpu-source", f"sim:{gpus}", "--json", "--host", "gpu-a",
                       "--runner-config", str(tmp_path / "config.toml"))
    assert result.returncode == 0, result.stderr
    assert [g["state"] for g in json.loads(result.stdout)["gpus"]] == ["idle", "unknown"]


def test_mig_gpus_are_left_alone_by_status_and_init(tmp_path: Path) -> None:
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("gpus:\n  - {}\n  - {mig: true, utilization: null}\n  - {}\n  - {}\n")
    common = ["--gpu-source", f"sim:{gpus}", "--host", "gpu-a",
              "--runner-config", str(tmp_path / "config.toml")]
    status = runnerctl("status", *common, "--json")
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert [g["state"] for g in report["gpus"]] == ["idle", "mig", "idle", "idle"]
    assert all(1 not in s["gpus"] for s in report["slots"]) and len(report["slots"]) == 5
    (note,) = report["left_alone"]
    assert note.startswith("GPU 1 in MIG mode: runnerctl leaves MIG GPUs alone") and "-mig 0" in note
    table = runnerctl("status", *common)
    assert table.returncode == 0 and "GPU 1 in MIG mode" in table.stdout
    init = runnerctl("init", *common, "--dry-run", "--gitlab-url", "https://gitlab.example.com")
    assert init.returncode == 0, init.stderr
    assert "# GPU 1 in MIG mode: runnerctl leaves MIG GPUs alone" in init.stdout
    body = tomlkit.parse(init.stdout.split("# config.toml for", 1)[1].split("\n", 1)[1]).unwrap()
    visible = [e for entry in body["runners"] for e in entry["environment"]
               if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert len(visible) == 5 and not any(report["gpus"][1]["uuid"] in v for v in visible)


def test_status_table_shows_processes_with_user(tmp_path: Path) -> None:
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("gpus: 2\nprocesses: [{gpu: 1, pid: 777, user: alice, memory: 3GiB}]\n")
    result = runnerctl("status", "--gpu-source", f"sim:{gpus}",
                       "--runner-config", str(tmp_path / "config.toml"))
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.strip().startswith("1 "))
    assert "busy" in row and "777 (alice)" in row


def test_status_cannot_claim_a_gpu_healthy_without_watching_its_xids(tmp_path: Path) -> None:
    """Issue 15: a one-shot reader never saw the Xid events (NVML hands them only to a
    session registered before they happen), so health is unknown, not healthy; an ECC
    count it can read still makes a GPU unhealthy."""
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("gpus:\n  - {xid: 2}\n  - {ecc_uncorrected: 1}\n")
    result = runnerctl("status", "--gpu-source", f"sim:{gpus}", "--json",
                       "--runner-config", str(tmp_path / "config.toml"))
    assert result.returncode == 0, result.stderr
    first, second = json.loads(result.stdout)["gpus"]
    assert (first["xid_errors"], first["healthy"]) == (None, None)
    assert second["healthy"] is False
    table = runnerctl("status", "--gpu-source", f"sim:{gpus}",
                      "--runner-config", str(tmp_path / "config.toml"))
    rows = [line.split() for line in table.stdout.splitlines() if line.strip()[:2] in ("0 ", "1 ")]
    assert [row[2] for row in rows[:2]] == ["unknown", "unhealthy"], table.stdout


def test_usage_error_exit_code() -> None:
    result = runnerctl("init", "--gitlab-url", "https://gitlab.example", "--group", "1", "--project", "2",
                       "--gpu-source", "sim:1", "--dry-run")
    assert result.returncode == 2
    assert "not both" in result.stderr
