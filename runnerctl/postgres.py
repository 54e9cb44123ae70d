"""A shared PostgreSQL for Optuna studies, run by runnerctl from the host's own binaries.

A hyperparameter search needs one database that every worker reaches; spending a whole
node or GPU slot on it is waste. `runnerctl postgres` runs a small server with initdb and
pg_ctl in a data directory of runnerctl's, password authentication (scram-sha-256)
only, listening where configured (default 127.0.0.1), and gives every study its own
database owned by its own login role, so a study's URL grants nothing else.

PostgreSQL refuses to run as root; when runnerctl runs as root, the server runs as the
`postgres` system user (created by Debian's postgresql package) and owns the data dir.
`start` is idempotent (a reboot leaves a stopped server; start it again) and `stop` is
a fast shutdown that keeps every committed transaction.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import pwd
import re
import secrets
import shutil
import subprocess
from pathlib import Path

from runnerctl.errors import ConfigError, RunnerctlError

ADMIN_ROLE = "runnerctl_admin"
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,47}$")
MAX_CONNECTIONS = 200
"""Room for 16 workers x a pool of 4 plus heartbeats, per study, for a few studies."""


class PostgresError(RunnerctlError):
    """The server could not be initialised, started, stopped or reached."""


@dataclasses.dataclass(frozen=True)
class PostgresConfig:
    base_dir: Path  # holds data/, secrets/ and server.log
    listen: str = "127.0.0.1"
    port: int = 5432

    @property
    def data_dir(self) -> Path:
        return self.base_dir / "data"

    @property
    def secrets_dir(self) -> Path:
        return self.base_dir / "secrets"

    @property
    def log_file(self) -> Path:
        return self.base_dir / "server.log"


def find_bindir() -> Path:
    """Debian keeps initdb/pg_ctl off PATH: ask pg_config, else the newest installed."""
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidate = Path(out.stdout.strip())
        if (candidate / "initdb").exists():
            return candidate
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    if shutil.which("initdb"):
        return Path(shutil.which("initdb") or "").parent
    raise PostgresError("PostgreSQL server binaries (initdb, pg_ctl) not found",
                        hint="install them, e.g. `apt-get install postgresql`, or use an external "
                        "PostgreSQL URL")


def check_name(name: str, what: str = "study") -> str:
    if not _NAME.match(name):
        raise ConfigError(f"{what} name {name!r} must start with a lowercase letter and hold only "
                          "lowercase letters, digits and _ (at most 48)")
    return name


class PostgresServer:
    def __init__(self, config: PostgresConfig) -> None:
        self.config = config
        self.bindir = find_bindir()
        self._user = "postgres" if os.geteuid() == 0 else None

    # -- life cycle --------------------------------------------------------------------
    def initialised(self) -> bool:
        return (self.config.data_dir / "PG_VERSION").exists()

    def init(self) -> bool:
        """Create the cluster once; False when it already exists (nothing is touched)."""
        if self.initialised():
            return False
        cfg = self.config
        cfg.secrets_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        cfg.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        password = self._secret(ADMIN_ROLE, create=True)
        pwfile = cfg.base_dir / ".initdb-pw"
        pwfile.write_text(password + "\n")
        try:
            self._own(cfg.data_dir, pwfile, cfg.base_dir)
            self._run("initdb", "-D", str(cfg.data_dir), "-U", ADMIN_ROLE, "--auth=scram-sha-256",
                      f"--pwfile={pwfile}", "-E", "UTF8", "--locale=C.UTF-8")
        finally:
            pwfile.unlink(missing_ok=True)
        with (cfg.data_dir / "postgresql.conf").open("a") as conf:
            conf.write(f"\n# written by runnerctl postgres init\nlisten_addresses = '{cfg.listen}'\n"
                       f"port = {cfg.port}\nunix_socket_directories = '{cfg.data_dir}'\n"
                       f"max_connections = {MAX_CONNECTIONS}\npassword_encryption = scram-sha-256\n")
        (cfg.data_dir / "pg_hba.conf").write_text(
            "# written by runnerctl: passwords only, every connection\n"
            "local all all scram-sha-256\n"
            "host all all 0.0.0.0/0 scram-sha-256\n"
            "host all all ::/0 scram-sha-256\n")
        self._own(cfg.data_dir / "postgresql.conf", cfg.data_dir / "pg_hba.conf")
        return True

    def running(self) -> bool:
        if not self.initialised():
            return False
        result = self._run("pg_ctl", "status", "-D", str(self.config.data_dir), check=False)
        return result.returncode == 0

    def start(self) -> bool:
        """Start the server; False when it was already running."""
        if not self.initialised():
            raise PostgresError(f"no PostgreSQL cluster in {self.config.data_dir}",
                                hint="run `runnerctl postgres init` first")
        if self.running():
            return False
        self.config.log_file.touch()
        self._own(self.config.log_file)
        result = self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.config.data_dir),
                           "-l", str(self.config.log_file), check=False)
        if result.returncode != 0:
            tail = self.config.log_file.read_text().strip().splitlines()[-3:]
            raise PostgresError(f"PostgreSQL did not start: {' | '.join(tail) or result.stderr.strip()}",
                                hint=f"see {self.config.log_file}")
        return True

    def stop(self) -> bool:
        """Fast shutdown (clients disconnected, committed data kept); False if not running."""
        if not self.running():
            return False
        self._run("pg_ctl", "stop", "-w", "-m", "fast", "-D", str(self.config.data_dir))
        return True

    # -- URLs and studies ----------------------------------------------------------------
    def url(self, role: str = ADMIN_ROLE, database: str = "postgres") -> str:
        password = self._secret(role)
        host = "127.0.0.1" if self.config.listen in ("*", "0.0.0.0", "") else self.config.listen
        return f"postgresql+psycopg://{role}:{password}@{host}:{self.config.port}/{database}"

    def create_database(self, name: str) -> str:
        """A database and a login role of the same name that owns only it; returns its URL."""
        import psycopg
        from psycopg import sql

        check_name(name)
        password = self._secret(name, create=True)
        with psycopg.connect(_libpq(self.url()), autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
            verb = "ALTER" if exists else "CREATE"
            conn.execute(sql.SQL(verb + " ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE "
                                 "PASSWORD {}").format(sql.Identifier(name), sql.Literal(password)))
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(name), sql.Identifier(name)))
            conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(name)))
        return self.url(name, name)

    # -- helpers ---------------------------------------------------------------------------
    def _secret(self, role: str, *, create: bool = False) -> str:
        path = self.config.secrets_dir / f"{role}.password"
        if path.exists():
            return path.read_text().strip()
        if not create:
            raise PostgresError(f"no password stored for role {role!r}",
                                hint=f"run `runnerctl postgres create-study {role}` first")
        self.config.secrets_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        password = secrets.token_urlsafe(24)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(password + "\n")
        return password

    def _own(self, *paths: Path) -> None:
        if self._user is None:
            return
        entry = pwd.getpwnam(self._user)
        for path in paths:
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        try:
            result = subprocess.run([str(self.bindir / tool), *args], capture_output=True, text=True,
                                    user=self._user, check=False, timeout=120,
                                    cwd=str(self.config.base_dir))
        except PermissionError as exc:
            raise PostgresError(f"cannot run {tool} as {self._user}: {exc}",
                                hint="every directory above the data dir must be searchable by "
                                f"the {self._user} user") from None
        if check and result.returncode != 0:
            message = (result.stderr or result.stdout).strip().splitlines()
            raise PostgresError(f"{tool} failed: {message[-1] if message else result.returncode}")
        return result


def _libpq(url: str) -> str:
    """psycopg wants postgresql://, SQLAlchemy URLs name the driver."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)
