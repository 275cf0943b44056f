"""Lost COMMIT replies and a vanishing server, through ``fencing.testing.pgproxy`` (real
PostgreSQL).

Findings these tests pin down (asyncpg 0.32, PostgreSQL 15):
- a cut after COMMIT reached the server (it committed) and a cut before it was forwarded
  (it rolled back) raise the same ``ConnectionDoesNotExistError``: only a re-read tells;
- a command timeout or a cancellation while COMMIT's reply is awaited leaves the outcome
  unknown (here the server had committed);
- an error reply to COMMIT (deferred constraint) is a proven rollback; a deterministic one
  (SQLSTATE class 23) is ``StatementRejected``, not retried.
"""
from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest

from fencing.errors import NotCommitted, OutcomeUnknown, ReadFailed, StatementRejected
from fencing.guarded import CallHooks, guarded_claim, guarded_observe, guarded_process
from fencing.postgres.store import PgFenceStore
from fencing.store import BatchCall
from fencing.testing.pgproxy import Action, PgProxy
from fencing.types import ClaimRequest, SourceRecord, Token, TopicPartition, Verdict
from tests.integration.pg_helpers import count_effects, effect_handler, make_records

pytestmark = pytest.mark.integration

TP = TopicPartition("lost", 0)


class Recorder:
    """Injected wait and callbacks: records waits, resolutions and store calls."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.resolved: list[tuple[str, str]] = []

    async def wait(self, seconds: float) -> None:
        self.waits.append(seconds)

    def on_resolve(self, op: str, outcome: str) -> None:
        self.resolved.append((op, outcome))


class Counting:
    """A FenceStore that counts calls per operation and delegates to a real store."""

    def __init__(self, store: PgFenceStore) -> None:
        self.store = store
        self.group_id = store.group_id
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.store, name)

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return await target(*args, **kwargs)

        return counted


def _live() -> None:
    return None


@pytest.fixture
async def proxy(pg_dsn: str) -> AsyncIterator[PgProxy]:
    parts = urlsplit(pg_dsn)
    async with PgProxy(parts.hostname or "127.0.0.1", parts.port or 5432) as p:
        yield p


@pytest.fixture
async def stores(pg_dsn: str, fence_schema: str,
                 proxy: PgProxy) -> AsyncIterator[tuple[PgFenceStore, PgFenceStore]]:
    """(direct store, store through the proxy), same group and schema."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    direct = await PgFenceStore.connect(pg_dsn, group_id=group, schema=fence_schema, pool_max=2)
    proxied = await PgFenceStore.connect(proxy.dsn(pg_dsn), group_id=group, schema=fence_schema,
                                         pool_max=2, command_timeout_s=5.0)
    try:
        yield direct, proxied
    finally:
        await proxied.close()
        await direct.close()


@pytest.mark.parametrize("action", [Action.CUT_AFTER, Action.CUT_BEFORE])
async def test_raw_lost_commit_is_unknown_either_way(
        stores: tuple[PgFenceStore, PgFenceStore], proxy: PgProxy, fence_schema: str,
        pg_dsn: str, action: Action) -> None:
    direct, proxied = stores
    token = (await direct.claim([ClaimRequest(TP, 0)], lifetime="L1"))[TP]
    rule = proxy.add_rule("COMMIT", action)
    with pytest.raises(OutcomeUnknown) as info:
        await proxied.process(BatchCall(TP, make_records(TP, range(4), bad=[2]),
                                        effect_handler(fence_schema)), token)
    assert rule.fired.is_set()
    assert type(info.value.__cause__) is asyncpg.ConnectionDoesNotExistError
    committed = action is Action.CUT_AFTER
    assert await direct.observe([TP]) == {TP: Token(1, 4 if committed else 0)}
    counts = await count_effects(pg_dsn, fence_schema)
    assert (counts["effects"], counts["quarantine"]) == ((3, 1) if committed else (0, 0))


