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
    parts = urlsplit(pg_dsn)
    table = f'"{fence_schema}".items'
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(f"CREATE TABLE {table} (id int8 PRIMARY KEY, name text NOT NULL)")
    finally:
        await conn.close()
    spec = SinkSpec(f"{fence_schema}.items", keys=("id",))
    tp = TopicPartition("rt-sink", 0)

    def batch(first: int) -> list[SourceRecord]:
        return [SourceRecord(tp.topic, tp.partition, o, None, json.dumps(
            {"id": o % records, "name": f"n{o}"}).encode()) for o in range(first, first + records)]

    async with PgProxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        store = await PgFenceStore.connect(proxy.dsn(pg_dsn), group_id=f"g-{uuid.uuid4().hex}",
                                           schema=fence_schema, pool_min=1, pool_max=1)
        try:
            token = (await store.claim([ClaimRequest(tp, 0)], lifetime="L"))[tp]
            sink = make_table_sink(spec)
            token = await store.process(BatchCall(tp, batch(0), sink), token)  # warm up
            before = proxy.round_trips()
            token = await store.process(BatchCall(tp, batch(records), sink), token)
            assert proxy.round_trips() - before == sink_trips + 2  # BEGIN+fence, COMMIT
        finally:
            await store.close()
    conn = await asyncpg.connect(pg_dsn)
    try:
        rows = await conn.fetch(f"SELECT id, name FROM {table} ORDER BY id")
    finally:
        await conn.close()
    assert [tuple(r) for r in rows] == [(i, f"n{records + i}") for i in range(records)]
    assert token == Token(1, 2 * records)
