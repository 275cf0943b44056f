"""Test-only handler of the Kafka fault scenarios (``--handler
tests.integration.fault_handlers:counting_handler``): the reference handler of the run's
``--schema``, after ``$FENCE_TEST_BATCH_DELAY_S`` per batch (a backlog that lasts through a
failover), counting each record's committed applications in ``<schema>.applied`` (``n`` per
topic, partition, offset) in the same transaction: a duplicate is ``n > 1``, a loss an
offset below the high watermark without a row.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

from fencing.handler import HandlerContext, handler, handler_factory
from fencing.store import HandlerFn
from fencing.types import SourceRecord, Verdict
from ops.reference.pg import ensure_tables, make_pg_handler

__all__ = ["counting_handler"]


async def _ensure(conn: Any, context: HandlerContext) -> None:
    await ensure_tables(conn, context.schema)
    await conn.execute(
        f'CREATE TABLE IF NOT EXISTS "{context.schema}".applied (topic text, partition int,'
        ' "offset" bigint, n int NOT NULL, PRIMARY KEY (topic, partition, "offset"))')


@handler_factory(ensure_tables=_ensure)
def counting_handler(context: HandlerContext) -> HandlerFn:
    inner = make_pg_handler(schema=context.schema)
    delay_s = float(os.environ.get("FENCE_TEST_BATCH_DELAY_S", "0"))
    count = (f'INSERT INTO "{context.schema}".applied AS a (topic, partition, "offset", n)'
             ' SELECT $1, p, o, 1 FROM unnest($2::int[], $3::bigint[]) AS t(p, o)'
             ' ON CONFLICT (topic, partition, "offset") DO UPDATE SET n = a.n + 1')

    @handler(durability="durable-critical", effects="transactional")
    async def handle(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
        if delay_s:
            await asyncio.sleep(delay_s)
        verdicts = list(await inner(conn, records))
        await conn.execute(count, records[0].topic, [r.partition for r in records],
                           [r.offset for r in records])
        return verdicts

    return handle
