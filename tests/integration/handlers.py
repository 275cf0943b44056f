"""Test-only handler factories for worker subprocesses
(``--handler tests.integration.handlers:...``), each the reference handler of the run's
``--schema`` (through ``HandlerContext``) wrapped by one behaviour:

``holding_handler``: while the file ``$FENCE_TEST_HOLD_DIR/hold`` exists it first writes
``held-<pid>-<partition>`` (partition, first and last offset of the batch) and waits,
inside the store's transaction, until the file is removed; without ``FENCE_TEST_HOLD_DIR``
it is exactly the reference handler. ``transient_while_held_handler``: while that file
exists every batch fails with ``Transient`` before anything is applied (a downstream that
is down: the worker retries the batch and its partition makes no progress for as long as
the file lasts, well past the 20 s budget of one call).

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
``--handler-setting``s name as ``partition:offset`` (several: comma-separated):
``transient`` (the first ``transient_times`` batches of this process holding it fail:
SQLSTATE 40001 raised by PostgreSQL, then ``Transient``), ``deadlock`` (the first two
batches holding it, of any process, fail with SQLSTATE 40P01 raised by PostgreSQL: counted
over the handler's own connection in ``<schema>.flaky``),
``poison`` (``ValueError`` every time) and ``kill`` (the process SIGKILLs itself, as an OOM
kill would). ``per_record_s``: seconds the handler waits per record before its write (a
slow downstream; the session is idle in transaction meanwhile). ``on_failure``: its
declaration's.

``convergent_handler``: declared ``derived-reconcilable`` + ``convergent``: per batch, over
its own connection (outside the store's transaction, so a replay writes again), upserts the
latest value per key into ``<schema>.derived`` (the higher offset wins: replays converge);
``per_batch_s`` seconds before it. ``best_effort_handler``: declared ``best-effort`` +
``loss-tolerant``: counts the records it saw in ``<schema>.seen`` over its own connection
and drops nothing else.

``uncertain_handler``: declared ``outcome-uncertain`` (``on_failure`` from the setting of
that name): per record, one external effect over its own connection (an autocommit upsert
counting ``n`` in ``<schema>.external``, standing for an HTTP call), then ``kill`` as above,
then its fenced write to ``<schema>.applied``.
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
    "best_effort_handler",
    "convergent_handler",
    "ending_handler",
    "failing_handler",
    "holding_handler",
    "raising_handler",
    "slow_handler",
    "stopping_raising_handler",
    "stubborn_handler",
    "swallowing_handler",
    "transient_while_held_handler",
    "uncertain_handler",
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


async def _transient_while_held(inner: HandlerFn, conn: Any,
                                records: Sequence[SourceRecord]) -> Any:
    hold_dir = os.environ.get("FENCE_TEST_HOLD_DIR")
    if hold_dir and (Path(hold_dir) / "hold").exists():
        raise Transient(f"downstream down (held) at offset {records[0].offset}")
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
transient_while_held_handler = _factory(_transient_while_held)
slow_handler = _factory(_slow)
swallowing_handler = _factory(_swallow)
ending_handler = _factory(_end)
raising_handler = _factory(_raise)
undefined_table_handler = _factory(_undefined)
stubborn_handler = _factory(_stubborn)
bad_member_handler = _factory(_bad_member)
stopping_raising_handler = _factory(_raise, on_failure="stop")


def _at(setting: str | None) -> set[tuple[int, int]]:
    out: set[tuple[int, int]] = set()
    for item in (setting or "").split(","):
        if item.strip():
            partition, _, offset = item.strip().partition(":")
            out.add((int(partition), int(offset)))
    return out


async def _ensure_applied(conn: Any, context: HandlerContext) -> None:
    for table in ("applied", "flaky"):
        await conn.execute(
            f'CREATE TABLE IF NOT EXISTS "{context.schema}".{table} (topic text, partition int,'
            ' "offset" bigint, n int NOT NULL, PRIMARY KEY (topic, partition, "offset"))')


async def _own_pool(pool: list[Any]) -> Any:
    """The handler's own connections (not the store's transaction), made once."""
    if not pool:
        pool.append(await asyncpg.create_pool(os.environ["FENCE_DSN"], min_size=1, max_size=4))
    return pool[0]


def _count_sql(schema: str, table: str) -> str:
    return (f'INSERT INTO "{schema}".{table} AS e (topic, partition, "offset", n)'
            ' VALUES ($1, $2, $3, 1) ON CONFLICT (topic, partition, "offset")'
            ' DO UPDATE SET n = e.n + 1 RETURNING n')


def _applied_sql(schema: str) -> str:
    return (f'INSERT INTO "{schema}".applied AS a (topic, partition, "offset", n)'
            ' SELECT $1, p, o, 1 FROM unnest($2::int[], $3::bigint[]) AS t(p, o)'
            ' ON CONFLICT (topic, partition, "offset") DO UPDATE SET n = a.n + 1')


def _kill_if(kills: set[tuple[int, int]], record: SourceRecord) -> None:
    if (record.partition, record.offset) in kills:
        os.kill(os.getpid(), signal.SIGKILL)


async def _raise_sqlstate(conn: Any, state: str, what: str) -> None:
    await conn.execute(f"DO $$ BEGIN RAISE EXCEPTION 'injected {what}' USING ERRCODE = "
                       f"'{state}'; END $$")


@handler_factory(ensure_tables=_ensure_applied)
def failing_handler(context: HandlerContext) -> HandlerFn:
    settings = context.settings
    transient, deadlock, poison, kill = (_at(settings.get(k)) for k in (
        "transient", "deadlock", "poison", "kill"))
    times = int(settings.get("transient_times", "2"))
    per_record_s = float(settings.get("per_record_s", "0"))
    failures: dict[tuple[int, int], int] = {}
    sql = _applied_sql(context.schema)
    flaky = _count_sql(context.schema, "flaky")
    pool: list[Any] = []

    @handler(durability="durable-critical", effects="transactional",
             on_failure=settings.get("on_failure", "quarantine"))
    async def handle(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
        held = {(r.partition, r.offset) for r in records}
        for r in records:
            _kill_if(kill, r)
        for at in sorted(held & transient):
            n = failures[at] = failures.get(at, 0) + 1
            if n <= times:
                if n == 1:
                    await _raise_sqlstate(conn, "40001", "serialization failure")
                raise Transient(f"downstream busy (failure {n})")
        for at in sorted(held & deadlock):
            if await (await _own_pool(pool)).fetchval(flaky, records[0].topic, *at) <= 2:
                await _raise_sqlstate(conn, "40P01", "deadlock")
        for at in sorted(held & poison):
            raise ValueError(f"cannot parse record {at[1]} of partition {at[0]}")
        if per_record_s:
            await asyncio.sleep(per_record_s * len(records))
        await conn.execute(sql, records[0].topic, [r.partition for r in records],
                           [r.offset for r in records])
        return [ACCEPT] * len(records)

    return handle


async def _ensure_uncertain(conn: Any, context: HandlerContext) -> None:
    await _ensure_applied(conn, context)
    await conn.execute(
        f'CREATE TABLE IF NOT EXISTS "{context.schema}".external (topic text, partition int,'
        ' "offset" bigint, n int NOT NULL, PRIMARY KEY (topic, partition, "offset"))')


@handler_factory(ensure_tables=_ensure_uncertain)
def uncertain_handler(context: HandlerContext) -> HandlerFn:
    kill = _at(context.settings.get("kill"))
    sql = _applied_sql(context.schema)
    external = _count_sql(context.schema, "external")
    pool: list[Any] = []

    @handler(durability="durable-critical", effects="outcome-uncertain",
             on_failure=context.settings.get("on_failure", "quarantine"))
    async def handle(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
        own = await _own_pool(pool)
        for r in records:
            await own.fetchval(external, r.topic, r.partition, r.offset)  # the HTTP call
            _kill_if(kill, r)
        await conn.execute(sql, records[0].topic, [r.partition for r in records],
                           [r.offset for r in records])
        return [ACCEPT] * len(records)

    return handle


async def _ensure_derived(conn: Any, context: HandlerContext) -> None:
    await conn.execute(f'CREATE TABLE IF NOT EXISTS "{context.schema}".derived (key text '
                       'PRIMARY KEY, partition int NOT NULL, last_offset bigint NOT NULL, '
                       'value text NOT NULL)')
    await conn.execute(f'CREATE TABLE IF NOT EXISTS "{context.schema}".seen (topic text, '
                       'partition int, "offset" bigint, n int NOT NULL, '
                       'PRIMARY KEY (topic, partition, "offset"))')


@handler_factory(ensure_tables=_ensure_derived)
def convergent_handler(context: HandlerContext) -> HandlerFn:
    per_batch_s = float(context.settings.get("per_batch_s", "0"))
    upsert = (f'INSERT INTO "{context.schema}".derived AS d (key, partition, last_offset, value)'
              ' SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[], $4::text[])'
              ' ON CONFLICT (key) DO UPDATE SET last_offset = EXCLUDED.last_offset,'
              ' value = EXCLUDED.value, partition = EXCLUDED.partition'
              ' WHERE d.last_offset < EXCLUDED.last_offset')
    pool: list[Any] = []

    @handler(durability="derived-reconcilable", effects="convergent")
    async def handle(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
        await asyncio.sleep(per_batch_s)
        latest: dict[str, SourceRecord] = {}
        for r in records:  # in offset order: the last one per key wins
            latest[(r.key or b"").decode()] = r
        await (await _own_pool(pool)).execute(
            upsert, list(latest), [r.partition for r in latest.values()],
            [r.offset for r in latest.values()],
            [(r.value or b"").decode() for r in latest.values()])
        return [ACCEPT] * len(records)

    return handle


@handler_factory(ensure_tables=_ensure_derived)
def best_effort_handler(context: HandlerContext) -> HandlerFn:
    seen = _count_sql(context.schema, "seen")
    pool: list[Any] = []

    @handler(durability="best-effort", effects="loss-tolerant")
    async def handle(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
        own = await _own_pool(pool)
        for r in records:
            await own.fetchval(seen, r.topic, r.partition, r.offset)
        return [ACCEPT] * len(records)

    return handle