@pytest.mark.parametrize(("action", "resolution", "waits"), [
    (Action.CUT_AFTER, "committed", []),
    (Action.CUT_BEFORE, "not-committed", [0.1]),
])
async def test_guarded_process_resolves_lost_commit_exactly_once(
        stores: tuple[PgFenceStore, PgFenceStore], proxy: PgProxy, fence_schema: str,
        pg_dsn: str, action: Action, resolution: str, waits: list[float]) -> None:
    direct, proxied = stores
    token = (await direct.claim([ClaimRequest(TP, 0)], lifetime="L1"))[TP]
    proxy.add_rule("COMMIT", action)
    rec = Recorder()
    new = await guarded_process(proxied, BatchCall(TP, make_records(TP, range(5)),
                                                   effect_handler(fence_schema)),
                                token, wait=rec.wait, check_live=_live,
                                hooks=CallHooks(on_resolve=rec.on_resolve))
    assert new == Token(1, 5)
    assert rec.resolved == [("process", resolution)] and rec.waits == waits
    assert await direct.observe([TP]) == {TP: Token(1, 5)}
    conn = await asyncpg.connect(pg_dsn)
    try:
        offsets = [r[0] for r in await conn.fetch(
            f'SELECT "offset" FROM "{fence_schema}".effects ORDER BY 1')]
    finally:
        await conn.close()
    assert offsets == [0, 1, 2, 3, 4]  # each effect exactly once


@pytest.mark.parametrize(("action", "final_epoch"), [
    (Action.CUT_AFTER, 2), (Action.CUT_BEFORE, 1)])
async def test_guarded_claim_resolves_lost_reply_by_claiming_afresh(
        stores: tuple[PgFenceStore, PgFenceStore], proxy: PgProxy, fence_schema: str,
        pg_dsn: str, action: Action, final_epoch: int) -> None:
    proxied = stores[1]
    rule = proxy.add_rule("INSERT INTO \"" + fence_schema + "\".partitions", action)
    rec = Recorder()
    got = await guarded_claim(proxied, [ClaimRequest(TP, 3)], lifetime="L1", wait=rec.wait,
                              check_live=_live, hooks=CallHooks(on_resolve=rec.on_resolve))
    assert rule.fired.is_set()
    assert got == {TP: Token(final_epoch, 3)}
    assert rec.resolved == [("claim", "reclaim")] and rec.waits == [0.1]
    conn = await asyncpg.connect(pg_dsn)
    try:
        epochs = [r[0] for r in await conn.fetch(
            f'SELECT epoch FROM "{fence_schema}".journal WHERE event = $1 ORDER BY id', "claim")]
    finally:
        await conn.close()
    assert epochs == list(range(1, final_epoch + 1))


async def test_cancellation_during_commit_propagates_with_unknown_outcome(
        stores: tuple[PgFenceStore, PgFenceStore], proxy: PgProxy, fence_schema: str) -> None:
    direct, proxied = stores
    token = (await direct.claim([ClaimRequest(TP, 0)], lifetime="L1"))[TP]
    rule = proxy.add_rule("COMMIT", Action.HOLD_REPLY)
    task = asyncio.ensure_future(proxied.process(BatchCall(TP, make_records(TP, range(3)),
                                                           effect_handler(fence_schema)), token))
    await asyncio.wait_for(rule.fired.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError) as info:
        await task
    assert any("outcome unknown" in n for n in getattr(info.value, "__notes__", []))
    proxy.release()
    assert await direct.observe([TP]) == {TP: Token(1, 3)}  # the server had committed


async def test_commit_timeout_is_outcome_unknown(pg_dsn: str, fence_schema: str,
                                                 proxy: PgProxy) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    direct = await PgFenceStore.connect(pg_dsn, group_id=group, schema=fence_schema)
    slow = await PgFenceStore.connect(proxy.dsn(pg_dsn), group_id=group, schema=fence_schema,
                                      command_timeout_s=0.3)
    try:
        token = (await direct.claim([ClaimRequest(TP, 0)], lifetime="L1"))[TP]
        proxy.add_rule("COMMIT", Action.HOLD_REPLY)
        with pytest.raises(OutcomeUnknown) as info:
            await slow.process(BatchCall(TP, make_records(TP, range(2)),
                                         effect_handler(fence_schema)), token)
        assert isinstance(info.value.__cause__, TimeoutError)
        proxy.release()
        assert await direct.observe([TP]) == {TP: Token(1, 2)}
    finally:
        await slow.close()
        await direct.close()


