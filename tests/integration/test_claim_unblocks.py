"""A successor's claim is not held hostage by an older owner's session that will never
finish on its own (real PostgreSQL).

The crash matrix found it: a member frozen (SIGSTOP) in the middle of an extended-protocol
exchange keeps its transaction *active* (waiting for the client), so
``idle_in_transaction_session_timeout`` never ends it, and the successor's claim waited past
its budget. Here the older owner's session holds the partition row in a transaction that is
busy (``pg_sleep``), which is just as unreachable by the idle timeout. The claim must end
that session after ``unblock_after_s`` and go on; the ended transaction applies nothing.
"""
from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg
import pytest

from fencing.postgres.store import APPLICATION_NAME, PgFenceStore
from fencing.types import ClaimRequest, Token, TopicPartition

pytestmark = pytest.mark.integration

TP = TopicPartition("unblock", 0)


async def _busy_owner(dsn: str, schema: str,
                      group: str) -> tuple[asyncpg.Connection, asyncio.Future[str]]:
    """A fenceworker session that moved the frontier under its lock and then hangs."""
    conn = await asyncpg.connect(dsn, server_settings={"application_name": APPLICATION_NAME})
    await conn.execute("BEGIN")
    await conn.execute(f'UPDATE "{schema}".partitions SET frontier = 99 '
                       "WHERE group_id = $1 AND topic = $2 AND partition = $3",
                       group, TP.topic, TP.partition)
    hang = asyncio.ensure_future(conn.execute("SELECT pg_sleep(60)"))
    await asyncio.sleep(0.2)
    return conn, hang


@pytest.mark.parametrize("unblock_after_s", [1.0, None], ids=["unblocks", "waits"])
async def test_claim_ends_an_older_owners_session_that_blocks_it(
        pg_dsn: str, fence_schema: str, unblock_after_s: float | None) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    store = await PgFenceStore.connect(pg_dsn, group_id=group, schema=fence_schema,
                                       unblock_after_s=unblock_after_s, command_timeout_s=8.0)
    try:
        await store.claim([ClaimRequest(TP, 0)], lifetime="old")
        owner, hang = await _busy_owner(pg_dsn, fence_schema, group)
        started = time.monotonic()
        try:
            claimed = await asyncio.wait_for(
                store.claim([ClaimRequest(TP, 0)], lifetime="new"), timeout=6.0)
        except TimeoutError:
            claimed = None
        elapsed = time.monotonic() - started
        if unblock_after_s is None:  # the control: without it the claim is held hostage
            assert claimed is None
            admin = await asyncpg.connect(pg_dsn)
            try:
                await admin.execute("SELECT pg_terminate_backend($1)", owner.get_server_pid())
            finally:
                await admin.close()
            hang.cancel()
            owner.terminate()
            return
        assert claimed == {TP: Token(2, 0)}, claimed  # the owner's frontier 99 rolled back
        assert elapsed < 4.0, elapsed
        with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, OSError)):
            await hang  # its session was ended
        assert await store.observe([TP]) == {TP: Token(2, 0)}
    finally:
        await store.close(timeout_s=2.0)
