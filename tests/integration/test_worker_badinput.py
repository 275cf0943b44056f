"""Bad input against real services: poison records are quarantined and processing continues;
a recreated topic and a retention gap are refused (exit 4) with a message saying what to do;
``--allow-retention-gap`` skips the gap and journals it."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from confluent_kafka import TopicPartition as KTP
from confluent_kafka.admin import AdminClient

from fencing.types import SourceRecord
from ops.reference.generate import GeneratedRecord
from tests.integration.workers import (
    GROUP_SETUPS,
    WorkerProc,
    create_topic,
    delete_topic,
    durable_rows,
    exactly_once_problems,
    fresh_schema,
    generated,
    journal_rows,
    produce,
    run_until_committed,
    unique,
)

pytestmark = pytest.mark.integration
SETUP = GROUP_SETUPS[1]  # the source checks do not depend on the group protocol


def _run_to_end(topic: str, group: str, schema: str, dsn: str, total: int,
                extra: tuple[str, ...] = ()) -> None:
    run_until_committed(topic=topic, group=group, schema=schema, dsn=dsn, setup=SETUP,
                        total=total, extra=extra)


def test_poison_records_are_quarantined_and_processing_continues(services) -> None:
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    topic, group = unique("poison"), unique("gpoison")
    create_topic(bootstrap, topic, 1)
    good, _ = generated(topic, count=300, partitions=1, seed=21)
    poison = [GeneratedRecord(topic, 0, b"doc-x", b"\xff\xfe not utf-8"),
              GeneratedRecord(topic, 0, b"doc-y", b'{"kind": "put", "rev": "one"}'),
              GeneratedRecord(topic, 0, b"", b'{"kind": "put", "rev": 1, "body": "b"}')]
    recs = good[:100] + poison + good[100:]
    produce(bootstrap, recs)
    source = [SourceRecord(topic, 0, i, r.key, r.value) for i, r in enumerate(recs)]
    schema = asyncio.run(fresh_schema(dsn))
    _run_to_end(topic, group, schema, dsn, len(recs))

    async def quarantined() -> dict[int, str]:
        conn = await asyncpg.connect(dsn)
        try:
            rows = await conn.fetch(f'SELECT "offset", reason FROM "{schema}".quarantine '
                                    "WHERE group_id = $1 AND topic = $2", group, topic)
        finally:
            await conn.close()
        return {r["offset"]: r["reason"] for r in rows}

    q = asyncio.run(quarantined())
    for off in (100, 101, 102):
        assert q[off].startswith("malformed:"), q
    assert asyncio.run(exactly_once_problems(dsn, schema, group, topic, source)) == []


def test_recreated_topic_is_refused(services) -> None:
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    topic, group = unique("recreate"), unique("grecreate")
    create_topic(bootstrap, topic, 2)
    recs, _ = generated(topic, count=200, partitions=2)
    produce(bootstrap, recs)
    schema = asyncio.run(fresh_schema(dsn))
    _run_to_end(topic, group, schema, dsn, len(recs))
    before = asyncio.run(durable_rows(dsn, schema, group, topic))
    delete_topic(bootstrap, topic)
    create_topic(bootstrap, topic, 2)
    produce(bootstrap, recs[:50])
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP, name="refused")
    try:
        assert w.wait(60) == 4, w.log()[-3000:]
    finally:
        w.ensure_dead()
    assert "RecreatedTopic" in w.log() and "an operator must decide" in w.log()
    assert asyncio.run(durable_rows(dsn, schema, group, topic)) == before


def test_retention_gap_refused_then_skipped_with_option(services) -> None:
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    topic, group = unique("gap"), unique("ggap")
    create_topic(bootstrap, topic, 1)
    recs, _ = generated(topic, count=400, partitions=1, seed=4)
    produce(bootstrap, recs[:100])
    schema = asyncio.run(fresh_schema(dsn))
    _run_to_end(topic, group, schema, dsn, 100)
    produce(bootstrap, recs[100:])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.delete_records([KTP(topic, 0, 250)]).values():
        fut.result(timeout=30)
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP, name="gap")
    try:
        assert w.wait(60) == 4, w.log()[-3000:]
    finally:
        w.ensure_dead()
    assert "RetentionGap" in w.log() and "below the low watermark" in w.log()
    assert asyncio.run(durable_rows(dsn, schema, group, topic))[0][1] == 100
    _run_to_end(topic, group, schema, dsn, 400, extra=("--allow-retention-gap",))
    events = [j["event"] for j in asyncio.run(journal_rows(dsn, schema, group, topic))]
    assert "gap-skip" in events, events
