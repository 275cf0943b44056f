"""Kafka's view of progress is exact, checked with Kafka's own ``kafka-consumer-groups``.

Per group protocol, real worker processes go through a rebalance with a SIGKILL, a SIGTERM
and lost COMMIT replies (``ProxyThread`` cutting one worker's connections around COMMIT,
both ways), drain to the high watermarks and stop with SIGTERM. Then
``kafka-consumer-groups --describe`` must show CURRENT-OFFSET equal to PostgreSQL's
frontier and LAG 0 on every partition.

Second phase: the group's Kafka offsets are made stale while it is empty, and one member
joins with nothing left to process. It must repair them by itself once positioned (seen
live through the AdminClient, while it runs), and the tool must agree after it stops.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient

from consumer.kafka.source import KafkaSource
from fencing.testing.pgproxy import Action
from fencing.types import TopicPartition
from ops.stack.kafka_tools import describe_group
from tests.integration.workers import (
    GROUP_SETUPS,
    GroupSetup,
    ProxyThread,
    WorkerProc,
    create_topic,
    durable_rows,
    exactly_once_problems,
    fresh_schema,
    generated,
    produce,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration

PARTITIONS = 4
RECORDS = 12_000


def _frontiers(dsn: str, schema: str, group: str, topic: str) -> dict[int, int]:
    return {p: f for p, (_e, f) in asyncio.run(durable_rows(dsn, schema, group, topic)).items()}


def _produce_in_chunks(bootstrap: str, recs: list, chunks: int, pause_s: float) -> threading.Thread:
    size = -(-len(recs) // chunks)

    def run() -> None:
        for i in range(0, len(recs), size):
            produce(bootstrap, recs[i:i + size])
            time.sleep(pause_s)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _cut_commits(proxy: ProxyThread, cuts: int) -> None:
    """Lose ``cuts`` COMMIT replies one at a time, alternating committed / not committed."""
    for i in range(cuts):
        action = Action.CUT_AFTER if i % 2 == 0 else Action.CUT_BEFORE
        rule = proxy.add_rule("COMMIT", action, times=1)
        wait_until(lambda rule=rule: rule.count >= 1,  # type: ignore[misc]
                   timeout_s=30, what=f"{action} fired")


def _assert_tool_agrees(bootstrap: str, group: str, topic: str,
                        frontiers: dict[int, int], ends: dict[int, int]) -> None:
    rows, out = describe_group(bootstrap, group)
    got = {r.partition: r for r in rows if r.topic == topic}
    assert sorted(got) == list(range(PARTITIONS)), out
    for p, row in sorted(got.items()):
        assert row.current_offset == frontiers[p], (p, frontiers, out)
        assert row.log_end_offset == ends[p], (p, ends, out)
        assert row.lag == 0, (p, out)


@pytest.mark.parametrize("setup", GROUP_SETUPS, ids=lambda s: s.name)
def test_kafka_offsets_equal_frontiers_after_churn(services, setup: GroupSetup) -> None:
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    topic, group = unique("mirror"), unique("gmirror")
    create_topic(bootstrap, topic, PARTITIONS)
    recs, source = generated(topic, count=RECORDS, partitions=PARTITIONS, klass="conflict",
                             seed=16)
    ends = {p: max(r.offset for r in source if r.partition == p) + 1 for p in range(PARTITIONS)}
    schema = asyncio.run(fresh_schema(dsn))
    proxy = ProxyThread(dsn)
    procs: list[WorkerProc] = []

    def start(name: str, *, via_proxy: bool = False) -> WorkerProc:
        w = WorkerProc(topic=topic, group=group, schema=schema, setup=setup, name=name,
                       extra=("--batch-max-records", "25", "--db-concurrency", "2"),
                       env={"FENCE_DSN": proxy.dsn} if via_proxy else None)
        procs.append(w)
        return w

    def committed(n: int) -> None:
        wait_until(lambda: sum(_frontiers(dsn, schema, group, topic).values()) >= n,
                   timeout_s=60, what=f"{n} records committed")

    producer = _produce_in_chunks(bootstrap, recs, chunks=12, pause_s=0.8)
    try:
        w1, w2 = start("w1", via_proxy=True), start("w2")
        wait_until(lambda: "assigned {'partitions': ['" in w1.log(), timeout_s=30,
                   what="w1 owns partitions")
        _cut_commits(proxy, 2)
        committed(2_000)
        w2.kill()                              # crash: its Kafka offsets are left behind
        w2.wait(10)
        w3 = start("w3")
        _cut_commits(proxy, 2)
        committed(6_000)
        w1.terminate()                         # graceful leave: revoke commits synchronously
        assert w1.wait(30) == 0, w1.log()[-3000:]
        w4 = start("w4")
        producer.join(timeout=60)
        wait_until(lambda: _frontiers(dsn, schema, group, topic) == ends, timeout_s=90,
                   what="every partition drained to its high watermark")
        for w in (w3, w4):
            w.terminate()
        for w in (w3, w4):
            assert w.wait(30) == 0, w.log()[-3000:]
    finally:
        for w in procs:
            w.ensure_dead()
        proxy.close()
    assert "lifetime ends" not in w1.log(), w1.log()[-3000:]
    assert asyncio.run(exactly_once_problems(dsn, schema, group, topic, source)) == []
    frontiers = _frontiers(dsn, schema, group, topic)
    assert frontiers == ends
    _assert_tool_agrees(bootstrap, group, topic, frontiers, ends)

    # Phase 2: stale Kafka offsets, a member with nothing to process repairs them.
    admin = AdminClient({"bootstrap.servers": bootstrap})
    stale = ConsumerGroupTopicPartitions(group, [KafkaTP(topic, p, 7) for p in range(PARTITIONS)])
    admin.alter_consumer_group_offsets([stale])[group].result(timeout=30)
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    kafka = KafkaSource({"bootstrap.servers": bootstrap})
    assert set(kafka.committed_offsets(group, tps).values()) == {7}
    w5 = start("w5")
    try:
        wait_until(lambda: kafka.committed_offsets(group, tps)
                   == {tp: frontiers[tp.partition] for tp in tps},
                   timeout_s=30, what="the new owner repaired Kafka's committed offsets")
        assert w5.alive()
        w5.terminate()
        assert w5.wait(30) == 0, w5.log()[-3000:]
    finally:
        w5.ensure_dead()
    assert _frontiers(dsn, schema, group, topic) == frontiers  # nothing was reprocessed
    _assert_tool_agrees(bootstrap, group, topic, frontiers, ends)
