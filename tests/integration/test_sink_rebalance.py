"""The table sink (``fencectl run --sink``, no handler code) under the churn of the rebalance
tests: workers leave gracefully, crash and join while records arrive. The table must hold
exactly one row per fitting record (it has no unique constraint, so a record applied twice
shows as a duplicate) and the quarantine exactly the records that do not fit."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter

import asyncpg
import pytest

from ops.reference.generate import GeneratedRecord
from tests.integration.workers import (
    GROUP_SETUPS,
    WorkerProc,
    committed_total,
    create_topic,
    durable_rows,
    fresh_schema,
    produce,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration

PARTITIONS = 6
COUNT = 12_000
SETUP = next(s for s in GROUP_SETUPS if s.name == "cooperative-sticky")


def _records(topic: str) -> list[GeneratedRecord]:
    """JSON orders; every 97th value is not JSON and every 89th lacks the required amount."""
    out = []
    for i in range(COUNT):
        if i % 97 == 13:
            value = b"{broken"
        elif i % 89 == 7:
            value = json.dumps({"id": f"o{i}"}).encode()
        else:
            value = json.dumps({"id": f"o{i}", "amount": i, "note": "x" * 40}).encode()
        out.append(GeneratedRecord(topic, i % PARTITIONS, f"k{i}".encode(), value))
    return out


async def _prepare(dsn: str) -> str:
    schema = await fresh_schema(dsn)
    conn = await asyncpg.connect(dsn)
    try:  # no unique constraint: a second application of a record would be a second row
        await conn.execute(f'CREATE TABLE "{schema}".orders (id text NOT NULL, amount bigint '
                           "NOT NULL, note text, kafka_partition int, kafka_offset bigint)")
    finally:
        await conn.close()
    return schema


async def _table(dsn: str, schema: str, group: str) -> tuple[Counter[tuple[str, int]], set[str]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(f'SELECT id, amount FROM "{schema}".orders')
        quarantined = await conn.fetch(f'SELECT key FROM "{schema}".quarantine '
                                       "WHERE group_id = $1", group)
    finally:
        await conn.close()
    return Counter((r["id"], r["amount"]) for r in rows), {bytes(r["key"]).decode()
                                                           for r in quarantined}


def test_table_sink_under_rebalance_churn_applies_every_record_once(services) -> None:
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    topic, group = unique("sink"), unique("gsink")
    create_topic(bootstrap, topic, PARTITIONS)
    schema = asyncio.run(_prepare(dsn))
    recs = _records(topic)

    def feed() -> None:  # in chunks while the workers churn
        for i in range(0, COUNT, 1500):
            produce(bootstrap, recs[i:i + 1500])
            time.sleep(0.4)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    procs: list[WorkerProc] = []

    def start(name: str) -> WorkerProc:
        w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP, name=name,
                       extra=("--sink", f"table={schema}.orders", "--batch-max-records", "100"))
        procs.append(w)
        return w

    def reached(n: int) -> None:
        wait_until(lambda: committed_total(dsn, schema, group, topic) >= n, timeout_s=90,
                   what=f"{n} records committed")

    try:
        w1, w2, w3 = start("w1"), start("w2"), start("w3")
        reached(2_000)
        w1.terminate()                       # graceful leave
        assert w1.wait(30) == 0, w1.log()[-2000:]
        w4 = start("w4")                     # join
        reached(5_000)
        w2.kill()                            # crash: its partitions move after the session
        w2.wait(10)
        w5 = start("w5")                     # join
        reached(8_000)
        w3.kill()
        w3.wait(10)
        feeder.join(timeout=60)
        wait_until(lambda: committed_total(dsn, schema, group, topic) >= COUNT, timeout_s=120,
                   what="every record committed")
        for w in (w4, w5):
            w.terminate()
        for w in (w4, w5):
            assert w.wait(30) == 0, w.log()[-3000:]
    finally:
        for w in procs:
            w.ensure_dead()
    epochs = {p: e for p, (e, _f) in asyncio.run(durable_rows(dsn, schema, group, topic)).items()}
    assert len(epochs) == PARTITIONS and min(epochs.values()) >= 2, epochs  # every one moved
    rows, quarantined = asyncio.run(_table(dsn, schema, group))
    misfit = {i for i in range(COUNT) if i % 97 == 13 or i % 89 == 7}
    assert quarantined == {f"k{i}" for i in misfit}
    expected = Counter((f"o{i}", i) for i in range(COUNT) if i not in misfit)
    assert rows == expected, (sum((rows - expected).values()), sum((expected - rows).values()))
