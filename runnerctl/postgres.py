"""A shared PostgreSQL for Optuna studies, run by runnerctl from the host's own binaries.

A hyperparameter search needs one database that every worker reaches; spending a whole
node or GPU slot on it is waste. `runnerctl postgres` runs a small server with initdb and
pg_ctl in a directory of runnerctl's (data/, secrets/, server.log), listening where
configured (default 127.0.0.1) with password authentication (scram-sha-256) only, and
gives every project or study its own database owned by its own login role: a study's URL
opens that database and nothing else (pg_hba `sameuser`, CONNECT revoked from PUBLIC, no
superuser, createdb or createrole). The admin role connects only through the local
socket or loopback. An external server works the same way through its admin URL: the
databases and roles are created there instead.

PostgreSQL refuses to run as root. When runnerctl runs as root, initdb and pg_ctl run as
the `postgres` system user (Debian's postgresql package creates it), with its own group
and no supplementary ones, and that user owns the data directory; every directory above
it must be searchable by that user, which `init` checks. `start` is idempotent (after a
reboot the server is stopped; start it again) and `stop` is a fast shutdown: clients
are disconnected, every committed transaction is kept.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import pwd
import re
import shutil
import socket
import stat
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from runnerctl.errors import ConfigError, RunnerctlError, first_line
from runnerctl.private import key_file, private_dir
from runnerctl.settings import POSTGRES_START_WAIT_S, POSTGRES_STOP_WAIT_S

ADMIN_ROLE = "runnerctl_admin"
SERVER_USER = "postgres"
"""Who runs the server when runnerctl runs as root (Debian's postgresql package user)."""
DEFAULT_DATABASE = "optuna"
"""The project database `runnerctl postgres url` hands out when no name is given."""
MAX_CONNECTIONS = 200
"""runnerctl.optuna's journal uses 1 connection per worker (about 190 workers), its RDB
path at most 2 (about 95)."""
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,47}$")
_RESERVED = {"postgres", "template0", "template1", "public", ADMIN_ROLE}
_WILDCARDS = {"*", "0.0.0.0", "::"}


class PostgresError(RunnerctlError):
    """The server could not be initialised, started, stopped or reached."""


@dataclasses.dataclass(frozen=True)
class PostgresConfig:
    base_dir: Path
    """Holds data/ (the cluster), secrets/ (one password file per role) and server.log."""
    listen: str = "127.0.0.1"
    """listen_addresses: comma-separated addresses, or * for all."""
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


def check_name(name: str, what: str = "study") -> str:
    """Database and role names: short, lowercase, never one of PostgreSQL's own."""
    if not _NAME.match(name) or name in _RESERVED or name.startswith("pg_"):
        raise ConfigError(f"{what} name {name!r} must start with a lowercase letter, hold only "
                          "lowercase letters, digits and _ (at most 48), and not be reserved")
    return name


DEBIAN_BINDIRS = "/usr/lib/postgresql/*/bin"
"""Where Debian installs each major version's server binaries, side by side."""


def find_bindir(data_dir: Path | None = None) -> Path:
    """Debian keeps initdb/pg_ctl off PATH: the binaries of the cluster's own major
    version (`data_dir/PG_VERSION`) when it has one; else ask pg_config, else the newest
    installed. A distribution upgrade installs a new major beside the old one, and the
    newest binaries refuse an older cluster (found by a review as a DBA)."""
    try:
        version = (data_dir / "PG_VERSION").read_text().strip() if data_dir is not None else ""
    except OSError:
        version = ""
    if version:
        own = Path(DEBIAN_BINDIRS.replace("*", version))
        if (own / "pg_ctl").exists():
            return own
    found = _newest_bindir()
    if version and _major(found) not in (version, ""):
        raise PostgresError(f"the cluster in {data_dir} is PostgreSQL {version}, and only "
                            f"PostgreSQL {_major(found)}'s server binaries are installed ({found})",
                            hint=f"install PostgreSQL {version}'s server package, or move the data to "
                                 "the new version: docs/operations.md, \"A new PostgreSQL major version\"")
    return found


def _major(bindir: Path) -> str:
    """The major version of the server binaries in `bindir` ("" when pg_ctl does not say)."""
    result = subprocess.run([str(bindir / "pg_ctl"), "--version"], capture_output=True, text=True,
                            check=False)
    match = re.search(r"\) (\d+)", result.stdout)
    return match.group(1) if match else ""


