"""The Kafka consumer every benchmark baseline reads with: subscribed to one topic from its
start, offsets never auto-committed, and the worker's prefetch (``consumer.config.PREFETCH``),
so a baseline consumes exactly as the worker's Kafka thread does.

A leaf: ``ops.bench.baselines`` (in-process runs) and ``ops.bench.consumer_process`` (the
child process of run (e'')) both take it from here and import nothing of each other but
``baselines`` -> ``consumer_process``.
"""

from __future__ import annotations

from confluent_kafka import Consumer

from consumer.config import PREFETCH

__all__ = ["subscribed"]


def subscribed(bootstrap: str, group: str, topic: str) -> Consumer:
    """A consumer of ``group`` subscribed to ``topic``, reading from the earliest offset."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,  # prefetch as the worker
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "enable.partition.eof": False, **PREFETCH})
    c.subscribe([topic])
    return c
