"""The table sink (``fencectl run --sink``, no handler code) under the churn of the rebalance
tests: workers leave gracefully, crash and join while records arrive.

- Insert mode: the table must hold exactly one row per fitting record (it has no unique
  constraint, so a record applied twice shows as a duplicate) and the quarantine exactly
  the records that do not fit.
- Upsert on a ``bigint`` key with tombstones (``sink_churn``), JSON with the key's decimal
  text and Avro through the schema registry with an Avro key: three members, SIGKILLs, a
  SIGTERM, joins and COMMIT replies lost both ways (a proxy cuts the connection after and
  before COMMIT reaches PostgreSQL). The table must equal the fold of the stream and the
  quarantine hold every unfit record exactly once. ``make test`` runs each format under one
  group protocol; ``make sink-churn`` (``FENCE_SINK_CHURN=full``) runs both formats under all
  three protocols ``FENCE_SINK_CHURN_REPEAT`` times (default 5).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from fencing.testing.pgproxy import Action
from ops.reference.generate import GeneratedRecord
from tests.integration.sink_churn import Script, account_schema, script
from tests.integration.workers import (
    GROUP_SETUPS,
    GroupSetup,
    ProxyThread,
    WorkerProc,
    committed_total,
    create_topic,
    durable_rows,
    fresh_schema,
    produce,
    stop_live,
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


def _churn_cases() -> list[Any]:
    if os.environ.get("FENCE_SINK_CHURN") == "full":
        repeat = int(os.environ.get("FENCE_SINK_CHURN_REPEAT", "5"))
        return [pytest.param(fmt, setup, id=f"{fmt}-{setup.name}-{n}")
                for fmt in ("json", "avro") for setup in GROUP_SETUPS
                for n in range(1, repeat + 1)]
    by_name = {s.name: s for s in GROUP_SETUPS}
    return [pytest.param("json", by_name["eager-range"], id="json-eager-range"),
            pytest.param("avro", by_name["kip848-consumer"], id="avro-kip848-consumer")]


UPSERT_PARTITIONS, UPSERT_COUNT, UPSERT_KEYS = 6, 6_000, 240


async def _accounts(dsn: str, schema: str, group: str
                    ) -> tuple[dict[int, tuple[Any, ...]], list[tuple[int, int]]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(f'SELECT id, name, amount, tags, updated FROM "{schema}".acct')
        quarantined = await conn.fetch(f'SELECT partition, "offset" FROM "{schema}".quarantine '
                                       "WHERE group_id = $1", group)
    finally:
        await conn.close()
    return ({r["id"]: (r["name"], r["amount"], json.loads(r["tags"]), r["updated"])
             for r in rows}, [(r["partition"], r["offset"]) for r in quarantined])


def epochs_of(dsn: str, schema: str, group: str, topic: str) -> dict[int, int]:
    return {p: e for p, (e, _f) in asyncio.run(durable_rows(dsn, schema, group, topic)).items()}


def _lose_commit(proxy: ProxyThread, action: Action,
                 then: Callable[[], None] = lambda: None) -> None:
    """One COMMIT cut (``CUT_AFTER``: PostgreSQL committed, the reply is lost;
    ``CUT_BEFORE``: COMMIT never reached it), waited for until it fired. ``then`` runs once
    the cut is armed (the last cut produces the last records: with nothing left to commit,
    no COMMIT would come to cut)."""
    rule = proxy.add_rule("COMMIT", action, times=1)
    then()
    wait_until(lambda: rule.count >= 1, timeout_s=60, what=f"{action.value} fired")


@pytest.mark.parametrize(("fmt", "setup"), _churn_cases())
def test_upsert_sink_with_a_bigint_key_under_kills_and_lost_commits_equals_the_fold(
        services: Any, fmt: str, setup: GroupSetup) -> None:
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    topic, group = unique(f"churn_{fmt}"), unique("gchurn")
    create_topic(bootstrap, topic, UPSERT_PARTITIONS)
    schema = asyncio.run(account_schema(dsn))
    plan: Script = script(topic, count=UPSERT_COUNT, partitions=UPSERT_PARTITIONS,
                          keys=UPSERT_KEYS, fmt=fmt, registry_url=services.schema_registry_url)
    proxy = ProxyThread(dsn)
    formats = ("--sink-format", "avro", "--sink-key-format", "avro") if fmt == "avro" else ()
    procs: list[WorkerProc] = []

    def start(name: str) -> WorkerProc:
        w = WorkerProc(topic=topic, group=group, schema=schema, setup=setup, name=name,
                       env={"FENCE_DSN": proxy.dsn},
                       extra=("--sink", f"table={schema}.acct", "--sink-key", "id", *formats,
                              "--batch-max-records", "50"))
        procs.append(w)
        return w

    def reached(n: int) -> None:
        wait_until(lambda: committed_total(dsn, schema, group, topic) >= n, timeout_s=120,
                   what=f"{n} records committed")

    last_chunk = UPSERT_COUNT - 500

    def feed() -> None:  # in chunks while the members churn; the last chunk comes after
        for i in range(0, last_chunk, 500):
            produce(bootstrap, plan.records[i:i + 500])
            time.sleep(0.5)

    feeder = threading.Thread(target=feed, daemon=True)
    try:
        w1, w2, w3 = start("w1"), start("w2"), start("w3")
        feeder.start()
        reached(900)
        _lose_commit(proxy, Action.CUT_AFTER)
        w1.kill()                           # crash: its partitions move after the session
        w1.wait(10)
        start("w4")
        reached(2_400)
        _lose_commit(proxy, Action.CUT_BEFORE)
        w2.terminate()                      # graceful leave
        assert w2.wait(30) == 0, w2.log()[-3000:]
        start("w5")
        reached(3_900)
        _lose_commit(proxy, Action.CUT_AFTER)
        w3.kill()
        w3.wait(10)
        start("w6")
        feeder.join(timeout=120)
        assert not feeder.is_alive()
        _lose_commit(proxy, Action.CUT_BEFORE,
                     then=lambda: produce(bootstrap, plan.records[last_chunk:]))
        wait_until(lambda: committed_total(dsn, schema, group, topic) >= UPSERT_COUNT,
                   timeout_s=180, what="every record committed")
        # w1..w3 are all gone: each of their partitions is claimed anew, also one whose
        # records were all committed before its owner's SIGKILL (that handover waits for the
        # session to expire, which can be after the last record)
        wait_until(lambda: len(epochs_of(dsn, schema, group, topic)) == UPSERT_PARTITIONS
                   and min(epochs_of(dsn, schema, group, topic).values()) >= 2,
                   timeout_s=90, what="every partition handed over at least once")
        stop_live(procs)
    finally:
        for w in procs:
            w.ensure_dead()
        proxy.close()
    assert not any("lifetime ends" in w.log() for w in procs)
    epochs = epochs_of(dsn, schema, group, topic)
    assert len(epochs) == UPSERT_PARTITIONS and min(epochs.values()) >= 2, epochs  # all moved
    table, quarantined = asyncio.run(_accounts(dsn, schema, group))
    assert sorted(quarantined) == sorted(plan.unfit)  # each exactly once (the primary key)
    missing = plan.table.keys() - table.keys()
    extra = table.keys() - plan.table.keys()
    wrong = {k for k in plan.table.keys() & table.keys() if plan.table[k] != table[k]}
    assert (missing, extra, wrong) == (set(), set(), set()), (
        f"{len(missing)} missing, {len(extra)} extra, {len(wrong)} wrong")
