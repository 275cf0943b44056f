"""``fencectl reset`` has an identity and a known outcome (real PostgreSQL, real Kafka, the
reset's COMMIT reply lost through ``fencing.testing.pgproxy``).

- Every reset is an operation with an id (printed, journaled); the same command run again
  is the same operation and is refused as already applied: the frontier moves back once,
  never twice.
- A lost COMMIT reply (cut after the server committed, or before it saw COMMIT: the client
  cannot tell them apart) or a reply held past ``--timeout-s`` exits 3 "outcome unknown",
  naming the operation and what to run; running the same command again then applies it
  exactly when it was not applied.
- ``--operation-id`` names another operation: the same reset applies once more.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from confluent_kafka import Producer

from fencing.postgres.store import PgFenceStore
from fencing.testing.pgproxy import Action
from fencing.types import ClaimRequest, TopicPartition
from tests.integration.observability_support import run_fencectl
from tests.integration.workers import ProxyThread, create_topic, unique

pytestmark = pytest.mark.integration

FRONTIER = 40


@dataclass(frozen=True, slots=True)
class Group:
    dsn: str
    schema: str
    group: str
    topic: str

    def reset(self, *extra: str, dsn: str | None = None) -> Any:
        return run_fencectl(
            "reset", "frontier", "--group", self.group, "--topic", self.topic, "--partition",
            "0", "--to-offset", "10", "--kafka-timeout-s", "20", "--yes-i-understand", *extra,
            env={"FENCE_SCHEMA": self.schema, **({} if dsn is None else {"FENCE_DSN": dsn})})

    def rows(self) -> tuple[tuple[int, int, str], list[tuple[str, int, str]]]:
        """The partition row (epoch, frontier, owner) and the journal (event, epoch, detail)."""
        async def read() -> tuple[tuple[int, int, str], list[tuple[str, int, str]]]:
            conn = await asyncpg.connect(self.dsn)
            try:
                row = await conn.fetchrow(
                    f'SELECT epoch, frontier, owner FROM "{self.schema}".partitions'
                    " WHERE group_id = $1 AND partition = 0", self.group)
                journal = await conn.fetch(
                    f'SELECT event, epoch, detail FROM "{self.schema}".journal'
                    " WHERE group_id = $1 AND partition = 0 ORDER BY id", self.group)
            finally:
                await conn.close()
            assert row is not None
            return (row["epoch"], row["frontier"], row["owner"]), [tuple(j) for j in journal]
        return asyncio.run(read())


async def _claimed(dsn: str, schema: str, group: str, topic: str) -> None:
    store = await PgFenceStore.connect(dsn, group_id=group, schema=schema)
    try:
        (token,) = (await store.claim([ClaimRequest(TopicPartition(topic, 0), FRONTIER)],
                                      lifetime="lt-owner")).values()
        assert token.frontier == FRONTIER
    finally:
        await store.close()


@pytest.fixture
def group(services: Any, pg_dsn: str, fence_schema: str) -> Group:
    topic, name = unique("rst-id"), unique("g-rst-id")
    create_topic(services.kafka_bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": services.kafka_bootstrap})
    for o in range(FRONTIER):
        producer.produce(topic, f"r{o}".encode(), partition=0)
    assert producer.flush(30) == 0
    asyncio.run(_claimed(pg_dsn, fence_schema, name, topic))
    return Group(pg_dsn, fence_schema, name, topic)


@pytest.fixture
def proxy(pg_dsn: str) -> Iterator[ProxyThread]:
    p = ProxyThread(pg_dsn)
    try:
        yield p
    finally:
        p.close()


def _resets(journal: list[tuple[str, int, str]]) -> list[tuple[str, int, str]]:
    return [j for j in journal if j[0] == "reset"]


def test_the_same_command_again_is_refused_as_applied(group: Group) -> None:
    first = group.reset("--json")
    assert first.returncode == 0, first.stderr
    operation = json.loads(first.stdout)["operation_id"]
    assert operation.startswith("reset-")
    again = group.reset()
    assert again.returncode == 1, (again.stdout, again.stderr)
    assert f"operation {operation} was already applied" in again.stderr
    assert "nothing changed" in again.stderr and "--operation-id" in again.stderr
    (epoch, frontier, owner), journal = group.rows()
    assert (epoch, frontier) == (2, 10) and owner.startswith("operator:")
    (reset,) = _resets(journal)
    assert reset[1] == 2 and reset[2].startswith(f"operation {operation}: frontier 40 -> 10")
    # another operation id is another operation: the same reset applies once more
    other = group.reset("--operation-id", "ticket-4711")
    assert other.returncode == 0, other.stderr
    assert "operation ticket-4711: applied and journaled" in other.stdout
    assert group.rows()[0][:2] == (3, 10)
    assert [j[2].split(":")[0] for j in _resets(group.rows()[1])] == [
        f"operation {operation}", "operation ticket-4711"]


@pytest.mark.parametrize(("action", "committed"), [(Action.CUT_AFTER, True),
                                                   (Action.CUT_BEFORE, False)])
def test_a_lost_commit_reply_is_outcome_unknown_and_the_rerun_settles_it(
        group: Group, proxy: ProxyThread, action: Action, committed: bool) -> None:
    rule = proxy.add_rule("COMMIT", action, 1)
    lost = group.reset(dsn=proxy.dsn)
    assert rule.fired.is_set()
    assert lost.returncode == 3, (lost.stdout, lost.stderr)
    assert "outcome unknown" in lost.stderr and "run the same command again" in lost.stderr
    operation = lost.stderr.split("operation ", 1)[1].split()[0]
    assert operation.startswith("reset-")
    # what the server did: the client could not tell
    assert group.rows()[0][:2] == ((2, 10) if committed else (1, FRONTIER))
    rerun = group.reset()
    if committed:
        assert rerun.returncode == 1 and "already applied" in rerun.stderr, rerun.stderr
    else:
        assert rerun.returncode == 0, rerun.stderr
    (epoch, frontier, _owner), journal = group.rows()
    assert (epoch, frontier) == (2, 10)  # applied exactly once either way
    (reset,) = _resets(journal)
    assert reset[2].startswith(f"operation {operation}:")


def test_a_held_commit_reply_times_out_as_outcome_unknown(group: Group,
                                                          proxy: ProxyThread) -> None:
    rule = proxy.add_rule("COMMIT", Action.HOLD_REPLY, 1)
    started = time.monotonic()
    held = group.reset("--timeout-s", "2", dsn=proxy.dsn)
    took_s = time.monotonic() - started
    assert rule.fired.is_set()
    assert held.returncode == 3, (held.stdout, held.stderr)
    assert "outcome unknown" in held.stderr
    assert took_s < 20, took_s  # the bound held: start-up, Kafka's facts, 2 s, exit
    # the server had committed before its reply was held
    assert group.rows()[0][:2] == (2, 10)
    assert group.reset().returncode == 1
    assert len(_resets(group.rows()[1])) == 1


def test_a_failure_before_commit_is_not_applied(group: Group, proxy: ProxyThread) -> None:
    rule = proxy.add_rule("INSERT INTO", Action.CUT_BEFORE, 1)  # the journal row
    failed = group.reset(dsn=proxy.dsn)
    assert rule.fired.is_set()
    assert failed.returncode == 1, (failed.stdout, failed.stderr)
    assert "not applied" in failed.stderr and "nothing changed" in failed.stderr
    assert group.rows()[0][:2] == (1, FRONTIER) and not _resets(group.rows()[1])
    assert group.reset().returncode == 0
    assert group.rows()[0][:2] == (2, 10)
