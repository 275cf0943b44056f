"""Traces in Jaeger, read back through its query API, from a real ``fencectl run`` worker.

- The span tree for one record: the producer's span (``fencectl produce``, W3C header) is
  linked from the batch's ``fence.process`` span, which names the partition, the offsets,
  the epoch and the outcome; the assignment's claim and seek spans exist.
- A lost COMMIT (cut by the proxy after the server committed) appears as a
  ``fence.resolve`` span under the batch's process span, with outcome ``committed`` (also in
  the waterfall of ``fencectl trace``); the metric of unknown outcomes counts it and the
  records are counted once.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

import pytest
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaTP

from fencing.testing.pgproxy import Action, PgProxy
from ops.stack.config import ServiceSettings
from tests.integration.observability_support import (
    Span,
    free_port,
    http_get,
    jaeger_spans,
    jaeger_trace,
    metric,
    readyz,
    run_fencectl,
    start_worker,
    unique_service,
)
from tests.integration.workers import (
    create_topic,
    durable_rows,
    fresh_schema,
    generated,
    produce,
    unique,
)
from tests.polling import until_blocking, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("go_services")]  # Jaeger


def _record_headers(bootstrap: str, topic: str, partition: int, offset: int) -> dict[str, bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("obs-read"),
                         "enable.auto.commit": False})
    try:
        consumer.assign([KafkaTP(topic, partition, offset)])
        msg = wait_until(lambda: consumer.poll(0.5), timeout_s=20, what="the record")
        assert msg.error() is None and msg.offset() == offset
        return {k: v for k, v in (msg.headers() or [])}
    finally:
        consumer.close()


def _covering(spans: list[Span], partition: int, offset: int) -> list[Span]:
    return [s for s in spans if s.name == "fence.process"
            and s.tags.get("messaging.destination.partition.id") == str(partition)
            and s.tags["fence.first_offset"] <= offset <= s.tags["fence.last_offset"]]


def test_span_tree_of_one_record(services: ServiceSettings) -> None:
    topic, group = unique("obs-trace"), unique("g-obs-trace")
    service = unique_service("obs-trace")
    schema = asyncio.run(fresh_schema(services.dsn))
    produced = run_fencectl("produce", "--topic", topic, "--count", "30", "--seed", "5",
                            "--class", "valid", "--partitions", "2", "--span-every", "1")
    assert produced.returncode == 0, produced.stderr
    worker = start_worker(topic=topic, group=group, schema=schema, service=service)
    try:
        rows = wait_until(lambda: (r := asyncio.run(durable_rows(services.dsn, schema, group,
                                                                topic)))
                        and sum(f for _e, f in r.values()) == 30 and r,
                        timeout_s=60, what="all 30 records committed")
        worker.terminate()
        assert worker.wait(30) == 0, worker.log()[-3000:]
    finally:
        worker.ensure_dead()
    (partition, offset) = (1, 3)
    epoch = rows[partition][0]
    traceparent = _record_headers(services.kafka_bootstrap, topic, partition, offset)[
        "traceparent"].decode()
    _version, producer_trace, producer_span, _flags = traceparent.split("-")

    # every span asserted below, waited for: the exporter sends batches every 5 s and the
    # rest at shutdown, and Jaeger stores each batch a moment after it arrives
    spans = jaeger_spans(services.jaeger_query_url, service, until=lambda ss: bool(
        _covering(ss, partition, offset)) and any(s.name == "fence.claim" for s in ss)
        and any(s.name == "fence.assign" for s in ss)
        and any(s.name == "fence.shutdown" for s in ss)
        and sum(s.name == "fence.seek" for s in ss) >= 2)
    (process,) = _covering(spans, partition, offset)
    tags = process.tags
    assert tags["messaging.system"] == "kafka"
    assert tags["messaging.destination.name"] == topic
    assert tags["messaging.consumer.group.name"] == group
    assert tags["messaging.operation.type"] == "process"
    assert tags["fence.epoch"] == epoch == 1
    assert tags["fence.outcome"] == "ok"
    assert tags["fence.frontier"] == tags["fence.last_offset"] + 1
    assert (producer_trace, producer_span) in process.links()

    producer = {s.span_id: s for s in jaeger_trace(services.jaeger_query_url, producer_trace)}
    assert producer[producer_span].service == "fencectl-produce"
    assert producer[producer_span].tags.get("messaging.kafka.offset") == offset

    lifetime = tags["fence.lifetime"]
    by_id = {s.span_id: s for s in spans}
    (claim,) = [s for s in spans if s.name == "fence.claim" and
                s.tags["fence.lifetime"] == lifetime]
    assert by_id[claim.parent or ""].name == "fence.assign"
    assert claim.tags["fence.outcome"] == "ok"
    (seek,) = [s for s in spans if s.name == "fence.seek" and s.tags["fence.lifetime"] == lifetime
               and s.tags["messaging.destination.partition.id"] == str(partition)]
    assert seek.tags["fence.epoch"] == epoch and seek.tags["fence.frontier"] == 0
    assert any(s.name == "fence.shutdown" and s.tags.get("fence.exit_code") == 0 for s in spans)

    found = run_fencectl("trace", "--topic", topic, "--partition", str(partition), "--offset",
                         str(offset), "--service", service, "--lookback", "1h", "--json",
                         env={"JAEGER_QUERY_URL": services.jaeger_query_url})
    assert found.returncode == 0, found.stderr
    (batch,) = json.loads(found.stdout)
    assert (batch["trace_id"].rjust(32, "0"), batch["span_id"].rjust(16, "0")) == \
        (process.trace_id, process.span_id)
    assert {"trace_id": producer_trace, "span_id": producer_span} in [
        {k: v.rjust(32 if k == "trace_id" else 16, "0") for k, v in link.items()}
        for link in batch["producer_links"]]


async def test_lost_commit_is_a_resolution_span_and_counted_once(
        services: ServiceSettings) -> None:
    topic, group = unique("obs-lost"), unique("g-obs-lost")
    service = unique_service("obs-lost")
    schema = await fresh_schema(services.dsn)
    await asyncio.to_thread(create_topic, services.kafka_bootstrap, topic, 1)
    parts = urlsplit(services.dsn)
    port = free_port()
    async with PgProxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        worker = start_worker(topic=topic, group=group, schema=schema, service=service,
                              http_port=port, env={"FENCE_DSN": proxy.dsn(services.dsn)})
        base = f"http://127.0.0.1:{port}"
        try:
            await until_blocking(lambda: (r := readyz(base)) is not None and r[0] == 200,
                              timeout_s=60, what="worker ready")
            rule = proxy.add_rule("COMMIT", Action.CUT_AFTER)
            records, _source = generated(topic, count=12, partitions=1)
            await asyncio.to_thread(produce, services.kafka_bootstrap, records)
            await asyncio.wait_for(rule.fired.wait(), timeout=60)
            rows = await until_blocking(
                lambda: (r := asyncio.run(durable_rows(services.dsn, schema, group, topic)))
                and r[0][1] == 12 and r, timeout_s=60, what="frontier 12")
            # the server committed before the worker learned it: wait for the resolution
            text = await until_blocking(
                lambda: (got := http_get(base + "/metrics")) is not None and metric(
                    got[1], "fence_records_processed_total", topic=topic) == 12 and got[1],
                timeout_s=30, what="every batch resolved and counted")
            assert metric(text, "fence_unknown_outcomes_total", operation="process",
                          resolution="committed") == 1
            assert metric(text, "fence_batches_total", outcome="committed") >= 1
            worker.terminate()
            assert await asyncio.to_thread(worker.wait, 30) == 0, worker.log()[-3000:]
        finally:
            await asyncio.to_thread(worker.ensure_dead)
    assert rows[0][0] == 1  # no re-claim: the lifetime survived the lost reply

    def resolved(ss: list[Span]) -> bool:
        return any(s.name == "fence.resolve" for s in ss)

    spans = await asyncio.to_thread(jaeger_spans, services.jaeger_query_url, service,
                                    until=resolved)
    (resolve,) = [s for s in spans if s.name == "fence.resolve"]
    assert resolve.tags["fence.operation"] == "process"
    assert resolve.tags["fence.outcome"] == "committed"
    assert resolve.tags["fence.epoch"] == 1
    parent = {s.span_id: s for s in spans}[resolve.parent or ""]
    assert parent.name == "fence.process" and parent.tags["fence.outcome"] == "ok"
    assert parent.tags["fence.frontier"] == resolve.tags["fence.frontier"] + \
        parent.tags["messaging.batch.message_count"]

    # the waterfall of `fencectl trace` shows the resolution under its batch
    shown = await asyncio.to_thread(
        run_fencectl, "trace", "--topic", topic, "--partition", "0", "--offset",
        str(parent.tags["fence.first_offset"]), "--service", service, "--lookback", "1h",
        "--json", env={"JAEGER_QUERY_URL": services.jaeger_query_url})
    assert shown.returncode == 0, shown.stderr
    (batch,) = [b for b in json.loads(shown.stdout) if b["resolutions"]]
    assert [(r["name"], r["depth"], r["outcome"]) for r in batch["spans"]] == [
        ("fence.process", 0, "ok"), ("fence.resolve", 1, "committed")]
    assert batch["spans"][1]["start_ms"] >= 0 and batch["spans"][1]["frontier"] == \
        resolve.tags["fence.frontier"]