def _newest_bindir() -> Path:
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidate = Path(out.stdout.strip())
        if (candidate / "initdb").exists():
            return candidate
    found = sorted(Path(p).parent for p in glob.glob(f"{DEBIAN_BINDIRS}/initdb"))
    found.sort(key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    if found:
        return found[-1]
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise PostgresError("PostgreSQL server binaries (initdb, pg_ctl) not found",
                        hint="install them, e.g. `apt-get install postgresql`, or set "
                        "[postgres] url to an external server")


class Secrets:
    """One password per role, in files only their owner reads (0600 in a 0700 dir)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def get(self, role: str) -> str | None:
        """The role's password; None when it has none. An empty or short file is an error."""
        path = self.directory / f"{role}.password"
        return key_file(path) if path.exists() else None

    def get_or_create(self, role: str) -> str:
        """URL-safe (it goes into storage URLs as it is), written whole: runnerctl.private."""
        private_dir(self.directory)
        return key_file(self.directory / f"{role}.password")


class PostgresServer:
    """runnerctl's own server: initdb once, start/stop with pg_ctl, admin over the socket."""

    def __init__(self, config: PostgresConfig) -> None:
        self.config = config
        self.bindir = find_bindir(config.data_dir)
        self.secrets = Secrets(config.secrets_dir)
        self._as = _server_user() if os.geteuid() == 0 else None

    # -- life cycle ------------------------------------------------------------------
    def initialised(self) -> bool:
        return (self.config.data_dir / "PG_VERSION").exists()

    def init(self) -> bool:
        """Create the cluster once; False when it already exists (nothing is touched). An
        existing one made with another port or listen address than the settings now say
        is refused: it kept the old ones, and the URLs runnerctl hands out named the new
        (found by a review as a DBA)."""
        if self.initialised():
            self.check_made_with()
            return False
        cfg = self.config
        _check_listen(cfg.listen)
        cfg.base_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        if self._as is not None:
            _check_reachable(cfg.base_dir, self._as)
        cfg.data_dir.mkdir(exist_ok=True, mode=0o700)
        pwfile = cfg.base_dir / ".initdb-password"
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(self.secrets.get_or_create(ADMIN_ROLE) + "\n")
        try:
            self._own(cfg.data_dir, pwfile)
            self._run("initdb", "-D", str(cfg.data_dir), "-U", ADMIN_ROLE, "--auth=scram-sha-256",
                      f"--pwfile={pwfile}", "-E", "UTF8", "--no-locale")
        finally:
            pwfile.unlink(missing_ok=True)
        with (cfg.data_dir / "postgresql.conf").open("a") as conf:
            conf.write(f"\n# written by runnerctl postgres init\nlisten_addresses = '{cfg.listen}'\n"
                       f"port = {cfg.port}\nunix_socket_directories = '{cfg.data_dir}'\n"
                       f"max_connections = {MAX_CONNECTIONS}\npassword_encryption = scram-sha-256\n")
        (cfg.data_dir / "pg_hba.conf").write_text(_PG_HBA)
        return True

    def running(self) -> bool:
        if not self.initialised():
            return False
        return self._run("pg_ctl", "status", "-D", str(self.config.data_dir), check=False).returncode == 0

    def start(self) -> bool:
        """Start the server; False when it was already running."""
        if not self.initialised():
            raise PostgresError(f"no PostgreSQL cluster in {self.config.data_dir}",
                                hint="run `runnerctl postgres init` first")
        if self.running():
            return False
        log = self.config.log_file
        # the server's log is its user's alone: a failed statement is logged whole, and a
        # role's CREATE ... PASSWORD with it (it was 0644, read by every user of the host)
        os.close(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600))
        log.chmod(0o600)
        self._own(log)
        # -t: crash recovery after a power loss can take minutes; killed at 60 s, it began again
        result = self._run("pg_ctl", "start", "-w", "-t", str(POSTGRES_START_WAIT_S),
                           "-D", str(self.config.data_dir), "-l", str(log), check=False)
        if result.returncode != 0:
            tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
            raise PostgresError(f"PostgreSQL did not start: {tail or result.stderr.strip()}",
                                hint=f"see {log}")
        return True

    def stop(self) -> bool:
        """Fast shutdown (clients disconnected, committed data kept); False if not running."""
        if not self.running():
            return False
        self._run("pg_ctl", "stop", "-w", "-t", str(POSTGRES_STOP_WAIT_S), "-m", "fast",
                  "-D", str(self.config.data_dir))
        return True

    # -- URLs --------------------------------------------------------------------------
    def admin_url(self) -> str:
        """The superuser, over the server's own socket (pg_hba refuses it from the network)."""
        password = self.secrets.get(ADMIN_ROLE)
        if password is None:
            raise PostgresError(f"no admin password in {self.config.secrets_dir}",
                                hint="run `runnerctl postgres init` first")
        return (f"postgresql+psycopg://{ADMIN_ROLE}:{password}@/postgres"
                f"?host={quote(str(self.config.data_dir))}&port={self.config.port}")

    def host(self) -> str:
        """The address workers use: the first listen address, this host's name for `*`."""
        entries = [e.strip() for e in self.config.listen.split(",") if e.strip()]
        if not entries or any(e in _WILDCARDS for e in entries):
            return socket.getfqdn()
        return entries[0]

    def create_database(self, name: str, *, host: str | None = None) -> str:
        """Database + role NAME on this server (see `create_database`); URL names `host()`."""
        return create_database(self.admin_url(), name, self.secrets, host=host or self.host())

    # -- helpers ---------------------------------------------------------------------------
    def check_made_with(self) -> None:
        """PostgresError when the cluster was made with another port or listen address than
        the settings say: start, status and url reported and named the settings' port, on
        which nothing answered (found by a review fuzzing the CLI)."""
        made = self._made_with()
        wanted = {"port": str(self.config.port), "listen_addresses": self.config.listen}
        differ = [f"{name} {made[name]} (settings: {value})" for name, value in wanted.items()
                  if name in made and made[name] != value]
        if differ:
            raise PostgresError(f"the server in {self.config.data_dir} was made with {', '.join(differ)}",
                                hint="set [postgres] port and listen back (or the options), or change "
                                     "them in its postgresql.conf and restart it")

    def _made_with(self) -> dict[str, str]:
        """port and listen_addresses as the cluster's postgresql.conf sets them (the last
        line of a name wins, as PostgreSQL reads it)."""
        found: dict[str, str] = {}
        try:
            text = (self.config.data_dir / "postgresql.conf").read_text()
        except OSError:
            return found
        for line in text.splitlines():
            name, _, value = line.partition("#")[0].partition("=")
            if name.strip() in ("port", "listen_addresses") and value.strip():
                found[name.strip()] = value.strip().strip("'")
        return found

    def _own(self, *paths: Path) -> None:
        if self._as is not None:
            for path in paths:
                os.chown(path, self._as.pw_uid, self._as.pw_gid)

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        user: dict[str, Any] = {}
        if self._as is not None:  # its own uid and gid, none of root's groups
            user = {"user": self._as.pw_uid, "group": self._as.pw_gid, "extra_groups": []}
        try:
            result = subprocess.run([str(self.bindir / tool), *args], capture_output=True, text=True,
                                    check=False, timeout=180, cwd=str(self.config.base_dir), **user)
        except PermissionError as exc:
            raise PostgresError(f"cannot run {tool}: {exc}") from None
        if check and result.returncode != 0:
            message = (result.stderr or result.stdout).strip().splitlines()
            raise PostgresError(f"{tool} failed: {message[-1] if message else result.returncode}")
        return result


