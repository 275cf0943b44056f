"""PostgreSQL for the local stack: Debian's binaries, an own cluster under ``.stack/``.

Rules:
- Never touches a system cluster: own data directory, own loopback port, own
  unix socket directory (``.stack/postgres/run``).
- initdb refuses root, so when run as root every server binary runs as the
  ``postgres`` OS user and the data directory belongs to it.
- The project role's password is generated once into ``.stack/postgres/password``
  (mode 0600) and reaches ``psql`` only through stdin or ``PGPASSWORD``, never argv.
"""

from __future__ import annotations

import glob
import hashlib
import os
import pwd
import secrets
import shutil
import signal
import subprocess
from pathlib import Path

from ops.stack.config import DB_NAME, DB_USER, HOST, Service, StackError, StackSettings
from ops.stack.procs import spawn

__all__ = ["STOP_SIGNAL", "check", "marker", "password", "provision", "start"]

# SIGINT is PostgreSQL's "fast shutdown": it does not wait for clients to disconnect.
STOP_SIGNAL = signal.SIGINT
_SERVER_USER = "postgres"


def _traversable(path: Path) -> bool:
    return all(p.stat().st_mode & 0o001 for p in (path, *path.parents) if p.exists())


def _pg_home(settings: StackSettings) -> Path:
    """Where ``data/`` and ``run/`` live: ``.stack/postgres``, unless we are root and the
    ``postgres`` user cannot traverse the checkout's parents (e.g. a clone under a 0700
    home); then a per-checkout directory under /var/tmp that it can reach."""
    svc = settings.paths.service_dir(Service.POSTGRES)
    if os.geteuid() != 0 or _traversable(settings.paths.root.parent):
        return svc
    digest = hashlib.sha256(str(svc).encode()).hexdigest()[:12]
    return Path("/var/tmp") / f"fenceworker-pg-{digest}"


def _data_dir(settings: StackSettings) -> Path:
    return _pg_home(settings) / "data"


def _run_dir(settings: StackSettings) -> Path:
    return _pg_home(settings) / "run"


def marker(settings: StackSettings) -> str:
    """A string the server's command line contains (its data directory)."""
    return str(_data_dir(settings))


def password(settings: StackSettings) -> str:
    """The project role's password, created on first use."""
    path = settings.paths.pg_password_file
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_hex(16)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(value + "\n")
    return value


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version_key)
    return Path(found[-1]).parent if found else None


def _version_key(path: str) -> tuple[int, ...]:
    part = Path(path).parent.parent.name
    return tuple(int(x) for x in part.split(".") if x.isdigit())


