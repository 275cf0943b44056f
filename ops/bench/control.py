"""The plain consumer beside a latency run (``ops.bench.latency``): what Kafka's path costs
on the same machine at the same moment, without the worker's batching and transactions.

``python -m ops.bench.control --topic T --group G --out FILE`` consumes ``T`` from its
beginning in its own group with the member's fetch settings (``consumer.config.PREFETCH``)
and the member's Kafka thread's pattern (``consumer.kafka.adapter.consume_ready`` with its
defaults: ``consume(1000, 0)``, and when that holds nothing ``consume(1, 0.05)`` plus what
came with it). Each record's latency is the wall clock when
``consume()`` returned it minus its Kafka timestamp, kept as the worker's histograms are
(``ops.bench.clock``: second of produce time -> whole ms -> records). On SIGTERM it closes
the consumer and writes ``{"lat": ..., "records": n, "cpu_s": its CPU seconds}`` to
``FILE``: it shares the machine with the member, and its CPU is part of the run's load.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from consumer.config import PREFETCH
from consumer.kafka.adapter import consume_ready
from ops.bench.clock import Histogram, add_latencies, plain_histogram

__all__ = ["consume_until", "main"]

CONSUME_MAX = 1000  # the member's: KafkaThread's consume_max_records
POLL_S = 0.05  # the member's: WorkerConfig.poll_timeout_s


def consume_until(topic: str, group: str, stop: threading.Event) -> tuple[Histogram, int]:
    """Consume ``topic`` from its beginning until ``stop`` is set; the latency histogram and
    the records received."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": os.environ["KAFKA_BOOTSTRAP_SERVERS"],
                         "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "enable.partition.eof": False,
                         **PREFETCH})
    consumer.subscribe([topic])
    hist: Histogram = {}
    received = 0
    try:
        while not stop.is_set():
            msgs = consume_ready(consumer, CONSUME_MAX, POLL_S)
            if not msgs:
                continue
            now_ms = time.time() * 1000
            stamps = [m.timestamp()[1] for m in msgs if m.error() is None]
            received += len(stamps)
            add_latencies(hist, stamps, now_ms)
    finally:
        consumer.close()
    return hist, received


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.bench.control")
    p.add_argument("--topic", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _sig, _frame: stop.set())
    hist, received = consume_until(a.topic, a.group, stop)
    a.out.write_text(json.dumps({"lat": plain_histogram(hist), "records": received,
                                 "cpu_s": time.process_time()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
