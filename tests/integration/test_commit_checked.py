"""COMMIT is checked, and a slow COMMIT is not misread (real PostgreSQL,
``fencing.testing.pgproxy``).

- item 4: PostgreSQL answers COMMIT with ROLLBACK when a handler caught a statement error
  without a SAVEPOINT; a handler may also end the transaction itself. Either way the batch
  is not reported applied: ``HandlerMisuse`` names the mistake, the frontier stays put.
- item 5: a lost COMMIT reply whose COMMIT is still being processed by the server (a
  deferred constraint trigger sleeps at COMMIT) must resolve as committed: the settled
  re-read waits for the row lock instead of reading the pre-commit row, retrying into a
  fence and retiring as a "zombie".
- deterministic statement errors are ``StatementRejected`` naming the SQLSTATE, one call.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest

from fencing.errors import HandlerMisuse, StatementRejected
from fencing.guarded import CallHooks, guarded_process
from fencing.postgres.store import PgFenceStore
from fencing.store import BatchCall
from fencing.testing.pgproxy import Action, PgProxy
from fencing.types import ClaimRequest, SourceRecord, Token, TopicPartition, Verdict
from tests.integration.pg_helpers import count_effects, effect_handler, make_records

pytestmark = pytest.mark.integration

TP = TopicPartition("checked", 0)
COMMIT_SLEEP_S = 1.5


async def _no_wait(_seconds: float) -> None:
    return None


def _live() -> None:
    return None


@pytest.fixture
async def direct(pg_dsn: str, fence_schema: str) -> AsyncIterator[PgFenceStore]:
    store = await PgFenceStore.connect(pg_dsn, group_id=f"g-{uuid.uuid4().hex[:8]}",
                                       schema=fence_schema, pool_max=2)
    try:
        yield store
    finally:
        await store.close()


@pytest.mark.parametrize(("bad", "message"), [
    ((), "answered COMMIT with ROLLBACK.*SAVEPOINT"),  # COMMIT is the next statement
    ((1,), "ran in an aborted transaction.*SAVEPOINT"),  # the quarantine insert comes first
])
async def test_commit_answered_rollback_is_handler_misuse(direct: PgFenceStore,
                                                          fence_schema: str, pg_dsn: str,
                                                          bad: tuple[int, ...],
                                                          message: str) -> None:
    inner = effect_handler(fence_schema)

    async def swallowing(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        verdicts = await inner(conn, records)
        try:
            await conn.execute("SELECT 1 / 0")
        except asyncpg.DivisionByZeroError:
            pass  # caught without a SAVEPOINT: the transaction is aborted
        return verdicts

    token = (await direct.claim([ClaimRequest(TP, 0)], lifetime="L1"))[TP]
    with pytest.raises(HandlerMisuse, match=message):
        await direct.process(BatchCall(TP, make_records(TP, range(4), bad=bad), swallowing), token)
    assert await direct.observe([TP]) == {TP: Token(1, 0)}
    counts = await count_effects(pg_dsn, fence_schema)
    assert (counts["effects"], counts["quarantine"]) == (0, 0)
    # the connection went back to the pool usable: the same batch now commits normally
    assert await direct.process(BatchCall(TP, make_records(TP, range(4), bad=bad), inner),
                                token) == Token(1, 4)


async def test_handler_ending_the_transaction_is_handler_misuse(direct: PgFenceStore,
                                                                fence_schema: str,
                                                                pg_dsn: str) -> None:
    inner = effect_handler(fence_schema)

    async def ending(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        verdicts = await inner(conn, records)
        await conn.execute("ROLLBACK")
        return verdicts

    token = (await direct.claim([ClaimRequest(TP, 0)], lifetime="L1"))[TP]
    with pytest.raises(HandlerMisuse, match="ended the store's transaction itself"):
        await direct.process(BatchCall(TP, make_records(TP, range(3)), ending), token)
    assert await direct.observe([TP]) == {TP: Token(1, 0)}
    assert (await count_effects(pg_dsn, fence_schema))["effects"] == 0


async def test_undefined_table_is_rejected_once_naming_the_sqlstate(direct: PgFenceStore) -> None:
    calls = 0

    async def undefined(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        nonlocal calls
        calls += 1
        await conn.execute("SELECT * FROM no_such_table_here")
        return []

    token = (await direct.claim([ClaimRequest(TP, 0)], lifetime="L1"))[TP]
    with pytest.raises(StatementRejected, match="42P01") as info:
        await guarded_process(direct, BatchCall(TP, make_records(TP, range(2)), undefined),
                              token, wait=_no_wait, check_live=_live)
    assert info.value.sqlstate == "42P01"
    assert calls == 1  # not retried as unavailability
    assert await direct.observe([TP]) == {TP: Token(1, 0)}


async def test_slow_commit_with_lost_reply_resolves_as_committed(
        direct: PgFenceStore, fence_schema: str, pg_dsn: str) -> None:
    s = f'"{fence_schema}"'
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(f"""
            CREATE TABLE {s}.lagging (k int);
            CREATE FUNCTION {s}.sleep_at_end() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN PERFORM pg_sleep({COMMIT_SLEEP_S}); RETURN NULL; END $$;
            CREATE CONSTRAINT TRIGGER lag AFTER INSERT ON {s}.lagging
                DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
                EXECUTE FUNCTION {s}.sleep_at_end();""")
    finally:
        await conn.close()
    inner = effect_handler(fence_schema)

    async def slow_at_commit(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        await conn.execute(f"INSERT INTO {s}.lagging VALUES (1)")
        return await inner(conn, records)

    parts = urlsplit(pg_dsn)
    async with PgProxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        proxied = await PgFenceStore.connect(proxy.dsn(pg_dsn), group_id=direct.group_id,
                                             schema=fence_schema, pool_max=2)
        try:
            token = (await direct.claim([ClaimRequest(TP, 0)], lifetime="L1"))[TP]
            rule = proxy.add_rule("COMMIT", Action.CUT_SENT)  # COMMIT sent, reply lost
            resolved: list[tuple[str, str]] = []
            started = time.monotonic()
            new = await guarded_process(
                direct_and_proxied(proxied, direct),  # type: ignore[arg-type]
                BatchCall(TP, make_records(TP, range(5)), slow_at_commit), token,
                wait=_no_wait, check_live=_live,
                hooks=CallHooks(on_resolve=lambda op, outcome: resolved.append((op, outcome))))
            assert rule.fired.is_set()
        finally:
            await proxied.close()
    assert new == Token(1, 5)
    assert resolved == [("process", "committed")]
    assert time.monotonic() - started >= COMMIT_SLEEP_S * 0.8  # the re-read waited
    assert await direct.observe([TP]) == {TP: Token(1, 5)}
    assert (await count_effects(pg_dsn, fence_schema))["effects"] == 5  # exactly once


class direct_and_proxied:
    """Processes through the proxy (where the reply is lost) and re-reads directly (as a
    second connection of the same worker would)."""

    def __init__(self, proxied: PgFenceStore, direct: PgFenceStore) -> None:
        self.group_id = direct.group_id
        self._proxied, self._direct = proxied, direct

    async def process(self, *args: Any, **kwargs: Any) -> Token:
        return await self._proxied.process(*args, **kwargs)

    async def observe(self, tps: Sequence[TopicPartition], *, settled: bool = False) -> Any:
        return await self._direct.observe(tps, settled=settled)
