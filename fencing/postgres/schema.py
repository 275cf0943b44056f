"""Schema name, numbered migrations and the version check.

Rules
- Migrations are ``fencing/postgres/migrations/NNNN_name.sql``, applied in number order, each in
  its own transaction with ``search_path`` set to the target schema only, and recorded
  in ``<schema>.schema_version``. Applying them again is a no-op.
- Concurrent ``migrate`` calls serialize on a transaction-scoped advisory lock per schema.
- ``check_version`` raises ``SchemaMismatch`` naming the version found and the one this
  build needs; the store refuses to start on any other version (older: run
  ``fencectl migrate``; newer: deploy a newer worker).
- ``grant_worker_sql`` is the least-privilege grant for a worker role: it reads and
  writes the fence tables but cannot change the schema, rewrite the journal, or delete
  (except attempt counts, deleted once their offset commits, and lane completions, deleted
  once the frontier moved past them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from fencing.errors import ConfigError, SchemaMismatch

__all__ = [
    "DEFAULT_SCHEMA",
    "SCHEMA_VERSION",
    "Migration",
    "check_version",
    "current_version",
    "grant_worker_sql",
    "load_migrations",
    "migrate",
    "quote_ident",
    "quote_schema",
]

DEFAULT_SCHEMA = "fence"
_IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def load_migrations() -> tuple[Migration, ...]:
    """Every packaged migration in version order; versions are 1, 2, ... without gaps."""
    found: list[Migration] = []
    for entry in resources.files("fencing.postgres").joinpath("migrations").iterdir():
        m = _FILE.match(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text("utf-8")))
    found.sort(key=lambda mig: mig.version)
    if [mig.version for mig in found] != list(range(1, len(found) + 1)):
        raise AssertionError(f"migrations must be numbered 1..n without gaps: {found}")
    return tuple(found)


SCHEMA_VERSION = len(load_migrations())


def quote_ident(name: str) -> str:
    """Any name (a role, a table, a column) as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def quote_schema(schema: str) -> str:
    """The schema as a quoted identifier; ``ConfigError`` for anything but [a-z_][a-z0-9_]*."""
    if not _IDENT.match(schema):
        raise ConfigError(f"schema {schema!r}: use lowercase letters, digits and _ (max 63)")
    return f'"{schema}"'


async def current_version(conn: Any, schema: str) -> int | None:
    """The highest applied version, or None when the schema has no version table."""
    q = quote_schema(schema)
    exists = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", f"{q}.schema_version")
    if not exists:
        return None
    return int(await conn.fetchval(f"SELECT coalesce(max(version), 0) FROM {q}.schema_version"))


async def check_version(conn: Any, schema: str) -> None:
    """Return when ``schema`` is at ``SCHEMA_VERSION``; raise ``SchemaMismatch`` otherwise."""
    found = await current_version(conn, schema)
    if found != SCHEMA_VERSION:
        shown = "no fence schema" if found is None else f"version {found}"
        older = found is None or found < SCHEMA_VERSION
        raise SchemaMismatch(
            f"schema {schema!r}: found {shown}, this build needs version {SCHEMA_VERSION}"
            + ("" if older else " (upgrade the worker)"), migrate=older)


async def migrate(conn: Any, schema: str = DEFAULT_SCHEMA) -> list[int]:
    """Apply the missing migrations to ``schema`` (created if missing); return the versions applied.

    Raises ``SchemaMismatch`` when the schema is newer than this build.
    """
    q = quote_schema(schema)
    applied: list[int] = []
    for mig in load_migrations():
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))",
                               f"fence-migrate:{schema}")
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {q}")
            await conn.execute(
                f"CREATE TABLE IF NOT EXISTS {q}.schema_version ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            have = int(await conn.fetchval(
                f"SELECT coalesce(max(version), 0) FROM {q}.schema_version"))
            if have > SCHEMA_VERSION:
                raise SchemaMismatch(
                    f"schema {schema!r}: found version {have}, this build knows up to "
                    f"{SCHEMA_VERSION} (upgrade fenceworker)"
                )
            if have >= mig.version:
                continue
            await conn.execute(f"SET LOCAL search_path TO {q}")
            await conn.execute(mig.sql)
            await conn.execute(
                f"INSERT INTO {q}.schema_version (version, name) VALUES ($1, $2)",
                mig.version, mig.name,
            )
            applied.append(mig.version)
    return applied


def grant_worker_sql(schema: str, role: str) -> list[str]:
    """Statements granting ``role`` what a worker needs on ``schema`` and nothing more.

    The worker's own effect tables need their own grants (SELECT/INSERT/UPDATE as the
    handler requires). Run as the schema owner after ``migrate``.
    """
    q = quote_schema(schema)
    r = quote_ident(role)
    return [
        f"GRANT USAGE ON SCHEMA {q} TO {r}",
        f"GRANT SELECT ON {q}.schema_version TO {r}",
        f"GRANT SELECT, INSERT, UPDATE ON {q}.partitions, {q}.members, {q}.quarantine TO {r}",
        f"GRANT SELECT, INSERT ON {q}.journal TO {r}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON {q}.attempts TO {r}",
        f"GRANT SELECT, INSERT, UPDATE ON {q}.intents TO {r}",
        f"GRANT SELECT, INSERT, DELETE ON {q}.completions TO {r}",
        f"GRANT USAGE ON SEQUENCE {q}.completions_id_seq TO {r}",
    ]
