"""Test-only handler factories for worker subprocesses
(``--handler tests.integration.handlers:...``), each the reference handler of the run's
``--schema`` (through ``HandlerContext``) wrapped by one behaviour:

``holding_handler``: while the file ``$FENCE_TEST_HOLD_DIR/hold`` exists it first writes
``held-<pid>-<partition>`` (partition, first and last offset of the batch) and waits,
inside the store's transaction, until the file is removed; without ``FENCE_TEST_HOLD_DIR``
it is exactly the reference handler.

The others misbehave on purpose, each the way one liveness or exit-code test needs:
``slow_handler`` (the reference handler after ``$FENCE_TEST_BATCH_DELAY_S`` per batch),
``swallowing_handler`` (catches a PostgreSQL error without a SAVEPOINT), ``ending_handler``
(ends the store's transaction itself), ``raising_handler`` (raises ``ValueError``),
``undefined_table_handler`` (selects from a table that does not exist) and
``stubborn_handler`` (ignores cancellation while ``$FENCE_TEST_HOLD_DIR/hold`` exists).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import asyncpg

from fencing.handler import HandlerContext, handler, handler_factory
from fencing.store import HandlerFn
from fencing.types import SourceRecord, Verdict
from ops.reference.pg import ensure_tables, make_pg_handler

__all__ = [
    "ending_handler",
    "holding_handler",
    "raising_handler",
    "slow_handler",
    "stubborn_handler",
    "swallowing_handler",
    "undefined_table_handler",
]

Wrap = Callable[[HandlerFn, Any, Sequence[SourceRecord]], Awaitable[Sequence[Verdict]]]


async def _ensure(conn: Any, context: HandlerContext) -> None:
    await ensure_tables(conn, context.schema)


def _factory(wrap: Wrap) -> Callable[[HandlerContext], HandlerFn]:
    """A factory of the reference handler for the run's schema, wrapped by ``wrap``."""
    @handler_factory(ensure_tables=_ensure)
    def build(context: HandlerContext) -> HandlerFn:
        inner = make_pg_handler(schema=context.schema)

        @handler(durability="durable-critical", effects="transactional")
        async def handle(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
            return list(await wrap(inner, conn, records))

        return handle

    return build


async def _hold(inner: HandlerFn, conn: Any, records: Sequence[SourceRecord]) -> Any:
    hold_dir = os.environ.get("FENCE_TEST_HOLD_DIR")
    if hold_dir:
        hold = Path(hold_dir) / "hold"
        if hold.exists():
            (Path(hold_dir) / f"held-{os.getpid()}-{records[0].partition}").write_text(
                f"{records[0].partition} {records[0].offset} {records[-1].offset}")
            while hold.exists():  # noqa: ASYNC110 - a file written by another process
                await asyncio.sleep(0.02)
    return await inner(conn, records)


async def _slow(inner: HandlerFn, conn: Any, records: Sequence[SourceRecord]) -> Any:
    await asyncio.sleep(float(os.environ.get("FENCE_TEST_BATCH_DELAY_S", "0")))
    return await inner(conn, records)


async def _swallow(inner: HandlerFn, conn: Any, records: Sequence[SourceRecord]) -> Any:
    verdicts = await inner(conn, records)
    try:
        await conn.execute("SELECT 1 / 0")  # the transaction is now aborted
    except asyncpg.DivisionByZeroError:
        pass  # the mistake: caught without a SAVEPOINT
    return verdicts


async def _end(inner: HandlerFn, conn: Any, records: Sequence[SourceRecord]) -> Any:
    verdicts = await inner(conn, records)
    await conn.execute("ROLLBACK")  # the mistake: the store owns the transaction
    return verdicts


async def _raise(inner: HandlerFn, conn: Any, records: Sequence[SourceRecord]) -> Any:
    raise ValueError(f"handler bug at offset {records[0].offset}")


async def _undefined(inner: HandlerFn, conn: Any, records: Sequence[SourceRecord]) -> Any:
    await conn.execute("SELECT count(*) FROM no_such_table_for_fenceworker")
    return await inner(conn, records)


async def _stubborn(inner: HandlerFn, conn: Any, records: Sequence[SourceRecord]) -> Any:
    hold_dir = os.environ.get("FENCE_TEST_HOLD_DIR")
    hold = Path(hold_dir) / "hold" if hold_dir else None
    if hold is not None and hold.exists():
        (hold.parent / f"held-{os.getpid()}-{records[0].partition}").write_text(
            f"{records[0].partition} {records[0].offset} {records[-1].offset}")
        deadline = time.monotonic() + 120
        while hold.exists() and time.monotonic() < deadline:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue  # the mistake: cancellation is ignored
    return await inner(conn, records)


holding_handler = _factory(_hold)
slow_handler = _factory(_slow)
swallowing_handler = _factory(_swallow)
ending_handler = _factory(_end)
raising_handler = _factory(_raise)
undefined_table_handler = _factory(_undefined)
stubborn_handler = _factory(_stubborn)
