"""``fencectl produce`` against real Kafka and Jaeger: every generated record arrives in its
generated partition and order, with a parseable W3C traceparent; sampled producer spans
are readable from Jaeger; bad usage exits 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ops.reference import generate
from ops.stack.config import ServiceSettings

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("go_services")]  # Jaeger

# W3C trace context: version 00, trace id, parent (span) id, flags (bit 0 = sampled; the
# SDK also sets bit 1, "random trace id", from trace context level 2)
TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
FENCECTL = [sys.executable, "-m", "ops.cli"]


def fencectl(
    services: ServiceSettings, *args: str, otlp: bool = True
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=services.kafka_bootstrap)
    env.pop("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", None)
    if otlp:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = services.otlp_endpoint
    else:
        env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    return subprocess.run(
        [*FENCECTL, "produce", *args], env=env, capture_output=True, text=True, timeout=120
    )


def consume_all(bootstrap: str, topic: str, partitions: int) -> list[Any]:
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False, "enable.partition.eof": True,
    })
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        msgs: list[Any] = []
        eof: set[int] = set()
        deadline = time.monotonic() + 60
        while len(eof) < partitions and time.monotonic() < deadline:
            for m in consumer.consume(1000, timeout=1.0):
                err = m.error()
                if err is None:
                    msgs.append(m)
                elif err.code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition() or 0)
                else:
                    raise AssertionError(err)
        return msgs
    finally:
        consumer.close()


def jaeger_trace(base_url: str, trace_id: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"{base_url}/api/traces/{trace_id}", timeout=10) as resp:
            data = json.loads(resp.read()).get("data") or []
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise
    return data[0] if data else None


@pytest.mark.parametrize("klass", ["valid", "conflict"])
def test_produce_writes_generated_source_with_trace_context(
    services: ServiceSettings, klass: str
) -> None:
    topic = f"produce-{klass}-{uuid.uuid4().hex[:8]}"
    count, partitions, seed = 3000, 4, 5
    done = fencectl(services, "--topic", topic, "--count", str(count), "--seed", str(seed),
                    "--class", klass, "--partitions", str(partitions), "--span-every", "100")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"produced {count} {klass} records")

    msgs = consume_all(services.kafka_bootstrap, topic, partitions)
    assert len(msgs) == count
    want = generate(seed, count=count, partitions=partitions, klass=klass, topic=topic)  # type: ignore[arg-type]
    for p in range(partitions):
        got = [(m.key(), m.value()) for m in msgs if m.partition() == p]
        assert got == [(r.key, r.value) for r in want if r.partition == p]
        assert [m.offset() for m in msgs if m.partition() == p] == list(range(len(got)))

    parsed = []
    for m in msgs:
        headers = dict(m.headers() or [])
        match = TRACEPARENT.match(headers["traceparent"].decode())
        assert match, headers
        parsed.append(match.groups())
    assert len({span_id for _, span_id, _ in parsed}) == count
    sampled = [trace_id for trace_id, _, flags in parsed if int(flags, 16) & 1]
    assert len(sampled) == count // 100

    deadline = time.monotonic() + 30
    found = jaeger_trace(services.jaeger_query_url, sampled[0])
    while found is None:
        assert time.monotonic() < deadline, f"trace {sampled[0]} not in Jaeger"
        time.sleep(0.5)
        found = jaeger_trace(services.jaeger_query_url, sampled[0])
    [span] = found["spans"]
    assert span["operationName"] == f"send {topic}"
    assert found["processes"][span["processID"]]["serviceName"] == "fencectl-produce"
    tags = {t["key"]: t["value"] for t in span["tags"]}
    assert tags["span.kind"] == "producer" and tags["messaging.destination.name"] == topic


def test_produce_without_otlp_still_sets_traceparent(services: ServiceSettings) -> None:
    topic = f"produce-nootel-{uuid.uuid4().hex[:8]}"
    done = fencectl(services, "--topic", topic, "--count", "50", "--seed", "1",
                    "--class", "valid", "--partitions", "2", otlp=False)
    assert done.returncode == 0, done.stderr
    assert "spans not exported" in done.stdout
    msgs = consume_all(services.kafka_bootstrap, topic, 2)
    assert len(msgs) == 50
    matches = [TRACEPARENT.match(dict(m.headers())["traceparent"].decode()) for m in msgs]
    assert all(matches)
    assert not any(int(m.group(3), 16) & 1 for m in matches if m)  # nothing claims sampling


def test_produce_refuses_bad_usage(services: ServiceSettings) -> None:
    base = ["--seed", "1", "--class", "valid"]
    assert fencectl(services, "--topic", "t", "--count", "-1", *base).returncode == 2
    assert fencectl(services, "--topic", "t", "--count", "1", "--seed", "1",
                    "--class", "other").returncode == 2
    assert fencectl(services, "--topic", "t", "--count", "1", "--partitions", "0",
                    *base).returncode == 2
    unreachable = fencectl(services, "--topic", "t", "--count", "1", "--bootstrap",
                           "127.0.0.1:1", *base, otlp=False)
    assert unreachable.returncode == 2 and "cannot reach Kafka" in unreachable.stderr

    small = f"produce-small-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": services.kafka_bootstrap})
    admin.create_topics([NewTopic(small, 2, 1)])[small].result(timeout=30)
    refused = fencectl(services, "--topic", small, "--count", "10", "--partitions", "6", *base)
    assert refused.returncode == 2 and "has 2 partitions" in refused.stderr
