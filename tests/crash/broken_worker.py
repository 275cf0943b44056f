"""A deliberately broken ``fencectl``: it takes its progress from Kafka's committed offsets.

``python -m tests.crash.broken_worker run ...`` is ``fencectl run`` with two patches, the
design of a worker that fences ownership in PostgreSQL but keeps progress in Kafka:

- ``Lifecycle.seek_all`` (every seek goes through it) positions each partition at the
  group's committed Kafka offset (the earliest offset when there is none) instead of the
  durable frontier, and makes that its token's frontier;
- the fence statement (and the attempt count's, written after the unclean end the crash
  leaves) checks the epoch only (with the frontier check, every batch of this worker would
  be fenced and it would exit 3 instead of applying records twice).

Wherever Kafka's committed offset lags PostgreSQL (a crash after COMMIT and before the
Kafka commit) it applies records a second time, which the reference oracle sees. Only the
crash matrix's own test runs it (``tests/integration/test_crash_matrix.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient

from consumer.lifecycle import Lifecycle
from fencing.postgres.sql import Statements
from fencing.types import Token, TopicPartition
from ops.cli import main


def _committed(group: str, tp: TopicPartition) -> int:
    admin = AdminClient({"bootstrap.servers": os.environ["KAFKA_BOOTSTRAP_SERVERS"]})
    request = ConsumerGroupTopicPartitions(group, [KafkaTP(tp.topic, tp.partition)])
    result = admin.list_consumer_group_offsets([request])[group].result(timeout=30)
    offset = result.topic_partitions[0].offset
    return offset if offset >= 0 else 0


_real_seek_all = Lifecycle.seek_all


async def _seek_from_kafka(self: Lifecycle,
                           tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
    await _real_seek_all(self, tps)
    out: dict[TopicPartition, int] = {}
    for tp in tps:
        out[tp] = await asyncio.to_thread(_committed, self.group_id, tp)
        self._tokens[tp] = Token(self._tokens[tp].epoch, out[tp])
    return out


_real_for_schema: Any = Statements.for_schema.__func__  # type: ignore[attr-defined]


def _epoch_only(cls: type[Statements], schema: str) -> Statements:
    s = _real_for_schema(cls, schema)
    return dataclasses.replace(
        s, begin_fence=s.begin_fence.replace(" AND frontier = {frontier:d}", ""),
        prepare_fence=s.prepare_fence.replace(" AND frontier = $4", ""),
        record_attempt=s.record_attempt.replace(" AND frontier = $5",
                                                " AND $5::bigint IS NOT NULL"))


Lifecycle.seek_all = _seek_from_kafka  # type: ignore[method-assign]
Statements.for_schema = classmethod(_epoch_only)  # type: ignore[assignment,method-assign]

if __name__ == "__main__":
    sys.exit(main())
