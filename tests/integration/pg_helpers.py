"""PostgreSQL helpers for the fence store's integration and contract tests.

Their fixtures (``pg_dsn``, ``fence_schema``, ``pg_store``) are in ``tests/conftest.py``:
``pg_dsn`` uses ``FENCE_DSN`` when set, else the session ``services`` fixture (which starts
the local stack). Every test gets its own fence schema (migrated) and group id.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from fencing.postgres.schema import migrate
from fencing.types import Accept, Reject, SourceRecord, TopicPartition, Verdict
from ops.stack.connectors import execute  # statements on one connection, for the tests too

__all__ = [
    "Dsn",
    "count_effects",
    "create_fence_schema",
    "drop_schema",
    "effect_handler",
    "execute",
    "make_records",
]


class Dsn(str):
    """A DSN whose repr hides the password (pytest prints fixture values on failure)."""

    __slots__ = ()

    def __repr__(self) -> str:
        parts = urlsplit(self)
        if parts.password is None:
            return super().__repr__()
        return repr(self.replace(f":{parts.password}@", ":***@", 1))


async def create_fence_schema(dsn: str) -> str:
    """A freshly migrated, uniquely named fence schema with an ``effects`` table."""
    schema = f"fence_t_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(dsn)
    try:
        await migrate(conn, schema)
        await conn.execute(
            f'CREATE TABLE "{schema}".effects (topic text, partition int, "offset" bigint,'
            ' value bytea)')  # no key: a double apply shows up as a duplicate
    finally:
        await conn.close()
    return schema


async def drop_schema(dsn: str, schema: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


def make_records(tp: TopicPartition, offsets: Sequence[int], *,
                 bad: Sequence[int] = ()) -> list[SourceRecord]:
    """Records at ``offsets``; values of offsets in ``bad`` start with b"bad" (rejected)."""
    return [SourceRecord(tp.topic, tp.partition, o, f"k{o}".encode(),
                         (b"bad-" if o in bad else b"ok-") + str(o).encode(),
                         (("h", b"v"),)) for o in offsets]


def effect_handler(schema: str) -> Any:
    """A transactional test handler: inserts accepted records into ``<schema>.effects``."""
    sql = (f'INSERT INTO "{schema}".effects (topic, partition, "offset", value)'
           " VALUES ($1, $2, $3, $4)")

    async def handle(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        verdicts: list[Verdict] = [Reject("value starts with bad") if (r.value or b"")
                                   .startswith(b"bad") else Accept() for r in records]
        rows = [(r.topic, r.partition, r.offset, r.value)
                for r, v in zip(records, verdicts, strict=True) if isinstance(v, Accept)]
        if rows:
            await conn.executemany(sql, rows)
        return verdicts

    return handle


async def count_effects(dsn: str, schema: str) -> dict[str, int]:
    """Row counts of effects, quarantine and journal."""
    conn = await asyncpg.connect(dsn)
    try:
        return {
            "effects": await conn.fetchval(f'SELECT count(*) FROM "{schema}".effects'),
            "quarantine": await conn.fetchval(f'SELECT count(*) FROM "{schema}".quarantine'),
            "journal": await conn.fetchval(f'SELECT count(*) FROM "{schema}".journal'),
        }
    finally:
        await conn.close()
