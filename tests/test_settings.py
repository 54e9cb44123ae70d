"""runnerctl's own settings file: defaults, overrides, and errors that name the key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runnerctl.errors import ConfigError
from runnerctl.settings import PlanPolicy, load_settings


def test_missing_file_means_defaults(tmp_path: Path) -> None:
    settings = load_settings(tmp_path / "absent.toml")
    assert settings.host.gpu_source == "nvml"
    assert settings.executor.gate_wait_s == 600.0
    assert settings.builds_dir == str(settings.state_dir / "builds")


def test_values_override_defaults(tmp_path: Path) -> None:
    path = tmp_path / "runnerctl.toml"
    path.write_text('[host]\nname = "gpu-a"\ngpu_source = "sim:4"\n'
                    '[paths]\nstate_dir = "/srv/rc"\n[executor]\ngate_wait_s = 5\n')
    settings = load_settings(path)
    assert (settings.host.name, settings.host.gpu_source) == ("gpu-a", "sim:4")
    assert settings.cache_dir == "/srv/rc/cache"
    assert settings.executor.gate_wait_s == 5.0 and isinstance(settings.executor.gate_wait_s, float)


def test_a_long_interval_without_a_claim_ttl_keeps_working(tmp_path: Path) -> None:
    """Older runnerctl took `interval_s = 60` with the claim left at its default; when the
    claim began to be checked against the interval, that file was refused, and with it
    every CI job (the executor stages read the same file) from the moment of `pip install
    --upgrade` (found by a review as a lab admin upgrading). Unset, the claim follows the
    interval; set, it is checked."""
    path = tmp_path / "runnerctl.toml"
    path.write_text(f'[host]\nname = "gpu-a"\ngpu_source = "sim:8"\n[paths]\nstate_dir = "{tmp_path}/state"\n'
                    "[controller]\ninterval_s = 60\n")
    assert load_settings(path).controller.claim_ttl() == 180.0
    assert load_settings(tmp_path / "absent.toml").controller.claim_ttl() == 120.0
    env = {**os.environ, "CUSTOM_ENV_CI_JOB_ID": "77"}
    stage = subprocess.run([sys.executable, "-m", "runnerctl.executors", "config",
                            "--slot", "runnerctl/gpu-a/gpu0", "--gpus", "0", "--gpu-source", "sim:8",
                            "--config", str(path), "--driver", "shell"],
                           check=False, capture_output=True, text=True, env=env, timeout=60)
    assert stage.returncode == 0, stage.stderr


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[host]\nnmae = 'x'\n", "unknown setting 'nmae'"),
        ("[executor]\ngate_wait_s = 'soon'\n", "gate_wait_s must be float"),
        ("host = 3\n", r"\[host\] must be a table"),
        ("[host\n", "not valid TOML"),
        ("[controller]\nfair_half_life_h = 0\n", "fair_half_life_h must be more than 0"),
        ("[controller]\nuser_shares = { ann = 0 }\n", "user_shares: ann must be a share more than 0"),
        ("[controller]\nproject_shares = { 'g/a' = 'many' }\n", "project_shares must be a table of float"),
        ("[controller]\nfair_weight_h = -1\n", "fair_weight_h must be a finite number"),
        ("[controller]\nrunner_max_timeout_s = { '1' = 300 }\n", "from 600 .GitLab's minimum."),
        ("[controller]\nrunner_max_timeout_s = { '8' = 99999999999 }\n", "to 2147483647, not 99999999999"),
        ("[controller]\nrunner_max_timeout_s = { single = 3600 }\n", "'single' is no number of GPUs"),
        ("[controller.planner]\ndrain_after = 600\n", r"controller.planner\]: unknown setting 'drain_after'"),
        ("[controller.planner]\nmax_draining = 0\n", r"max_draining must be at least 1 \(blocks: else no"),
        ("[controller.planner]\nmax_draining = 1.5\n", "max_draining must be int"),
        ("[controller.planner]\ndrain_after_s = -600\n", "drain_after_s must be a finite number"),
        ("[controller.planner]\nbackfill_max_s = 'soon'\n", "backfill_max_s must be float"),
        ("[controller]\nplanner = 2\n", r"\[planner\] must be a table"),
        ("[controller.planner]\nmax_draining = true\n", r"planner\]: max_draining must be int, not True"),
        ("[controller.planner]\nbackfill_estimated = 1\n", "backfill_estimated must be bool, not 1"),
        ("[controller]\nfair_queue_step_min = -1\n", "fair_queue_step_min must be a finite number"),
        ("[controller]\nunused_utilization = 1.5\n", r"unused_utilization must be from 0 to 1 \(a ratio\)"),
        ("[controller]\nevents_retention_days = 0\n", "events_retention_days must be more than 0, not 0.0"),
        ("[web]\nsession_max_age_s = 59\n", r"session_max_age_s must be at least 60 \(seconds\), not 59"),
        ("[controller.planner]\nmax_draining = 99999999999999999999\n", "max_draining is too large"),
        ("[controller]\ninterval_s = 99999999999999999999\n", "interval_s is too large"),
        ("[controller]\ninterval_s = 1e308\n", "interval_s is too large"),
        ("[controller]\ninterval_s = 0\n", r"interval_s must be from 0.05 to 3600 \(seconds"),
        ("[controller]\napi_budget_per_min = 0\n", "api_budget_per_min must be from 1 to 100000"),
        ("[controller]\nforeign_utilization = 7\n", "foreign_utilization must be from 0 to 1 .a ratio"),
        ("[controller]\nreopen_ratio = 12\n", "reopen_ratio must be from 0 to 1"),
        ("[controller]\nclaim_ttl_s = 1e300\n", "claim_ttl_s is too large"),
        ("[controller]\ninterval_s = 60\nclaim_ttl_s = 120\n",  # a 120 s claim, a 60 s interval
         r"claim_ttl_s must be at least 3 reconcile intervals \(3 x 60 s = 180 s\), not 120: a claim would"),
        ("[controller]\nclaim_ttl_s = 'x'\n", "claim_ttl_s must be float, not 'x'"),
        ("[controller]\nclaim_ttl_s = 10\n", r"claim_ttl_s must be at least 3 reconcile intervals \(3 x 5 s"),
        ("[controller]\nproject_priorities = { '7' = 'urgent' }\n",
         "project_priorities: 7 must be one of high, normal, low, not 'urgent'"),
        ("[controller]\nprojects = [true, -5]\n", "projects must be GitLab project ids"),
        ("[postgres]\nport = 999999\n", "port must be from 1 to 65535"),
        ("[executor]\ndriver = 'kubernetes'\n", "driver must be one of shell, docker, slurm"),
        ("[executor]\ndocker_pull_policy = 'never'\n",
         "docker_pull_policy must be one of if-not-present, always"),
        ("[paths]\nstate_dir = ''\n", "state_dir must be an absolute path, not ''"),
        ("[paths]\nstate_dir = 'relative/dir'\n", "state_dir must be an absolute path"),
        ("[web]\ntrusted_proxies = ['not-an-ip']\n", "trusted_proxies: 'not-an-ip' is no address or CIDR"),
        ("[web]\npublic_url = 'lab.example/gpus'\n", "public_url must be an http.s. address"),
        ("[web]\nmax_concurrent_signins = 0\n", "max_concurrent_signins must be from 1 to 1000"),
        ("[host]\nname = 'gpu-a/b'\n", r"\[host\]: host name 'gpu-a/b' must be 1 to 63 letters"),
        ("[host]\nname = 'x,gpus:8'\n", "host name 'x,gpus:8' must be"),
        ("[monitoring]\nexporter_listen = 'nope'\n", "exporter_listen 'nope' is not HOST:PORT"),
        ("[monitoring]\nexporter_listen = '127.0.0.1:0'\n", "exporter_listen needs a port from 1 to 65535"),
    ],
)
def test_bad_settings_name_the_problem(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "runnerctl.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_settings(path)


def test_a_settings_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "runnerctl.toml"
    path.write_bytes(b'[host]\nname = "\xff"\n')
    with pytest.raises(ConfigError, match=r"runnerctl.toml is not UTF-8 text \(byte 15\)"):
        load_settings(path)


def test_good_values_at_the_edges_load(tmp_path: Path) -> None:
    path = tmp_path / "runnerctl.toml"
    path.write_text("[controller]\ninterval_s = 0.05\nreopen_ratio = 1\nprojects = [7]\n"
                    "project_priorities = { '7' = 'high' }\n[postgres]\nport = 65535\n"
                    "[executor]\ndriver = 'pjm'\ngate_wait_s = 600\n"
                    "[web]\ntrusted_proxies = ['10.0.0.0/8', '::1']\n"
                    "[paths]\nbuilds_dir = ''\nrunner_config = '/etc/gitlab-runner/config.toml'\n")
    settings = load_settings(path)
    assert (settings.controller.interval_s, settings.postgres.port, settings.executor.driver,
            settings.web.trusted_proxies) == (0.05, 65535, "pjm", ("10.0.0.0/8", "::1"))


def test_runner_timeout_sizes_are_numbers_of_gpus(tmp_path: Path) -> None:
    path = tmp_path / "runnerctl.toml"
    path.write_text("[controller]\nrunner_max_timeout_s = { '01' = 3600, '8' = 86400 }\n")
    assert load_settings(path).controller.runner_max_timeout_s == {"1": 3600, "8": 86400}


def test_the_planner_settings_are_the_planners(tmp_path: Path) -> None:
    """`[controller.planner]` is `PlanPolicy` itself: absent, the planner's defaults; given,
    the keys set override them (TOML's 600 is 600.0 seconds)."""
    path = tmp_path / "runnerctl.toml"
    assert load_settings(path).controller.planner == PlanPolicy()
    path.write_text("[controller.planner]\ndrain_after_s = 600\nmax_draining = 2\n")
    planner = load_settings(path).controller.planner
    assert planner == PlanPolicy(drain_after_s=600.0, max_draining=2)
    assert isinstance(planner.drain_after_s, float) and planner.backfill_max_s == PlanPolicy().backfill_max_s


def test_the_readme_settings_example_loads(tmp_path: Path) -> None:
    """README.md's Settings example is a runnerctl.toml this version reads, key by key."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    start = readme.index("```toml", readme.index("## Settings")) + len("```toml")
    path = tmp_path / "runnerctl.toml"
    path.write_text(readme[start:readme.index("```", start)])
    settings = load_settings(path)
    assert settings.host.name == "gpu-a" and settings.controller.planner == PlanPolicy()


def test_a_config_option_naming_a_missing_file_is_refused(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A misspelt `--config` would mean the defaults, their state directory included."""
    from runnerctl.cli import main

    missing = tmp_path / "runnerct.toml"
    assert main(["report", "--config", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"'{missing}' does not exist" in err and len(err.strip().splitlines()) == 1


def test_a_settings_file_an_editor_saved_with_a_bom_loads(tmp_path: Path) -> None:
    """"Invalid statement (at line 1, column 1)" named nothing a lab admin could see."""
    path = tmp_path / "runnerctl.toml"
    path.write_bytes(b"\xef\xbb\xbf[host]\r\nname = \"gpu-b\"\r\n")
    assert load_settings(path).host.name == "gpu-b"


@pytest.mark.parametrize(("text", "said"), [
    # under systemd (working directory /) a relative runner_config named another file than
    # init wrote, and `~` was never expanded (found by a review as a lab admin)
    ("[paths]\nrunner_config = 'gr/config.toml'\n", "[paths] runner_config 'gr/config.toml' is not"),
    ("[paths]\nbuilds_dir = 'builds'\n", "[paths] builds_dir 'builds' is not an absolute path"),
    ("[paths]\ncache_dir = '~/cache'\n", "[paths] cache_dir '~/cache' is not an absolute path"),
    ("[postgres]\ndir = 'pg'\n", "[postgres] dir 'pg' is not an absolute path"),
    ("[monitoring]\ndcgm_job_mapping_dir = 'map'\n", "dcgm_job_mapping_dir 'map' is not an absolute path"),
    # gitlab-runner ends prepare at 900 s, the image pull after the wait: the gate's message is lost
    ("[executor]\ngate_wait_s = 3600\n", "[executor] gate_wait_s 3600 is over 600 s"),
    # its keys are project ids; a path (as project_shares takes) matched no project, silently
    ("[controller]\nproject_priorities = { 'ml/vision' = 'high' }\n", "'ml/vision' is no GitLab project id"),
    ("[controller]\nproject_priorities = { '042' = 'high' }\n", "'042' is no GitLab project id"),
])
def test_settings_an_older_runnerctl_took_load_and_are_named_as_doubtful(tmp_path: Path, text: str,
                                                                        said: str) -> None:
    """Refused at load, they stopped every job's stages after an upgrade (found by a
    review of the day's changes): they load, and doctor and serve name them."""
    from runnerctl.executors.contract import PREPARE_EXEC_TIMEOUT_S
    from runnerctl.settings import GATE_WAIT_MAX_S, doubtful

    path = tmp_path / "runnerctl.toml"
    path.write_text(text)
    [found] = doubtful(load_settings(path))
    assert said in found, found
    assert doubtful(load_settings(tmp_path / "absent.toml")) == []
    assert PREPARE_EXEC_TIMEOUT_S - GATE_WAIT_MAX_S >= 300  # the driver's own prepare gets 5 minutes


def test_a_setting_of_the_wrong_type_never_echoes_a_password(tmp_path: Path) -> None:
    """Every job's stages load the settings, and their errors go into the job log: a URL
    given as a list came back whole, its password with it (found by a secrets audit)."""
    from runnerctl.errors import redact

    config = tmp_path / "runnerctl.toml"
    config.write_text('[controller]\nstore_url = ["postgresql://u:S3CRETpw@db/runnerctl"]\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(config)
    assert "store_url must be str" in str(caught.value) and "S3CRETpw" not in str(caught.value)
    for text in ('invalid percent-encoded token: "pa%zzS3CRETpw"', "host=db password=S3CRETpw user=u",
                 "postgresql://u@db/x?sslmode=require&password=S3CRETpw"):  # libpq's own forms
        assert "S3CRETpw" not in redact(text)
    assert "S3CRETpw" not in redact('forbidden value %00 in percent-encoded value: "pa%00S3CRETpw"')
    assert redact("see https://lab.example:8443/pages@v2 and postgresql://u@db/x") == (
        "see https://lab.example:8443/pages@v2 and postgresql://u@db/x")  # no password: left alone
