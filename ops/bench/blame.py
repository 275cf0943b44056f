"""``make bench-blame``: what blaming the right record costs, against real PostgreSQL.

- Handover: ``--partitions`` partitions whose previous owner died (no release), each with a
  suspect window of ``--window`` records, drained by one process (the production
  ``Lifecycle`` and ``FailureRun``, partitions submitted concurrently as the worker's runners
  do). Modes, alternating per round: ``alone`` (the rule: each suspect record tried with
  nothing else of the process in flight), ``side-by-side`` (each partition's window one record
  at a time, the partitions concurrently: the rule's absence) and ``clean`` (the same records
  after a clean handover: batches of ``--window``). Reported: wall time to drain, round trips
  per record (counted on the wire by ``fencing.testing.pgproxy``).
- Intent: batches of an ``outcome-uncertain`` handler (a durable intent before each) against
  the same handler declared ``transactional``, alternating; round trips per batch and the
  median of paired latency differences.
Writes ``artifacts/bench/blame.json`` and prints two markdown tables. Uses ``FENCE_DSN``, or
starts the local stack's PostgreSQL when it is unset.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from consumer.alone_gate import AloneGate
from consumer.failure_run import FailureRun
from consumer.lifecycle import Lifecycle
from fencing.failures import RetryPolicy
from fencing.handler import Declaration, Durability, Effects
from fencing.postgres.schema import migrate
from fencing.postgres.store import PgFenceStore
from fencing.testing.pgproxy import PgProxy
from fencing.types import ACCEPT, SourceCheck, SourceFacts, SourceRecord, TopicPartition, Verdict
from ops.bench.store import _dsn, _machine

__all__ = ["main", "run_bench"]

MODES = ("alone", "side-by-side", "clean")


class _SideBySide(AloneGate):
    """The rule's absence: an "alone" entry that waits for nothing."""

    async def alone(self, stopped: Callable[[], bool]) -> bool:
        return True

    def release_alone(self) -> None:
        pass


