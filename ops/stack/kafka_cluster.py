"""The three-node Kafka cluster of the local stack: ``kafka-1`` .. ``kafka-3`` on loopback.

Rules:
- Every node is broker + controller (KRaft, static voters: ``controller.quorum.voters``
  lists all three) with its own ports (``FENCE_KAFKA_<N>_PORT``,
  ``FENCE_KAFKA_<N>_CONTROLLER_PORT``), its own directory ``.stack/kafka-<N>/`` and the
  same jars as the one-node cluster (``ops.stack.kafka``). The nodes are formatted once,
  each with the cluster id kept in ``.stack/kafka-cluster.id`` (no ``--standalone``).
- Failover must mean something: replication 3 and ``min.insync.replicas=2`` for the
  internal topics and for every topic created without a replication factor of its own
  (``default.replication.factor``), ``__consumer_offsets`` on three partitions (a group's
  coordinator lives on one node and moves when that node dies), no unclean leader
  election. Group timeouts are the one-node cluster's fast-test values.
- A node is healthy when it is registered (listed in the metadata it answers itself), a
  message produced with ``acks=all`` comes back, and it is in the ISR of every partition it
  replicates (``in_sync``): after ``start_node`` a rolling restart may stop the next one.
- ``stop_node``/``start_node`` act on one node by its tracked pid (``ops.stack.control``);
  ``active_controller`` asks the quorum (Kafka's ``kafka-metadata-quorum`` tool).
"""

from __future__ import annotations

import re
import signal
import subprocess
from dataclasses import dataclass
from typing import Any

from ops.stack import kafka as stack_kafka
from ops.stack.config import (
    HOST,
    KAFKA_NODES,
    Service,
    StackError,
    StackSettings,
    kafka_bootstrap,
    node_number,
)

__all__ = [
    "HEAP",
    "METADATA_QUORUM",
    "NodeOps",
    "active_controller",
    "cluster_id",
    "in_sync",
    "node_properties",
    "node_settings",
]

HEAP = "384m"
METADATA_QUORUM = "org.apache.kafka.tools.MetadataQuorumCommand"
REPLICATION = 3
MIN_ISR = 2


def node_settings(settings: StackSettings, service: Service) -> dict[str, str]:
    """Broker + controller properties of one node of the three-node cluster (pure)."""
    n = node_number(service)
    p = settings.ports
    port, ctl = p.of(service)
    props = stack_kafka.broker_settings(
        bind_host=HOST, port=port, controller_port=ctl, advertised=f"{HOST}:{port}",
        log_dir=str(settings.paths.service_dir(service) / "data"))
    del props["controller.quorum.bootstrap.servers"]
    voters = ",".join(f"{node_number(s)}@{HOST}:{p.of(s)[1]}" for s in KAFKA_NODES)
    props.update({
        "node.id": str(n),
        "controller.quorum.voters": voters,
        "default.replication.factor": str(REPLICATION),
        "min.insync.replicas": str(MIN_ISR),
        "unclean.leader.election.enable": "false",
        "offsets.topic.replication.factor": str(REPLICATION),
        "offsets.topic.num.partitions": "3",
        "transaction.state.log.replication.factor": str(REPLICATION),
        "transaction.state.log.min.isr": str(MIN_ISR),
        "share.coordinator.state.topic.replication.factor": str(REPLICATION),
        "share.coordinator.state.topic.min.isr": str(MIN_ISR),
    })
    return props


def node_properties(settings: StackSettings, service: Service) -> str:
    """``server.properties`` text of one node (pure)."""
    return "".join(f"{k}={v}\n" for k, v in node_settings(settings, service).items())


def cluster_id(settings: StackSettings) -> str:
    """The three-node cluster's id: made once, kept in ``.stack/kafka-cluster.id``."""
    path = settings.paths.root / "kafka-cluster.id"
    if path.exists():
        value = path.read_text().strip()
        if value:
            return value
    path.parent.mkdir(parents=True, exist_ok=True)
    value = stack_kafka.cluster_id()
    path.write_text(value + "\n")
    return value


def _admin(bootstrap: str, timeout_s: float) -> Any:
    from confluent_kafka.admin import AdminClient

    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": stack_kafka.QUIET,
                            "socket.timeout.ms": int(timeout_s * 1000)}
    return AdminClient(conf)


def in_sync(settings: StackSettings, service: Service, *, timeout_s: float = 10.0) -> str | None:
    """None when ``service`` is in the ISR of every partition it replicates, else which
    partitions still lack it (read from the cluster's metadata)."""
    from confluent_kafka import KafkaException

    n = node_number(service)
    try:
        md = _admin(kafka_bootstrap(settings.ports, KAFKA_NODES), timeout_s).list_topics(
            timeout=timeout_s)
    except KafkaException as exc:
        return f"metadata request failed: {exc}"
    behind = [f"{t.topic}[{p.id}]" for t in md.topics.values() for p in t.partitions.values()
              if n in p.replicas and n not in p.isrs]
    if behind:
        return (f"node {n} not yet in sync for {len(behind)} partition(s), e.g. "
                f"{', '.join(sorted(behind)[:3])}")
    return None


def _registered(settings: StackSettings, service: Service, timeout_s: float) -> str | None:
    from confluent_kafka import KafkaException

    n = node_number(service)
    own = f"{HOST}:{settings.ports.of(service)[0]}"
    try:
        brokers = _admin(own, timeout_s).list_topics(timeout=timeout_s).brokers
    except KafkaException as exc:
        return f"node {n} ({own}) did not answer a metadata request: {exc}"
    if n not in brokers:
        return f"node {n} is not (yet) a registered broker: the cluster lists {sorted(brokers)}"
    return None


@dataclass(frozen=True, slots=True)
class NodeOps:
    """The service operations ``ops.stack.control`` calls, for one node of the cluster."""

    service: Service
    STOP_SIGNAL: signal.Signals = signal.SIGTERM

    def marker(self, settings: StackSettings) -> str:
        """A string the node's command line contains (its properties file)."""
        return str(settings.paths.service_dir(self.service) / "server.properties")

    def start(self, settings: StackSettings) -> int:
        return stack_kafka.launch(settings, self.service, node_properties(settings, self.service),
                                  heap=HEAP, cluster=cluster_id(settings))

    def check(self, settings: StackSettings, *, timeout_s: float = 10.0) -> str | None:
        """Registered, a produced message fetched back through the cluster, in sync."""
        return (_registered(settings, self.service, timeout_s)
                or stack_kafka.round_trip(kafka_bootstrap(settings.ports, KAFKA_NODES),
                                          replication=REPLICATION, timeout_s=timeout_s)
                or in_sync(settings, self.service, timeout_s=timeout_s))


_LEADER = re.compile(r"^LeaderId:\s*(\d+)", re.MULTILINE)


def active_controller(settings: StackSettings, *, timeout_s: float = 60.0) -> int:
    """The node id of the active controller (the KRaft quorum's leader), as
    ``kafka-metadata-quorum describe --status`` reports it; raises StackError."""
    from ops.stack.kafka_tools import tool_argv

    controllers = ",".join(f"{HOST}:{settings.ports.of(s)[1]}" for s in KAFKA_NODES)
    argv = tool_argv(settings, METADATA_QUORUM, "--bootstrap-controller", controllers,
                     "describe", "--status")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    found = _LEADER.search(done.stdout)
    if done.returncode != 0 or found is None:
        raise StackError(f"kafka-metadata-quorum describe --status exited {done.returncode}: "
                         f"{(done.stderr or done.stdout).strip()[-2000:]}")
    return int(found.group(1))
