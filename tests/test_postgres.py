"""`runnerctl postgres` against the real PostgreSQL binaries of this machine (none: fail)."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import optuna
import psycopg
import pytest

from runnerctl.cli import main
from runnerctl.errors import ConfigError
from runnerctl.postgres import (
    ADMIN_ROLE,
    PostgresConfig,
    PostgresError,
    PostgresServer,
    check_name,
    database_url,
    find_bindir,
    libpq_url,
    with_host,
)
from tests.conftest import defaults_toml
from tests.pg import free_port


@pytest.fixture
def base_dir() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="runnerctl-pgcli-"))
    os.chmod(base, 0o755)  # pytest's tmp_path is 0700: the postgres user could not enter it
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _out(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().out.strip()


def test_binaries_are_found() -> None:
    assert (find_bindir() / "pg_ctl").exists()


def test_a_cluster_is_run_by_the_binaries_of_its_own_major_version(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A distribution upgrade installs PostgreSQL 17 beside 15; the newest binaries were
    taken, and they refuse a 15 cluster at start (found by a review as a DBA)."""
    import runnerctl.postgres as pg

    for major in ("15", "17"):
        bindir = tmp_path / "lib" / major / "bin"
        bindir.mkdir(parents=True)
        (bindir / "initdb").write_text("")
        (bindir / "pg_ctl").write_text(f"#!/bin/sh\necho 'pg_ctl (PostgreSQL) {major}.2'\n")
        (bindir / "pg_ctl").chmod(0o755)
    monkeypatch.setattr(pg, "DEBIAN_BINDIRS", str(tmp_path / "lib" / "*" / "bin"))
    monkeypatch.setattr(pg.shutil, "which", lambda name: None)
    data = tmp_path / "data"
    data.mkdir()
    assert find_bindir(data) == tmp_path / "lib" / "17" / "bin"  # a new cluster: the newest
    (data / "PG_VERSION").write_text("15\n")
    assert find_bindir(data) == tmp_path / "lib" / "15" / "bin"
    shutil.rmtree(tmp_path / "lib" / "15")
    with pytest.raises(PostgresError, match="is PostgreSQL 15, and only PostgreSQL 17's") as found:
        find_bindir(data)
    assert "A new PostgreSQL major version" in (found.value.hint or "")


