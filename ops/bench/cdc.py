"""Change events into the table sink (``make bench-cdc``, part of ``make bench``): what
Debezium's envelope costs against the plain sink writing the same rows, what the version
guard costs, and the replication lag through a real Debezium at a steady rate.

Sections of ``artifacts/bench/cdc.json``:
- ``throughput``: worker runs of ``ops.bench.worker`` (same clock, one member, the sink's
  batch bound) on the same rows — ``c_sink_typed_json`` (100-byte JSON objects into the
  typed table, ``ops.bench.sink.TYPED_DDL``) beside ``c_sink_cdc`` (each row as Debezium's
  PostgreSQL connector sends it through Kafka Connect's JSON converter,
  ``schemas.enable=false``: the envelope with its ``source`` block, ``cdc_value``),
  ``c_sink_cdc_schemas`` (the converter's default, ``schemas.enable=true``: each record
  carries its schema, 2.8 KB) and ``c_sink_cdc_guarded`` (``c_sink_cdc`` with
  ``--sink-version-column lsn --sink-version-from source.lsn``), alternating ``--repeat``
  times, medians; ``ratios`` of their records/s.
- ``lag``: a source table on the stack's PostgreSQL (database ``source``) read by Debezium's
  PostgreSQL connector in the stack's Kafka Connect (``fencectl stack up --with debezium``),
  one ``fencectl run --sink ... --sink-envelope debezium`` member writing the target; rows
  inserted at a steady rate, one transaction each. A row's lag is the target's
  ``clock_timestamp()`` when the sink wrote it (a column default) minus the source's when
  it was inserted: one server's clock, commit to row, Kafka Connect's poll and flush
  intervals included. p50, p99 and max per rate, and the two shares split at the record's
  Kafka timestamp (set by Connect's producer on this machine): Debezium's and Connect's
  up to Kafka, the sink's from Kafka to the row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg

from fencing.postgres.schema import migrate
from ops.bench.provenance import provenance
from ops.bench.runs import ROOT, delete_topics, env
from ops.bench.sink import sink_row
from ops.bench.sources import produce_topics
from ops.bench.worker import _sink_worker, throughput
from ops.stack.connectors import (
    delete_connector,
    drop_slot,
    execute,
    postgres_connector,
    register_connector,
)

__all__ = ["RUNS", "main", "measure_lag"]

RUNS = [
    _sink_worker("c_sink_typed_json", "(c) sink: JSON into columns", repeat=True,
                 table="bench_sink_typed", more=("layout=typed",)),
    _sink_worker("c_sink_cdc", "(c) sink: Debezium change events into columns", repeat=True,
                 topic="sink_cdc", table="bench_sink_typed",
                 more=("layout=typed", "envelope=debezium")),
    _sink_worker("c_sink_cdc_schemas", "(c) sink: change events with their schemas",
                 repeat=True, topic="sink_cdc_schemas", table="bench_sink_typed",
                 more=("layout=typed", "envelope=debezium")),
    _sink_worker("c_sink_cdc_guarded", "(c) sink: change events, version guard (source.lsn)",
                 repeat=True, topic="sink_cdc", table="bench_sink_typed",
                 more=("layout=typed_versioned", "envelope=debezium", "version=lsn",
                       "version_from=source.lsn")),
]
RATIOS = {"cdc_over_plain": ("c_sink_cdc", "c_sink_typed_json"),
          "cdc_schemas_over_plain": ("c_sink_cdc_schemas", "c_sink_typed_json"),
          "guarded_over_cdc": ("c_sink_cdc_guarded", "c_sink_cdc")}
TARGETS = {"cdc_over_plain": 0.8}

_SOURCE_DDL = ("(id int PRIMARY KEY, amount int NOT NULL, note text NOT NULL, "
               "written timestamptz NOT NULL DEFAULT clock_timestamp())")
_TARGET_DDL = _SOURCE_DDL[:-1] + (", kafka_timestamp timestamptz, "
                                  "landed timestamptz DEFAULT clock_timestamp())")


def _ratios(runs: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name, (num, den) in RATIOS.items():
        a, b = (runs.get(n, {}).get("records_per_s") for n in (num, den))
        out[name] = round(a / b, 3) if a and b else None
    return out


async def _migrated(dsn: str, schema: str, ddl: str) -> None:
    """The fence schema ``schema`` (migrated: the worker never migrates) and ``ddl`` in it."""
    conn = await asyncpg.connect(dsn)
    try:
        await migrate(conn, schema)
        await conn.execute(ddl)
    finally:
        await conn.close()


async def _insert_paced(source_dsn: str, table: str, first: int, rate: float,
                        seconds: float) -> tuple[int, float]:
    """Insert rows ``first..`` one transaction each, the i-th at ``i / rate`` s; the rows
    written and the seconds it took."""
    conn = await asyncpg.connect(source_dsn)
    try:
        stmt = await conn.prepare(f"INSERT INTO {table} (id, amount, note) VALUES ($1, $2, $3)")
        n = int(rate * seconds)
        t0 = time.monotonic()
        for i in range(n):
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            row = sink_row(first + i)
            await stmt.fetch(first + i, row["amount"], row["note"])
        return n, time.monotonic() - t0
    finally:
        await conn.close()


async def _count(dsn: str, target: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval(f"SELECT count(*) FROM {target}"))
    finally:
        await conn.close()


async def _lags(dsn: str, target: str, first: int) -> dict[str, float]:
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            "SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY lag) AS q, "
            "percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY source) AS s, "
            "percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY sink) AS k, "
            "max(lag) AS worst, count(*) AS n FROM (SELECT "
            "extract(epoch FROM landed - written) * 1000 AS lag, "
            "extract(epoch FROM kafka_timestamp - written) * 1000 AS source, "
            "extract(epoch FROM landed - kafka_timestamp) * 1000 AS sink "
            f"FROM {target} WHERE id >= $1) l", first)
        assert row is not None  # an aggregate answers one row
        return {"rows": int(row["n"]), "p50_ms": round(float(row["q"][0]), 1),
                "p99_ms": round(float(row["q"][1]), 1), "max_ms": round(float(row["worst"]), 1),
                # the two shares: Debezium and Kafka Connect up to the record's Kafka
                # timestamp (its producer's clock, this machine's), then the sink's
                "to_kafka_p50_ms": round(float(row["s"][0]), 1),
                "to_kafka_p99_ms": round(float(row["s"][1]), 1),
                "sink_p50_ms": round(float(row["k"][0]), 1),
                "sink_p99_ms": round(float(row["k"][1]), 1)}
    finally:
        await conn.close()


def _topics() -> set[str]:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": os.environ["KAFKA_BOOTSTRAP_SERVERS"]})
    return set(admin.list_topics(timeout=10).topics)


def _wait(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.5)


def measure_lag(dsn: str, source_dsn: str, connect_url: str, *, rate: float,
                seconds: float) -> dict[str, Any]:
    """One rate's replication lag (module docstring); everything it made is removed."""
    tag = uuid.uuid4().hex[:6]
    table, prefix, schema = f"lag_{tag}", f"benchcdc{tag}", f"benchcdc_{tag}"
    topic, target = f"{prefix}.public.{table}", f'"{schema}".{table}'
    asyncio.run(execute(source_dsn, f"CREATE TABLE {table} {_SOURCE_DDL}",
                     f"INSERT INTO {table} (id, amount, note) VALUES (0, 0, 'first')"))
    asyncio.run(_migrated(dsn, schema, f"CREATE TABLE {target} {_TARGET_DDL}"))
    member: subprocess.Popen[bytes] | None = None
    log = ROOT / "artifacts" / "bench" / f"cdc-member-{rate:.0f}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        register_connector(connect_url, prefix, postgres_connector(source_dsn, prefix, table))
        _wait(lambda: topic in _topics(), 120, "Debezium's topic")  # else the member exits 2
        member = subprocess.Popen(
            [sys.executable, "-m", "ops.cli", "run", "--topic", topic, "--group", f"g{prefix}",
             "--schema", schema, "--sink", f"table={schema}.{table}", "--sink-envelope",
             "debezium", "--sink-key-format", "json"],
            cwd=ROOT, env={**env(), "OTEL_TRACES_EXPORTER": "none"},
            stdout=subprocess.DEVNULL, stderr=log.open("wb"))
        _wait(lambda: asyncio.run(_count(dsn, target)) == 1, 180,
              f"the snapshot's row (the member's log: {log})")
        written, took_s = asyncio.run(_insert_paced(source_dsn, table, 1, rate, seconds))
        _wait(lambda: asyncio.run(_count(dsn, target)) == written + 1, 180,
              "every row in the target")
        return {"rate_per_s": rate, "seconds": seconds,
                "achieved_per_s": round(written / took_s, 1),
                **asyncio.run(_lags(dsn, target, 1))}
    finally:
        if member is not None:
            member.send_signal(signal.SIGTERM)
            try:
                member.wait(30)
            except subprocess.TimeoutExpired:
                member.kill()
                member.wait()
        delete_connector(connect_url, prefix)
        asyncio.run(drop_slot(source_dsn, f"{prefix}_slot"))
        asyncio.run(execute(source_dsn, f"DROP TABLE IF EXISTS {table}",
                         f"DROP PUBLICATION IF EXISTS {prefix}_pub"))
        asyncio.run(execute(dsn, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        from confluent_kafka.admin import AdminClient

        if topic in _topics():
            AdminClient({"bootstrap.servers": os.environ["KAFKA_BOOTSTRAP_SERVERS"]}
                        ).delete_topics([topic])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.bench.cdc", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=200_000, help="records per throughput run")
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--rates", default="200,1000", help="rows/s of the lag runs")
    p.add_argument("--seconds", type=float, default=30.0, help="length of a lag run")
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    p.add_argument("--out", type=Path, default=ROOT / "artifacts" / "bench" / "cdc.json")
    a = p.parse_args(argv)
    if a.quick:
        a.count, a.repeat, a.rates, a.seconds = 6_000, 1, "200", 5.0
    dsn = os.environ["FENCE_DSN"]
    measured = provenance(os.environ.get("FENCE_BENCH_COMMAND")
                          or " ".join(["python -m ops.bench.cdc", *(argv or sys.argv[1:])]))
    try:
        topics = produce_topics((r.topic for r in RUNS), a.count, a.count, a.partitions)
        runs = throughput(RUNS, topics, a.repeat, dsn)
    finally:
        delete_topics()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".partial.json").write_text(json.dumps(
        {"provenance": measured, "runs": runs, "ratios": _ratios(runs)}, indent=2) + "\n")
    lag = [measure_lag(dsn, os.environ["FENCE_SOURCE_DSN"], os.environ["KAFKA_CONNECT_URL"],
                       rate=float(r), seconds=a.seconds) for r in a.rates.split(",") if r]
    result = {"provenance": measured, "count": a.count, "partitions": a.partitions,
              "repeat": a.repeat, "quick": a.quick, "runs": runs, "ratios": _ratios(runs),
              "targets": TARGETS, "lag": lag}
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    a.out.with_suffix(".partial.json").unlink(missing_ok=True)
    print("ratios", json.dumps(result["ratios"], indent=2))
    for one in lag:
        print(f"lag at {one['rate_per_s']:.0f} rows/s: p50 {one['p50_ms']} ms, "
              f"p99 {one['p99_ms']} ms, max {one['max_ms']} ms")
    print("wrote", a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
