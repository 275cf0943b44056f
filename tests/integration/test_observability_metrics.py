"""Metrics scraped from the worker's port move by exactly what happened, across a fence.

A worker (allowed one fresh lifetime after a retirement) commits 20 records; another
lifetime claims the partition (epoch + 1, journaled: what a member that took it over on a
session timeout does), so the worker's next commit is fenced: the lifetime retires, a fresh
one claims and commits the next 10 records. ``/metrics`` then shows 30 records, exactly one
fence, one fenced batch, one retirement and no unknown outcome; ``fencectl status
--history`` shows the journal. (An operator's ``fencectl reset`` fences too, but the owner
claims again without retiring: ``test_reset_pickup.py``.)
"""

from __future__ import annotations

import asyncio
import json

import pytest

from fencing.postgres.store import PgFenceStore
from fencing.types import ClaimRequest, Token, TopicPartition
from ops.stack.config import ServiceSettings
from tests.integration.observability_support import (
    free_port,
    http_get,
    metric,
    readyz,
    run_fencectl,
    start_worker,
)
from tests.integration.workers import (
    create_topic,
    durable_rows,
    fresh_schema,
    generated,
    produce,
    unique,
)
from tests.polling import wait_until

pytestmark = pytest.mark.integration


async def _claim_as_another_member(dsn: str, schema: str, group: str, topic: str) -> Token:
    tp = TopicPartition(topic, 0)
    store = await PgFenceStore.connect(dsn, group_id=group, schema=schema)
    try:
        return (await store.claim([ClaimRequest(tp, 0)], lifetime="lt-another-member"))[tp]
    finally:
        await store.close()


def test_counters_after_known_records_and_one_fenced_commit(services: ServiceSettings) -> None:
    topic, group = unique("obs-metrics"), unique("g-obs-metrics")
    schema = asyncio.run(fresh_schema(services.dsn))
    create_topic(services.kafka_bootstrap, topic, 1)
    records, _source = generated(topic, count=30, partitions=1)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    worker = start_worker(topic=topic, group=group, schema=schema, http_port=port,
                          extra=["--restart-lifetimes", "1"])

    def durable() -> tuple[int, int]:
        return asyncio.run(durable_rows(services.dsn, schema, group, topic)).get(0, (0, 0))

    def scrape() -> str:
        got = http_get(base + "/metrics")
        assert got is not None and got[0] == 200
        return got[1]

    try:
        wait_until(lambda: (r := readyz(base)) is not None and r[0] == 200, timeout_s=60,
                 what="worker ready")
        produce(services.kafka_bootstrap, records[:20])
        wait_until(lambda: metric(scrape(), "fence_records_processed_total") == 20, timeout_s=60,
                 what="20 records counted")
        first_epoch, frontier = durable()
        assert frontier == 20
        before = scrape()
        assert metric(before, "fence_fences_total") == 0
        for reason in ("rejected", "unavailable", "error", "lost", "not-assigned"):
            assert f'fence_kafka_commits_failed_total{{reason="{reason}"}} 0.0' in before
        assert metric(before, "fence_batches_total", outcome="committed") >= 1
        assert metric(before, "fence_partition_lag", topic=topic) in (0, 20)  # sampled every 5 s

        taken = asyncio.run(_claim_as_another_member(services.dsn, schema, group, topic))
        assert taken == Token(first_epoch + 1, 20)
        assert durable() == (first_epoch + 1, 20)

        produce(services.kafka_bootstrap, records[20:])
        wait_until(lambda: durable() == (first_epoch + 2, 30), timeout_s=60,
                 what="a fresh lifetime claims and commits the rest")
        wait_until(lambda: metric(scrape(), "fence_records_processed_total") == 30,
                 timeout_s=30, what="30 records counted")
        after = scrape()
        assert metric(after, "fence_fences_total", topic=topic, partition="0") == 1
        assert metric(after, "fence_batches_total", outcome="Fenced") == 1
        assert metric(after, "fence_retirements_total") == 1
        assert metric(after, "fence_unknown_outcomes_total") == 0
        assert metric(after, "fence_rebalance_duration_seconds_count", kind="assign") == 2
        assert metric(after, "fence_batch_duration_seconds_count", outcome="committed") == \
            metric(after, "fence_batches_total", outcome="committed")
        wait_until(lambda: (r := readyz(base)) is not None and r[0] == 200, timeout_s=30,
                 what="ready again after the fresh lifetime positioned")
        worker.terminate()
        assert worker.wait(30) == 0, worker.log()[-3000:]
    finally:
        worker.ensure_dead()

    history = run_fencectl("status", "--history", "--topic", topic, "--partition", "0",
                           "--group", group, "--schema", schema, "--json")
    assert history.returncode == 0, history.stderr
    events = [(r["event"], r["epoch"]) for r in json.loads(history.stdout)]
    assert events[0] == ("claim", first_epoch)
    assert ("claim", first_epoch + 1) in events
    assert ("claim", first_epoch + 2) in events
    assert "retire" in [e for e, _ in events]
    assert events.index(("claim", first_epoch + 1)) < events.index(("claim", first_epoch + 2))
