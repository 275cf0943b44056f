"""Members of a group start together: their factories' ``ensure_tables`` must not race
PostgreSQL's catalog. A plain ``CREATE TABLE IF NOT EXISTS`` from four connections at once
fails on ``pg_type_typname_nsp_index`` for most of the losers (89 of 120 here, without the
lock; once in CI, as a member's exit 2); through the loaded handler every one succeeds."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg
import pytest

from fencing.handler import HandlerContext, build_from, handler, handler_factory
from fencing.types import ACCEPT, SourceRecord, Verdict

pytestmark = pytest.mark.integration

MEMBERS = 4
ROUNDS = 10


async def _create(conn: Any, context: HandlerContext) -> None:
    await conn.execute(f'CREATE TABLE IF NOT EXISTS "{context.schema}".seen'
                       ' (k text PRIMARY KEY, n int NOT NULL)')


@handler_factory(ensure_tables=_create)
def _seen(context: HandlerContext) -> Any:
    @handler(durability="durable-critical", effects="transactional")
    async def handle(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
        return [ACCEPT] * len(records)
    return handle


async def _member(dsn: str, schema: str) -> str | None:
    loaded = build_from(_seen, HandlerContext(schema, "g", ("t",), {}), label="seen")
    assert loaded.ensure_tables is not None
    conn = await asyncpg.connect(dsn)
    try:
        await loaded.ensure_tables(conn)
        return None
    except asyncpg.PostgresError as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        await conn.close()


async def test_members_starting_together_all_create_the_handlers_tables(services: Any) -> None:
    admin = await asyncpg.connect(services.dsn)
    try:
        for _ in range(ROUNDS):
            schema = f"ens_{uuid.uuid4().hex[:8]}"
            await admin.execute(f'CREATE SCHEMA "{schema}"')
            try:
                failures = [f for f in await asyncio.gather(
                    *(_member(services.dsn, schema) for _ in range(MEMBERS))) if f]
                assert failures == []
                assert await admin.fetchval("SELECT to_regclass($1) IS NOT NULL",
                                            f'"{schema}".seen')
            finally:
                await admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
    finally:
        await admin.close()
