"""What librdkafka does with the worker's Kafka calls when a node of the three-node cluster
dies, pinned (``consumer/kafka/source.py`` Rules; docs/kafka-failures.md).

- ``describe_topics`` goes to the broker librdkafka's cached metadata names as controller and
  waits for that broker: after it is SIGKILLed, a plain AdminClient keeps failing with
  ``_TIMED_OUT`` "waiting for controller" while the broker is down; ``KafkaSource`` (one
  metadata request after a failure) answers again once the cluster fenced the dead broker.
  Which broker that is changes: KRaft names a random live broker as controller in every
  metadata answer (KIP-590), so any node's death can fail one ``describe_topics``.
- ``list_offsets`` for a partition whose leader died answers offset -1001 and no error;
  ``KafkaSource`` raises ``SourceUnavailable`` instead of returning it as a watermark.
- Reading a group's committed offsets during a coordinator move neither aborts the process
  nor returns a wrong value (``KafkaSource.committed_offsets``: a consumer, not an admin
  request to the coordinator).

``make test-kafka-faults`` runs all four (``make test`` none: they are facts about librdkafka;
the worker's settings are unit-tested and the fault scenarios throw the same kills at them).
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest
from confluent_kafka import KafkaException, TopicCollection
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from consumer.kafka.source import KafkaSource
from fencing.errors import SourceUnavailable
from fencing.types import TopicPartition
from ops.reference import generate
from tests.integration.workers import ROOT, produce, unique, wait_until

pytestmark = pytest.mark.integration

PARTITIONS = 3


def _topic(cluster: Any) -> str:
    topic = unique("facts3")
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": "0"})
    admin.create_topics([NewTopic(topic, PARTITIONS)])[topic].result(timeout=60)
    wait_until(lambda: topic in admin.list_topics(timeout=10).topics, timeout_s=60,
               what=f"topic {topic}")
    produce(cluster.bootstrap, generate(1, count=30, partitions=PARTITIONS, klass="valid",
                                        topic=topic))
    return topic


@pytest.mark.kafka_faults
def test_describe_topics_waits_for_the_cached_controller_until_metadata_is_refreshed(
        cluster: Any) -> None:
    topic = _topic(cluster)
    plain = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": "0"})
    controller = plain.describe_cluster(request_timeout=10).result().controller.id
    source = KafkaSource({"bootstrap.servers": cluster.bootstrap}, request_timeout_s=3.0)
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    source.facts(tps)
    cluster.kill(controller)
    try:
        t0 = time.monotonic()
        errors: list[str] = []
        while time.monotonic() - t0 < 25:
            try:
                plain.describe_topics(TopicCollection([topic]),
                                      request_timeout=3)[topic].result(timeout=4)
                errors.append("answered")
            except KafkaException as exc:
                errors.append(exc.args[0].str())
        assert errors and all("waiting for controller" in e for e in errors), errors

        def refreshed() -> bool:
            try:
                source.facts(tps)
            except SourceUnavailable:
                return False
            return True
        # the cluster fences the dead broker after broker.session.timeout.ms (9 s) at most
        wait_until(refreshed, timeout_s=30, what="KafkaSource answering again", interval_s=0.5)
    finally:
        cluster.start(controller)


@pytest.mark.kafka_faults
def test_list_offsets_without_a_leader_is_unavailable_not_minus_1001(cluster: Any) -> None:
    topic = _topic(cluster)
    plain = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": "0"})
    source = KafkaSource({"bootstrap.servers": cluster.bootstrap}, request_timeout_s=2.0)
    p = 0
    leader = cluster.leader(topic, p)
    cluster.kill(leader)
    try:
        got = plain.list_offsets({KafkaTP(topic, p): OffsetSpec.latest()},
                                 request_timeout=2)[KafkaTP(topic, p)].result(timeout=5)
        assert got.offset == -1001  # librdkafka: no error, an invalid offset
        # KRaft names a random live broker as "controller" in every metadata answer (KIP-590:
        # Kafka's KRaftMetadataCache.getControllerId), so the source's describe_topics can
        # go to the dead node first and fail "waiting for controller" -- unavailable too;
        # the -1001 answer must come as SourceUnavailable, never as a watermark
        seen: list[str] = []
        t0 = time.monotonic()
        while not any("answered no offset (-1001)" in m for m in seen):
            assert time.monotonic() - t0 < 30, seen
            with pytest.raises(SourceUnavailable) as caught:
                source.facts([TopicPartition(topic, p)])
            seen.append(str(caught.value))
    finally:
        cluster.start(leader)
    answers: list[Any] = []

    def answered() -> bool:  # the same can hold for the first call after the return
        try:
            answers.append(source.facts([TopicPartition(topic, q) for q in range(PARTITIONS)]))
        except SourceUnavailable:
            return False
        return True
    wait_until(answered, timeout_s=30, what="KafkaSource answering again", interval_s=0.5)
    assert all(f.high_watermark >= 0 for f in answers[-1].values())


_READER = """
import sys, time
from consumer.kafka.source import KafkaSource
from fencing.errors import SourceUnavailable
from fencing.types import TopicPartition
bootstrap, group, topic, expect = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
source = KafkaSource({"bootstrap.servers": bootstrap}, request_timeout_s=2.0)
answers = failures = 0
t0 = time.monotonic()
while time.monotonic() - t0 < float(sys.argv[5]):
    try:
        got = source.committed_offsets(group, [TopicPartition(topic, 0)])
        assert got == {TopicPartition(topic, 0): expect}, got
        answers += 1
    except SourceUnavailable:
        failures += 1
