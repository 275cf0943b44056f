"""Test support for the table sink against real PostgreSQL (the migrated fence schema per
test is ``tests/conftest.py``'s ``schema``): batches through the real fence store, rows and
quarantine reasons read back; ``write_path``, a module's tests run on both ways the COPY
method writes a set of upserts (``Writer.write``: by unnest when the set is small, through
the staging table when it is not), each set forced one way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg
import pytest

from fencing.postgres.sink import SinkSpec, ensure_table, make_table_sink, writer
from fencing.postgres.store import PgFenceStore
from fencing.store import BatchCall
from fencing.types import ClaimRequest, SourceRecord, TopicPartition

__all__ = ["SINK_TP", "apply", "fetch", "write_path"]

SINK_TP = TopicPartition("orders", 0)


@pytest.fixture(params=["unnest", "staged"])
def write_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every set of upserts by unnest (the tests' batches are small: the default), or
    every one through the staging table (``UNNEST_MAX`` 0), for the test's writers."""
    if request.param == "staged":
        monkeypatch.setattr(writer, "UNNEST_MAX", 0)
    return str(request.param)


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
            token = await store.process(BatchCall(tp, batch, sink), token)
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
