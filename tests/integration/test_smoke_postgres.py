"""PostgreSQL is real: an asyncpg round trip through a table in a unique schema."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from ops.stack.config import ServiceSettings

pytestmark = pytest.mark.integration


async def test_asyncpg_creates_writes_and_reads_a_table(services: ServiceSettings) -> None:
    schema = f"smoke_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(services.dsn, timeout=10)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        await conn.execute(
            f'CREATE TABLE "{schema}".items (id int PRIMARY KEY, label text NOT NULL)'
        )
        rows = [(i, f"label-{i}") for i in range(3)]
        async with conn.transaction():
            await conn.executemany(f'INSERT INTO "{schema}".items VALUES ($1, $2)', rows)
        # a second connection sees the committed rows
        other = await asyncpg.connect(services.dsn, timeout=10)
        try:
            got = await other.fetch(f'SELECT id, label FROM "{schema}".items ORDER BY id')
            version = await other.fetchval("SHOW server_version_num")
        finally:
            await other.close()
        assert [(r["id"], r["label"]) for r in got] == rows
        assert int(version) >= 150000
    finally:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()
