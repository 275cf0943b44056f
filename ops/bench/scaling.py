"""``make bench``, scaling section: one ``fencectl run --processes N`` for N = 1 .. the cores.

For the reference handler and the table sink (upsert on ``id``, batches of 2,000), a set
of N members (``--processes N``, each its own process and consumer of one group) starts on
a fresh, empty topic of ``max(6, 4 x cores)`` partitions (each member can fill its
``--db-concurrency`` of 4); once every member owns partitions (the fence table shows N
owners of all of them), the records are produced (the throughput runs' kind and count)
and the set drains them, timed by the members' marks (``ops.bench.clock``: first handler
call of any member to last return of any): no member starts alone on a backlog while the
others join. Reported per N: records/s, each member's CPU seconds over its own span and
per record it handled, and PostgreSQL's CPU per record over the span
(``ops.bench.runs._pg_over_span``).

From the CPU per record the page predicts the curve on a larger host
(``prediction``, rendered by ``ops.bench.tables``): a member is bound by one core, so
``members x 1e6 / worker_us`` records/s while cores remain; the host's cores bound the sum
``records/s x (worker_us + postgres_us + kafka_us)``; the assumptions are stated on
docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

from ops.bench.paced import create_topic
from ops.bench.runs import Run, execute, new_topic
from ops.operator.db import connection
from ops.worker.supervisor import cores

Produce = Callable[[str, str, int, int], None]  # kind, topic, records, partitions

__all__ = ["predict", "run_all"]

SINK_SETTINGS = ("table=bench_sink", "key=id")
SINK_ARGS = ("--batch-max-records", "2000")


def _run(handler: str, n: int) -> Run:
    if handler == "sink":
        return Run(f"scaling_sink_{n}", f"sink, {n} processes", "worker", SINK_ARGS,
                   topic="sink", handler="sink", settings=SINK_SETTINGS, processes=n)
    return Run(f"scaling_{n}", f"reference, {n} processes", "worker", processes=n)


async def _owners(dsn: str, schema: str, group: str) -> tuple[int, int]:
    """(partitions claimed, distinct owners) of ``group`` in the fence table."""
    async with connection(dsn) as conn:
        row = await conn.fetchrow(
            f'SELECT count(*) AS n, count(DISTINCT owner) AS owners FROM "{schema}".partitions '
            "WHERE group_id = $1", group)
    return int(row["n"]), int(row["owners"])


def _when_all_own(dsn: str, schema: str, group: str, *, members: int, partitions: int,
                  fill: Callable[[], None]) -> None:
    """Wait until ``members`` distinct lifetimes own all ``partitions``, then ``fill``."""
    deadline = time.monotonic() + 120
    while asyncio.run(_owners(dsn, schema, group)) != (partitions, members):
        if time.monotonic() > deadline:
            raise TimeoutError(f"scaling: {members} members did not share the partitions "
                               "within 120 s")
        time.sleep(0.2)
    fill()


def run_all(dsn: str, count: int, produce: Produce, *, max_processes: int = 0
            ) -> dict[str, Any]:
    """Sets of 1 .. ``max_processes`` (default: the cores) members per handler on ``count``
    records each (``produce(kind, topic, count, partitions)`` writes them)."""
    top = max_processes or cores()
    partitions = max(6, 4 * cores())
    out: dict[str, Any] = {"cores": cores(), "partitions": partitions, "runs": []}
    for handler, kind in (("reference", "main"), ("sink", "sink")):
        for n in range(1, top + 1):
            print(f"scaling: {handler}, --processes {n} ...", flush=True)
            topic = new_topic(f"scale{kind}")
            create_topic(topic, partitions)

            def ready(schema: str, group: str, topic: str = topic, n: int = n,
                      kind: str = kind) -> None:
                _when_all_own(dsn, schema, group, members=n, partitions=partitions,
                              fill=lambda: produce(kind, topic, count, partitions))

            got = execute(_run(handler, n), topic, count, dsn, ready=ready)
            out["runs"].append({"handler": handler, "processes": n, "partitions": partitions,
                                **got})
            print(f"  {got}", flush=True)
    return out


def predict(runs: list[dict[str, Any]], host_cores: int, handler: str) -> dict[str, Any] | None:
    """The records/s a host of ``host_cores`` cores would reach with as many members as
    fit, from the one-process run's CPU per record (see the module docstring): the worker's
    (``member_cpu_s``) and PostgreSQL's, both on the same host."""
    one = next((r for r in runs if r["handler"] == handler and r["processes"] == 1), None)
    if one is None or not one.get("records") or one.get("pg_cpu_us_per_record") is None:
        return None
    worker_us = sum(one["member_cpu_s"]) * 1e6 / one["records"]
    pg_us = float(one["pg_cpu_us_per_record"])
    per_record = worker_us + pg_us  # CPU of one record on the host (Kafka's left out)
    members = max(math.ceil(host_cores * worker_us / per_record), 1)
    rate = min(members * 1e6 / worker_us, host_cores * 1e6 / per_record)
    return {"cores": host_cores, "members": members, "records_per_s": round(rate),
            "worker_us_per_record": round(worker_us, 1), "pg_us_per_record": round(pg_us, 1)}
