"""Kafka facts for source validation: topic identity and watermarks (a thin AdminClient shell).

Rules
- ``topic_id`` comes from ``AdminClient.describe_topics`` (``TopicDescription.topic_id``,
  a KIP-516 Uuid, rendered as its base64 string); it changes when a topic is deleted and
  recreated under the same name.
- Watermarks come from ``AdminClient.list_offsets`` with ``OffsetSpec.earliest()`` and
  ``OffsetSpec.latest()`` (the low watermark is the first offset still stored).
- The AdminClient is its own librdkafka handle, so these calls are safe from any thread,
  including while the consumer's thread sits inside a rebalance callback.
- ``committed_offsets`` reads a group's committed offsets with
  ``AdminClient.list_consumer_group_offsets`` (one group per request); a partition without
  a committed offset reads as None.
- ``matching_topics`` lists the topics a ``--topic-pattern`` matches now (for the start-up
  log and metrics only: librdkafka itself resolves the subscription, also for later topics).
- Foreign errors become ``SourceUnavailable`` (a ``StoreUnavailable``-like transient error
  of the source, not a refusal); a missing topic or partition is a ``SourceRefused``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicCollection,
)
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient, OffsetSpec

from fencing.errors import SourceRefused, SourceUnavailable
from fencing.types import SourceCheck, SourceFacts, TopicPartition

__all__ = ["KafkaSource", "build_checks"]


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
        conf = {"log_level": "4", **admin_conf}
        self._admin = AdminClient(dict[str, str | int | float | bool](conf))
        self._timeout_s = request_timeout_s

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
            raise SourceUnavailable(f"describe_topics({topic!r}) failed: {exc}") from exc
        except TimeoutError as exc:
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
                raise SourceUnavailable(f"list_offsets({ktp.topic}[{ktp.partition}]) failed: "
                                        f"{exc}") from exc
            out[TopicPartition(ktp.topic, ktp.partition)] = int(info.offset)
        return out

    def committed_offsets(self, group: str, tps: Sequence[TopicPartition]
                          ) -> dict[TopicPartition, int | None]:
        """Kafka's committed offset of ``group`` per partition (None: none committed)."""
        if not tps:
            return {}
        req = ConsumerGroupTopicPartitions(group, [KafkaTP(tp.topic, tp.partition)
                                                   for tp in tps])
        futures = self._admin.list_consumer_group_offsets([req],
                                                          request_timeout=self._timeout_s)
        try:
            got = futures[group].result(timeout=self._timeout_s + 1)
        except (KafkaException, TimeoutError) as exc:
            raise SourceUnavailable(f"list_consumer_group_offsets({group!r}) failed: "
                                    f"{exc}") from exc
        out: dict[TopicPartition, int | None] = {}
        for p in got.topic_partitions or ():
            if p.error is not None:
                raise SourceUnavailable(f"list_consumer_group_offsets({group!r}): "
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
