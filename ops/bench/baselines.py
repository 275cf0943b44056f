"""Baseline consumers for ``ops.bench.worker`` (each runs as its own process; prints one JSON line).

- ``raw``: consume the topic to its end with no database (records/s of librdkafka + Python).
- ``raw-aio``: the same through ``confluent_kafka.aio.AIOConsumer`` (for comparison only).
- ``unfenced``: an ordinary at-least-once consumer: per consume() call, per partition, one
  PostgreSQL transaction running the same reference handler over the batch (partitions
  concurrently on a pool of ``--db-concurrency``), then an asynchronous Kafka offset commit.
  No epochs, no frontier row, no quarantine: what a careful engineer writes without fencing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import defaultdict
from typing import Any

from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KTP

from consumer.kafka.adapter import to_record
from fencing.types import SourceRecord


def _consumer(bootstrap: str, group: str, topic: str) -> Any:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "enable.partition.eof": False, "queued.max.messages.kbytes": "16384"})
    c.subscribe([topic])
    return c


def run_raw(bootstrap: str, group: str, topic: str, total: int) -> dict[str, Any]:
    c = _consumer(bootstrap, group, topic)
    seen, t_first = 0, 0.0
    while seen < total:
        msgs = c.consume(1000, 0.5)
        for m in msgs:
            if m.error() is None:
                if not seen:
                    t_first = time.monotonic()
                to_record(m)  # same translation cost as the worker
                seen += 1
    elapsed = time.monotonic() - t_first
    c.close()
    return {"records": seen, "elapsed_s": elapsed}


async def run_raw_aio(bootstrap: str, group: str, topic: str, total: int) -> dict[str, Any]:
    """Raw consumption through ``confluent_kafka.aio.AIOConsumer`` (measured, not used)."""
    from confluent_kafka.aio import AIOConsumer

    c = AIOConsumer({"bootstrap.servers": bootstrap, "group.id": group,
                     "enable.auto.commit": False, "auto.offset.reset": "earliest",
                     "queued.max.messages.kbytes": "4096"})
    await c.subscribe([topic])
    seen, t_first = 0, 0.0
    while seen < total:
        for m in await c.consume(1000, 0.5):
            if m.error() is None:
                if not seen:
                    t_first = time.monotonic()
                to_record(m)
                seen += 1
    elapsed = time.monotonic() - t_first
    await c.close()
    return {"records": seen, "elapsed_s": elapsed}


async def run_unfenced(bootstrap: str, group: str, topic: str, total: int, dsn: str,
                       schema: str, batch_max: int, concurrency: int) -> dict[str, Any]:
    import asyncpg

    from ops.reference.pg import make_pg_handler

    handler = make_pg_handler(schema=schema)
    pool = await asyncpg.create_pool(dsn, min_size=concurrency, max_size=concurrency)
    c = _consumer(bootstrap, group, topic)
    loop = asyncio.get_running_loop()
    seen, t_first = 0, 0.0

    async def apply(records: list[SourceRecord]) -> None:
        async with pool.acquire() as conn, conn.transaction():
            await handler(conn, records)

    while seen < total:
        msgs = await loop.run_in_executor(None, c.consume, 1000, 0.5)
        by_tp: dict[tuple[str, int], list[SourceRecord]] = defaultdict(list)
        for m in msgs:
            if m.error() is None:
                r = to_record(m)
                by_tp[(r.topic, r.partition)].append(r)
        if not by_tp:
            continue
        if not seen:
            t_first = time.monotonic()
        jobs = [apply(recs[i:i + batch_max]) for recs in by_tp.values()
                for i in range(0, len(recs), batch_max)]
        await asyncio.gather(*jobs)
        c.commit(offsets=[KTP(t, p, recs[-1].offset + 1) for (t, p), recs in by_tp.items()],
                 asynchronous=True)
        seen += sum(len(v) for v in by_tp.values())
    elapsed = time.monotonic() - t_first
    c.close()
    await pool.close()
    return {"records": seen, "elapsed_s": elapsed}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.bench.baselines")
    p.add_argument("mode", choices=["raw", "raw-aio", "unfenced"])
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--total", type=int, required=True)
    p.add_argument("--schema", default="fence")
    p.add_argument("--batch-max-records", type=int, default=500)
    p.add_argument("--db-concurrency", type=int, default=4)
    a = p.parse_args(argv)
    if a.mode == "raw":
        out = run_raw(a.bootstrap, a.group, a.topic, a.total)
    elif a.mode == "raw-aio":
        out = asyncio.run(run_raw_aio(a.bootstrap, a.group, a.topic, a.total))
    else:
        import os

        out = asyncio.run(run_unfenced(a.bootstrap, a.group, a.topic, a.total,
                                       os.environ["FENCE_DSN"], a.schema,
                                       a.batch_max_records, a.db_concurrency))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
