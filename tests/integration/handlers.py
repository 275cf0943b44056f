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
``stubborn_handler`` (ignores cancellation while ``$FENCE_TEST_HOLD_DIR/hold`` exists),
``bad_member_handler`` (in the member of a ``--processes`` set whose index is
``$FENCE_TEST_BAD_MEMBER``, ``undefined_table_handler``; elsewhere the reference handler);
``stopping_raising_handler`` is ``raising_handler`` declared ``on_failure="stop"``.

``failing_handler`` (handler failures): counts each record's committed applications in
``<schema>.applied`` (``n`` per topic, partition, offset) and fails on the records its
``--handler-setting``s name as ``partition:offset``: ``transient`` (the first
``transient_times`` batches holding it fail: SQLSTATE 40001 raised by PostgreSQL, then
``Transient``), ``poison`` (``ValueError`` every time) and ``kill`` (the process SIGKILLs
itself, as an OOM kill would).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import asyncpg

from fencing.errors import Transient
from fencing.handler import HandlerContext, handler, handler_factory
from fencing.store import HandlerFn
from fencing.types import ACCEPT, SourceRecord, Verdict
from ops.reference.pg import ensure_tables, make_pg_handler

__all__ = [
    "bad_member_handler",
    "ending_handler",
    "failing_handler",
    "holding_handler",
    "raising_handler",
    "slow_handler",
    "stopping_raising_handler",
    "stubborn_handler",
    "swallowing_handler",
    "undefined_table_handler",
]

Wrap = Callable[[HandlerFn, Any, Sequence[SourceRecord]], Awaitable[Sequence[Verdict]]]


async def _ensure(conn: Any, context: HandlerContext) -> None:
    await ensure_tables(conn, context.schema)


def _factory(wrap: Wrap, *, on_failure: str = "quarantine") -> Callable[[HandlerContext],
                                                                         HandlerFn]:
    """A factory of the reference handler for the run's schema, wrapped by ``wrap``."""
    @handler_factory(ensure_tables=_ensure)
    def build(context: HandlerContext) -> HandlerFn:
        inner = make_pg_handler(schema=context.schema)

        @handler(durability="durable-critical", effects="transactional", on_failure=on_failure)
        async def handle(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
            return list(await wrap(inner, conn, records))

        return handle

    return build


def _announce_held(hold_dir: Path, records: Sequence[SourceRecord]) -> None:
    """``held-<pid>-<partition>`` appears whole (written aside, then renamed): a test that
    sees the file reads its content, never an empty file still being written."""
    name = f"held-{os.getpid()}-{records[0].partition}"
    aside = hold_dir / f".{name}.tmp"
    aside.write_text(f"{records[0].partition} {records[0].offset} {records[-1].offset}")
    os.replace(aside, hold_dir / name)


async def _hold(inner: HandlerFn, conn: Any, records: Sequence[SourceRecord]) -> Any:
    hold_dir = os.environ.get("FENCE_TEST_HOLD_DIR")
    if hold_dir:
        hold = Path(hold_dir) / "hold"
        if hold.exists():
            _announce_held(Path(hold_dir), records)
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


async def _bad_member(inner: HandlerFn, conn: Any, records: Sequence[SourceRecord]) -> Any:
    if os.environ.get("FENCE_MEMBER_INDEX", "-") == os.environ.get("FENCE_TEST_BAD_MEMBER"):
        return await _undefined(inner, conn, records)
    return await inner(conn, records)


async def _stubborn(inner: HandlerFn, conn: Any, records: Sequence[SourceRecord]) -> Any:
    hold_dir = os.environ.get("FENCE_TEST_HOLD_DIR")
    hold = Path(hold_dir) / "hold" if hold_dir else None
    if hold is not None and hold.exists():
        _announce_held(hold.parent, records)
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
bad_member_handler = _factory(_bad_member)
stopping_raising_handler = _factory(_raise, on_failure="stop")


def _at(setting: str | None) -> tuple[int, int] | None:
    if not setting:
        return None
    partition, _, offset = setting.partition(":")
    return int(partition), int(offset)


async def _ensure_applied(conn: Any, context: HandlerContext) -> None:
    await conn.execute(
        f'CREATE TABLE IF NOT EXISTS "{context.schema}".applied (topic text, partition int,'
        ' "offset" bigint, n int NOT NULL, PRIMARY KEY (topic, partition, "offset"))')


@handler_factory(ensure_tables=_ensure_applied)
def failing_handler(context: HandlerContext) -> HandlerFn:
    settings = context.settings
    transient, poison, kill = (_at(settings.get(k)) for k in ("transient", "poison", "kill"))
    times = int(settings.get("transient_times", "2"))
    failures = {"n": 0}
    sql = (f'INSERT INTO "{context.schema}".applied AS a (topic, partition, "offset", n)'
           ' SELECT $1, p, o, 1 FROM unnest($2::int[], $3::bigint[]) AS t(p, o)'
           ' ON CONFLICT (topic, partition, "offset") DO UPDATE SET n = a.n + 1')

    @handler(durability="durable-critical", effects="transactional")
    async def handle(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
        held = {(r.partition, r.offset) for r in records}
        if kill in held:
            os.kill(os.getpid(), signal.SIGKILL)
        if transient in held and failures["n"] < times:
            failures["n"] += 1
            if failures["n"] == 1:
                await conn.execute("DO $$ BEGIN RAISE EXCEPTION 'injected serialization "
                                   "failure' USING ERRCODE = '40001'; END $$")
            raise Transient(f"downstream busy (failure {failures['n']})")
        if poison in held:
            raise ValueError(f"cannot parse record {poison[1]} of partition {poison[0]}")
        await conn.execute(sql, records[0].topic, [r.partition for r in records],
                           [r.offset for r in records])
        return [ACCEPT] * len(records)

    return handle
