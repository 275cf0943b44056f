"""``make bench``, scale section: assignment cost, join time, members, backlog, memory.

- Assignment cost: one member on a fresh topic of 1, 8, 64, 256 partitions; from its log,
  ``assign {...}`` (the callback began) to ``assigned {...}`` (validated, claimed in one
  statement, every partition's frontier read for the seek): claim + seek, per size. O(1)
  round trips means this grows far slower than the partition count.
- Join: 3 members started together on 48 partitions per group protocol, under steady
  production; from the earliest ``lifetime.start`` to the moment every partition is owned
  by one of 3 distinct members and committed a batch since its latest claim (journal).
- Rebalance: member B joins A under steady production; B's join to the first commit on a
  partition moved to it (per group setup; the earlier benchmark, kept).
- Scale-out: the worker with 1, 2, 3 members on 12 partitions (``ops.bench.runs``; the
  span includes the members' initial rebalance).
- Backlog: 3 members drain ``backlog`` records; the run's peak RSS is the largest member's.
- Large records: one member, 1 MiB values, the accept-all handler: peak RSS against the
  bound docs/benchmarks.md states (``consumer.batching`` queue bounds + librdkafka's prefetch).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from ops.bench.runs import (
    COOPERATIVE,
    PY,
    ROOT,
    Run,
    env,
    execute,
    fresh_schema,
    log_dir,
    new_topic,
    uid,
)
from ops.operator.db import connection

SETUPS = {
    "eager-range": ["--group-protocol", "classic", "--assignment-strategy", "range",
                    "-X", "session.timeout.ms=6000", "-X", "heartbeat.interval.ms=500"],
    "cooperative-sticky": COOPERATIVE,
    "kip848-consumer": ["--group-protocol", "consumer"],
}
Produce = Callable[[str, int, int, int], None]


def _log_time(path: Path, marker: str, after: float = 0.0) -> float | None:
    for line in path.read_text(errors="replace").splitlines():
        if marker in line:
            t = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if t >= after:
                return t
    return None


async def _rows(dsn: str, schema: str, group: str) -> list[Any]:
    async with connection(dsn) as conn:
        return list(await conn.fetch(
            f'SELECT partition, owner, frontier FROM "{schema}".partitions WHERE group_id = $1',
            group))


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as fh:
        return subprocess.Popen(argv, env=env(), cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _argv(topic: str, group: str, schema: str, setup: list[str]) -> list[str]:
    return [PY, "-m", "ops.cli", "run", "--topic", topic, "--group", group, "--schema", schema,
            "--log-level", "INFO", *setup]


def assignment_cost(dsn: str, partitions: int, produce: Produce, logs: Path) -> dict[str, Any]:
    topic, group, schema = new_topic("assign"), uid("ga"), fresh_schema(dsn)
    produce(topic, partitions, partitions, 5)  # creates the topic: one record per partition
    log = logs / f"assign-{partitions}.log"
    proc = _start(_argv(topic, group, schema, COOPERATIVE), log)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and _log_time(log, "assigned {") is None:
            time.sleep(0.1)
    finally:
        _stop([proc])
    began, done = _log_time(log, "assign {"), _log_time(log, "assigned {")
    if began is None or done is None:
        return {"partitions": partitions, "error": f"no assignment within 120 s (see {log})"}
    return {"partitions": partitions, "claim_seek_s": round(done - began, 3)}


async def _settled(dsn: str, schema: str, group: str) -> list[Any]:
    """Per partition: its owner, and whether it committed since its latest claim."""
    async with connection(dsn) as conn:
        return list(await conn.fetch(f"""
SELECT p.partition, p.owner, p.frontier > split_part(j.detail, '=', 2)::bigint AS committed
FROM "{schema}".partitions p
CROSS JOIN LATERAL (SELECT detail FROM "{schema}".journal j
    WHERE j.group_id = p.group_id AND j.topic = p.topic AND j.partition = p.partition
      AND j.event = 'claim' ORDER BY j.id DESC LIMIT 1) j
