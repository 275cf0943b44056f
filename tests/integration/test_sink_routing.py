"""Routing (``--sink table='SCHEMA.{topic}'``): a ``--topic-pattern`` subscription over three
topics into three tables, against real Kafka and PostgreSQL, through a SIGKILL, a member
joining (a rebalance) and COMMIT replies lost both ways (a proxy cuts the connection after
and before COMMIT reaches PostgreSQL).

- One table exists before (typed: a ``bigint`` key), one is created by the sink on the first
  batch of its topic (a name with ``.``: stored with ``_``), and the third topic is created
  while the members run: its table is created on its first sight, inside the fenced
  transaction of that batch. Each table must equal its topic's fold (upserts by key,
  tombstones delete) and the quarantine hold each topic's records that are not JSON,
  exactly once. ``make test`` runs one group protocol; ``make sink-routing``
  (``FENCE_SINK_ROUTING=full``) all three, ``FENCE_SINK_ROUTING_REPEAT`` times each.
- Kafka's own rule that makes the ``.`` -> ``_`` mapping safe is pinned: it refuses a topic
  whose name collides with an existing one after that replacement.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from typing import Any

import asyncpg
import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from fencing.testing.pgproxy import Action
from ops.reference.generate import GeneratedRecord
from tests.integration.workers import (
    GROUP_SETUPS,
    GroupSetup,
    ProxyThread,
    WorkerProc,
    committed_total,
    create_topic,
    durable_rows,
    fresh_schema,
    produce,
    stop_live,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration

PARTITIONS, COUNT, KEYS = 4, 2_400, 150


def _stream(topic: str, seed: int) -> tuple[list[GeneratedRecord], dict[str, int],
                                            set[tuple[int, int]]]:
    """Records of ``topic``: key k always in partition k % PARTITIONS, value {"id", "n"};
    every 23rd a tombstone, every 37th not JSON. Its fold (id -> n) and the (partition,
    offset) of each record that must be quarantined."""
    out: list[GeneratedRecord] = []
    fold: dict[str, int] = {}
    unfit: set[tuple[int, int]] = set()
    offsets = [0] * PARTITIONS
    for i in range(COUNT):
        k = 1 + (i * 7919 + seed) % KEYS
        p = k % PARTITIONS
        value: bytes | None
        if i % 23 == 5:
            value = None
            fold.pop(str(k), None)
        elif i % 37 == 11:
            value = b"{not json"
            unfit.add((p, offsets[p]))
        else:
            value = json.dumps({"id": k, "n": i}).encode()
            fold[str(k)] = i
        out.append(GeneratedRecord(topic, p, str(k).encode(), value))  # type: ignore[arg-type]
        offsets[p] += 1
    return out, fold, unfit


async def _table_fold(dsn: str, schema: str, table: str, typed: bool) -> dict[str, int]:
    conn = await asyncpg.connect(dsn)
    try:
        sql = (f'SELECT id::text AS id, n FROM "{schema}"."{table}"' if typed else
               f'SELECT id, (payload->>\'n\')::bigint AS n FROM "{schema}"."{table}"')
        return {r["id"]: r["n"] for r in await conn.fetch(sql)}
    finally:
        await conn.close()


async def _quarantined(dsn: str, schema: str, group: str, topic: str) -> list[tuple[int, int]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(f'SELECT partition, "offset" FROM "{schema}".quarantine '
                                "WHERE group_id = $1 AND topic = $2", group, topic)
    finally:
        await conn.close()
    return [(r["partition"], r["offset"]) for r in rows]


def _cases() -> list[Any]:
    if os.environ.get("FENCE_SINK_ROUTING") == "full":
        repeat = int(os.environ.get("FENCE_SINK_ROUTING_REPEAT", "5"))
        return [pytest.param(s, id=f"{s.name}-{n}") for s in GROUP_SETUPS
                for n in range(1, repeat + 1)]
    return [pytest.param(next(s for s in GROUP_SETUPS if s.name == "kip848-consumer"),
                         id="kip848-consumer")]


@pytest.mark.parametrize("setup", _cases())
def test_a_pattern_routed_into_three_tables_under_a_kill_and_lost_commits(
        services: Any, setup: GroupSetup) -> None:
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    prefix, group = unique("rt"), unique("grt")
    # a: its table exists (typed); b: a '.' in the name, table made by the sink at its first
    # batch; c: created while the members run
    topics = {"a": f"{prefix}-a", "b": f"{prefix}.b", "c": f"{prefix}-c"}
    tables = {"a": f"{prefix}-a", "b": f"{prefix}_b", "c": f"{prefix}-c"}
    schema = asyncio.run(fresh_schema(dsn))

    async def precreate() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'CREATE TABLE "{schema}"."{tables["a"]}" (id bigint PRIMARY '
                               "KEY, n bigint NOT NULL, kafka_offset bigint)")
        finally:
            await conn.close()
    asyncio.run(precreate())
    streams = {x: _stream(t, seed) for seed, (x, t) in enumerate(topics.items())}
    for x in ("a", "b"):
        create_topic(bootstrap, topics[x], PARTITIONS)
    proxy = ProxyThread(dsn)
    procs: list[WorkerProc] = []

    def start(name: str) -> WorkerProc:
        w = WorkerProc(topic=None, group=group, schema=schema, setup=setup, name=name,
                       env={"FENCE_DSN": proxy.dsn},
                       extra=("--topic-pattern", f"{prefix}[.-][a-c]",
                              "-X", "topic.metadata.refresh.interval.ms=1000",
                              "--sink", f"table={schema}.{{topic}}", "--sink-key", "id",
                              "--batch-max-records", "60"))
        procs.append(w)
        return w

    def total() -> int:
        return sum(committed_total(dsn, schema, group, t) for t in topics.values())

    def feed(x: str) -> None:
        records = streams[x][0]
        for i in range(0, COUNT, 200):
            produce(bootstrap, records[i:i + 200])
            time.sleep(0.5)

    def lose_commit(action: Action) -> None:
        rule = proxy.add_rule("COMMIT", action, times=1)
        wait_until(lambda: rule.count >= 1, timeout_s=60, what=f"{action.value} fired")

    feeders = [threading.Thread(target=feed, args=(x,), daemon=True) for x in ("a", "b")]
    try:
        w1, _w2 = start("w1"), start("w2")
        for f in feeders:
            f.start()
        wait_until(lambda: total() >= 600, timeout_s=120, what="600 records committed")
        create_topic(bootstrap, topics["c"], PARTITIONS)     # picked up by the pattern
        later = threading.Thread(target=feed, args=("c",), daemon=True)
        later.start()
        feeders.append(later)
        lose_commit(Action.CUT_AFTER)
        wait_until(lambda: committed_total(dsn, schema, group, topics["c"]) > 0,
                   timeout_s=120, what=f"{topics['c']}, created while running, applied")
        w1.kill()                                             # crash
        w1.wait(10)
        w3 = start("w3")                                      # join: a rebalance
        lose_commit(Action.CUT_BEFORE)
        wait_until(w3.owns_partitions, timeout_s=90, what="w3 owning partitions")
        for f in feeders:
            f.join(timeout=120)
        wait_until(lambda: total() >= 3 * COUNT, timeout_s=240, what="every record committed")
        stop_live(procs)
    finally:
        for w in procs:
            w.ensure_dead()
        proxy.close()
    assert not any("lifetime ends" in w.log() for w in procs)
    moved = [e for t in topics.values()
             for e, _f in asyncio.run(durable_rows(dsn, schema, group, t)).values()]
    assert len(moved) == 3 * PARTITIONS and max(moved) >= 2, moved  # handed over
    for x, topic in topics.items():
        _records, fold, unfit = streams[x]
        got = asyncio.run(_table_fold(dsn, schema, tables[x], typed=x == "a"))
        assert got == fold, (topic, len(got), len(fold),
                             sorted(set(got.items()) ^ set(fold.items()))[:5])
        quarantined = asyncio.run(_quarantined(dsn, schema, group, topic))
        assert sorted(quarantined) == sorted(unfit), topic  # each exactly once


def test_kafka_refuses_a_topic_that_collides_after_dot_to_underscore(services: Any) -> None:
    """What makes the routing rule ``.`` -> ``_`` map no two topics to one table."""
    prefix = unique("coll")
    create_topic(services.kafka_bootstrap, f"{prefix}.x", 1)
    admin = AdminClient({"bootstrap.servers": services.kafka_bootstrap})
    fut = admin.create_topics([NewTopic(f"{prefix}_x", 1, 1)])[f"{prefix}_x"]
    with pytest.raises(KafkaException, match="collides with existing topic"):
        fut.result(timeout=30)
