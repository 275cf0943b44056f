"""Test support for the table sink against real PostgreSQL: a migrated fence schema per test,
batches through the real fence store, rows and quarantine reasons read back."""

# ruff: noqa: F811  (pytest fixtures imported from pg_helpers are redefined as parameters)

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import pytest

from fencing.postgres.schema import migrate
from fencing.postgres.sink import SinkSpec, ensure_table, make_table_sink
from fencing.postgres.store import PgFenceStore
from fencing.types import ClaimRequest, SourceRecord, TopicPartition
from tests.integration.pg_helpers import pg_dsn  # noqa: F401  (fixture)

__all__ = ["SINK_TP", "apply", "fetch", "schema"]

SINK_TP = TopicPartition("orders", 0)


@pytest.fixture
async def schema(pg_dsn: str) -> AsyncIterator[str]:
    """A freshly migrated fence schema, dropped after the test."""
    name = f"sink_t_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(pg_dsn)
    try:
        await migrate(conn, name)
        yield name
    finally:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        await conn.close()


async def apply(dsn: str, schema: str, spec: SinkSpec, records: list[SourceRecord], *,
                batches: list[list[SourceRecord]] | None = None,
                topics: Sequence[str] = (), tp: TopicPartition = SINK_TP) -> dict[int, str]:
    """Create/validate the table (from the schemas of ``topics`` for a schema'd format),
    process ``records`` in one batch (or ``batches`` one after another); the quarantine
    reasons by offset."""
    conn = await asyncpg.connect(dsn)
    try:
        await ensure_table(conn, spec, topics=topics)
    finally:
        await conn.close()
    store = await PgFenceStore.connect(dsn, group_id="g", schema=schema, pool_max=2)
    try:
        token = (await store.claim([ClaimRequest(tp, 0)], lifetime="L"))[tp]
        sink = make_table_sink(spec)
        for batch in batches if batches is not None else [records]:
            token = await store.process(tp, token, batch, sink)
    finally:
        await store.close()
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(f'SELECT "offset", reason FROM "{schema}".quarantine')
        return {r["offset"]: r["reason"] for r in rows}
    finally:
        await conn.close()


async def fetch(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    conn = await asyncpg.connect(dsn)
    try:
        return [tuple(r) for r in await conn.fetch(sql)]
    finally:
        await conn.close()
