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


def _produce_paced(bootstrap: str, recs: list, per_s: int) -> threading.Thread:
    """Produce ``recs`` in order at ``per_s`` records a second, in 1 ms steps."""
    from confluent_kafka import Producer

    def run() -> None:
        p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                      "linger.ms": 1})
        start = time.monotonic()
        for i, r in enumerate(recs):
            due = start + i / per_s
            if due > time.monotonic():
                p.poll(0)
                time.sleep(max(0.0, due - time.monotonic()))
            p.produce(r.topic, r.value, r.key, partition=r.partition)
        assert p.flush(60) == 0, "records left unflushed"

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("setup", GROUP_SETUPS, ids=lambda s: s.name)
def test_a_stream_of_one_record_batches_keeps_the_member_and_kafka_in_step(
        services, setup: GroupSetup) -> None:
    """A low rate makes batches of a record or two (1,000 records/s on 4 partitions: ~1,000
    transactions/s): every batch's frontier is mirrored, yet one offset commit awaits its
    answer at a time (``consumer.kafka.committer``). Committing each batch queued
    OffsetCommit requests faster than the coordinator answered, until a heartbeat behind
    them timed the session out and the member lost its assignment (seen at 1,000 records/s,
    ~14 s in). The member must keep its first claim of every partition, and Kafka's tool
    must show the frontier, lag 0."""
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    topic, group = unique("onebatch"), unique("gonebatch")
    create_topic(bootstrap, topic, PARTITIONS)
    recs, source = generated(topic, count=30_000, partitions=PARTITIONS, seed=21)
    ends = {p: max(r.offset for r in source if r.partition == p) + 1 for p in range(PARTITIONS)}
    schema = asyncio.run(fresh_schema(dsn))
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=setup, name="one")
    try:
        wait_until(lambda: "assigned {'partitions': ['" in w.log(), timeout_s=60,
                   what="the member owns its partitions")
        producer = _produce_paced(bootstrap, recs, per_s=1_000)
        producer.join(timeout=120)
        wait_until(lambda: _frontiers(dsn, schema, group, topic) == ends, timeout_s=120,
                   what="every partition drained")
        w.terminate()
        assert w.wait(30) == 0, w.log()[-3000:]
    finally:
        w.ensure_dead()
    rows = asyncio.run(durable_rows(dsn, schema, group, topic))
    assert {p: epoch for p, (epoch, _f) in rows.items()} == dict.fromkeys(range(PARTITIONS), 1), (
        rows, w.log()[-3000:])  # claimed once: never revoked, never lost
    assert "session timed out" not in w.log().lower(), w.log()[-3000:]
    assert asyncio.run(exactly_once_problems(dsn, schema, group, topic, source)) == []
    frontiers = _frontiers(dsn, schema, group, topic)
    _assert_tool_agrees(bootstrap, group, topic, frontiers, ends)