WHERE p.group_id = $1""", group))


def _feeder(topic: str, partitions: int, produce: Produce) -> tuple[threading.Event,
                                                                     threading.Thread]:
    """Steady production into ``topic`` until the returned event is set."""
    stop = threading.Event()

    def keep_producing() -> None:
        seed = 100
        while not stop.is_set():
            produce(topic, 2_000, partitions, seed)
            seed += 1

    feeder = threading.Thread(target=keep_producing, daemon=True)
    feeder.start()
    return stop, feeder


def join_time(dsn: str, setup: str, produce: Produce, logs: Path,
              partitions: int = 48, members: int = 3) -> dict[str, Any]:
    """3 members start together under steady production: from the earliest start to every
    partition owned by one of ``members`` distinct members that committed since claiming."""
    topic, group, schema = new_topic("join"), uid("gj"), fresh_schema(dsn)
    produce(topic, partitions * 20, partitions, 6)
    stop, feeder = _feeder(topic, partitions, produce)
    files = [logs / f"join-{setup}-{i}.log" for i in range(members)]
    procs = [_start(_argv(topic, group, schema, SETUPS[setup]), f) for f in files]
    done_at, owners = None, 0
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            rows = asyncio.run(_settled(dsn, schema, group))
            owners = len({r["owner"] for r in rows})
            if len(rows) == partitions and owners == members and all(
                    r["committed"] for r in rows):
                done_at = time.time()
                break
            time.sleep(0.05)
    finally:
        stop.set()
        _stop(procs)
        feeder.join(timeout=60)
    starts = [t for t in (_log_time(f, "lifetime.start") for f in files) if t is not None]
    if done_at is None or not starts:
        return {"setup": setup, "error": f"not settled within 120 s ({owners} owners)"}
    return {"setup": setup, "members": members, "partitions": partitions,
            "join_to_all_committed_s": round(done_at - min(starts), 3)}


def rebalance_time(setup: str, dsn: str, partitions: int, produce: Produce,
                   logs: Path) -> dict[str, Any]:
    """Member B joins a group where A owns every partition under steady production; time
    from B's subscribe to the first commit on a partition moved to B."""
    topic, group, schema = new_topic("rebal"), uid("gr"), fresh_schema(dsn)
    produce(topic, 20_000, partitions, 3)
    argv = _argv(topic, group, schema, SETUPS[setup])
    procs = [_start(argv, logs / f"rebalance-{setup}-a.log")]
    stop, feeder = _feeder(topic, partitions, produce)
    b_log = logs / f"rebalance-{setup}-b.log"
    resumed: float | None = None
    at_move: dict[int, int] = {}
    try:
        while True:
            rows = asyncio.run(_rows(dsn, schema, group))
            if len(rows) == partitions and all(r["frontier"] > 0 for r in rows):
                break
            time.sleep(0.1)
        owner_a = {r["partition"]: r["owner"] for r in rows}
        procs.append(_start(argv, b_log))
        deadline = time.monotonic() + 120
        while resumed is None and time.monotonic() < deadline:
            for r in asyncio.run(_rows(dsn, schema, group)):
                p = r["partition"]
                if r["owner"] != owner_a[p] and p not in at_move:
                    at_move[p] = r["frontier"]
                elif p in at_move and r["frontier"] > at_move[p] and r["owner"] != owner_a[p]:
                    resumed = time.time()
                    break
            time.sleep(0.02)
    finally:
        stop.set()
        _stop(procs)
        feeder.join(timeout=60)
    joined = _log_time(b_log, "lifetime.start")
    if resumed is None or joined is None:
        return {"setup": setup, "error": "no moved partition resumed within 120 s"}
    return {"setup": setup, "join_to_moved_partition_processing_s": round(resumed - joined, 3),
            "partitions_moved": len(at_move)}


def produce_large(topic: str, count: int, size: int, partitions: int) -> None:
    """``count`` records of ``size`` random bytes (not reference documents)."""
    import os

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    bootstrap = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the answer
    admin.create_topics(
        [NewTopic(topic, partitions, 1, config={"max.message.bytes": str(2 * size)})]
    )[topic].result(30)
    p = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": str(2 * size),
                  "linger.ms": "5"})
    payload = os.urandom(size)
    for i in range(count):
        p.produce(topic, key=str(i).encode(), value=payload, partition=i % partitions)
        p.poll(0)
    p.flush(60)


def run_all(dsn: str, *, quick: bool, produce: Produce) -> dict[str, Any]:
    logs = log_dir("scale")
    sizes = [1, 8] if quick else [1, 8, 64, 256]
    out: dict[str, Any] = {"logs": str(logs.relative_to(ROOT))}
    print("scale: assignment cost ...", flush=True)
    out["assignment"] = [assignment_cost(dsn, n, produce, logs) for n in sizes]
    print("scale: join ...", flush=True)
    setups = ["cooperative-sticky"] if quick else list(SETUPS)
    out["join_3x48"] = [join_time(dsn, s, produce, logs, 12 if quick else 48) for s in setups]
    if not quick:
        out["rebalance"] = [rebalance_time(s, dsn, 6, produce, logs) for s in SETUPS]
    count = 6_000 if quick else 200_000
    topic = new_topic("scale")
    produce(topic, count, 12, 7)
    out["members_12_partitions"] = []
    for m in (1, 2, 3):
        print(f"scale: {m} member(s) ...", flush=True)
        got = execute(Run(f"scale_{m}", f"{m} members", "worker", members=m), topic, count, dsn)
        out["members_12_partitions"].append({"members": m, **got})
    backlog = 20_000 if quick else 1_000_000
    print(f"scale: backlog of {backlog} ...", flush=True)
    topic = new_topic("backlog")
    produce(topic, backlog, 12, 8)
    out["backlog"] = execute(Run("backlog", "3 members drain", "worker", members=3),
                             topic, backlog, dsn)
    print("scale: 1 MiB records ...", flush=True)
    topic, n = new_topic("large"), (12 if quick else 200)
    produce_large(topic, n, 1 << 20, 6)
    out["large_records"] = {"record_bytes": 1 << 20, **execute(
        Run("large", "1 MiB records", "worker", handler="accept"), topic, n, dsn)}
    return out
