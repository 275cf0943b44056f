"""The reference handler against real PostgreSQL: through the fence store, committed rows
equal the independent oracle's fold for both generated classes and several seeds."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import pytest

from fencing.postgres.schema import migrate
from fencing.postgres.store import PgFenceStore
from fencing.store import BatchCall
from fencing.types import ClaimRequest, Reject, SourceRecord, TopicPartition
from ops.reference import generate, make_pg_handler, to_source_records
from ops.reference.oracle import check, fold
from ops.reference.pg import ensure_tables, grant_sql
from ops.reference.snapshot import pg_state

pytestmark = pytest.mark.integration

PARTITIONS = 3
TOPIC = "ledger"


@pytest.fixture
async def schema(services: Any) -> AsyncIterator[str]:
    name = f"ref_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(services.dsn)
    try:
        await migrate(conn, name)
        await ensure_tables(conn, name)
        yield name
    finally:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        await conn.close()


def batches(records: Sequence[SourceRecord], rng: random.Random) -> list[list[SourceRecord]]:
    """Per-partition batches of sizes 1..300, partitions interleaved at random."""
    per: dict[int, list[SourceRecord]] = {}
    for r in records:
        per.setdefault(r.partition, []).append(r)
    out: list[list[SourceRecord]] = []
    pos = dict.fromkeys(per, 0)
    while pos:
        p = rng.choice(sorted(pos))
        n = rng.choice((1, 3, 40, 100, 300))
        out.append(per[p][pos[p] : pos[p] + n])
        pos[p] += n
        if pos[p] >= len(per[p]):
            del pos[p]
    return out


@pytest.mark.parametrize("klass", ["valid", "conflict"])
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_pg_handler_through_fence_store_equals_oracle(
    services: Any, schema: str, seed: int, klass: str
) -> None:
    src = to_source_records(
        generate(seed, count=2000, partitions=PARTITIONS, klass=klass, topic=TOPIC)  # type: ignore[arg-type]
    )
    group = f"g-{uuid.uuid4().hex[:8]}"
    handle = make_pg_handler(schema=schema)
    store = await PgFenceStore.connect(services.dsn, group_id=group, schema=schema)
    try:
        tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        tokens = dict(await store.claim([ClaimRequest(tp, 0) for tp in tps], lifetime="L1"))
        plan = batches(src, random.Random(seed))

        async def run_partition(tp: TopicPartition) -> None:  # partitions run concurrently
            for batch in (b for b in plan if b[0].tp == tp):
                tokens[tp] = await store.process(BatchCall(tp, batch, handle), tokens[tp])

        await asyncio.gather(*(run_partition(tp) for tp in tps))
    finally:
        await store.close()
    frontiers = {(t.topic, t.partition): tok.frontier for t, tok in tokens.items()}
    conn = await asyncpg.connect(services.dsn)
    try:
        actual = await pg_state(conn, topic=TOPIC, schema=schema, group_id=group)
    finally:
        await conn.close()
    expected = fold(src)
    assert check(src, frontiers, actual) == []
    assert len(actual.outbox) == len(expected.outbox) > 0
    assert (len(actual.quarantine) > 0) == (klass == "conflict")


class CountingConn:
    """Counts round trips made through the real asyncpg connection."""

    def __init__(self, conn: Any) -> None:
        self.conn, self.calls = conn, 0

    async def fetch(self, *args: Any) -> Any:
        self.calls += 1
        return await self.conn.fetch(*args)

    async def execute(self, *args: Any) -> Any:
        self.calls += 1
        return await self.conn.execute(*args)


async def test_pg_handler_uses_two_round_trips_per_batch(services: Any, schema: str) -> None:
    src = to_source_records(generate(7, count=900, partitions=1, klass="conflict", topic=TOPIC))
    handle = make_pg_handler(schema=schema)
    conn = await asyncpg.connect(services.dsn)
    quarantine: dict[tuple[str, int, int], str] = {}
    try:
        for i in range(0, len(src), 300):
            batch = src[i : i + 300]
            counting = CountingConn(conn)
            async with conn.transaction():
                verdicts = await handle(counting, batch)
            assert counting.calls == 2
            quarantine.update(
                {(r.topic, r.partition, r.offset): v.reason
                 for r, v in zip(batch, verdicts, strict=True) if isinstance(v, Reject)}
            )
        counting = CountingConn(conn)
        async with conn.transaction():
            verdicts = await handle(counting, [SourceRecord(TOPIC, 0, 900, b"k", b"{")])
        assert counting.calls == 0 and isinstance(verdicts[0], Reject)
        actual = await pg_state(conn, topic=TOPIC, schema=schema, quarantine=quarantine)
    finally:
        await conn.close()
    assert check(src, {(TOPIC, 0): len(src)}, actual) == []


async def test_rolled_back_batch_leaves_no_effect(services: Any, schema: str) -> None:
    src = to_source_records(generate(8, count=50, partitions=1, klass="valid", topic=TOPIC))
    handle = make_pg_handler(schema=schema)
    conn = await asyncpg.connect(services.dsn)
    try:
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await handle(conn, src)
                raise RuntimeError("abort after the handler")
        n_docs = await conn.fetchval(f'SELECT count(*) FROM "{schema}".ref_documents')
        n_out = await conn.fetchval(f'SELECT count(*) FROM "{schema}".ref_outbox')
    finally:
        await conn.close()
    assert (n_docs, n_out) == (0, 0)


async def test_ensure_tables_is_idempotent_and_concurrent_safe(services: Any) -> None:
    name = f"ref_{uuid.uuid4().hex[:8]}"
    conns = [await asyncpg.connect(services.dsn) for _ in range(3)]
    try:
        await asyncio.gather(*(ensure_tables(c, name) for c in conns))
        await ensure_tables(conns[0], name)
        tables = await conns[0].fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = $1 "
            "ORDER BY table_name",
            name,
        )
        assert [r[0] for r in tables] == ["ref_documents", "ref_outbox"]
    finally:
        await conns[0].execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        for c in conns:
            await c.close()



async def test_ensure_tables_on_existing_tables_runs_no_ddl(services: Any, schema: str) -> None:
    """A role without DDL rights can call ``ensure_tables`` once the tables exist: inside a
    read-only transaction (where any DDL fails) it succeeds; ``grant_sql`` is valid SQL."""
    conn = await asyncpg.connect(services.dsn)
    try:
        async with conn.transaction(readonly=True):
            await ensure_tables(conn, schema)
        user = await conn.fetchval("SELECT current_user")
        for stmt in grant_sql(schema, user):
            await conn.execute(stmt)
        with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
            async with conn.transaction(readonly=True):
                await ensure_tables(conn, f"{schema}_new")
    finally:
        await conn.close()


async def test_one_document_in_two_partitions_cannot_lose_an_update(
    services: Any, schema: str
) -> None:
    """A mis-keyed producer puts one document into two partitions processed concurrently:
    the second transaction fails on the outbox key instead of overwriting silently."""
    handle = make_pg_handler(schema=schema)
    put = b'{"kind": "put", "rev": 1, "body": "x"}'
    c1, c2 = await asyncpg.connect(services.dsn), await asyncpg.connect(services.dsn)
    try:
        t1 = c1.transaction()
        await t1.start()
        assert not isinstance((await handle(c1, [SourceRecord(TOPIC, 0, 0, b"x", put)]))[0], Reject)
        t2 = c2.transaction()
        await t2.start()
        second = asyncio.ensure_future(handle(c2, [SourceRecord(TOPIC, 1, 0, b"x", put)]))
        await asyncio.sleep(0.3)
        assert not second.done()  # waits on the first transaction's row
        await t1.commit()
        with pytest.raises(asyncpg.UniqueViolationError):
            await second
        await t2.rollback()
        rows = await c1.fetch(f'SELECT src_partition FROM "{schema}".ref_outbox')
        assert [r[0] for r in rows] == [0]
    finally:
        await c1.close()
        await c2.close()
