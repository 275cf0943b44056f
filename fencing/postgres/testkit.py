"""The PostgreSQL side of the handler test kit (``fencing.testing``): run schemas, the run's
store and connections, and snapshots of committed tables.

Rules
- Every run gets a freshly migrated schema ``kit_<hex>``; the tables present right after the
  migration are the fence's own and are never part of a snapshot. A run's connections put
  its schema first on ``search_path`` (then ``public``), so a handler's unqualified tables
  land in it, and ``HandlerContext.schema`` names it.
- ``snapshot`` reads committed state only (its own connection, READ COMMITTED): every
  ordinary table of the run schema but the fence's, each row as canonical ``jsonb`` text,
  without identity columns and columns whose default is volatile (``nextval``, ``now()``,
  random): those differ between two runs whatever the handler does (sequences are not
  transactional). The quarantine is projected to (topic, partition, offset, reason).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg

from fencing.postgres.schema import migrate, quote_schema
from fencing.postgres.store import PgFenceStore

__all__ = ["RunSchema", "connect", "snapshot"]

_RUN_DEPENDENT = """
SELECT c.relname AS table_name, a.attname AS column_name
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped
  AND (a.attidentity <> '' OR pg_get_expr(d.adbin, d.adrelid) ~* $2)
"""
_VOLATILE = (r"nextval|now\(|clock_timestamp|statement_timestamp|transaction_timestamp|"
             r"current_timestamp|localtimestamp|random|gen_random_uuid|uuid_generate")
_TABLES = ("SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
           "WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') ORDER BY 1")


def _settings(schema: str) -> dict[str, str]:
    return {"search_path": f"{quote_schema(schema)}, public"}


async def connect(dsn: str, schema: str) -> Any:
    """A connection with ``schema`` first on its search path."""
    return await asyncpg.connect(dsn, server_settings=_settings(schema))


class RunSchema:
    """One run's schema: created and migrated by ``create``, dropped by ``drop``."""

    def __init__(self, dsn: str, name: str, fence_tables: Sequence[str]) -> None:
        self.dsn = dsn
        self.name = name
        self.fence_tables = frozenset(fence_tables)

    @classmethod
    async def create(cls, dsn: str) -> RunSchema:
        name = f"kit_{uuid.uuid4().hex[:10]}"
        conn = await asyncpg.connect(dsn)
        try:
            await migrate(conn, name)
            tables = [r[0] for r in await conn.fetch(_TABLES, name)]
        finally:
            await conn.close()
        return cls(dsn, name, tables)

    async def store(self, dsn: str, *, group_id: str) -> PgFenceStore:
        """A fence store for this schema over ``dsn`` (the kit's proxy, or the server)."""
        return await PgFenceStore.connect(dsn, group_id=group_id, schema=self.name,
                                          pool_max=2, server_settings=_settings(self.name))

    async def drop(self) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute(f"DROP SCHEMA IF EXISTS {quote_schema(self.name)} CASCADE")
        finally:
            await conn.close()


async def snapshot(conn: Any, run: RunSchema, *, group_id: str | None = None,
                   ignore: Sequence[str] = ()) -> tuple[dict[str, list[str]], list[str]]:
    """The committed rows of the run's handler tables (plus the quarantine of ``group_id``
    when given) and the ``table.column`` names left out (see the module Rules). ``ignore``:
    more ``table.column`` names to leave out."""
    s = quote_schema(run.name)
    left_out: dict[str, list[str]] = {}
    for r in await conn.fetch(_RUN_DEPENDENT, run.name, _VOLATILE):
        if r["table_name"] in run.fence_tables:
            continue
        left_out.setdefault(r["table_name"], []).append(r["column_name"])
    for name in ignore:
        table, _, column = name.partition(".")
        left_out.setdefault(table, []).append(column)
    out: dict[str, list[str]] = {}
    for (table,) in await conn.fetch(_TABLES, run.name):
        if table in run.fence_tables:
            continue
        q = f'{s}."{table.replace(chr(34), chr(34) * 2)}"'
        rows = await conn.fetch(f"SELECT (to_jsonb(t) - $1::text[])::text FROM {q} t",
                                left_out.get(table, []))
        out[table] = sorted(r[0] for r in rows)
    if group_id is not None:
        rows = await conn.fetch(f'SELECT topic, partition, "offset", reason FROM {s}.quarantine '
                                "WHERE group_id = $1", group_id)
        out["(fence quarantine)"] = sorted(
            f"{r['topic']}[{r['partition']}]@{r['offset']}: {r['reason']}" for r in rows)
    names = sorted(f"{t}.{c}" for t, cols in left_out.items() for c in cols)
    return out, names