_PG_HBA = """\
# written by runnerctl: passwords (scram-sha-256) for every connection; the admin only
# through the socket or loopback; a study role only into its own database (sameuser)
local   sameuser  all                               scram-sha-256
local   all       runnerctl_admin                   scram-sha-256
host    all       runnerctl_admin   127.0.0.1/32    scram-sha-256
host    all       runnerctl_admin   ::1/128         scram-sha-256
host    all       runnerctl_admin   0.0.0.0/0       reject
host    all       runnerctl_admin   ::/0            reject
host    sameuser  all               0.0.0.0/0       scram-sha-256
host    sameuser  all               ::/0            scram-sha-256
"""


def _server_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(SERVER_USER)
    except KeyError:
        raise PostgresError(f"PostgreSQL refuses to run as root and there is no {SERVER_USER!r} user",
                            hint="install Debian's postgresql package, or `useradd --system "
                            "postgres`, or run runnerctl postgres as another user") from None


def _check_listen(listen: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9.:*%_-]+(\s*,\s*[A-Za-z0-9.:*%_-]+)*", listen):
        raise ConfigError(f"listen address {listen!r} is not a comma-separated list of addresses")


def _check_reachable(path: Path, user: pwd.struct_passwd) -> None:
    """Every directory above the data dir must let `user` pass (x), or initdb fails oddly."""
    groups = set(os.getgrouplist(user.pw_name, user.pw_gid))
    for directory in [path.resolve(), *path.resolve().parents]:
        info = directory.stat()
        if info.st_uid == user.pw_uid:
            ok = bool(info.st_mode & stat.S_IXUSR)
        elif info.st_gid in groups:
            ok = bool(info.st_mode & stat.S_IXGRP)
        else:
            ok = bool(info.st_mode & stat.S_IXOTH)
        if not ok:
            raise PostgresError(f"the {user.pw_name} user cannot enter {directory}, above the data dir",
                                hint=f"chmod o+x {directory}, or choose another --dir")


# -- databases and roles, on runnerctl's server or an external one -------------------------
def database_exists(admin_url: str, name: str) -> bool:
    """Whether the server holds a database NAME (asked as admin; changes nothing)."""
    import psycopg

    try:
        with psycopg.connect(libpq_url(admin_url), autocommit=True, connect_timeout=10) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            return found is not None
    except psycopg.Error as exc:
        raise PostgresError(f"cannot reach PostgreSQL as admin: {first_line(exc)}",
                            hint="is it running? `runnerctl postgres status`") from None


