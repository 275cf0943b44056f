"""The table sink's numbers: its write methods compared on batches through the real fence
store (``python -m ops.bench.sink``), and the 100-byte JSON values the worker benchmark's
sink run produces (``ops.bench.worker --sink-only``).

Each method (binary COPY, binary executemany) x mode (insert, upsert) processes ``--rounds``
batches of ``--batch`` records of fresh keys into its own table, the four taking turns batch
by batch; the median milliseconds per batch and records/s are printed as JSON. The
machine's load moves single numbers: compare the methods within one run.
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


class _Lane:
    """One method x mode: its table, fence store, partition token and batch timings."""

    def __init__(self, dsn: str, schema: str, spec: SinkSpec) -> None:
        self.dsn, self.schema, self.spec = dsn, schema, spec
        self.tp = TopicPartition(f"t-{uuid.uuid4().hex[:6]}", 0)
        self.took: list[float] = []

    async def open(self) -> None:
        async with connection(self.dsn) as conn:
            await ensure_table(conn, self.spec)
        self.store = await PgFenceStore.connect(self.dsn, group_id="bench", schema=self.schema,
                                                pool_max=2)
        self.token = (await self.store.claim([ClaimRequest(self.tp, 0)], lifetime="b"))[self.tp]
        self.sink = make_table_sink(self.spec)

    async def batch(self, first_id: int, size: int) -> None:
        records = [SourceRecord(self.tp.topic, 0, self.token.frontier + i, None,
                                sink_value(first_id + i)) for i in range(size)]
        start = time.perf_counter()
        self.token = await self.store.process(self.tp, self.token, records, self.sink)
        self.took.append(time.perf_counter() - start)

    def result(self, size: int) -> dict[str, Any]:
        ms = statistics.median(self.took[1:] or self.took) * 1000  # batch 1 reads the catalog
        return {"ms_per_batch": round(ms, 2), "records_per_s": round(size / ms * 1000)}


async def measure_methods(dsn: str, *, batch: int = 500, rounds: int = 20) -> dict[str, Any]:
    """Median ms per batch and records/s of each method x mode (see the module doc). The
    lanes take turns batch by batch, so a change of load hits all of them alike."""
    schema = f"bench_sink_{uuid.uuid4().hex[:8]}"
    async with connection(dsn) as conn:
        await migrate(conn, schema)
    lanes = {f"{mode}/{method.value}": _Lane(dsn, schema, SinkSpec(
                 f"{schema}.{mode}_{method.value}", key=key, method=method))
             for mode, key in (("insert", None), ("upsert", "id")) for method in Method}
    try:
        for lane in lanes.values():
            await lane.open()
        for r in range(rounds):
            for lane in lanes.values():
                await lane.batch(r * batch, batch)
    finally:
        for lane in lanes.values():
            if hasattr(lane, "store"):
                await lane.store.close()
        async with connection(dsn) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return {"batch": batch, "rounds": rounds, "load_average_1m": round(os.getloadavg()[0], 2),
            **{name: lane.result(batch) for name, lane in lanes.items()}}


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
