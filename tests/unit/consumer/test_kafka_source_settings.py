"""``KafkaSource``'s AdminClient settings (consumer/kafka/source.py Rules): no broker needed.

The librdkafka fact behind the first setting (an AdminClient with sparse connections spins
reconnecting to a dead broker) is pinned on the three-node cluster by
``tests/integration/test_kafka_facts_failover.py`` (``make test-kafka-faults``)."""

from __future__ import annotations

from consumer.kafka.source import KafkaSource

NOWHERE = {"bootstrap.servers": "127.0.0.1:1"}


def test_the_admin_client_keeps_a_connection_to_every_broker() -> None:
    source = KafkaSource(dict(NOWHERE))
    assert source._admin_conf["enable.sparse.connections"] is False


def test_informational_librdkafka_lines_are_off_and_the_callers_settings_win() -> None:
    source = KafkaSource({**NOWHERE, "log_level": "7", "client.id": "mine"})
    assert source._admin_conf["log_level"] == "7" and source._admin_conf["client.id"] == "mine"
    assert KafkaSource(dict(NOWHERE))._admin_conf["log_level"] == "4"
