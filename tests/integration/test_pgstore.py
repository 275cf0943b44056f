"""The asyncpg fence store against real PostgreSQL: claims, fencing, lock orders, quarantine."""
from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg
import pytest

from fencing.errors import (
    Fenced,
    HandlerFailed,
    RecreatedTopic,
    RetentionGap,
    SchemaMismatch,
)
from fencing.postgres.schema import SCHEMA_VERSION
from fencing.postgres.store import PgFenceStore
from fencing.store import BatchCall
from fencing.types import (
    ClaimRequest,
    SourceCheck,
    SourceFacts,
    SourceRecord,
    Token,
    TopicPartition,
    Verdict,
)
from tests.integration.pg_helpers import count_effects, effect_handler, make_records

pytestmark = pytest.mark.integration

TP = TopicPartition("orders", 0)


async def _journal(dsn: str, schema: str) -> list[Any]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(
            f'SELECT topic, partition, event, epoch, lifetime FROM "{schema}".journal ORDER BY id'))
    finally:
        await conn.close()


async def _wait_for_lock_waiters(conn: Any, n: int, timeout_s: float = 10.0) -> None:
    """Return once ``n`` other sessions wait on a lock (pg_stat_activity)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        await conn.execute("SELECT pg_stat_clear_snapshot()")  # stats are cached per transaction
        waiting = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND datname = current_database() AND pid <> pg_backend_pid()")
        if waiting >= n:
            return
        assert loop.time() < deadline, f"only {waiting} of {n} sessions waiting on a lock"
        await asyncio.sleep(0.02)


async def test_claim_raises_epoch_by_one_and_journals(pg_store: PgFenceStore, pg_dsn: str,
                                                      fence_schema: str) -> None:
    tp2 = TopicPartition("orders", 1)
    first = await pg_store.claim([ClaimRequest(TP, 7, "tid-1"), ClaimRequest(tp2, 0, "tid-1")],
                                 lifetime="L1")
    assert first == {TP: Token(1, 7), tp2: Token(1, 0)}
    second = await pg_store.claim([ClaimRequest(TP, 99, "tid-1")], lifetime="L2")
    assert second == {TP: Token(2, 7)}  # initial_frontier only applies to a new row
    assert await pg_store.observe([TP, tp2, TopicPartition("orders", 9)]) == {
        TP: Token(2, 7), tp2: Token(1, 0), TopicPartition("orders", 9): None}
    rows = await _journal(pg_dsn, fence_schema)
    assert [(r["partition"], r["event"], r["epoch"], r["lifetime"]) for r in rows] == [
        (0, "claim", 1, "L1"), (1, "claim", 1, "L1"), (0, "claim", 2, "L2")]


async def test_concurrent_claims_serialize(pg_store: PgFenceStore, pg_dsn: str,
                                           fence_schema: str) -> None:
    await pg_store.claim([ClaimRequest(TP, 0)], lifetime="L0")
    blocker = await asyncpg.connect(pg_dsn)
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute(f'SELECT 1 FROM "{fence_schema}".partitions FOR UPDATE')
        a = asyncio.ensure_future(pg_store.claim([ClaimRequest(TP, 0)], lifetime="LA"))
        b = asyncio.ensure_future(pg_store.claim([ClaimRequest(TP, 0)], lifetime="LB"))
        await _wait_for_lock_waiters(blocker, 2)
        await tx.rollback()
        got = sorted([(await a)[TP].epoch, (await b)[TP].epoch])
    finally:
        await blocker.close()
    assert got == [2, 3]
    rows = await _journal(pg_dsn, fence_schema)
    assert sorted((r["epoch"], r["lifetime"]) for r in rows)[0] == (1, "L0")
    assert sorted(r["epoch"] for r in rows) == [1, 2, 3]
    assert {r["lifetime"] for r in rows} == {"L0", "LA", "LB"}
    assert await pg_store.observe([TP]) == {TP: Token(3, 0)}


@pytest.mark.parametrize("stale", ["epoch", "frontier"])
async def test_stale_token_is_fenced_and_applies_nothing(
        pg_store: PgFenceStore, pg_dsn: str, fence_schema: str, stale: str) -> None:
    await pg_store.claim([ClaimRequest(TP, 0)], lifetime="L1")
    await pg_store.claim([ClaimRequest(TP, 0)], lifetime="L2")  # epoch 2, frontier 0
    handler = effect_handler(fence_schema)
    token = Token(1, 0) if stale == "epoch" else Token(2, 3)
    before = await count_effects(pg_dsn, fence_schema)
    with pytest.raises(Fenced):
        await pg_store.process(BatchCall(TP, make_records(TP, range(token.frontier, 5), bad=[4]),
                                         handler), token)
    assert await count_effects(pg_dsn, fence_schema) == before
    assert before["effects"] == 0 and before["quarantine"] == 0
    assert await pg_store.observe([TP]) == {TP: Token(2, 0)}


async def test_process_advances_frontier_past_gaps_and_quarantines(
        pg_store: PgFenceStore, pg_dsn: str, fence_schema: str) -> None:
    token = (await pg_store.claim([ClaimRequest(TP, 10)], lifetime="L1"))[TP]
    handler = effect_handler(fence_schema)
    new = await pg_store.process(BatchCall(TP, make_records(TP, [10, 12, 15], bad=[12]),
                                           handler), token)
    assert new == Token(1, 16)
    assert await pg_store.observe([TP]) == {TP: Token(1, 16)}
    counts = await count_effects(pg_dsn, fence_schema)
    assert (counts["effects"], counts["quarantine"]) == (2, 1)
    conn = await asyncpg.connect(pg_dsn)
    try:
        q = await conn.fetchrow(f'SELECT "offset", key, value, headers::text, reason, epoch'
                                f' FROM "{fence_schema}".quarantine')
    finally:
        await conn.close()
    assert q is not None
    assert (q["offset"], q["key"], q["value"], q["reason"], q["epoch"]) == (
        12, b"k12", b"bad-12", "value starts with bad", 1)
    assert q["headers"] == '[["h", "dg=="]]'


async def test_process_first_then_claim_reads_advanced_frontier(
        pg_store: PgFenceStore, pg_dsn: str, fence_schema: str) -> None:
    token = (await pg_store.claim([ClaimRequest(TP, 0)], lifetime="L1"))[TP]
    inner = effect_handler(fence_schema)
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        verdicts = await inner(conn, records)
        entered.set()
        await release.wait()  # holds the row lock taken by the fence statement
        return verdicts

    proc = asyncio.ensure_future(pg_store.process(BatchCall(TP, make_records(TP, range(5)),
                                                            slow), token))
    await entered.wait()
    claim = asyncio.ensure_future(pg_store.claim([ClaimRequest(TP, 0)], lifetime="L2"))
    watcher = await asyncpg.connect(pg_dsn)
    try:
        await _wait_for_lock_waiters(watcher, 1)  # the claim waits for the process's lock
        assert not claim.done()
        release.set()
        assert await proc == Token(1, 5)
        assert (await claim)[TP] == Token(2, 5)
    finally:
        await watcher.close()
    assert (await count_effects(pg_dsn, fence_schema))["effects"] == 5


async def test_claim_first_then_process_is_fenced(
        pg_store: PgFenceStore, pg_dsn: str, fence_schema: str) -> None:
    token = (await pg_store.claim([ClaimRequest(TP, 0)], lifetime="L1"))[TP]
    blocker = await asyncpg.connect(pg_dsn)
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute(f'SELECT 1 FROM "{fence_schema}".partitions FOR UPDATE')
        # Queue the claim first, then the process: PostgreSQL grants the row lock in
        # queue order (the first waiter holds the tuple lock), so the claim wins.
        claim = asyncio.ensure_future(pg_store.claim([ClaimRequest(TP, 0)], lifetime="L2"))
        await _wait_for_lock_waiters(blocker, 1)
        proc = asyncio.ensure_future(pg_store.process(
            BatchCall(TP, make_records(TP, range(5)), effect_handler(fence_schema)), token))
        await _wait_for_lock_waiters(blocker, 2)
        await tx.rollback()
        assert (await claim)[TP] == Token(2, 0)
        with pytest.raises(Fenced):
            await proc
    finally:
        await blocker.close()
    assert (await count_effects(pg_dsn, fence_schema))["effects"] == 0
    assert await pg_store.observe([TP]) == {TP: Token(2, 0)}


async def test_validate_refusals(pg_store: PgFenceStore) -> None:
    await pg_store.claim([ClaimRequest(TP, 5, "tid-A")], lifetime="L1")
    new_tp = TopicPartition("orders", 3)
    res = await pg_store.validate([
        SourceCheck(TP, SourceFacts("tid-A", 0, 100)),
        SourceCheck(new_tp, SourceFacts("tid-A", 50, 100)),
    ])
    assert res[TP].ok and res[TP].durable == Token(1, 5) and res[new_tp].ok
    assert res[new_tp].durable is None
    recreated = await pg_store.validate([SourceCheck(TP, SourceFacts("tid-B", 0, 100))])
    assert isinstance(recreated[TP].refusal, RecreatedTopic)
    gap = await pg_store.validate([SourceCheck(TP, SourceFacts("tid-A", 8, 100))])
    assert isinstance(gap[TP].refusal, RetentionGap)
    allowed = await pg_store.validate(
        [SourceCheck(TP, SourceFacts("tid-A", 8, 100), allow_retention_gap=True)])
    assert allowed[TP].ok and allowed[TP].gap_skipped_to == 8


async def test_skip_journal_and_heartbeat(pg_store: PgFenceStore, pg_dsn: str,
                                          fence_schema: str) -> None:
    token = (await pg_store.claim([ClaimRequest(TP, 2)], lifetime="L1"))[TP]
    assert await pg_store.skip(TP, token, to_offset=8, reason="retention gap") == Token(1, 8)
    with pytest.raises(Fenced):
        await pg_store.skip(TP, token, to_offset=9, reason="stale")
    await pg_store.journal([TP], lifetime="L1", event="release", epoch=1, detail="revoked")
    with pytest.raises(ValueError):
        await pg_store.journal([TP], lifetime="L1", event="bogus")
    rows = await _journal(pg_dsn, fence_schema)
    assert [(r["event"], r["epoch"], r["lifetime"]) for r in rows] == [
        ("claim", 1, "L1"), ("gap-skip", 1, "L1"), ("release", 1, "L1")]
    await pg_store.heartbeat(lifetime="L1", member_id=None, host="h", pid=1, state="running")
    await pg_store.heartbeat(lifetime="L1", member_id="m-1", host="h", pid=1, state="stopping",
                             detail={"partitions": ["orders[0]"]})
    conn = await asyncpg.connect(pg_dsn)
    try:
        m = await conn.fetchrow(f'SELECT member_id, state, detail::text, last_seen >= started_at'
                                f' AS ok FROM "{fence_schema}".members WHERE lifetime_id = $1',
                                "L1")
        with pytest.raises(asyncpg.PostgresError, match="append-only"):
            await conn.execute(f'DELETE FROM "{fence_schema}".journal')
    finally:
        await conn.close()
    assert m is not None
    assert (m["member_id"], m["state"], m["ok"]) == ("m-1", "stopping", True)
    assert m["detail"] == '{"partitions": ["orders[0]"]}'


async def test_store_refuses_unknown_schema_version(pg_dsn: str, fence_schema: str) -> None:
    with pytest.raises(SchemaMismatch,
                       match=f"found no fence schema, this build needs version {SCHEMA_VERSION}"):
        await PgFenceStore.connect(pg_dsn, group_id="g", schema=f"nope_{uuid.uuid4().hex[:6]}")
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(f'INSERT INTO "{fence_schema}".schema_version VALUES (99, $1)', "x")
    finally:
        await conn.close()
    with pytest.raises(SchemaMismatch,
                       match=f"found version 99, this build needs version {SCHEMA_VERSION}"):
        await PgFenceStore.connect(pg_dsn, group_id="g", schema=fence_schema)


async def test_deadlock_in_handler_is_transient_not_committed_and_retry_succeeds(
        pg_store: PgFenceStore, pg_dsn: str, fence_schema: str) -> None:
    tp_a, tp_b = TopicPartition("dl", 0), TopicPartition("dl", 1)
    tokens = await pg_store.claim([ClaimRequest(tp_a, 0), ClaimRequest(tp_b, 0)], lifetime="L")
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(f'CREATE TABLE "{fence_schema}".res (k int PRIMARY KEY, n int)'
                           f'; INSERT INTO "{fence_schema}".res VALUES (1, 0), (2, 0)')
    finally:
        await conn.close()
    first_locked = {1: asyncio.Event(), 2: asyncio.Event()}
    crossing = True

    def locker(mine: int, other: int) -> Any:
        async def handle(c: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
            sql = f'UPDATE "{fence_schema}".res SET n = n + 1 WHERE k = $1'
            await c.execute(sql, mine)
            if crossing:
                first_locked[mine].set()
                await first_locked[other].wait()  # both hold one row: lock the other's
            await c.execute(sql, other)
            return await effect_handler(fence_schema)(c, records)
        return handle

    results = await asyncio.gather(
        pg_store.process(BatchCall(tp_a, make_records(tp_a, [0]), locker(1, 2)), tokens[tp_a]),
        pg_store.process(BatchCall(tp_b, make_records(tp_b, [0]), locker(2, 1)), tokens[tp_b]),
        return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    # the handler's deadlock: rolled back, transient (the worker retries it with backoff)
    assert len(failed) == 1 and isinstance(failed[0], HandlerFailed) and failed[0].transient
    assert isinstance(failed[0].__cause__, asyncpg.DeadlockDetectedError)
    loser = tp_a if isinstance(results[0], BaseException) else tp_b
    assert (await pg_store.observe([loser]))[loser] == Token(1, 0)  # rolled back
    crossing = False
    mine, other = (1, 2) if loser == tp_a else (2, 1)
    assert await pg_store.process(BatchCall(loser, make_records(loser, [0]),
                                            locker(mine, other)), tokens[loser]) == Token(1, 1)
    assert (await count_effects(pg_dsn, fence_schema))["effects"] == 2


async def test_process_by_a_store_that_never_claimed_looks_up_the_row(
        pg_store: PgFenceStore, pg_dsn: str, fence_schema: str) -> None:
    """A store that neither claimed nor observed the partition finds its row itself (a
    partition without a row is the contract test's fenced case)."""
    token = (await pg_store.claim([ClaimRequest(TP, 0)], lifetime="L1"))[TP]
    other = await PgFenceStore.connect(pg_dsn, group_id=pg_store.group_id, schema=fence_schema,
                                       pool_max=1)
    try:
        handler = effect_handler(fence_schema)
        assert await other.process(BatchCall(TP, make_records(TP, range(3)),
                                             handler), token) == Token(1, 3)
    finally:
        await other.close()
    assert (await count_effects(pg_dsn, fence_schema))["effects"] == 3
    assert await pg_store.observe([TP]) == {TP: Token(1, 3)}