def test_init_on_a_cluster_made_with_another_port_says_so(pg_server: PostgresServer,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """init on an existing cluster changed nothing, yet `url` then named the new port and
    nothing answered there (found by a review as a DBA)."""
    config = pg_server.config
    assert PostgresServer(config).init() is False  # the same settings: nothing to do
    other = PostgresServer(PostgresConfig(base_dir=config.base_dir, port=config.port + 1,
                                          listen=config.listen))
    said = rf"was made with port {config.port} \(settings: {config.port + 1}\)"
    with pytest.raises(PostgresError, match=said):
        other.init()
    for command in ("status", "start", "url"):  # they named the settings' port, where nothing answers
        code = main(["postgres", "--dir", str(config.base_dir), "--port", str(config.port + 1),
                     "--listen", config.listen, command])
        assert code == 1 and "was made with port" in capsys.readouterr().err, command


def test_stop_works_whatever_the_settings_say(base_dir: Path) -> None:
    """The unit's ExecStop is `runnerctl postgres stop`: refused for settings that differ
    from the cluster's, it would leave the server running (found by a final review)."""
    server = PostgresServer(PostgresConfig(base_dir=base_dir / "pg", port=free_port()))
    server.init()
    server.start()
    try:
        assert main(["postgres", "--dir", str(base_dir / "pg"), "--port", str(server.config.port + 1),
                     "stop"]) == 0
        assert not server.running()
    finally:
        server.stop()


def test_the_documented_backup_and_restore_work(pg_server: PostgresServer, tmp_path: Path) -> None:
    """docs/operations.md's pg_dump ran as a `postgres` role init never makes, and wrote
    the dump (web users' password hashes) world-readable (found by a review as a DBA).
    The documented commands, with this server's directory and port, dump and restore."""
    import subprocess

    doc = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    lines = [line.strip() for line in doc.splitlines()]
    commands = [next(line for line in lines if line.startswith(start))
                for start in ("umask ", "export PGPASSWORD")]
    dump = next(line for line in lines if line.startswith("pg_dump "))
    restore = next(line for line in lines if line.startswith("pg_restore "))
    base = str(pg_server.config.base_dir)

    def run(script: str) -> None:
        script = (script.replace("/var/lib/runnerctl/postgres", base)
                  .replace("-p 5432", f"-p {pg_server.config.port}").replace("/backup", str(tmp_path)))
        result = subprocess.run(["bash", "-euc", script], capture_output=True, text=True, check=False,
                                env={**os.environ, "PATH": f"{pg_server.bindir}:{os.environ['PATH']}"})
        assert result.returncode == 0, result.stderr

    url = pg_server.create_database("optuna")
    with psycopg.connect(libpq_url(url)) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS kept (v TEXT)")
        conn.execute("DELETE FROM kept")
        conn.execute("INSERT INTO kept VALUES ('trial 1')")
    run("\n".join([*commands, dump]))
    assert stat.S_IMODE((tmp_path / "optuna.dump").stat().st_mode) == 0o600
    with psycopg.connect(libpq_url(url)) as conn:
        conn.execute("DROP TABLE kept")
    run("\n".join([commands[-1], restore]))
    with psycopg.connect(libpq_url(url)) as conn:
        assert conn.execute("SELECT v FROM kept").fetchall() == [("trial 1",)]


def test_fresh_machine_init_start_url_and_a_study_survives_stop_start(
        base_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["postgres", "--dir", str(base_dir / "pg"), "--port", str(free_port()),
            "--config", str(defaults_toml(base_dir))]
    try:
        assert main([*args, "init"]) == 0
        assert main([*args, "init"]) == 0  # changes nothing
        assert main([*args, "status"]) == 1  # initialised but stopped
        (base_dir / "pg" / "server.log").write_text("")  # as an older runnerctl left it: 0644
        assert main([*args, "start"]) == 0
        # the server's log is its user's alone: a failed CREATE ROLE ... PASSWORD is logged whole
        assert stat.S_IMODE((base_dir / "pg" / "server.log").stat().st_mode) == 0o600
        assert main([*args, "start"]) == 0  # harmless
        assert "already running" in _out(capsys)
        # but not as the unit's ExecStart: systemd would refuse the hand-started server's pid
        # file and restart the unit for ever (found by a review as a systemd expert)
        os.environ["INVOCATION_ID"] = "0123456789abcdef0123456789abcdef"
        try:
            assert main([*args, "start"]) != 0
        finally:
            del os.environ["INVOCATION_ID"]
        assert "started outside this unit" in capsys.readouterr().err
        assert main([*args, "status"]) == 0
        capsys.readouterr()
        assert main([*args, "url", "--kind", "rdb"]) == 0  # the project database, made on first use
        project_url = _out(capsys)
        assert project_url.startswith("postgresql+psycopg://optuna:") and project_url.endswith("/optuna")
        optuna.create_study(study_name="from_url", storage=project_url)  # Optuna can use it

        assert main([*args, "create-study", "cli_study", "--direction", "maximize", "--kind", "rdb"]) == 0
        url = _out(capsys)
        assert url.startswith("postgresql+psycopg://cli_study:") and "@127.0.0.1:" in url
        study = optuna.load_study(study_name="cli_study", storage=url)
        study.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=0.5))
        assert main([*args, "create-study", "cli_study", "--kind", "rdb"]) == 3  # minimize: not this study
        capsys.readouterr()
        assert main([*args, "create-study", "cli_study", "--direction", "maximize", "--kind", "rdb"]) == 0
        assert _out(capsys) == url
        assert main([*args, "stop"]) == 0
        assert main([*args, "stop"]) == 0
        assert "not running" in _out(capsys)
        assert main([*args, "start"]) == 0
        again = optuna.load_study(study_name="cli_study", storage=url)
        assert [t.value for t in again.trials] == [0.5]
        assert again.direction == optuna.study.StudyDirection.MAXIMIZE
        capsys.readouterr()
        assert main([*args, "url", "cli_study", "--kind", "rdb"]) == 0
        assert _out(capsys) == url
        assert main([*args, "url", "--admin"]) == 0
        assert _out(capsys).startswith(f"postgresql+psycopg://{ADMIN_ROLE}:")
    finally:
        main([*args, "stop"])
    secrets = base_dir / "pg" / "secrets"
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in secrets.iterdir())
    if os.geteuid() == 0:  # PostgreSQL refuses root: the server ran as, and owns, `postgres`
        assert (base_dir / "pg" / "data").stat().st_uid == pwd.getpwnam("postgres").pw_uid


def test_study_role_is_least_privilege(pg_server: PostgresServer) -> None:
    url_a = libpq_url(pg_server.create_database("study_a"))
    pg_server.create_database("study_b")
    with psycopg.connect(url_a, autocommit=True) as conn:
        row = conn.execute("SELECT rolsuper, rolcreatedb, rolcreaterole, rolreplication FROM pg_roles "
                           "WHERE rolname = current_user").fetchone()
        assert row == (False, False, False, False)
        conn.execute("CREATE TABLE mine (x int)")  # it owns its own database
    for other in ("study_b", "postgres"):
        with pytest.raises(psycopg.OperationalError, match="no pg_hba.conf entry"):
            psycopg.connect(url_a.rsplit("/", 1)[0] + f"/{other}").close()


