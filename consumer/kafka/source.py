"""Kafka facts for source validation: topic identity and watermarks (a thin AdminClient shell).

Rules
- ``topic_id`` comes from ``AdminClient.describe_topics`` (``TopicDescription.topic_id``,
  a KIP-516 Uuid, rendered as its base64 string); it changes when a topic is deleted and
  recreated under the same name.
- librdkafka sends ``describe_topics`` to the broker its cached metadata names as controller
  (in KRaft a live broker the answering broker picks) and waits for *that* broker to be up
  (``rd_kafka_broker_controller_async``, rdkafka_broker.c); it refreshes the controller id
  only with the next metadata response, and an AdminClient without topics of its own sends
  none when a broker goes down. So once that broker dies, every ``describe_topics`` fails
  with ``_TIMED_OUT`` "Timed out waiting for controller" until the broker is back (measured:
  still failing 90 s after a SIGKILL). After a failed call this module therefore sends one
  metadata request (``list_topics``) so the next attempt goes to a live broker
  (tests/integration/test_kafka_facts_failover.py pins both); after ``REBUILD_AFTER``
  failures in a row it also replaces the AdminClient with a fresh one (a worker's long-lived
  handle was seen failing for over 60 s while its consumer fetched from the new leaders).
- Watermarks come from ``AdminClient.list_offsets`` with ``OffsetSpec.earliest()`` and
  ``OffsetSpec.latest()`` (the low watermark is the first offset still stored). While a
  partition has no live leader, librdkafka answers ``list_offsets`` for it with offset
  -1001 (``OFFSET_INVALID``) and no error after the request timeout; such an answer is
  ``SourceUnavailable``, never a watermark.
- The AdminClient is its own librdkafka handle, so these calls are safe from any thread,
  including while the consumer's thread sits inside a rebalance callback.
- The AdminClient keeps a connection to every broker (``enable.sparse.connections=false``).
  With librdkafka's default sparse (on-demand) connections, an AdminClient that has sent
  requests to a broker spins reconnecting to it once that broker is dead -- measured with
  librdkafka 2.16.0: 50-80 % of a CPU per client and ~20,000 "Connection refused" a second
  while the broker stayed down (on the sparse path a refused connect goes DOWN -> INIT and
  back to TRY_CONNECT on demand, and the ``OP_CONNECT`` that asks for a connection clears the
  reconnect backoff: "Expedite next reconnect", rdkafka_broker.c); three workers doing so
  starved a two-core machine's surviving brokers until their KRaft quorum lost its leader
  and a coordinator failover outlived the outage bound. Without sparse connections the
  broker thread reconnects with its backoff (the fact is pinned by
  tests/integration/test_kafka_facts_failover.py).
- ``committed_offsets`` reads a group's committed offsets with ``Consumer.committed`` of a
  consumer that never joins the group (an OffsetFetch to its coordinator); a partition
  without a committed offset reads as None. Not ``AdminClient.list_consumer_group_offsets``:
  librdkafka's coordinator-bound admin requests can abort the process when the coordinator
  connection drops (librdkafka #4605, fix proposed in #5397: an assertion in
  ``rd_kafka_enq_once_del_source_return``), seen here during a coordinator kill.
- ``matching_topics`` lists the topics a ``--topic-pattern`` matches now (for the start-up
  log and metrics only: librdkafka itself resolves the subscription, also for later topics).
- Foreign errors become ``SourceUnavailable`` (a ``StoreUnavailable``-like transient error
  of the source, not a refusal); a missing topic or partition is a ``SourceRefused``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    TopicCollection,
)
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient, OffsetSpec

from fencing.errors import SourceRefused, SourceUnavailable
from fencing.types import SourceCheck, SourceFacts, TopicPartition

__all__ = ["REBUILD_AFTER", "KafkaSource", "build_checks"]

#: failed calls in a row after which the AdminClient is replaced by a fresh one
REBUILD_AFTER = 3


_MISSING_CODES = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC,
                            KafkaError.UNKNOWN_TOPIC_ID})


def build_checks(facts: dict[TopicPartition, SourceFacts], *,
                 allow_retention_gap: bool) -> list[SourceCheck]:
    """One ``SourceCheck`` per partition, in partition order."""
    return [SourceCheck(tp, facts[tp], allow_retention_gap) for tp in sorted(facts)]


class KafkaSource:
    """Reads topic identity and watermarks for partitions of one topic."""

    def __init__(self, admin_conf: dict[str, str], *, request_timeout_s: float = 10.0) -> None:
        # librdkafka's informational lines (e.g. "Purging 1 unserved events from background
        # queue" when the client is destroyed) are noise on a command's output: warnings up
        self._conf = dict(admin_conf)
        self._admin_conf: dict[str, str | int | float | bool] = {
            "log_level": "4", "enable.sparse.connections": False, **admin_conf}
        self._admin = AdminClient(self._admin_conf)
        self._timeout_s = request_timeout_s
        self._failures = 0  # failed calls in a row (any thread; a rough count is enough)

    def _refresh_metadata(self) -> None:
        """After a failed call: one metadata request (librdkafka takes the controller id and
        the leaders from its answer), and a fresh AdminClient after ``REBUILD_AFTER`` failures
        in a row (see Rules); a failure here is the caller's next attempt's to report."""
        self._failures += 1
        if self._failures % REBUILD_AFTER == 0:
            self._admin = AdminClient(self._admin_conf)
        try:
            self._admin.list_topics(timeout=min(self._timeout_s, 5.0))
        except KafkaException:
            pass

    def topic_id(self, topic: str) -> tuple[str | None, int]:
        """``(topic_id, partition_count)``; raises ``SourceRefused`` if the topic is gone."""
        futures = self._admin.describe_topics(TopicCollection([topic]),
                                              request_timeout=self._timeout_s)
        try:
            desc = futures[topic].result(timeout=self._timeout_s + 1)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if err is not None and getattr(err, "code", lambda: None)() in _MISSING_CODES:
                raise SourceRefused(f"topic {topic!r} does not exist; create it or fix --topic") \
                    from exc
            self._refresh_metadata()
            raise SourceUnavailable(f"describe_topics({topic!r}) failed: {exc}") from exc
        except TimeoutError as exc:
            self._refresh_metadata()
            raise SourceUnavailable(f"describe_topics({topic!r}) timed out") from exc
        tid = getattr(desc, "topic_id", None)
        return (str(tid) if tid is not None else None), len(desc.partitions)

    def facts(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, SourceFacts]:
        """Facts for every partition of ``tps`` (one describe per topic, two list_offsets)."""
        out: dict[TopicPartition, SourceFacts] = {}
        if not tps:
            return out
        ids = {topic: self.topic_id(topic) for topic in {tp.topic for tp in tps}}
        for tp in tps:
            if tp.partition >= ids[tp.topic][1]:
                raise SourceRefused(f"{tp} does not exist (topic has {ids[tp.topic][1]} "
                                    "partitions)")
        low = self._offsets(tps, OffsetSpec.earliest())
        high = self._offsets(tps, OffsetSpec.latest())
        for tp in tps:
            out[tp] = SourceFacts(topic_id=ids[tp.topic][0], low_watermark=low[tp],
                                  high_watermark=high[tp])
        self._failures = 0
        return out

    def _offsets(self, tps: Sequence[TopicPartition],
                 spec: OffsetSpec) -> dict[TopicPartition, int]:
        req = {KafkaTP(tp.topic, tp.partition): spec for tp in tps}
        futures = self._admin.list_offsets(req, request_timeout=self._timeout_s)
        out: dict[TopicPartition, int] = {}
        for ktp, fut in futures.items():
            try:
                info = fut.result(timeout=self._timeout_s + 1)
            except (KafkaException, TimeoutError) as exc:
                self._refresh_metadata()
                raise SourceUnavailable(f"list_offsets({ktp.topic}[{ktp.partition}]) failed: "
                                        f"{exc}") from exc
            if int(info.offset) < 0:  # no live leader answered (see Rules)
                self._refresh_metadata()
                raise SourceUnavailable(f"list_offsets({ktp.topic}[{ktp.partition}]) answered "
                                        f"no offset ({info.offset}): the partition has no "
                                        "reachable leader")
            out[TopicPartition(ktp.topic, ktp.partition)] = int(info.offset)
        return out

    def committed_offsets(self, group: str, tps: Sequence[TopicPartition]
                          ) -> dict[TopicPartition, int | None]:
        """Kafka's committed offset of ``group`` per partition (None: none committed)."""
        if not tps:
            return {}
        try:
            reader = Consumer({**self._conf, "group.id": group, "enable.auto.commit": False,
                               "log_level": "0"})
        except KafkaException as exc:
            raise SourceUnavailable(f"committed offsets of {group!r}: {exc}") from exc
        try:
            got = reader.committed([KafkaTP(tp.topic, tp.partition) for tp in tps],
                                   timeout=self._timeout_s)
        except KafkaException as exc:
            raise SourceUnavailable(f"committed offsets of {group!r} failed: {exc}") from exc
        finally:
            reader.close()
        out: dict[TopicPartition, int | None] = {}
        for p in got:
            if p.error is not None:
                raise SourceUnavailable(f"committed offsets of {group!r}: "
                                        f"{p.topic}[{p.partition}]: {p.error}")
            out[TopicPartition(p.topic, p.partition)] = p.offset if p.offset >= 0 else None
        return out

    def matching_topics(self, pattern: str) -> list[str]:
        """Names of the existing topics that ``pattern`` matches from their start, as
        librdkafka's ``^`` subscription does (internal ``__`` topics left out), sorted.
        Raises ``SourceUnavailable`` when the cluster does not answer."""
        regex = re.compile(pattern if pattern.startswith("^") else "^" + pattern)
        try:
            names = self._admin.list_topics(timeout=self._timeout_s).topics
        except KafkaException as exc:
            raise SourceUnavailable(f"list_topics failed: {exc}") from exc
        return sorted(n for n in names if not n.startswith("__") and regex.search(n))

    def list_topics_ok(self, timeout_s: float) -> bool:
        """True when the cluster answered a metadata request within ``timeout_s``."""
        try:
            self._admin.list_topics(timeout=timeout_s)
        except KafkaException:
            return False
        return True
