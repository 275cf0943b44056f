"""Test support for the three-node Kafka cluster (``ops.stack.kafka_cluster``): which node has
which role, and faults thrown at one node.

Rules
- Roles are read from Kafka itself: a partition's leader from the cluster's metadata, the
  active controller from the quorum (``kafka-metadata-quorum``), a group's coordinator as
  the leader of its ``__consumer_offsets`` partition -- ``abs(hash(group)) % 3`` with Java's
  ``String.hashCode`` (Kafka's ``GroupCoordinator.partitionFor``) -- never with an admin
  request sent to the coordinator (librdkafka #4605: such requests can abort the process
  while the coordinator moves).
- ``kill`` is SIGKILL (a crash), ``stop`` a controlled shutdown (SIGTERM); ``start`` returns
  once the node is healthy and in the ISR of every partition it replicates.
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka.admin import AdminClient

from ops.stack import control as stack
from ops.stack.config import KAFKA_NODES, StackSettings, kafka_bootstrap
from ops.stack.kafka_cluster import active_controller
from ops.stack.kafka_tools import GroupOffsetRow, describe_group

__all__ = ["Cluster", "java_string_hash"]

OFFSETS_PARTITIONS = 3


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` of ``text`` (UTF-16 code units), as a signed 32-bit int."""
    data = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def _quiet(_line: str) -> None:
    pass


@dataclass(frozen=True, slots=True)
class Cluster:
    """The running three-node cluster of this test session."""

    settings: StackSettings

    @property
    def bootstrap(self) -> str:
        return kafka_bootstrap(self.settings.ports, KAFKA_NODES)

    def kill(self, node: int) -> None:
        stack.stop_node(node, settings=self.settings, kill=True, out=_quiet)

    def stop(self, node: int) -> None:
        stack.stop_node(node, settings=self.settings, out=_quiet)

    def start(self, node: int) -> None:
        stack.start_node(node, settings=self.settings, out=_quiet)

    def start_all(self) -> None:
        """Every node running, healthy and in sync (after a test that stopped some)."""
        stack.up(self.settings, services=KAFKA_NODES, out=_quiet)

    def leader(self, topic: str, partition: int) -> int:
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": "0"})
        md = admin.list_topics(topic, timeout=30)
        return int(md.topics[topic].partitions[partition].leader)

    def coordinator(self, group: str) -> int:
        """The node that coordinates ``group`` now (see Rules)."""
        h = java_string_hash(group)
        partition = (0 if h == -(1 << 31) else abs(h)) % OFFSETS_PARTITIONS  # Utils.abs
        return self.leader("__consumer_offsets", partition)

    def controller(self) -> int:
        return active_controller(self.settings)

    def lags(self, group: str) -> list[GroupOffsetRow]:
        """Kafka's own view of ``group`` (``kafka-consumer-groups --describe``)."""
        rows, _out = describe_group(self.bootstrap, group, settings=self.settings)
        return rows
