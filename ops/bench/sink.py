"""The table sink's numbers: its write methods compared on batches through the real fence
store (``python -m ops.bench.sink``), and the 100-byte JSON values the worker benchmark's
sink run produces (``ops.bench.worker --sink-only``).

Each method (binary COPY, binary executemany) x mode (insert, upsert) processes ``--rounds``
batches of ``--batch`` records of fresh keys into its own table; the median milliseconds per
batch and records/s are printed as JSON. The machine's load moves single numbers: compare
the methods within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from typing import Any

from fencing.postgres.schema import migrate
from fencing.postgres.sink import Method, SinkSpec, ensure_table, make_table_sink
from fencing.postgres.store import PgFenceStore
from fencing.types import ClaimRequest, SourceRecord, TopicPartition
from ops.operator.db import connection

__all__ = ["measure_methods", "produce_values", "sink_value"]


def sink_value(i: int) -> bytes:
    """A JSON object of exactly 100 bytes with an ``id`` (the upsert key) and a few fields."""
    head = json.dumps({"id": f"o{i}", "amount": i % 997, "status": "new", "note": ""},
                      separators=(",", ":"))
    return head.replace('"note":""', '"note":"' + "x" * (100 - len(head)) + '"').encode()


def produce_values(topic: str, count: int, partitions: int, bootstrap: str) -> None:
    """Create ``topic`` (``partitions``) and produce ``count`` ``sink_value`` records, keyed by
    their id, round robin over the partitions; raises ``RuntimeError`` on a failed delivery."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    from ops.commands.produce import ProduceOptions, ensure_topic

    opts = ProduceOptions(topic, count, 0, "valid", partitions=partitions, bootstrap=bootstrap)
    problem = ensure_topic(AdminClient({"bootstrap.servers": bootstrap}), opts)
    if problem is not None:
        raise RuntimeError(problem)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 20, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 500_000})
    for i in range(count):
        while True:
            try:
                producer.produce(topic, sink_value(i), f"o{i}".encode(), partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120) != 0:
        raise RuntimeError(f"{topic}: records left undelivered")


async def _one(dsn: str, schema: str, spec: SinkSpec, batch: int, rounds: int) -> dict[str, Any]:
    async with connection(dsn) as conn:
        await ensure_table(conn, spec)
    store = await PgFenceStore.connect(dsn, group_id="bench", schema=schema, pool_max=2)
    tp = TopicPartition(f"t-{uuid.uuid4().hex[:6]}", 0)
    try:
        token = (await store.claim([ClaimRequest(tp, 0)], lifetime="bench"))[tp]
        sink = make_table_sink(spec)
        took = []
        for r in range(rounds):
            records = [SourceRecord(tp.topic, 0, token.frontier + i, None,
                                    sink_value(r * batch + i)) for i in range(batch)]
            start = time.perf_counter()
            token = await store.process(tp, token, records, sink)
            took.append(time.perf_counter() - start)
    finally:
        await store.close()
    ms = statistics.median(took[1:] or took) * 1000  # the first batch reads the catalog
    return {"ms_per_batch": round(ms, 2), "records_per_s": round(batch / ms * 1000)}


async def measure_methods(dsn: str, *, batch: int = 500, rounds: int = 20) -> dict[str, Any]:
    """Median ms per batch and records/s of each method x mode (see the module doc)."""
    schema = f"bench_sink_{uuid.uuid4().hex[:8]}"
    async with connection(dsn) as conn:
        await migrate(conn, schema)
    out: dict[str, Any] = {"batch": batch, "rounds": rounds,
                           "load_average_1m": round(os.getloadavg()[0], 2)}
    try:
        for _ in range(2):  # interleaved twice: load drifts, each pair is measured close together
            for mode, key in (("insert", None), ("upsert", "id")):
                for method in Method:
                    spec = SinkSpec(f"{schema}.{mode}_{method.value}_{uuid.uuid4().hex[:4]}",
                                    key=key, method=method)
                    got = await _one(dsn, schema, spec, batch, rounds)
                    out.setdefault(f"{mode}/{method.value}", []).append(got)
    finally:
        async with connection(dsn) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.bench.sink")
    p.add_argument("--batch", type=int, default=500)
    p.add_argument("--rounds", type=int, default=20)
    a = p.parse_args(argv)
    got = asyncio.run(measure_methods(os.environ["FENCE_DSN"], batch=a.batch, rounds=a.rounds))
    print(json.dumps(got, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
