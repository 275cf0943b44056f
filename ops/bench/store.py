"""``make bench-store``: the fence's cost, fenced batch commits vs an unfenced baseline.

Both modes write the same effect rows with the same handler (one ``executemany`` insert
per batch) on the same pool settings, one client, sequentially:
- fenced: ``PgFenceStore.process`` (BEGIN; lock + token check + frontier advance; handler;
  COMMIT);
- unfenced: BEGIN; handler; COMMIT (no epoch check, no frontier: the at-least-once baseline).
Fenced and unfenced batches alternate (which goes first alternates too), so noise hits
both alike. Reported per batch size: records/s per mode and their ratio (throughput), the
ratio of median batch latencies, and the fence's cost as the median of paired differences
(batch i fenced minus batch i unfenced, run back to back) with the ratio it implies.
Writes ``artifacts/bench/store.json`` and prints a markdown table. Uses ``FENCE_DSN``, or
starts the local stack's PostgreSQL when it is unset.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg

from fencing.postgres.schema import migrate
from fencing.postgres.store import PgFenceStore, light_reset
from fencing.store import BatchCall
from fencing.types import ACCEPT, ClaimRequest, SourceRecord, Token, TopicPartition, Verdict
from ops.bench.provenance import provenance

__all__ = ["main", "run_bench"]

BATCH_SIZES = (1, 100, 1000)


def _machine() -> dict[str, Any]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu_model": model, "python": platform.python_version(),
            "asyncpg": asyncpg.__version__, "platform": platform.platform()}


def _handler(table: str) -> Any:
    sql = f'INSERT INTO {table} (topic, partition, "offset", value) VALUES ($1, $2, $3, $4)'

    async def handle(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        await conn.executemany(sql, [(r.topic, r.partition, r.offset, r.value) for r in records])
        return [ACCEPT] * len(records)

    return handle


def _batches(tp: TopicPartition, start: int, total: int, size: int) -> list[list[SourceRecord]]:
    value = b"x" * 100
    recs = [SourceRecord(tp.topic, tp.partition, o, None, value)
            for o in range(start, start + total)]
    return [recs[i:i + size] for i in range(0, total, size)]


async def _fenced_one(store: PgFenceStore, tp: TopicPartition, token: Token,
                      batch: list[SourceRecord], handler: Any) -> tuple[float, Token]:
    t0 = time.perf_counter()
    token = await store.process(BatchCall(tp, batch, handler), token)
    return time.perf_counter() - t0, token


async def _unfenced_one(pool: Any, batch: list[SourceRecord], handler: Any) -> float:
    t0 = time.perf_counter()
    async with pool.acquire() as conn:
        await conn.execute("BEGIN")
        await handler(conn, batch)
        await conn.execute("COMMIT")
    return time.perf_counter() - t0


async def run_bench(dsn: str, *, records: int, rounds: int,
                    sizes: Sequence[int] = BATCH_SIZES) -> dict[str, Any]:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(dsn)
    try:
        await migrate(admin, schema)
        for mode in ("fenced", "unfenced"):
            await admin.execute(f'CREATE TABLE "{schema}".effects_{mode} (topic text, partition'
                                ' int, "offset" bigint, value bytea)')
        server = {k: await admin.fetchval(f"SHOW {k}") for k in
                  ("server_version", "fsync", "synchronous_commit", "shared_buffers")}
        store = await PgFenceStore.connect(dsn, group_id="bench", schema=schema, pool_min=1,
                                           pool_max=1)
        # the same light pool reset as the store (the default reset costs a round trip)
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1, reset=light_reset)
        try:
            results = await _measure(store, pool, schema, records=records, rounds=rounds,
                                     sizes=sizes)
        finally:
            await pool.close()
            await store.close()
    finally:
        await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await admin.close()
    return {"machine": _machine(), "postgres": server, "records_per_run": records,
            "rounds": rounds, "clients": 1, "results": results}


async def _measure(store: PgFenceStore, pool: Any, schema: str, *, records: int, rounds: int,
                   sizes: Sequence[int]) -> list[dict[str, Any]]:
    """Per batch size: ``rounds`` runs; within a run fenced and unfenced batches alternate
    (which goes first alternates too), so disk and CPU noise hit both modes alike."""
    fenced_h = _handler(f'"{schema}".effects_fenced')
    plain_h = _handler(f'"{schema}".effects_unfenced')
    out = []
    for size in sizes:
        n = max(size, min(records, 2000) if size == 1 else records)
        tp = TopicPartition("bench", size)
        token = (await store.claim([ClaimRequest(tp, 0)], lifetime="bench"))[tp]
        warm = _batches(tp, 0, size, size)[0]  # warm up both paths (prepared statements)
        _, token = await _fenced_one(store, tp, token, warm, fenced_h)
        await _unfenced_one(pool, warm, plain_h)
        offset = size
        lat: dict[str, list[float]] = {"fenced": [], "unfenced": []}
        for _ in range(rounds):
            for i, batch in enumerate(_batches(tp, offset, n, size)):
                for mode in (("fenced", "unfenced") if i % 2 == 0 else ("unfenced", "fenced")):
                    if mode == "fenced":
                        secs, token = await _fenced_one(store, tp, token, batch, fenced_h)
                    else:
                        secs = await _unfenced_one(pool, batch, plain_h)
                    lat[mode].append(secs)
            offset += n
        f_rate = len(lat["fenced"]) * size / sum(lat["fenced"])
        u_rate = len(lat["unfenced"]) * size / sum(lat["unfenced"])
        f_med, u_med = statistics.median(lat["fenced"]), statistics.median(lat["unfenced"])
        # batch i of both modes ran back to back: the paired difference is the fence's cost
        cost = statistics.median(f - u for f, u in zip(lat["fenced"], lat["unfenced"],
                                                      strict=True))
        out.append({
            "batch_size": size, "records": n * rounds,
            "fenced_records_per_s": round(f_rate), "unfenced_records_per_s": round(u_rate),
            "ratio_throughput": round(f_rate / u_rate, 3),
            "fenced_median_batch_ms": round(f_med * 1000, 3),
            "unfenced_median_batch_ms": round(u_med * 1000, 3),
            "ratio_median": round(u_med / f_med, 3),
            "fence_cost_median_paired_ms": round(cost * 1000, 3),
            "ratio_paired": round(u_med / (u_med + cost), 3),
        })
    return out


def table(report: dict[str, Any]) -> str:
    m, pg = report["machine"], report["postgres"]
    lines = [
        f"Machine: {m['nproc']} cores, {m['cpu_model']}; PostgreSQL {pg['server_version']} "
        f"(fsync={pg['fsync']}, synchronous_commit={pg['synchronous_commit']}); "
        f"asyncpg {m['asyncpg']}; 1 client; {report['rounds']} runs per size, fenced and "
        "unfenced batches alternating.",
        "",
        "| batch | records | fenced rec/s | unfenced rec/s | ratio (throughput) "
        "| median batch ms fenced / unfenced | ratio (medians) "
        "| fence cost ms/batch (paired median) | ratio (paired) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        lines.append(
            f"| {r['batch_size']} | {r['records']} | {r['fenced_records_per_s']} "
            f"| {r['unfenced_records_per_s']} | {r['ratio_throughput']:.3f} "
            f"| {r['fenced_median_batch_ms']:.2f} / {r['unfenced_median_batch_ms']:.2f} "
            f"| {r['ratio_median']:.3f} | {r['fence_cost_median_paired_ms']:.3f} "
            f"| {r['ratio_paired']:.3f} |")
    return "\n".join(lines)


def _dsn() -> str:
    dsn = os.environ.get("FENCE_DSN")
    if dsn:
        return dsn
    from ops.stack import control as stack
    from ops.stack.config import Service

    stack.up(services=[Service.POSTGRES])
    return stack.env()["FENCE_DSN"]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_store", description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=20000, help="records per run (batch 1: 2000)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved runs per mode (5)")
    p.add_argument("--out", default="artifacts/bench/store.json", help="JSON report path")
    args = p.parse_args(argv)
    measured = provenance(" ".join(["python -m ops.bench.store", *(argv or sys.argv[1:])]))
    report = {"provenance": measured,
              **asyncio.run(run_bench(_dsn(), records=args.records, rounds=args.rounds))}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
