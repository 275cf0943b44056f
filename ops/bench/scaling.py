"""``make bench``, scaling section: one ``fencectl run --processes N`` for N = 1 .. the cores.

For the reference handler and the table sink (upsert on ``id``, batches of 2,000), each on
the topic its throughput runs read (the same records), a set of N members (``--processes
N``, each its own process and consumer of one group) drains the topic, timed by the
members' marks (``ops.bench.clock``: first handler call of any member to last return of
any). Reported per N: records/s, each member's CPU seconds over its own span and per
record, and PostgreSQL's CPU over the run (``ops.bench.pgcpu``), per record.

From the CPU per record the page predicts the curve on a larger host
(``prediction``, rendered by ``ops.bench.tables``): a member is bound by one core, so
``members x 1e6 / worker_us`` records/s while cores remain; the host's cores bound the sum
``records/s x (worker_us + postgres_us + kafka_us)``; the assumptions are stated on
docs/benchmarks.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ops.bench.runs import Run, execute
from ops.worker.supervisor import cores

__all__ = ["predict", "run_all"]

SINK_SETTINGS = ("table=bench_sink", "key=id")
SINK_ARGS = ("--batch-max-records", "2000")


def _run(handler: str, n: int) -> Run:
    if handler == "sink":
        return Run(f"scaling_sink_{n}", f"sink, {n} processes", "worker", SINK_ARGS,
                   topic="sink", handler="sink", settings=SINK_SETTINGS, processes=n)
    return Run(f"scaling_{n}", f"reference, {n} processes", "worker", processes=n)


def run_all(dsn: str, topics: Mapping[str, tuple[str, int]], *, max_processes: int = 0
            ) -> dict[str, Any]:
    """Sets of 1 .. ``max_processes`` (default: the cores) members per handler, each on the
    topic of its kind in ``topics`` (kind -> (topic, records))."""
    top = max_processes or cores()
    out: dict[str, Any] = {"cores": cores(), "runs": []}
    for handler, kind in (("reference", "main"), ("sink", "sink")):
        if kind not in topics:
            continue
        topic, total = topics[kind]
        for n in range(1, top + 1):
            print(f"scaling: {handler}, --processes {n} ...", flush=True)
            got = execute(_run(handler, n), topic, total, dsn)
            out["runs"].append({"handler": handler, "processes": n, **got})
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
