"""Rebalance under load and crash/restart, per group setup, with real Kafka and PostgreSQL.

The effect tables must equal the oracle's fold of the whole source (no record applied
twice, none missing), and the journal must show a claim for every epoch a partition
went through (every ownership change).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

from tests.integration.workers import (
    GROUP_SETUPS,
    GroupSetup,
    WorkerProc,
    committed_total,
    create_topic,
    durable_rows,
    exactly_once_problems,
    fresh_schema,
    generated,
    journal_rows,
    produce,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration

PARTITIONS = 6


def _produce_in_chunks(bootstrap: str, recs: list, chunks: int, pause_s: float) -> threading.Thread:
    size = -(-len(recs) // chunks)

    def run() -> None:
        for i in range(0, len(recs), size):
            produce(bootstrap, recs[i:i + size])
            time.sleep(pause_s)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


async def _journal_shows_every_claim(dsn: str, schema: str, group: str, topic: str) -> None:
    rows = await durable_rows(dsn, schema, group, topic)
    journal = await journal_rows(dsn, schema, group, topic)
    for p, (epoch, _f) in rows.items():
        claims = sorted(j["epoch"] for j in journal
                        if j["partition"] == p and j["event"] == "claim")
        assert claims == list(range(1, epoch + 1)), (p, epoch, claims)


@pytest.mark.parametrize("setup", GROUP_SETUPS, ids=lambda s: s.name)
def test_rebalance_under_load(services, setup: GroupSetup) -> None:
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    topic, group = unique("load"), unique("gload")
    create_topic(bootstrap, topic, PARTITIONS)
    recs, source = generated(topic, count=50_000, partitions=PARTITIONS, klass="conflict")
    schema = asyncio.run(fresh_schema(dsn))
    producer = _produce_in_chunks(bootstrap, recs, chunks=10, pause_s=0.6)
    procs: list[WorkerProc] = []

    def start(name: str) -> WorkerProc:
        w = WorkerProc(topic=topic, group=group, schema=schema, setup=setup, name=name,
                       extra=("--batch-max-records", "200"))
        procs.append(w)
        return w

    def reached(n: int) -> None:
        wait_until(lambda: committed_total(dsn, schema, group, topic) >= n, timeout_s=90,
                   what=f"{n} records committed")

    try:
        w1, w2, w3 = start("w1"), start("w2"), start("w3")
        reached(8_000)
        w1.terminate()                       # graceful leave
        assert w1.wait(30) == 0, w1.log()[-2000:]
        w4 = start("w4")                     # join
        reached(18_000)
        w2.kill()                            # crash: partitions move after the session timeout
        w2.wait(10)
        reached(28_000)
        w5 = start("w5")                     # join
        reached(36_000)
        w3.kill()
        w3.wait(10)
        w6 = start("w6")
        producer.join(timeout=60)
        wait_until(lambda: committed_total(dsn, schema, group, topic) >= len(source), timeout_s=120,
                   what="every record committed")
        for w in (w4, w5, w6):
            w.terminate()
        for w in (w4, w5, w6):
            assert w.wait(30) == 0, w.log()[-3000:]
    finally:
        for w in procs:
            w.ensure_dead()
    assert asyncio.run(exactly_once_problems(dsn, schema, group, topic, source)) == []
    asyncio.run(_journal_shows_every_claim(dsn, schema, group, topic))


@pytest.mark.parametrize("setup", GROUP_SETUPS, ids=lambda s: s.name)
def test_crash_and_restart_exactly_once(services, setup: GroupSetup) -> None:
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    topic, group = unique("crash"), unique("gcrash")
    create_topic(bootstrap, topic, 4)
    recs, source = generated(topic, count=20_000, partitions=4, klass="conflict", seed=11)
    produce(bootstrap, recs)
    schema = asyncio.run(fresh_schema(dsn))
    rng = random.Random(f"crash-{setup.name}")
    w: WorkerProc | None = None
    try:
        for round_ in range(4):
            w = WorkerProc(topic=topic, group=group, schema=schema, setup=setup,
                           name=f"r{round_}", extra=("--batch-max-records", "50"))
            if round_ == 3:
                break
            wait_until(lambda w=w: "assign {" in w.log(), timeout_s=30,  # type: ignore[misc]
                       what="assignment")
            time.sleep(rng.uniform(0.05, 0.8))  # SIGKILL at a random point of processing
            w.kill()
            w.wait(10)
        assert w is not None
        wait_until(lambda: "assigned {" in w.log(), timeout_s=30, what="final worker assigned")
        wait_until(lambda: committed_total(dsn, schema, group, topic) >= len(source), timeout_s=120,
                   what="every record committed after the restarts")
        w.terminate()
        assert w.wait(30) == 0, w.log()[-3000:]
    finally:
        if w is not None:
            w.ensure_dead()
    assert asyncio.run(exactly_once_problems(dsn, schema, group, topic, source)) == []