print(answers, failures)
"""


@pytest.mark.kafka_faults
def test_committed_offsets_during_a_coordinator_move_never_abort(cluster: Any) -> None:
    from confluent_kafka import Consumer

    topic, group = _topic(cluster), unique("gfacts3")
    committer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group,
                          "log_level": "0"})
    committer.commit(offsets=[KafkaTP(topic, 0, 7)], asynchronous=False)
    committer.close()
    coordinator = cluster.coordinator(group)
    reader = subprocess.Popen([sys.executable, "-c", _READER, cluster.bootstrap, group, topic,
                               "7", "30"], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3)
        cluster.kill(coordinator)
        out, err = reader.communicate(timeout=90)
    finally:
        if reader.poll() is None:
            reader.kill()
        cluster.start(coordinator)
    assert reader.returncode == 0, err[-3000:]
    answers, _failures = (int(x) for x in out.split())
    assert answers > 0


_SPINNER = """
import resource, sys, time
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from consumer.kafka.source import KafkaSource
bootstrap, topic, partitions, which = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
conf = {"bootstrap.servers": bootstrap, "log_level": "0"}
admin = AdminClient(conf) if which == "plain" else KafkaSource(conf)._admin
def offsets():  # a lag sample: every partition's leader asked
    try:
        for f in admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest()
                                     for p in range(partitions)}, request_timeout=2).values():
            f.result(timeout=3)
    except Exception:
        pass
offsets()
print("ready", flush=True)
sys.stdin.readline()  # a node was killed
cpu = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
c0, t0 = cpu(), time.monotonic()
while time.monotonic() - t0 < 6:
    offsets()
    time.sleep(1)
print(round((cpu() - c0) / (time.monotonic() - t0), 3), flush=True)
"""


@pytest.mark.kafka_faults  # a librdkafka fact; make test pins the setting itself
# (tests/unit/consumer/test_kafka_source_settings.py) and throws the coordinator kill at it
def test_an_admin_client_with_sparse_connections_spins_on_a_dead_broker(cluster: Any) -> None:
    """librdkafka 2.16: an AdminClient with its default sparse connections, after asking a
    broker for offsets, reconnects to it without backoff once it is dead (most of a CPU);
    ``KafkaSource``'s AdminClient (``enable.sparse.connections=false``) does not. When this
    test's first assertion fails, librdkafka has fixed it and the setting can go."""
    topic = _topic(cluster)
    procs = {which: subprocess.Popen([sys.executable, "-c", _SPINNER, cluster.bootstrap, topic,
                                      str(PARTITIONS), which], cwd=ROOT, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
             for which in ("plain", "source")}
    node = cluster.leader(topic, 0)
    try:
        for proc in procs.values():
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        cluster.kill(node)
        for proc in procs.values():
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        share = {which: float(proc.communicate(timeout=60)[0]) for which, proc in procs.items()}
    finally:
        for proc in procs.values():
            proc.kill()
        cluster.start(node)
    assert share["plain"] > 0.2, share  # the librdkafka fact
    assert share["source"] < 0.05, share  # the worker's client waits out its backoff