def _handler(table: str) -> Any:
    sql = f'INSERT INTO {table} (topic, partition, "offset", value) VALUES ($1, $2, $3, $4)'

    async def handle(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        await conn.executemany(sql, [(r.topic, r.partition, r.offset, r.value) for r in records])
        return [ACCEPT] * len(records)

    return handle


def _records(tp: TopicPartition, start: int, n: int) -> list[SourceRecord]:
    return [SourceRecord(tp.topic, tp.partition, o, None, b"x" * 100)
            for o in range(start, start + n)]


def _clock() -> float:
    return time.monotonic()


async def _handover(store: PgFenceStore, proxy: PgProxy, handler: Any, *, mode: str,
                    topic: str, partitions: int, window: int) -> dict[str, float]:
    """One drain of every partition's window; the partitions start unclean (or clean)."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    checks = [SourceCheck(tp, SourceFacts("id", 0, window)) for tp in tps]
    dead = Lifecycle(store=store, lifetime_id=f"dead-{uuid.uuid4().hex[:6]}", clock=_clock,
                     wait=asyncio.sleep)
    await dead.assign(checks)
    if mode == "clean":
        await dead.revoke(tps)
    dead.stop()
    lc = Lifecycle(store=store, lifetime_id=f"bench-{uuid.uuid4().hex[:6]}", clock=_clock,
                   wait=asyncio.sleep)
    await lc.assign(checks)
    gate = _SideBySide() if mode == "side-by-side" else AloneGate()
    run = FailureRun(lifecycle=lc, handler=handler, declaration=Declaration(),
                     policy=RetryPolicy(), rng=random.Random(1), clock=_clock,
                     wait=asyncio.sleep, suspect_window=window, gate=gate)
    trips, t0 = proxy.round_trips(), time.perf_counter()
    await asyncio.gather(*(run.submit(tp, _records(tp, 0, window), links=(),
                                      stopped=lambda: False) for tp in tps))
    elapsed = time.perf_counter() - t0
    trips = proxy.round_trips() - trips
    await lc.revoke(tps)
    return {"drain_s": elapsed, "round_trips_per_record": trips / (partitions * window)}


async def _intent(store: PgFenceStore, proxy: PgProxy, handler: Any, *, topic: str,
                  size: int, batches: int) -> dict[str, Any]:
    decls = {"transactional": Declaration(),
             "outcome-uncertain": Declaration(Durability.DURABLE_CRITICAL,
                                              Effects.OUTCOME_UNCERTAIN)}
    tps = {name: TopicPartition(f"{topic}-{name}", size) for name in decls}
    lc = Lifecycle(store=store, lifetime_id=f"bench-{uuid.uuid4().hex[:6]}", clock=_clock,
                   wait=asyncio.sleep)
    await lc.assign([SourceCheck(tp, SourceFacts("id", 0, 10**9)) for tp in tps.values()])
    runs = {name: FailureRun(lifecycle=lc, handler=handler, declaration=d,
                             policy=RetryPolicy(), rng=random.Random(1), clock=_clock,
                             wait=asyncio.sleep) for name, d in decls.items()}
    lat: dict[str, list[float]] = {name: [] for name in decls}
    trips: dict[str, list[int]] = {name: [] for name in decls}
    for i in range(batches + 1):  # the first batch warms the prepared statements
        order = list(decls) if i % 2 == 0 else list(reversed(decls))
        for name in order:
            tp = tps[name]
            before, t0 = proxy.round_trips(), time.perf_counter()
            await runs[name].submit(tp, _records(tp, i * size, size), links=(),
                                    stopped=lambda: False)
            if i:
                lat[name].append(time.perf_counter() - t0)
                trips[name].append(proxy.round_trips() - before)
    await lc.revoke(list(tps.values()))
    paired = statistics.median(u - t for u, t in zip(lat["outcome-uncertain"],
                                                     lat["transactional"], strict=True))
    return {"batch_size": size, "batches": batches,
            **{f"{name}_round_trips": statistics.median(trips[name]) for name in decls},
            **{f"{name}_median_ms": round(statistics.median(lat[name]) * 1000, 3)
               for name in decls},
            "intent_cost_median_paired_ms": round(paired * 1000, 3)}


async def run_bench(dsn: str, *, partitions: int, window: int, rounds: int,
                    intent_sizes: Sequence[int], batches: int) -> dict[str, Any]:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(dsn)
    parts = urlsplit(dsn)
    try:
        await migrate(admin, schema)
        await admin.execute(f'CREATE TABLE "{schema}".effects (topic text, partition int, '
                            '"offset" bigint, value bytea)')
        server = {k: await admin.fetchval(f"SHOW {k}") for k in
                  ("server_version", "fsync", "synchronous_commit")}
        async with PgProxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
            store = await PgFenceStore.connect(proxy.dsn(dsn), group_id="bench", schema=schema,
                                               pool_min=1, pool_max=4)
            handler = _handler(f'"{schema}".effects')
            try:
                drains: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
                for r in range(rounds):
                    for mode in (MODES if r % 2 == 0 else tuple(reversed(MODES))):
                        drains[mode].append(await _handover(
                            store, proxy, handler, mode=mode, topic=f"h{r}-{mode}",
                            partitions=partitions, window=window))
                intents = [await _intent(store, proxy, handler, topic="intent", size=size,
                                         batches=batches) for size in intent_sizes]
            finally:
                await store.close()
    finally:
        await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await admin.close()
    handover = {mode: {"median_drain_s": round(statistics.median(d["drain_s"] for d in runs), 3),
                       "round_trips_per_record": round(statistics.median(
                           d["round_trips_per_record"] for d in runs), 3)}
                for mode, runs in drains.items()}
    return {"machine": _machine(), "postgres": server, "partitions": partitions,
            "window": window, "rounds": rounds, "handover": handover, "intent": intents}


def tables(report: dict[str, Any]) -> str:
    m, pg = report["machine"], report["postgres"]
    lines = [f"Machine: {m['nproc']} cores, {m['cpu_model']}; PostgreSQL "
             f"{pg['server_version']} (fsync={pg['fsync']}); {report['partitions']} partitions "
             f"x a window of {report['window']} records, {report['rounds']} rounds, "
             "modes alternating.", "",
             "| after the handover | median time to drain (s) | round trips per record |",
             "|---|---:|---:|"]
    for mode, h in report["handover"].items():
        lines.append(f"| {mode} | {h['median_drain_s']:.3f} | {h['round_trips_per_record']} |")
    lines += ["", "| batch | round trips transactional / outcome-uncertain | median ms "
                  "transactional / outcome-uncertain | intent cost ms (paired median) |",
              "|---:|---:|---:|---:|"]
    for i in report["intent"]:
        lines.append(f"| {i['batch_size']} | {i['transactional_round_trips']:g} / "
                     f"{i['outcome-uncertain_round_trips']:g} | {i['transactional_median_ms']} "
                     f"/ {i['outcome-uncertain_median_ms']} | "
                     f"{i['intent_cost_median_paired_ms']} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_blame", description=__doc__.splitlines()[0])
    p.add_argument("--partitions", type=int, default=4, help="suspect partitions (4)")
    p.add_argument("--window", type=int, default=500,
                   help="records per suspect window: --batch-max-records (500)")
    p.add_argument("--rounds", type=int, default=3, help="drains per mode (3)")
    p.add_argument("--batches", type=int, default=200, help="batches per intent size (200)")
    p.add_argument("--out", default="artifacts/bench/blame.json", help="JSON report path")
    args = p.parse_args(argv)
    report = asyncio.run(run_bench(_dsn(), partitions=args.partitions, window=args.window,
                                   rounds=args.rounds, intent_sizes=(1, 100, 500),
                                   batches=args.batches))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(tables(report))
    print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
