"""Kafka is real: a multi-partition topic, a consumer group that rebalances, both protocols.

Each test creates its own topic and group; a second consumer joining the group
must make the first one give up partitions (``on_revoke``) and the newcomer
receive them (``on_assign``), and every produced record must be consumed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KTP
from confluent_kafka.admin import AdminClient, NewTopic

from ops.stack.config import ServiceSettings

pytestmark = pytest.mark.integration

PARTITIONS = 4
RECORDS_PER_PARTITION = 5
REBALANCE_TIMEOUT_S = 60.0


@dataclass
class Member:
    """One group member: its consumer, callback history and consumed records."""

    name: str
    consumer: Consumer
    events: list[tuple[str, frozenset[int]]] = field(default_factory=list)
    values: set[bytes] = field(default_factory=set)

    def owned(self) -> frozenset[int]:
        return frozenset(tp.partition for tp in self.consumer.assignment())

    def poll_once(self) -> None:
        msg = self.consumer.poll(0.2)
        if msg is not None and msg.error() is None:
            value = msg.value()
            assert value is not None
            self.values.add(value)


def _create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, PARTITIONS, 1)], operation_timeout=30)
    futures[topic].result(timeout=30)


def _produce(bootstrap: str, topic: str) -> set[bytes]:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    values = set()
    for partition in range(PARTITIONS):
        for i in range(RECORDS_PER_PARTITION):
            value = f"p{partition}-r{i}".encode()
            producer.produce(topic, value, partition=partition)
            values.add(value)
    assert producer.flush(30) == 0
    return values


def _member(name: str, conf: dict[str, object], topic: str) -> Member:
    member = Member(name=name, consumer=Consumer(conf))

    def on_assign(_c: Consumer, parts: list[KTP]) -> None:
        member.events.append(("assign", frozenset(p.partition for p in parts)))

    def on_revoke(_c: Consumer, parts: list[KTP]) -> None:
        member.events.append(("revoke", frozenset(p.partition for p in parts)))

    member.consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
    return member


def _poll_until(members: list[Member], done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + REBALANCE_TIMEOUT_S
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}: " + "; ".join(
            f"{m.name} events={m.events} owned={sorted(m.owned())}" for m in members
        )
        for member in members:
            member.poll_once()


def _rebalance_round_trip(services: ServiceSettings, protocol_conf: dict[str, object]) -> None:
    suffix = uuid.uuid4().hex[:8]
    topic, group = f"smoke-{suffix}", f"smoke-group-{suffix}"
    _create_topic(services.kafka_bootstrap, topic)
    produced = _produce(services.kafka_bootstrap, topic)
    conf: dict[str, object] = {
        "bootstrap.servers": services.kafka_bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        **protocol_conf,
    }
    everything = frozenset(range(PARTITIONS))
    first = _member("first", conf, topic)
    second: Member | None = None
    try:
        _poll_until([first], lambda: first.owned() == everything, "first to own all partitions")
        assigned = [parts for kind, parts in first.events if kind == "assign"]
        assert assigned and frozenset().union(*assigned) == everything, first.events
        events_before = len(first.events)
        second = _member("second", conf, topic)
        both = [first, second]

        def split() -> bool:
            assert second is not None
            mine, theirs = first.owned(), second.owned()
            return bool(mine) and bool(theirs) and mine | theirs == everything and not mine & theirs

        _poll_until(both, split, "the group to split the partitions")
        revoked = [parts for kind, parts in first.events[events_before:] if kind == "revoke"]
        assert revoked and any(revoked), f"first never revoked: {first.events}"
        assert any(kind == "assign" and parts for kind, parts in second.events), second.events
        assert set().union(*revoked) >= second.owned()
        _poll_until(both, lambda: first.values | second.values >= produced, "every record consumed")
        assert first.values | second.values == produced
    finally:
        first.consumer.close()
        if second is not None:
            second.consumer.close()
    AdminClient({"bootstrap.servers": services.kafka_bootstrap}).delete_topics([topic])


def test_classic_group_rebalances_with_callbacks(services: ServiceSettings) -> None:
    _rebalance_round_trip(
        services,
        {"group.protocol": "classic", "session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
    )


def test_consumer_protocol_group_rebalances_with_callbacks(services: ServiceSettings) -> None:
    _rebalance_round_trip(services, {"group.protocol": "consumer"})
