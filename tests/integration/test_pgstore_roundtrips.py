"""Round trips per store call, counted on the wire by fencing.testing.pgproxy (real PostgreSQL)."""
from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest

from consumer import Lifecycle
from consumer.failure_run import FailureRun
from fencing.failures import RetryPolicy
from fencing.handler import Declaration, Durability, Effects
from fencing.postgres.sink import SinkSpec, make_table_sink
from fencing.postgres.sink.writer import UNNEST_MAX
from fencing.postgres.store import PgFenceStore
from fencing.store import BatchCall
from fencing.testing.pgproxy import PgProxy
from fencing.types import (
    ClaimRequest,
    SourceCheck,
    SourceFacts,
    SourceRecord,
    Token,
    TopicPartition,
    Verdict,
)
from tests.integration.pg_helpers import effect_handler, make_records

pytestmark = pytest.mark.integration


async def test_assignment_calls_take_one_round_trip_and_process_adds_none(
        pg_dsn: str, fence_schema: str) -> None:
    parts = urlsplit(pg_dsn)
    tps = [TopicPartition("rt", p) for p in range(8)]
    async with PgProxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        store = await PgFenceStore.connect(proxy.dsn(pg_dsn), group_id=f"g-{uuid.uuid4().hex}",
                                           schema=fence_schema, pool_min=1, pool_max=1)
        try:
            claims = [ClaimRequest(tp, 0, "tid") for tp in tps]
            checks = [SourceCheck(tp, SourceFacts("tid", 0, 10)) for tp in tps]
            await store.claim(claims, lifetime="warm")  # first use prepares the statements
            await store.observe(tps)

            async def trips(coro: Any) -> int:
                before = proxy.round_trips()
                await coro
                return proxy.round_trips() - before

            assert await trips(store.claim(claims, lifetime="L")) == 1
            assert await trips(store.observe(tps)) == 1
            assert await trips(store.validate(checks)) == 1
            handler_trips = 0
            inner = effect_handler(fence_schema)

            async def counting(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
                nonlocal handler_trips
                before = proxy.round_trips()
                verdicts = await inner(conn, records)
                handler_trips += proxy.round_trips() - before
                return verdicts

            tp = tps[0]
            token = Token(2, 0)  # warm up (prepare) the handler's and the quarantine statements
            token = await store.process(BatchCall(tp, make_records(tp, range(100), bad=[5]),
                                                  counting), token)
            handler_trips = 0
            n = await trips(store.process(BatchCall(tp, make_records(tp, range(100, 200)),
                                                    counting), token))
            assert handler_trips >= 1
            assert n == handler_trips + 2  # BEGIN+fence, handler, COMMIT: like BEGIN/COMMIT
            handler_trips = 0
            n = await trips(store.process(BatchCall(
                tp, make_records(tp, range(200, 300), bad=[250]), counting), Token(2, 200)))
            assert n == handler_trips + 3  # plus one quarantine insert for all rejects
        finally:
            await store.close()


async def test_the_worker_path_adds_no_round_trip_and_an_intent_adds_one(
        pg_dsn: str, fence_schema: str) -> None:
    """``FailureRun.submit`` of a healthy partition (the gate's counter, the lifecycle's
    handler time limit) costs what ``PgFenceStore.process`` costs; an ``outcome-uncertain``
    handler's batch costs one more: its intent."""
    parts = urlsplit(pg_dsn)
    async with PgProxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        store = await PgFenceStore.connect(proxy.dsn(pg_dsn), group_id=f"g-{uuid.uuid4().hex}",
                                           schema=fence_schema, pool_min=1, pool_max=1)
        try:
            inner = effect_handler(fence_schema)
            lc = Lifecycle(store=store, lifetime_id="L", clock=lambda: 0.0, wait=asyncio.sleep)
            tps = {decl: TopicPartition("rt-w", p) for p, decl in enumerate(
                ("transactional", "outcome-uncertain"))}
            await lc.assign([SourceCheck(tp, SourceFacts("tid", 0, 1000)) for tp in tps.values()])
            for name, tp in tps.items():
                decl = Declaration() if name == "transactional" else Declaration(
                    Durability.DURABLE_CRITICAL, Effects.OUTCOME_UNCERTAIN)
                run = FailureRun(lifecycle=lc, handler=inner, declaration=decl,
                                 policy=RetryPolicy(), rng=random.Random(1), clock=lambda: 0.0,
                                 wait=asyncio.sleep)
                await run.submit(tp, make_records(tp, range(100)), links=(),
                                 stopped=lambda: False)  # warm up the prepared statements
                handler_trips = 0

                async def counting(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
                    nonlocal handler_trips
                    before = proxy.round_trips()
                    verdicts = await inner(conn, records)
                    handler_trips += proxy.round_trips() - before
                    return verdicts

                run = FailureRun(lifecycle=lc, handler=counting, declaration=decl,
                                 policy=RetryPolicy(), rng=random.Random(1), clock=lambda: 0.0,
                                 wait=asyncio.sleep)
                before = proxy.round_trips()
                await run.submit(tp, make_records(tp, range(100, 200)), links=(),
                                 stopped=lambda: False)
                n = proxy.round_trips() - before
                assert handler_trips >= 1
                assert n == handler_trips + (2 if name == "transactional" else 3), name
        finally:
            await store.close()


async def _sink_batches(pg_dsn: str, schema: str, ddl: str, values: list[list[Any]]
                        ) -> tuple[int, list[tuple[Any, ...]]]:
    """The table sink's batches of ``values`` (JSON objects, a batch each) into a table
    ``items`` of ``ddl`` (key ``id``), through the proxy: the round trips of the last batch
    (the first ones prepare the statements) and the table's rows by ``id``."""
    parts = urlsplit(pg_dsn)
    table = f'"{schema}".items'
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(f"CREATE TABLE {table} ({ddl})")
    finally:
        await conn.close()
    tp = TopicPartition("rt-sink", 0)
    offset = 0
    async with PgProxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        store = await PgFenceStore.connect(proxy.dsn(pg_dsn), group_id=f"g-{uuid.uuid4().hex}",
                                           schema=schema, pool_min=1, pool_max=1)
        try:
            token = (await store.claim([ClaimRequest(tp, 0)], lifetime="L"))[tp]
            sink = make_table_sink(SinkSpec(f"{schema}.items", keys=("id",)))
            for batch in values:
                records = [SourceRecord(tp.topic, tp.partition, offset + i, None,
                                        json.dumps(v).encode()) for i, v in enumerate(batch)]
                offset += len(records)
                before = proxy.round_trips()
                token = await store.process(BatchCall(tp, records, sink), token)
                trips = proxy.round_trips() - before
        finally:
            await store.close()
    assert token == Token(1, offset)
    conn = await asyncpg.connect(pg_dsn)
    try:
        rows = await conn.fetch(f"SELECT * FROM {table} ORDER BY id")
    finally:
        await conn.close()
    return trips, [tuple(r) for r in rows]


@pytest.mark.parametrize(("records", "sink_trips"), [(5, 2), (UNNEST_MAX, 3)],
                         ids=["a small set: unnest", "a large set: the staging table"])
async def test_the_table_sinks_small_set_of_upserts_takes_two_round_trips(
        pg_dsn: str, fence_schema: str, records: int, sink_trips: int) -> None:
    """A batch of upserts into typed columns: fewer than ``UNNEST_MAX`` go by SAVEPOINT and
    one prepared INSERT … SELECT FROM unnest (its savepoint ended by the COMMIT); a set of
    ``UNNEST_MAX`` by SAVEPOINT with the stage's statement, the COPY, and the set statement
    with the RELEASE (the proxy counts Query and Sync messages: the COPY's data phase is one
    more wait for the CopyInResponse, not counted). The rows written either way are the
    records'."""
    trips, rows = await _sink_batches(
        pg_dsn, fence_schema, "id int8 PRIMARY KEY, name text NOT NULL",
        [[{"id": i, "name": f"n{o}"} for i, o in enumerate(range(first, first + records))]
         for first in (0, records)])
    assert trips == sink_trips + 2  # BEGIN+fence, COMMIT
    assert rows == [(i, f"n{records + i}") for i in range(records)]


async def test_columns_with_a_length_or_a_precision_go_by_unnest_whole(
        pg_dsn: str, fence_schema: str) -> None:
    """bit(n), varbit(n), char(n), varchar(n), numeric(p, s): each value whole in its
    column, in the two round trips of ``unnest`` (a cast to ``bit[]`` would cut each bit
    string to one bit, which bit(4) refuses: the batch would be written again one record at
    a time, a round trip per statement)."""
    ddl = ("id int8 PRIMARY KEY, b bit(4), v varbit(6), c char(3), s varchar(5), "
           "n numeric(6, 2)")
    row = {"b": "1010", "v": "110", "c": "ab", "s": "hello", "n": 12.5}
    trips, rows = await _sink_batches(pg_dsn, fence_schema, ddl,
                                      [[{"id": 0, **row}], [{"id": 1, **row}, {"id": 2, **row}]])
    assert trips == 2 + 2
    assert [(r[0], r[1].as_string(), r[2].as_string(), r[3], r[4], str(r[5])) for r in rows] \
        == [(i, "1010", "110", "ab ", "hello", "12.50") for i in range(3)]
