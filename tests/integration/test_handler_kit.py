"""The handler test kit (``fencing.testing``) against real PostgreSQL: it passes the reference
handler and the table sink, and catches a handler that writes through a second connection
and one that applies twice on a replay."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg
import pytest

from fencing.handler import HandlerContext, handler, handler_factory
from fencing.postgres.sink import table_sink
from fencing.testing import Fault, HandlerUnsafe, check_handler_async, json_records
from fencing.types import ACCEPT, Reject, SourceRecord, Verdict
from ops.reference import generate, to_source_records
from ops.reference.pg import reference

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("klass", ["valid", "conflict"])
async def test_the_reference_handler_passes(pg_dsn: str, klass: str) -> None:
    records = to_source_records(generate(3, count=400, partitions=3, klass=klass,  # type: ignore[arg-type]
                                         topic="ledger"))
    report = await check_handler_async(reference, records, dsn=pg_dsn, seed=3)
    assert report.ok
    assert set(report.faults) == {f.value for f in Fault}  # every fault hit some batch
    assert {"ref_documents", "ref_outbox", "(fence quarantine)"} <= set(report.tables)
    assert report.left_out == ("ref_documents.updated_at", "ref_outbox.created_at",
                               "ref_outbox.outbox_id")


def orders() -> list[SourceRecord]:
    items: list[tuple[str | None, Any]] = []
    for i in range(120):
        key = f"o{i % 17}"
        if i % 11 == 5:
            items.append((key, None))  # tombstone: delete
        elif i % 13 == 7:
            items.append((key, "not an object"))  # misfit: quarantined
        else:
            items.append((key, {"id": key, "amount": i, "status": "new"}))
    return json_records("orders", items, partitions=3)


@pytest.mark.parametrize("key", ["id", None])
async def test_the_table_sink_passes(pg_dsn: str, key: str | None) -> None:
    settings = {"table": "orders"} | ({"key": key} if key else {})
    records = (r for r in orders())  # a generator works as well as a list
    report = await check_handler_async(table_sink, records, dsn=pg_dsn, settings=settings,
                                       seed=5)
    assert report.ok and report.tables == ("(fence quarantine)", "orders")


async def _ensure_seen(conn: Any, context: HandlerContext) -> None:
    await conn.execute("CREATE TABLE IF NOT EXISTS seen (k text, o bigint)")


@handler_factory(ensure_tables=_ensure_seen)
def second_connection(context: HandlerContext) -> Any:
    """Writes each record through its own connection (autocommit): outside the fence."""
    table = f'"{context.schema}".seen'
    dsn = context.settings["dsn"]

    @handler(durability="durable-critical", effects="transactional")  # a false declaration
    async def handle(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
        other = await asyncpg.connect(dsn)
        try:
            await other.executemany(f"INSERT INTO {table} VALUES ($1, $2)",
                                    [(str(r.key), r.offset) for r in records])
        finally:
            await other.close()
        return [ACCEPT] * len(records)

    return handle


async def _ensure_totals(conn: Any, context: HandlerContext) -> None:
    await conn.execute("CREATE TABLE IF NOT EXISTS totals (k text PRIMARY KEY, total bigint)")


@handler_factory(ensure_tables=_ensure_totals)
def running_total(context: HandlerContext) -> Any:
    """Keeps totals in process memory and upserts them: a replay adds its records again."""
    totals: dict[str, int] = {}

    async def handle(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
        for r in records:
            k = (r.key or b"").decode()
            totals[k] = totals.get(k, 0) + 1
            await conn.execute("INSERT INTO totals VALUES ($1, $2) ON CONFLICT (k) DO UPDATE "
                               "SET total = EXCLUDED.total", k, totals[k])
        return [ACCEPT] * len(records)

    return handle


async def test_the_kit_catches_a_handler_writing_through_a_second_connection(pg_dsn: str) -> None:
    with pytest.raises(HandlerUnsafe) as info:
        await check_handler_async(second_connection, orders(), dsn=pg_dsn,
                                  settings={"dsn": pg_dsn})
    problems = info.value.report.problems
    assert any("writes through another connection" in p for p in problems), problems
    assert any(p.startswith("after the faults, table seen:") for p in problems), problems


async def test_the_kit_catches_a_handler_that_applies_twice_on_replay(pg_dsn: str) -> None:
    with pytest.raises(HandlerUnsafe) as info:
        await check_handler_async(running_total, orders(), dsn=pg_dsn,
                                  faults=[Fault.ABORT])
    problems = info.value.report.problems
    assert problems and all(p.startswith("after the faults, table totals:") for p in problems)
    assert not any("another connection" in p for p in problems)


@handler_factory()
def call_dependent(context: HandlerContext) -> Any:
    """Accepts or rejects depending on how often it was called: unstable verdicts."""
    calls = [0]

    async def handle(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
        calls[0] += 1
        return [Reject("odd call") if calls[0] % 2 else ACCEPT for _ in records]

    return handle


async def test_the_kit_catches_verdicts_that_change_on_a_replay(pg_dsn: str) -> None:
    with pytest.raises(HandlerUnsafe) as info:
        await check_handler_async(call_dependent, orders(), dsn=pg_dsn, faults=[Fault.ABORT])
    problems = info.value.report.problems
    assert any("verdicts differ across attempts: ['accept', 'reject: odd call']" in p
               for p in problems), problems


@handler(durability="durable-critical", effects="transactional")
async def _count_plain(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
    await conn.executemany("INSERT INTO seen_plain (k) VALUES ($1)",
                           [((r.key or b"").decode(),) for r in records])
    return [ACCEPT] * len(records)


async def _create_with_context(conn: Any, context: HandlerContext) -> None:
    assert context.schema == await conn.fetchval("SELECT current_schema()")
    await conn.execute("CREATE TABLE seen_plain (k text NOT NULL)")


async def _create_plain(conn: Any) -> None:
    await conn.execute("CREATE TABLE seen_plain (k text NOT NULL)")


@pytest.mark.parametrize("ensure", [_create_with_context, _create_plain],
                         ids=["conn-context", "conn"])
async def test_ensure_tables_takes_conn_and_context_or_conn_alone(pg_dsn: str,
                                                                  ensure: Any) -> None:
    """The README's ``create_tables(conn, context)`` (a factory's signature) works as
    ``ensure_tables=`` of a plain handler, as does ``(conn)``."""
    records = json_records("seen", [(f"k{i}", {"i": i}) for i in range(30)], partitions=2)
    report = await check_handler_async(_count_plain, records, dsn=pg_dsn,
                                       ensure_tables=ensure, seed=2)
    assert report.ok and "seen_plain" in report.tables
