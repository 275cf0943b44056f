"""Test-only handlers for worker subprocesses (``--handler tests.integration.handlers:...``).

``holding_handler`` is the reference handler, except that while the file
``$FENCE_TEST_HOLD_DIR/hold`` exists it first writes ``held-<pid>`` (partition and first
offset of the batch) and waits, inside the store's transaction, until the file is removed.
Without ``FENCE_TEST_HOLD_DIR`` it is exactly the reference handler.

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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg

from fencing.handler import handler
from fencing.types import SourceRecord, Verdict
from ops.reference.pg import ensure_tables, make_pg_handler

__all__ = [
    "ending_handler",
    "ensure_tables",
    "holding_handler",
    "raising_handler",
    "slow_handler",
    "stubborn_handler",
    "swallowing_handler",
    "undefined_table_handler",
]

_inner = make_pg_handler(schema=os.environ.get("FENCE_SCHEMA") or "fence")


@handler(durability="durable-critical", effects="transactional")
async def holding_handler(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
    hold_dir = os.environ.get("FENCE_TEST_HOLD_DIR")
    if hold_dir:
        hold = Path(hold_dir) / "hold"
        if hold.exists():
            (Path(hold_dir) / f"held-{os.getpid()}-{records[0].partition}").write_text(
                f"{records[0].partition} {records[0].offset} {records[-1].offset}")
            while hold.exists():  # noqa: ASYNC110 - a file written by another process
                await asyncio.sleep(0.02)
    return list(await _inner(conn, records))


@handler(durability="durable-critical", effects="transactional")
async def slow_handler(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
    await asyncio.sleep(float(os.environ.get("FENCE_TEST_BATCH_DELAY_S", "0")))
    return list(await _inner(conn, records))


@handler(durability="durable-critical", effects="transactional")
async def swallowing_handler(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
    verdicts = list(await _inner(conn, records))
    try:
        await conn.execute("SELECT 1 / 0")  # the transaction is now aborted
    except asyncpg.DivisionByZeroError:
        pass  # the mistake: caught without a SAVEPOINT
    return verdicts


@handler(durability="durable-critical", effects="transactional")
async def ending_handler(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
    verdicts = list(await _inner(conn, records))
    await conn.execute("ROLLBACK")  # the mistake: the store owns the transaction
    return verdicts


@handler(durability="durable-critical", effects="transactional")
async def raising_handler(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
    raise ValueError(f"handler bug at offset {records[0].offset}")


@handler(durability="durable-critical", effects="transactional")
async def undefined_table_handler(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
    await conn.execute("SELECT count(*) FROM no_such_table_for_fenceworker")
    return list(await _inner(conn, records))


@handler(durability="durable-critical", effects="transactional")
async def stubborn_handler(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
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
    return list(await _inner(conn, records))