async def test_error_reply_to_commit_is_not_committed_and_atomic(
        stores: tuple[PgFenceStore, PgFenceStore], fence_schema: str, pg_dsn: str) -> None:
    """Quarantine insert done, COMMIT fails (deferred unique violation): neither persists."""
    direct = stores[0]
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(f'CREATE TABLE "{fence_schema}".once (k int, CONSTRAINT once_k UNIQUE'
                           " (k) DEFERRABLE INITIALLY DEFERRED)")
    finally:
        await conn.close()
    inner = effect_handler(fence_schema)

    async def clashing(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        await conn.execute(f'INSERT INTO "{fence_schema}".once VALUES (1), (1)')
        return await inner(conn, records)

    token = (await direct.claim([ClaimRequest(TP, 0)], lifetime="L1"))[TP]
    # proven not committed, and deterministic: StatementRejected, never retried
    with pytest.raises(StatementRejected) as info:
        await direct.process(BatchCall(TP, make_records(TP, range(4), bad=[1, 3]), clashing), token)
    assert isinstance(info.value.__cause__, asyncpg.UniqueViolationError)
    assert info.value.sqlstate == "23505"
    assert await direct.observe([TP]) == {TP: Token(1, 0)}
    counts = await count_effects(pg_dsn, fence_schema)
    assert (counts["effects"], counts["quarantine"]) == (0, 0)


async def test_server_gone_three_calls_then_typed_error_then_recovery(
        stores: tuple[PgFenceStore, PgFenceStore], proxy: PgProxy, fence_schema: str) -> None:
    direct, proxied = stores
    token = (await direct.claim([ClaimRequest(TP, 0)], lifetime="L1"))[TP]
    counting = Counting(proxied)
    await proxy.refuse(True)
    rec = Recorder()
    records = make_records(TP, range(3))
    with pytest.raises(NotCommitted):
        await guarded_process(counting, BatchCall(TP, records, effect_handler(fence_schema)),
                              token, wait=rec.wait, check_live=_live)
    assert counting.calls == {"process": 3} and rec.waits == [0.1, 0.2]
    rec.waits.clear()
    with pytest.raises(ReadFailed):
        await guarded_observe(counting, [TP], wait=rec.wait, check_live=_live)
    assert counting.calls["observe"] == 3 and rec.waits == [0.1, 0.2]
    await proxy.refuse(False)
    rec.waits.clear()
    new = await guarded_process(counting, BatchCall(TP, records, effect_handler(fence_schema)),
                                token, wait=rec.wait, check_live=_live)
    assert new == Token(1, 3) and rec.waits == [] and counting.calls["process"] == 4
    observed: Mapping[TopicPartition, Token | None] = await direct.observe([TP])
    assert observed == {TP: Token(1, 3)}


async def test_claim_cancelled_in_flight_propagates_then_resolves_by_observe(
        stores: tuple[PgFenceStore, PgFenceStore], proxy: PgProxy, fence_schema: str) -> None:
    direct, proxied = stores
    rule = proxy.add_rule(f'INSERT INTO "{fence_schema}".partitions', Action.HOLD_REPLY)
    task = asyncio.ensure_future(proxied.claim([ClaimRequest(TP, 0)], lifetime="L1"))
    await asyncio.wait_for(rule.fired.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError) as info:
        await task
    assert any("outcome unknown" in n for n in getattr(info.value, "__notes__", []))
    proxy.release()
    assert await direct.observe([TP]) == {TP: Token(1, 0)}  # it had committed


async def test_session_ended_before_commit_is_not_committed(
        stores: tuple[PgFenceStore, PgFenceStore], fence_schema: str, pg_dsn: str) -> None:
    """The server ends the session mid-transaction (idle-in-transaction timeout): asyncpg
    refuses COMMIT with InterfaceError before writing it; proven not committed."""
    direct = stores[0]
    inner = effect_handler(fence_schema)

    async def dawdle(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        verdicts = await inner(conn, records)
        await conn.execute("SET LOCAL idle_in_transaction_session_timeout = '50ms'")
        for _ in range(200):  # until asyncpg has seen the server end the session (not a
            await asyncio.sleep(0.05)  # fixed time: a loaded server may take longer)
            if conn.is_closed():
                break
        assert conn.is_closed(), "the server did not end the idle transaction's session"
        return verdicts

    token = (await direct.claim([ClaimRequest(TP, 0)], lifetime="L1"))[TP]
    with pytest.raises(NotCommitted) as info:
        await direct.process(BatchCall(TP, make_records(TP, range(3)), dawdle), token)
    assert isinstance(info.value.__cause__, asyncpg.InterfaceError)
    assert await direct.observe([TP]) == {TP: Token(1, 0)}
    assert (await count_effects(pg_dsn, fence_schema))["effects"] == 0
    assert await direct.process(BatchCall(TP, make_records(TP, range(3)), inner),
                                token) == Token(1, 3)
