"""Handler failures in the asyncpg store against real PostgreSQL: classification of the
handler's own errors by SQLSTATE, poison details in quarantine, durable attempt counts
(fenced, read back with the unclean mark, deleted with the frontier)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg
import pytest

from fencing.errors import Fenced, HandlerFailed, StatementRejected, Transient
from fencing.failures import Attempts
from fencing.postgres.store import PgFenceStore
from fencing.store import BatchCall
from fencing.types import ClaimRequest, Reject, SourceRecord, Token, TopicPartition, Verdict
from tests.integration.pg_helpers import count_effects, effect_handler, make_records

pytestmark = pytest.mark.integration

TP = TopicPartition("orders", 0)


def raising_sqlstate(state: str) -> Any:
    async def handle(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        await conn.execute(f"DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '{state}';"
                           " END $$")
        return []
    return handle


@pytest.mark.parametrize("state, transient", [("40001", True), ("40P01", True),
                                              ("55P03", True), ("23505", False),
                                              ("22P02", False), ("P0001", False)])
async def test_handler_sqlstate_is_transient_or_poison_and_nothing_applies(
        pg_store: PgFenceStore, pg_dsn: str, fence_schema: str, state: str,
        transient: bool) -> None:
    token = (await pg_store.claim([ClaimRequest(TP, 0)], lifetime="L1"))[TP]
    with pytest.raises(HandlerFailed) as info:
        await pg_store.process(BatchCall(TP, make_records(TP, range(3)),
                                         raising_sqlstate(state)), token)
    assert info.value.transient is transient
    assert isinstance(info.value.__cause__, asyncpg.PostgresError)
    assert info.value.__cause__.sqlstate == state
    assert await pg_store.observe([TP]) == {TP: token}
    # the connection went back to the pool usable: the next batch commits
    assert await pg_store.process(BatchCall(TP, make_records(TP, range(3)),
                                            effect_handler(fence_schema)), token) == Token(1, 3)


async def test_deployment_errors_in_the_handler_still_stop(pg_store: PgFenceStore) -> None:
    token = (await pg_store.claim([ClaimRequest(TP, 0)], lifetime="L1"))[TP]
    with pytest.raises(StatementRejected, match="42P01"):
        await pg_store.process(BatchCall(TP, make_records(TP, range(1)),
                                         raising_sqlstate("42P01")), token)


async def test_transient_marker_and_poison_details_reach_quarantine(
        pg_store: PgFenceStore, pg_dsn: str, fence_schema: str) -> None:
    token = (await pg_store.claim([ClaimRequest(TP, 0)], lifetime="L1"))[TP]

    async def marked(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        raise Transient("downstream busy")

    with pytest.raises(HandlerFailed) as info:
        await pg_store.process(BatchCall(TP, make_records(TP, range(2)), marked), token)
    assert info.value.transient

    reject = Reject("poison: ValueError: bad", error_type="ValueError", error_message="bad",
                    traceback_digest="0123456789abcdef")

    async def rejecting(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        return [reject for _ in records]

    await pg_store.process(BatchCall(TP, make_records(TP, [0]), rejecting), token)
    conn = await asyncpg.connect(pg_dsn)
    try:
        row = await conn.fetchrow(f'SELECT reason, error_type, error_message, traceback_digest'
                                  f' FROM "{fence_schema}".quarantine')
    finally:
        await conn.close()
    assert row is not None
    assert tuple(row) == (reject.reason, "ValueError", "bad", "0123456789abcdef")


async def test_attempt_counts_are_fenced_read_back_and_deleted_with_the_frontier(
        pg_store: PgFenceStore, pg_dsn: str, fence_schema: str) -> None:
    t1 = (await pg_store.claim([ClaimRequest(TP, 0)], lifetime="L1"))[TP]
    got = await pg_store.record_attempt(TP, t1, offset=0, max_attempts=3, error="E: boom",
                                        next_retry_in_s=1.5)
    assert got == Attempts(count=1, last_error="E: boom")
    got = await pg_store.record_attempt(TP, t1, offset=0, max_attempts=3, error=None,
                                        next_retry_in_s=None)
    assert got == Attempts(count=2, last_error="E: boom")  # the last error is kept
    # L1 dies (no release): L2's claim reads the count and the unclean end
    t2 = (await pg_store.claim([ClaimRequest(TP, 0)], lifetime="L2"))[TP]
    assert await pg_store.attempts({TP: t2}) == {
        TP: Attempts(unclean=True, count=2, last_error="E: boom")}
    with pytest.raises(Fenced):  # the stale owner cannot count
        await pg_store.record_attempt(TP, t1, offset=0, max_attempts=3, error=None,
                                      next_retry_in_s=None)
    await pg_store.journal([TP], lifetime="L2", event="release", epoch=t2.epoch)
    t3 = (await pg_store.claim([ClaimRequest(TP, 0)], lifetime="L3"))[TP]
    assert (await pg_store.attempts({TP: t3}))[TP] == Attempts(unclean=False, count=2,
                                                               last_error="E: boom")
    await pg_store.process(BatchCall(TP, make_records(TP, range(2)), effect_handler(fence_schema),
                                     clear_attempts=True), t3)
    conn = await asyncpg.connect(pg_dsn)
    try:
        left = await conn.fetchval(f'SELECT count(*) FROM "{fence_schema}".attempts')
    finally:
        await conn.close()
    assert left == 0
    assert (await count_effects(pg_dsn, fence_schema))["effects"] == 2
