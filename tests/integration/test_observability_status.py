"""``fencectl status --json`` with one live member and one SIGKILLed member.

The killed member's heartbeat goes stale (bound: 3 x its 1 s interval) well before its
12 s Kafka session expires, so for a while its partition is still fenced to it: status must
show it *unavailable* (state null, last observation in its own field) and the partition's
lag growing by exactly the records produced since. After the session expires the live
member claims the partition: a new epoch, its lifetime as owner, lag 0. A member that
stopped cleanly is *observed* with state ``stopped``.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import datetime
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient

from ops.reference import generate
from ops.stack.config import ServiceSettings
from tests.integration.observability_support import (
    free_port,
    readyz,
    run_fencectl,
    start_worker,
)
from tests.integration.workers import create_topic, fresh_schema, produce, unique
from tests.polling import wait_until

pytestmark = pytest.mark.integration


def _status(group: str, schema: str) -> dict[str, Any]:
    got = run_fencectl("status", "--json", "--group", group, "--schema", schema)
    assert got.returncode == 0, got.stderr
    assert "rdkafka#" not in got.stderr, got.stderr  # no librdkafka info lines on the output
    return dict(json.loads(got.stdout))


def _member(status: dict[str, Any], pid: int) -> dict[str, Any] | None:
    return next((m for m in status["members"] if m["pid"] == pid), None)


def _part(status: dict[str, Any], partition: int) -> dict[str, Any]:
    return next(p for p in status["partitions"] if p["partition"] == partition)


def test_live_and_killed_members(services: ServiceSettings) -> None:
    topic, group = unique("obs-status"), unique("g-obs-status")
    schema = asyncio.run(fresh_schema(services.dsn))
    create_topic(services.kafka_bootstrap, topic, 2)
    first = generate(11, count=20, partitions=2, klass="valid", topic=topic)
    later = generate(12, count=20, partitions=2, klass="valid", topic=topic)
    produce(services.kafka_bootstrap, first)
    ends = Counter(r.partition for r in first)
    port_a, port_b = free_port(), free_port()
    a = start_worker(topic=topic, group=group, schema=schema, http_port=port_a, name="a")
    b = None
    try:
        wait_until(lambda: (r := readyz(f"http://127.0.0.1:{port_a}")) and r[0] == 200,
                 timeout_s=60, what="a ready")
        b = start_worker(topic=topic, group=group, schema=schema, http_port=port_b, name="b",
                         # b's row reads stale 3 s after its kill and a takes the partition
                         # over when this session ends: the window for the stale snapshot, in
                         # which each poll is a whole `fencectl status` (seconds under load)
                         extra=["-X", "session.timeout.ms=25000"])
        b_ready = wait_until(lambda: (r := readyz(f"http://127.0.0.1:{port_b}")) and r[0] == 200
                           and r[1]["assigned"] and r, timeout_s=60, what="b ready")
        (b_part_name,) = b_ready[1]["assigned"]
        pb = int(b_part_name.rsplit("[", 1)[1].rstrip("]"))
        pa = 1 - pb
        def running(s: dict[str, Any], pid: int) -> bool:
            m = _member(s, pid)
            return m is not None and m["state"] == "running"

        settled = wait_until(lambda: (s := _status(group, schema)) and all(
            p["frontier"] == ends[p["partition"]] for p in s["partitions"]) and running(
            s, b.pid) and running(s, a.pid) and s, timeout_s=60, what="first records done")
        b_member = _member(settled, b.pid)
        a_member = _member(settled, a.pid)
        assert b_member is not None and a_member is not None
        assert (b_member["availability"], b_member["state"]) == ("observed", "running")
        in_sync = wait_until(lambda: (s := _status(group, schema)) and all(
            p["kafka_mirror"] == "in-sync" for p in s["partitions"]) and s, timeout_s=30,
            what="Kafka's committed offsets mirror the frontiers")
        assert [p["kafka_committed"] for p in in_sync["partitions"]] == \
            [p["frontier"] for p in in_sync["partitions"]]
        b_epoch = _part(settled, pb)["epoch"]
        assert _part(settled, pb)["owner"] == b_member["lifetime"]

        b.kill()
        assert b.wait(10) == -9
        produce(services.kafka_bootstrap, later)
        grown = Counter(r.partition for r in later)

        def stale_view() -> dict[str, Any] | None:
            s = _status(group, schema)
            m = _member(s, b.pid) if b is not None else None
            if m is None or m["availability"] != "unavailable" or _part(s, pa)["lag"] != 0:
                return None
            return s

        stale = wait_until(stale_view, timeout_s=30, what="b unavailable, a caught up")
        killed, live = _member(stale, b.pid), _member(stale, a.pid)
        assert killed is not None and live is not None
        assert killed["state"] is None
        assert killed["last_observed"]["state"] == "running"
        datetime.fromisoformat(killed["last_observed"]["at"])
        assert killed["last_seen_age_s"] > killed["unavailable_after_s"] == 3.0
        assert (live["availability"], live["state"]) == ("observed", "running")
        assert live["member_id"] and killed["member_id"] and live["member_id"] != \
            killed["member_id"]  # Kafka group member ids (consumer.memberid())
        stuck = _part(stale, pb)
        assert stuck["owner"] == killed["lifetime"] and stuck["epoch"] == b_epoch
        assert stuck["owner_availability"] == "unavailable" and stuck["owner_state"] is None
        assert stuck["frontier"] == ends[pb]
        assert stuck["high_watermark"] == ends[pb] + grown[pb]
        assert stuck["lag"] == grown[pb]
        assert stale["kafka"]["answered"] is True

        text = run_fencectl("status", "--group", group, "--schema", schema)
        assert text.returncode == 0 and "unavailable" in text.stdout
        assert f"running at {killed['last_observed']['at']}" in text.stdout

        def taken_over() -> dict[str, Any] | None:
            s = _status(group, schema)
            p = _part(s, pb)
            return s if p["owner"] == live["lifetime"] and p["lag"] == 0 \
                and p["owner_state"] == "running" else None  # rows lag states by <= 0.5 s

        after = wait_until(taken_over, timeout_s=60, what="a claims b's partition")
        moved = _part(after, pb)
        assert moved["epoch"] == b_epoch + 1
        assert moved["frontier"] == moved["high_watermark"] == ends[pb] + grown[pb]
        assert (moved["owner_availability"], moved["owner_state"]) == ("observed", "running")
        assert _member(after, b.pid)["availability"] == "unavailable"  # type: ignore[index]

        a.terminate()
        assert a.wait(30) == 0, a.log()[-3000:]
        final = _status(group, schema)
        stopped = _member(final, a.pid)
        assert stopped is not None
        assert (stopped["availability"], stopped["state"]) == ("observed", "stopped")
        assert stopped["last_observed"] is None
        assert all(p["kafka_committed"] == p["frontier"] for p in final["partitions"])

        # Kafka's offsets made stale while the group is empty: flagged once older than the bound
        admin = AdminClient({"bootstrap.servers": services.kafka_bootstrap})
        admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(
            group, [KafkaTP(topic, pa, 1)])])[group].result(timeout=30)
        flagged = json.loads(run_fencectl(
            "status", "--json", "--group", group, "--schema", schema,
            "--offset-mirror-warn-s", "0.001").stdout)
        bad = _part(flagged, pa)
        assert (bad["kafka_committed"], bad["kafka_mirror"]) == (1, "mismatch")
        assert any(n.startswith("offset mirror: Kafka has committed offset 1") for n in
                   bad["notes"])
        assert _part(flagged, pb)["kafka_mirror"] == "in-sync"
        table = run_fencectl("status", "--group", group, "--schema", schema,
                             "--offset-mirror-warn-s", "0.001").stdout
        assert " 1 !" in table and "offset mirror:" in table
    finally:
        a.ensure_dead()
        if b is not None:
            b.ensure_dead()
