"""``fencectl reset`` against real Kafka and PostgreSQL: confirmation, fencing, journal.

- Without ``--yes-i-understand`` the plan is printed, exit 2, nothing changes.
- ``accept-gap`` after ``delete_records`` raised the low watermark: frontier := low
  watermark, epoch + 1, a ``gap-skip`` journal row; a worker's validation then passes.
- ``adopt-topic`` after the topic was deleted and recreated: topic id := Kafka's new id,
  frontier := the new low watermark, epoch + 1, an ``adopt`` journal row.
- A stale token is fenced by the bumped epoch; refusals exit 1 and change nothing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient

from consumer.kafka.source import KafkaSource
from fencing.errors import Fenced, FenceError
from fencing.postgres.store import PgFenceStore
from fencing.store import BatchCall
from fencing.types import (
    ACCEPT,
    ClaimRequest,
    SourceCheck,
    SourceRecord,
    Token,
    TopicPartition,
    Verdict,
)
from ops.stack.config import ServiceSettings
from tests.integration.observability_support import run_fencectl
from tests.integration.workers import (
    create_topic,
    delete_topic,
    fresh_schema,
    generated,
    journal_rows,
    produce,
    unique,
)
from tests.polling import wait_until

pytestmark = pytest.mark.integration


async def _claim(dsn: str, schema: str, group: str, tp: TopicPartition,
                 topic_id: str | None) -> Token:
    store = await PgFenceStore.connect(dsn, group_id=group, schema=schema)
    try:
        return (await store.claim([ClaimRequest(tp, 0, topic_id)], lifetime="lt-test"))[tp]
    finally:
        await store.close()


async def _row(dsn: str, schema: str, group: str, tp: TopicPartition) -> Token | None:
    store = await PgFenceStore.connect(dsn, group_id=group, schema=schema)
    try:
        return (await store.observe([tp]))[tp]
    finally:
        await store.close()


def _reset(*args: str) -> tuple[int, Any]:
    got = run_fencectl("reset", *args, "--json")
    return got.returncode, (json.loads(got.stdout) if got.stdout.strip() else got.stderr)


def test_accept_gap_and_frontier_refusals(services: ServiceSettings) -> None:
    topic, group = unique("obs-gap"), unique("g-obs-gap")
    schema = asyncio.run(fresh_schema(services.dsn))
    create_topic(services.kafka_bootstrap, topic, 1)
    produce(services.kafka_bootstrap, generated(topic, count=10, partitions=1)[0])
    tp = TopicPartition(topic, 0)
    source = KafkaSource({"bootstrap.servers": services.kafka_bootstrap})
    topic_id = source.facts([tp])[tp].topic_id
    old = asyncio.run(_claim(services.dsn, schema, group, tp, topic_id))
    admin = AdminClient({"bootstrap.servers": services.kafka_bootstrap})
    for fut in admin.delete_records([KafkaTP(topic, 0, 6)]).values():
        fut.result(timeout=30)
    wait_until(lambda: source.facts([tp])[tp].low_watermark == 6, timeout_s=30,
             what="low watermark 6")
    common = ("--group", group, "--topic", topic, "--schema", schema)

    code, plan = _reset("accept-gap", *common)
    assert code == 2 and isinstance(plan, dict) and plan["applied"] is False
    assert asyncio.run(_row(services.dsn, schema, group, tp)) == old

    code, out = _reset("frontier", *common, "--partition", "0", "--to-offset", "11",
                       "--yes-i-understand")
    assert code == 1 and "above the high watermark" in str(out)
    code, out = _reset("accept-gap", *common, "--expect-epoch", str(old.epoch + 5),
                       "--yes-i-understand")
    assert code == 1 and "moved" in str(out)
    assert asyncio.run(_row(services.dsn, schema, group, tp)) == old

    code, done = _reset("accept-gap", *common, "--reason", "retention ran ahead",
                        "--yes-i-understand")
    assert code == 0 and isinstance(done, dict) and done["applied"] is True
    assert asyncio.run(_row(services.dsn, schema, group, tp)) == Token(old.epoch + 1, 6)
    (last,) = [r for r in asyncio.run(journal_rows(services.dsn, schema, group, topic))
               if r["event"] == "gap-skip"]
    assert last["epoch"] == old.epoch + 1 and "retention ran ahead" in last["detail"]
    assert str(last["lifetime"]).startswith("operator:")

    async def stale_commit() -> None:
        store = await PgFenceStore.connect(services.dsn, group_id=group, schema=schema)
        try:
            rec = SourceRecord(topic, 0, 0, None, b"x")
            await store.process(BatchCall(tp, [rec], lambda _c, rs: _accept_all(rs)), old)
        finally:
            await store.close()

    with pytest.raises(Fenced):
        asyncio.run(stale_commit())

    async def validates() -> bool:
        store = await PgFenceStore.connect(services.dsn, group_id=group, schema=schema)
        try:
            facts = source.facts([tp])[tp]
            return (await store.validate([SourceCheck(tp, facts)]))[tp].ok
        finally:
            await store.close()

    assert asyncio.run(validates())


async def _accept_all(records: Sequence[SourceRecord]) -> list[Verdict]:
    return [ACCEPT for _ in records]


def test_adopt_recreated_topic(services: ServiceSettings) -> None:
    topic, group = unique("obs-adopt"), unique("g-obs-adopt")
    schema = asyncio.run(fresh_schema(services.dsn))
    create_topic(services.kafka_bootstrap, topic, 1)
    tp = TopicPartition(topic, 0)
    source = KafkaSource({"bootstrap.servers": services.kafka_bootstrap})
    old_id = source.facts([tp])[tp].topic_id
    old = asyncio.run(_claim(services.dsn, schema, group, tp, old_id))
    delete_topic(services.kafka_bootstrap, topic)
    create_topic(services.kafka_bootstrap, topic, 1)
    def recreated_id() -> str | None:
        try:
            tid = source.facts([tp])[tp].topic_id
        except FenceError:  # metadata of the new topic not served yet
            return None
        return tid if tid != old_id else None

    new_id = wait_until(recreated_id, timeout_s=30, what="the recreated topic's id")
    common = ("--group", group, "--topic", topic, "--schema", schema)

    code, done = _reset("adopt-topic", *common, "--frontier", "earliest", "--yes-i-understand")
    assert code == 0 and isinstance(done, dict), done
    (plan,) = done["plans"]
    assert plan["topic_id"] == [old_id, new_id]
    assert asyncio.run(_row(services.dsn, schema, group, tp)) == Token(old.epoch + 1, 0)
    events = [r["event"] for r in asyncio.run(journal_rows(services.dsn, schema, group, topic))]
    assert events == ["claim", "adopt"]
    code, out = _reset("adopt-topic", *common, "--yes-i-understand")
    assert code == 1 and "already" in str(out)