def _install() -> Path:
    if os.geteuid() != 0:
        raise StackError(
            "PostgreSQL server binaries not found (/usr/lib/postgresql/*/bin/initdb); "
            "install them: sudo apt-get update && sudo apt-get install -y postgresql"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update"], ["apt-get", "install", "-y", "postgresql"]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
            raise StackError(f"`{' '.join(argv)}` failed (exit {done.returncode}):\n{tail}")
    found = _bin_dir()
    if found is None:
        raise StackError("apt-get installed postgresql but no /usr/lib/postgresql/*/bin/initdb")
    return found


def _server_user() -> str | None:
    """The OS user for server binaries: ``postgres`` when we are root, else ourselves."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(_SERVER_USER)
    except KeyError:
        raise StackError(
            "running as root but no `postgres` OS user exists; reinstall the Debian package: "
            "apt-get install --reinstall -y postgresql-common"
        ) from None
    return _SERVER_USER


def _own(path: Path, user: str | None, mode: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)
    path.chmod(mode)


def _initdb(bin_dir: Path, data: Path, user: str | None) -> None:
    if (data / "PG_VERSION").exists():
        return
    if data.exists() and any(data.iterdir()):
        shutil.rmtree(data)  # a half-made cluster from an interrupted initdb; ours to remove
    _own(data, user, 0o700)
    argv = [
        str(bin_dir / "initdb"),
        "-D",
        str(data),
        "-U",
        "postgres",
        "-E",
        "UTF8",
        "--no-locale",
        "--auth-local=trust",
        "--auth-host=scram-sha-256",
    ]
    done = subprocess.run(
        argv, capture_output=True, text=True, check=False, user=user, cwd=str(data.parent)
    )
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise StackError(f"initdb failed (exit {done.returncode}):\n{tail}")


def start(settings: StackSettings) -> int:
    """Install if needed, initdb once, start the server detached; return its pid."""
    bin_dir = _bin_dir() or _install()
    user = _server_user()
    svc = settings.paths.service_dir(Service.POSTGRES)
    svc.mkdir(parents=True, exist_ok=True)
    svc.chmod(0o755)
    settings.paths.root.chmod(0o755)
    data, run = _data_dir(settings), _run_dir(settings)
    if user is not None:
        _own(data.parent, None, 0o755)
    _initdb(bin_dir, data, user)
    _own(run, user, 0o755)
    argv = [
        str(bin_dir / "postgres"),
        "-D",
        str(data),
        "-c",
        f"listen_addresses={HOST}",
        "-c",
        f"port={settings.ports.postgres}",
        "-c",
        f"unix_socket_directories={run}",
        "-c",
        "max_connections=200",
        "-c",
        "logging_collector=off",
        # logical decoding for Debezium's connector (fencectl stack up --with debezium)
        "-c",
        "wal_level=logical",
        "-c",
        "max_replication_slots=10",
        "-c",
        "max_wal_senders=10",
    ]
    return spawn(
        argv,
        log_path=settings.paths.log_file(Service.POSTGRES),
        pid_path=settings.paths.pid_file(Service.POSTGRES),
        cwd=data.parent,
        user=user,
    )


def _psql(settings: StackSettings, sql: str, *, env: dict[str, str], timeout_s: float) -> str:
    bin_dir = _bin_dir()
    exe = str(bin_dir / "psql") if bin_dir else "psql"
    argv = [exe, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-tA"]
    full_env = {**os.environ, "PGCONNECT_TIMEOUT": "3", **env}
    try:
        done = subprocess.run(
            argv,
            input=sql,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise StackError(f"psql did not answer within {timeout_s:.0f} s") from None
    if done.returncode != 0:
        raise StackError(done.stderr.strip() or f"psql exited {done.returncode}")
    return done.stdout.strip()


def run_sql(settings: StackSettings, sql: str, *, timeout_s: float = 15.0) -> str:
    """Run ``sql`` with psql as the cluster's superuser over its socket; raises StackError."""
    env = {
        "PGHOST": str(_run_dir(settings)),
        "PGPORT": str(settings.ports.postgres),
        "PGUSER": "postgres",
        "PGDATABASE": "postgres",
    }
    return _psql(settings, sql, env=env, timeout_s=timeout_s)


def provision(settings: StackSettings) -> None:
    """Create (or update) the project role and database; raises StackError while not ready."""
    secret = password(settings)
    sql = f"""
DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{DB_USER}') THEN
    CREATE ROLE {DB_USER} LOGIN CREATEDB CREATEROLE PASSWORD '{secret}';
  ELSE
    ALTER ROLE {DB_USER} LOGIN CREATEDB CREATEROLE PASSWORD '{secret}';
  END IF;
  -- the benchmarks start every run from a CHECKPOINT (ops/bench/runs.py); PostgreSQL 15+
  IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'pg_checkpoint') THEN
    GRANT pg_checkpoint TO {DB_USER};
  END IF;
END $$;
SELECT 'CREATE DATABASE {DB_NAME} OWNER {DB_USER}'
 WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '{DB_NAME}')\\gexec
"""
    env = {
        "PGHOST": str(_run_dir(settings)),
        "PGPORT": str(settings.ports.postgres),
        "PGUSER": "postgres",
        "PGDATABASE": "postgres",
    }
    _psql(settings, sql, env=env, timeout_s=15.0)


def check(settings: StackSettings) -> str | None:
    """Run ``SELECT 1`` over TCP as the project role; None when healthy, else the reason."""
    env = {
        "PGHOST": HOST,
        "PGPORT": str(settings.ports.postgres),
        "PGUSER": DB_USER,
        "PGDATABASE": DB_NAME,
        "PGPASSWORD": password(settings),
    }
    try:
        out = _psql(settings, "SELECT 1;", env=env, timeout_s=10.0)
    except StackError as exc:
        return str(exc)
    return None if out == "1" else f"unexpected answer to SELECT 1: {out!r}"