def create_database(admin_url: str, name: str, secrets_: Secrets, *, host: str | None = None) -> str:
    """A database NAME owned by a login role NAME and nothing more; returns its storage URL.

    The URL names `host`, else the admin URL's host. Idempotent. The password lives in
    `secrets_`; a role that exists without one there was
    made elsewhere (another host), and is refused rather than given a new password.
    """
    import psycopg
    from psycopg import sql

    check_name(name)
    known = secrets_.get(name)
    try:
        with psycopg.connect(libpq_url(admin_url), autocommit=True, connect_timeout=10) as conn:
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
            if exists and known is None:
                raise PostgresError(f"role {name!r} exists but its password is not in "
                                    f"{secrets_.directory}",
                                    hint="use the URL from the host that created it")
            password = known or secrets_.get_or_create(name)
            verb = "ALTER" if exists else "CREATE"
            conn.execute(sql.SQL(verb + " ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE "
                                 "NOREPLICATION PASSWORD {}").format(sql.Identifier(name),
                                                                     sql.Literal(password)))
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(name), sql.Identifier(name)))
            conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(name)))
    except psycopg.Error as exc:
        raise PostgresError(f"cannot reach PostgreSQL as admin: {first_line(exc)}",
                            hint="is it running? `runnerctl postgres status`") from None
    return database_url(admin_url, name, password, host=host)


def database_url(admin_url: str, name: str, password: str, *, host: str | None = None) -> str:
    """The storage URL of role+database NAME on the admin URL's server (or at `host`)."""
    parts = urlsplit(admin_url)
    query = [p for p in parts.query.split("&") if p and p.split("=", 1)[0] not in ("host", "port")]
    port = parts.port or int(dict(p.split("=", 1) for p in parts.query.split("&") if "=" in p)
                             .get("port", "5432"))
    url = urlunsplit(("postgresql+psycopg", f"{name}:{password}@{parts.hostname or ''}:{port}",
                      f"/{name}", "&".join(query), ""))
    return with_host(url, host) if host else url


def with_host(url: str, host: str) -> str:
    """`url` with another host name, port and everything else kept."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    bracketed = f"[{host}]" if ":" in host else host
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{userinfo}{bracketed}{port}"))


KINDS = ("journal", "rdb")
"""How Optuna keeps a study in a database: runnerctl's journal (a log table; workers read
only what is new: the default) or Optuna's RDB tables (what plain Optuna URLs open)."""
JOURNAL_SCHEME = "journal+postgresql"


def storage_url(url: str, kind: str) -> str:
    """The Optuna storage URL of one database for `kind`: journal+postgresql:// or
    postgresql+psycopg:// (SQLAlchemy's form, which Optuna's RDBStorage takes)."""
    if kind not in KINDS:
        raise ConfigError(f"storage kind {kind!r} is not one of {', '.join(KINDS)}")
    rest = libpq_url(url).partition("://")[2]
    return f"{JOURNAL_SCHEME if kind == 'journal' else 'postgresql+psycopg'}://{rest}"


def libpq_url(url: str) -> str:
    """psycopg wants postgresql://; SQLAlchemy URLs name the driver, journal URLs the kind."""
    scheme, sep, rest = url.partition("://")
    if not sep or not scheme.removeprefix("journal+").startswith(("postgresql", "postgres")):
        raise ConfigError(f"not a PostgreSQL URL: {scheme or url!r}")
    check_user_part(rest)
    return "postgresql://" + rest


def check_user_part(rest: str) -> None:
    """ConfigError if the URL part after `scheme://` has a second '@' before its host ends.
    libpq (fe-connect.c, conninfo_uri_parse_options) ends the user and password at the
    first '@' before any '/', as SQLAlchemy's URL pattern does (`password [^@]*`), so the
    rest of a password with an '@' in it becomes the host, which their errors quote."""
    _, at, after = rest.split("/", 1)[0].partition("@")
    if at and "@" in after.split("?", 1)[0]:
        raise ConfigError("the PostgreSQL URL has more than one '@' before its host: write an '@' "
                          "in the user name or password as %40")


def ping(url: str) -> str:
    """The server's version string, or PostgresError."""
    import psycopg

    try:
        with psycopg.connect(libpq_url(url), connect_timeout=10) as conn:
            row = conn.execute("SHOW server_version").fetchone()
    except psycopg.Error as exc:  # also a URL libpq cannot parse (ProgrammingError)
        raise PostgresError(f"cannot reach PostgreSQL: {first_line(exc)}") from None
    return str(row[0]) if row else "?"

