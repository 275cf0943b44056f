"""Readiness from a real worker: false before its assignment is claimed, false during a forced
rebalance, true after; health stays true throughout.

The claim is held back deterministically with real PostgreSQL row locks: a transaction
inserts (uncommitted) or locks ``FOR UPDATE`` the group's partition rows, so the claim's
upsert waits on them while reads go on, and the assign callback is provably in progress
while ``/readyz`` is probed. (A table-level lock would not do: the store prepares its fence
UPDATE at connect, and preparing an UPDATE takes ROW EXCLUSIVE on the table, so a joining
worker would block before its HTTP port opens.)
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import pytest

from ops.stack.config import ServiceSettings
from tests.integration.observability_support import (
    free_port,
    http_get,
    readyz,
    start_worker,
)
from tests.integration.workers import create_topic, fresh_schema, unique
from tests.polling import wait_until

pytestmark = pytest.mark.integration

HOLD_S = 1.5  # well inside the lifecycle's 20 s budget


class RowLock:
    """A transaction holding the row locks of ``topic``'s partitions in ``group``, on its own loop.

    Rows that do not exist yet are inserted uncommitted (epoch 0, frontier 0) and vanish on
    release; the claim's INSERT ... ON CONFLICT waits for this transaction either way.
    """

    def __init__(self, dsn: str, schema: str, *, group: str, topic: str,
                 partitions: int) -> None:
        self._dsn, self._schema = dsn, schema
        self._group, self._topic, self._partitions = group, topic, partitions
        self._loop = asyncio.new_event_loop()
        self._conn: Any = None
        self._tx: Any = None

    def __enter__(self) -> RowLock:
        self._loop.run_until_complete(self._take())
        return self

    async def _take(self) -> None:
        self._conn = await asyncpg.connect(self._dsn)
        self._tx = self._conn.transaction()
        await self._tx.start()
        parts = list(range(self._partitions))
        await self._conn.execute(
            f'INSERT INTO "{self._schema}".partitions (group_id, topic, partition, epoch, frontier)'
            " SELECT $1, $2, p, 0, 0 FROM unnest($3::int[]) AS p ON CONFLICT DO NOTHING",
            self._group, self._topic, parts)
        locked = await self._conn.fetch(
            f'SELECT partition FROM "{self._schema}".partitions'
            " WHERE group_id = $1 AND topic = $2 FOR UPDATE", self._group, self._topic)
        assert sorted(r["partition"] for r in locked) == parts

    def __exit__(self, *exc: object) -> None:
        async def release() -> None:
            await self._tx.rollback()
            await self._conn.close()
        self._loop.run_until_complete(release())
        self._loop.close()


def _not_ready_for(base: str, seconds: float, phases: set[str]) -> list[str]:
    """Probe /readyz for ``seconds``; every answer must be 503 in one of ``phases``."""
    seen: list[str] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        got = readyz(base)
        if got is not None:
            code, body = got
            assert code == 503 and body["ready"] is False, body
            assert body["phase"] in phases, body
            seen.append(body["phase"])
        time.sleep(0.05)
    return seen


def test_readiness_before_assignment_during_rebalance_and_after(
        services: ServiceSettings) -> None:
    topic, group = unique("obs-ready"), unique("g-obs-ready")
    schema = asyncio.run(fresh_schema(services.dsn))
    create_topic(services.kafka_bootstrap, topic, 2)
    port_a, port_b = free_port(), free_port()
    a_url, b_url = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
    workers = []
    try:
        with RowLock(services.dsn, schema, group=group, topic=topic, partitions=2):
            workers.append(start_worker(topic=topic, group=group, schema=schema,
                                        http_port=port_a, name="a"))
            first = wait_until(lambda: readyz(a_url), timeout_s=60, what="worker a's port")
            assert first[0] == 503 and first[1]["phase"] in ("starting", "waiting",
                                                              "rebalancing")
            wait_until(lambda: (r := readyz(a_url)) and r[1]["phase"] == "rebalancing",
                     timeout_s=30, what="a's assignment in progress (claim blocked)")
            seen = _not_ready_for(a_url, HOLD_S, {"rebalancing"})
            assert seen, "no probe answered while the claim was held"
            health = http_get(a_url + "/healthz")
            assert health is not None and health[0] == 200
        ready = wait_until(lambda: (r := readyz(a_url)) and r[0] == 200 and r, timeout_s=30,
                         what="a ready after its claim")
        assert ready[1]["assigned"] == [f"{topic}[0]", f"{topic}[1]"]

        with RowLock(services.dsn, schema, group=group, topic=topic,
                     partitions=2):  # forced rebalance: a second member joins
            workers.append(start_worker(topic=topic, group=group, schema=schema,
                                        http_port=port_b, name="b"))
            wait_until(lambda: (r := readyz(a_url)) and r[0] == 503, timeout_s=30,
                     what="a not ready once the rebalance starts")
            wait_until(lambda: (r := readyz(a_url)) and r[1]["phase"] == "rebalancing"
                     and len(r[1]["assigned"]) == 0, timeout_s=30,
                     what="a revoked and waiting for its new claim")
            _not_ready_for(a_url, HOLD_S, {"rebalancing"})
        a_after = wait_until(lambda: (r := readyz(a_url)) and r[0] == 200 and r, timeout_s=30,
                           what="a ready after the rebalance")
        b_after = wait_until(lambda: (r := readyz(b_url)) and r[0] == 200 and r, timeout_s=30,
                           what="b ready after the rebalance")
        assert len(a_after[1]["assigned"]) == len(b_after[1]["assigned"]) == 1
        assert set(a_after[1]["assigned"]) | set(b_after[1]["assigned"]) == {
            f"{topic}[0]", f"{topic}[1]"}
        for w in workers:
            w.terminate()
        for w in workers:
            assert w.wait(30) == 0, w.log()[-3000:]
    finally:
        for w in workers:
            w.ensure_dead()
