"""The paced producer of the latency runs (``ops.bench.latency``, ``ops.bench.peer``).

``python -m ops.bench.paced --topic T --kind reference|sink|peer --rate R --seconds S
--partitions P --out FILE`` prepares ``R x S`` records, then produces ``R`` per second in
1 ms steps on ``CLOCK_MONOTONIC`` (``linger.ms=5``: see ``LINGER_MS``) and writes what it
did to ``FILE``: the wall-clock start and the time of its last ``produce()``, the records
produced and the rate achieved. ``peer`` values carry the wall-clock milliseconds of their
own ``produce()``.
SIGTERM ends the producing early (``ops.bench.latency``'s moves produce until the moved
partitions resumed); what was produced is flushed and reported as always.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ops.bench.runs import PY, ROOT, env

__all__ = ["LINGER_MS", "create_topic", "finish_producer", "produce_paced", "start_producer"]

#: librdkafka's default ``linger.ms`` (the Java producer's too since Kafka 4.0, KIP-1030). A
#: record's latency counts from ``produce()`` (its ``CreateTime``), so it includes this
#: wait. Why not 1 ms: on this 2-core machine, ``linger.ms=1`` made produce requests of a few
#: records each, and the producer and the broker took so much of the cores the member shares
#: that the plain consumer beside it saw p99 of 210-430 ms at 25 % of capacity, and the table
#: sink at 50 % fell 5.2-6.3 s behind in three runs, against 1.3 and 3.1 s in two with 5 ms
#: (docs/benchmarks.md, "Latency under steady load").
LINGER_MS = 5


def create_topic(topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": os.environ["KAFKA_BOOTSTRAP_SERVERS"]})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    deadline = time.monotonic() + 30
    while topic not in admin.list_topics(timeout=5).topics and time.monotonic() < deadline:
        time.sleep(0.1)


# ---- the producer process ----------------------------------------------------------------

def _source(kind: str, topic: str, count: int, partitions: int
            ) -> Callable[[int], tuple[bytes, bytes, int]]:
    """Record ``i`` as (key, value, partition): reference documents (valid class, generated
    first: the generator keeps a ledger), the sink's 100-byte JSON values, or (``peer``) the
    sink's fields with ``produced_ms``, the wall-clock milliseconds when it is made, just
    before its ``produce()``; the last two are made as they are sent (a rate of 60,000/s for
    25 s would otherwise hold 1.5 million of them)."""
    if kind == "peer":
        return lambda i: (f"o{i}".encode(), b'{"id":"o%d","amount":%d,"status":"new",'
                          b'"note":"x","produced_ms":%d}' % (i, i % 997, time.time() * 1000),
                          i % partitions)
    if kind == "sink":
        from ops.bench.sink import sink_value

        return lambda i: (f"o{i}".encode(), sink_value(i), i % partitions)
    from ops.reference import generate

    made = [(r.key, r.value, r.partition) for r in generate(
        21, count=count, partitions=partitions, klass="valid", topic=topic)]
    return made.__getitem__


def produce_paced(topic: str, kind: str, rate: float, seconds: float, partitions: int
                  ) -> dict[str, Any]:
    """Produce ``rate`` records/s for ``seconds`` (paced in 1 ms steps on the monotonic
    clock); the wall-clock start and end and what was produced."""
    from confluent_kafka import Producer

    total = max(int(rate * seconds), 1)
    record = _source(kind, topic, total, partitions)
    producer = Producer({"bootstrap.servers": os.environ["KAFKA_BOOTSTRAP_SERVERS"],
                         "linger.ms": LINGER_MS, "queue.buffering.max.messages": 1_000_000})
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _sig, _frame: stop.set())
    start, wall_start, sent = time.monotonic(), time.time(), 0
    while sent < total and not stop.is_set():
        due = min(total, int((time.monotonic() - start) * rate) + 1)
        while sent < due:
            key, value, partition = record(sent)
            try:
                producer.produce(topic, value, key, partition=partition)
            except BufferError:
                producer.poll(0.01)
                continue
            sent += 1
        producer.poll(0)
        time.sleep(0.001)
    elapsed, wall_end = time.monotonic() - start, time.time()  # the last produce() call
    left = producer.flush(60)
    return {"produced": sent, "undelivered": left, "start_wall": wall_start,
            "end_wall": wall_end, "rate_achieved": round(sent / max(elapsed, 1e-9))}


def start_producer(topic: str, kind: str, rate: float, seconds: float, partitions: int,
                    out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([PY, "-m", "ops.bench.paced", "--topic", topic,
                             "--kind", kind, "--rate", str(rate), "--seconds", str(seconds),
                             "--partitions", str(partitions), "--out", str(out)],
                            env=env(), cwd=ROOT)


def finish_producer(proc: subprocess.Popen[bytes], out: Path, timeout_s: float
                    ) -> dict[str, Any]:
    """Wait for a producer ``start_producer`` started; what it wrote to ``out``. Raises
    ``RuntimeError`` when it failed (a run must not be measured on records never sent)."""
    code = proc.wait(timeout=timeout_s)
    if code != 0 or not out.exists():
        raise RuntimeError(f"the paced producer exited {code} (its summary: {out})")
    return dict(json.loads(out.read_text()))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.bench.paced")
    p.add_argument("--topic", required=True)
    p.add_argument("--kind", choices=["reference", "sink", "peer"], required=True)
    p.add_argument("--rate", type=float, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--partitions", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    got = produce_paced(a.topic, a.kind, a.rate, a.seconds, a.partitions)
    a.out.write_text(json.dumps(got))
    return 0 if got["undelivered"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