def test_admin_is_refused_from_the_network(pg_server: PostgresServer) -> None:
    admin = pg_server.admin_url()
    with psycopg.connect(libpq_url(admin)) as conn:  # the local socket: fine
        assert conn.execute("SELECT current_user").fetchone() == (ADMIN_ROLE,)
    password = admin.split(":", 2)[2].split("@")[0]
    over_tcp = f"postgresql://{ADMIN_ROLE}:{password}@127.0.0.1:{pg_server.config.port}/postgres"
    with psycopg.connect(over_tcp) as conn:  # loopback: fine
        assert conn.execute("SELECT 1").fetchone() == (1,)
    hba = (pg_server.config.data_dir / "pg_hba.conf").read_text()
    assert "runnerctl_admin   0.0.0.0/0       reject" in hba


def test_create_database_is_idempotent(pg_server: PostgresServer) -> None:
    assert pg_server.create_database("twice") == pg_server.create_database("twice")


def test_a_role_made_elsewhere_is_not_given_a_new_password(pg_server: PostgresServer) -> None:
    pg_server.create_database("elsewhere")
    (pg_server.config.secrets_dir / "elsewhere.password").rename(pg_server.config.base_dir / "moved")
    try:
        with pytest.raises(PostgresError, match="exists but its password is not in"):
            pg_server.create_database("elsewhere")
    finally:
        (pg_server.config.base_dir / "moved").rename(pg_server.config.secrets_dir / "elsewhere.password")


def test_wrong_password_is_refused(pg_server: PostgresServer) -> None:
    url = libpq_url(pg_server.create_database("pw_check"))
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(url.replace("pw_check:", "pw_check:x", 1)).close()


def test_an_external_server_works_the_same_way(pg_server: PostgresServer, base_dir: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """`[postgres] url` names another server's admin URL: url/create-study make roles there."""
    settings = base_dir / "runnerctl.toml"
    settings.write_text(f'[postgres]\ndir = "{base_dir / "local"}"\nurl = "{pg_server.admin_url()}"\n')
    args = ["postgres", "--config", str(settings)]
    assert main([*args, "status"]) == 0 and "reachable" in _out(capsys)
    assert main([*args, "create-study", "ext_study", "--host", "127.0.0.1", "--kind", "rdb"]) == 0
    url = _out(capsys)
    assert url.startswith("postgresql+psycopg://ext_study:") and f"127.0.0.1:{pg_server.config.port}" in url
    assert optuna.load_study(study_name="ext_study", storage=url).trials == []
    assert (base_dir / "local" / "secrets" / "ext_study.password").exists()
    assert main([*args, "init"]) == 3  # runnerctl runs no server of its own then
    assert "external PostgreSQL" in capsys.readouterr().err


def test_start_without_init_is_a_clear_error(base_dir: Path) -> None:
    server = PostgresServer(PostgresConfig(base_dir=base_dir, port=free_port()))
    with pytest.raises(PostgresError, match="runnerctl postgres init"):
        server.start()


def test_a_data_dir_the_server_user_cannot_reach_is_refused_before_initdb(base_dir: Path) -> None:
    assert os.geteuid() == 0, "only root hands the server to another user: run the tests as root (.ci/run)"
    private = base_dir / "private"
    private.mkdir(mode=0o700)
    server = PostgresServer(PostgresConfig(base_dir=private / "pg", port=free_port()))
    with pytest.raises(PostgresError, match=f"cannot enter {private}"):
        server.init()
    assert not (private / "pg" / "data").exists()


def test_urls_name_the_listen_address_or_this_host() -> None:
    def host(listen: str) -> str:
        server = PostgresServer.__new__(PostgresServer)
        server.config = PostgresConfig(base_dir=Path("/nonexistent"), listen=listen)
        return server.host()

    assert host("127.0.0.1") == "127.0.0.1"
    assert host("10.1.2.3, 127.0.0.1") == "10.1.2.3"
    assert host("*") == host("0.0.0.0") != "*"
    url = database_url("postgresql://admin:pw@/postgres?host=/run/pg&port=6543&sslmode=require",
                       "lr", "secret", host="db.lab")
    assert url == "postgresql+psycopg://lr:secret@db.lab:6543/lr?sslmode=require"
    assert with_host(url, "::1") == "postgresql+psycopg://lr:secret@[::1]:6543/lr?sslmode=require"


def test_bad_names_and_listen_addresses_are_refused(pg_server: PostgresServer, base_dir: Path) -> None:
    for name in ("Bad", "1abc", "a-b", "x" * 49, "drop table", "postgres", "pg_signal", ADMIN_ROLE):
        with pytest.raises(ConfigError):
            check_name(name)
        with pytest.raises(ConfigError):
            pg_server.create_database(name)
    server = PostgresServer(PostgresConfig(base_dir=base_dir / "x", listen="'; drop"))
    with pytest.raises(ConfigError, match="listen address"):
        server.init()
