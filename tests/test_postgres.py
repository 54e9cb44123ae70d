"""`runnerctl postgres` against the real PostgreSQL binaries of this machine."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import optuna
import psycopg
import pytest

from runnerctl.cli import main
from runnerctl.errors import ConfigError
from runnerctl.postgres import PostgresConfig, PostgresError, PostgresServer, find_bindir
from tests.pg import free_port


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


@pytest.fixture
def base_dir() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="runnerctl-pgcli-"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_binaries_are_found() -> None:
    assert (find_bindir() / "pg_ctl").exists()


def test_cli_lifecycle_keeps_the_study(base_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["postgres", "--dir", str(base_dir), "--port", str(free_port()),
            "--config", str(base_dir / "absent.toml")]
    try:
        assert main([*args, "init"]) == 0
        assert main([*args, "init"]) == 0
        assert main([*args, "status"]) == 1  # initialised but stopped
        assert main([*args, "start"]) == 0
        assert main([*args, "start"]) == 0  # harmless
        assert main([*args, "status"]) == 0
        capsys.readouterr()
        assert main([*args, "create-study", "cli_study", "--direction", "maximize"]) == 0
        url = capsys.readouterr().out.strip()
        assert url.startswith("postgresql+psycopg://cli_study:")
        study = optuna.load_study(study_name="cli_study", storage=url)
        study.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=0.5))
        assert main([*args, "stop"]) == 0
        assert main([*args, "stop"]) == 0
        assert main([*args, "start"]) == 0
        again = optuna.load_study(study_name="cli_study", storage=url)
        assert [t.value for t in again.trials] == [0.5]
        assert again.direction == optuna.study.StudyDirection.MAXIMIZE
        capsys.readouterr()
        assert main([*args, "url", "--study", "cli_study"]) == 0
        assert capsys.readouterr().out.strip() == url
    finally:
        main([*args, "stop"])


def test_study_role_is_least_privilege(pg_server: PostgresServer) -> None:
    url_a = pg_server.create_database("study_a")
    pg_server.create_database("study_b")
    with psycopg.connect(_libpq(url_a), autocommit=True) as conn:
        row = conn.execute("SELECT rolsuper, rolcreatedb, rolcreaterole FROM pg_roles "
                           "WHERE rolname = current_user").fetchone()
        assert row == (False, False, False)
        conn.execute("CREATE TABLE mine (x int)")  # it owns its own database
    other = _libpq(url_a).rsplit("/", 1)[0] + "/study_b"
    with pytest.raises(psycopg.OperationalError, match="permission denied"):
        psycopg.connect(other).close()


def test_create_database_is_idempotent(pg_server: PostgresServer) -> None:
    assert pg_server.create_database("twice") == pg_server.create_database("twice")


def test_wrong_password_is_refused(pg_server: PostgresServer) -> None:
    url = pg_server.create_database("pw_check")
    forged = _libpq(url).replace("pw_check:", "pw_check:x", 1)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(forged).close()


def test_start_without_init_is_a_clear_error(base_dir: Path) -> None:
    server = PostgresServer(PostgresConfig(base_dir=base_dir, port=free_port()))
    with pytest.raises(PostgresError, match="runnerctl postgres init"):
        server.start()


def test_bad_study_names_are_refused(pg_server: PostgresServer) -> None:
    for name in ("Bad", "1abc", "a-b", "x" * 49, "drop table"):
        with pytest.raises(ConfigError):
            pg_server.create_database(name)
