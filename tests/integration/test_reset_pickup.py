"""An operator's ``fencectl reset frontier`` on a running group is picked up by the running
owner (DESIGN.md, Liveness): one real worker, real Kafka and PostgreSQL, per group protocol.

- Partition 0 is idle (everything processed) when it is reset backwards: the member learns
  of it from its next heartbeat, claims it again and applies offsets from the new frontier.
- Partition 1 is busy (a producer keeps writing) when it is reset backwards: the member's
  next batch is fenced by the reset, it claims again and goes on from the new frontier.
- The lifetime never ends (no fresh lifetime, no ERROR line, no ``lifetime ends``; every
  claim after the resets is its own), every record below the old frontier and at or above
  the new one is applied exactly twice and every other record once (the handler's effect
  rows), Kafka's committed offsets follow the frontiers, and SIGTERM afterwards exits 0.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import asyncpg
import pytest
from confluent_kafka import Producer

from tests.integration.observability_support import run_fencectl
from tests.integration.workers import (
    GROUP_SETUPS,
    GroupSetup,
    WorkerProc,
    create_topic,
    durable_rows,
    fresh_schema,
    journal_rows,
    unique,
)
from tests.polling import wait_until

pytestmark = pytest.mark.integration

HANDLER = "tests.integration.quarantine_handlers:effects_handler"  # one row per application
FIRST = 50  # records per partition before the resets
BUSY = 300  # more records of partition 1, produced while it is reset
HEARTBEAT_S = 1.0
# fencectl reset reads Kafka's watermarks (describe_topics, list_offsets) before it plans; on
# this 2-core machine under parallel test runs (load average 80+) the single broker once took
# longer than the default 5 s to answer ("Failed while waiting for controller")
KAFKA_TIMEOUT_S = "20"


async def _sql(dsn: str, sql: str, *args: Any) -> list[Any]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


def _applications(dsn: str, schema: str, partition: int) -> dict[int, int]:
    rows = asyncio.run(_sql(dsn, f'SELECT "offset", count(*) AS n FROM "{schema}".effects'
                                 " WHERE partition = $1 GROUP BY 1", partition))
    return {r["offset"]: r["n"] for r in rows}


def _produce(bootstrap: str, topic: str, partition: int, offsets: range, *,
             every_s: float = 0.0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 0})
    for o in offsets:
        producer.produce(topic, f"r{o}".encode(), partition=partition)
        if every_s:
            producer.poll(0)
            time.sleep(every_s)
    assert producer.flush(30) == 0


def _reset(schema: str, group: str, topic: str, partition: int, to_offset: int,
           epoch: int) -> dict[str, Any]:
    done = run_fencectl("reset", "frontier", "--group", group, "--topic", topic, "--partition",
                        str(partition), "--to-offset", str(to_offset), "--expect-epoch",
                        str(epoch), "--kafka-timeout-s", KAFKA_TIMEOUT_S,
                        "--yes-i-understand", "--json",
                        env={"FENCE_SCHEMA": schema})
    assert done.returncode == 0, done.stderr
    (plan,) = json.loads(done.stdout)["plans"]
    return dict(plan)


def _claims_after(dsn: str, schema: str, group: str, topic: str, partition: int,
                  epoch: int) -> list[dict[str, Any]]:
    rows = asyncio.run(journal_rows(dsn, schema, group, topic))
    return [r for r in rows if r["partition"] == partition and r["event"] == "claim"
            and r["epoch"] > epoch]


# A classic member's session is 2 s in the fast setups; here no session needs to expire, and
# on a loaded machine the coordinator has gone that long without answering a heartbeat
# (SESSTMOUT, then a rebalance), so the classic setups get a longer one.
_STEADY = ("-X", "session.timeout.ms=10000", "-X", "heartbeat.interval.ms=1000")


@pytest.mark.parametrize("setup", GROUP_SETUPS, ids=lambda s: s.name)
def test_a_running_owner_picks_up_resets_of_an_idle_and_a_busy_partition(
        services: Any, setup: GroupSetup) -> None:
    dsn, bootstrap = services.dsn, services.kafka_bootstrap
    schema = asyncio.run(fresh_schema(dsn))
    asyncio.run(_sql(dsn, f'CREATE TABLE "{schema}".effects (topic text, partition int,'
                          ' "offset" bigint, value bytea)'))
    topic, group = unique("pickup"), unique("g-pickup")
    create_topic(bootstrap, topic, 2)
    for p in (0, 1):
        _produce(bootstrap, topic, p, range(FIRST))
    steady = _STEADY if "classic" in setup.args else ()
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=setup, name="pickup",
                   extra=("--handler", HANDLER, "--heartbeat-interval-s", str(HEARTBEAT_S),
                          "--batch-max-records", "20", *steady))
    try:
        wait_until(lambda: asyncio.run(durable_rows(dsn, schema, group, topic))
                   == {0: (1, FIRST), 1: (1, FIRST)}, timeout_s=60,
                   what="both partitions processed once")
        (lifetime,) = {r["lifetime"] for r in asyncio.run(journal_rows(
            dsn, schema, group, topic)) if r["event"] == "claim"}

        # idle: nothing arrives after the reset; the heartbeat carries it
        idle_at = time.monotonic()
        idle = _reset(schema, group, topic, 0, 20, 1)
        assert idle["frontier"] == [FIRST, 20] and idle["fenced_owner"] == lifetime
        wait_until(lambda: _claims_after(dsn, schema, group, topic, 0, 2), timeout_s=60,
                   what="partition 0 claimed again")
        idle_pickup_s = time.monotonic() - idle_at

        # busy: a producer keeps writing partition 1 while it is reset
        feeding = threading.Thread(target=_produce, args=(bootstrap, topic, 1,
                                                          range(FIRST, FIRST + BUSY)),
                                   kwargs={"every_s": 0.02})
        feeding.start()
        wait_until(lambda: asyncio.run(durable_rows(dsn, schema, group, topic))[1][1]
                   >= FIRST + 40, timeout_s=60, what="partition 1 busy")
        busy = _reset(schema, group, topic, 1, 30, 1)
        old_frontier = busy["frontier"][0]
        assert old_frontier >= FIRST + 40
        wait_until(lambda: _claims_after(dsn, schema, group, topic, 1, 2), timeout_s=60,
                   what="partition 1 claimed again")
        feeding.join(timeout=60)

        wait_until(lambda: {p: f for p, (_e, f) in asyncio.run(
            durable_rows(dsn, schema, group, topic)).items()} == {0: FIRST, 1: FIRST + BUSY},
            timeout_s=90, what="both partitions caught up from their new frontiers")
        assert all(e >= 3 for e, _f in asyncio.run(
            durable_rows(dsn, schema, group, topic)).values())
        assert {c["lifetime"] for p in (0, 1)
                for c in _claims_after(dsn, schema, group, topic, p, 2)} == {lifetime}
        assert _applications(dsn, schema, 0) == {o: 2 if o >= 20 else 1 for o in range(FIRST)}
        assert _applications(dsn, schema, 1) == {
            o: 2 if 30 <= o < old_frontier else 1 for o in range(FIRST + BUSY)}

        def mirrored() -> bool:
            status = json.loads(run_fencectl("status", "--group", group, "--json",
                                             env={"FENCE_SCHEMA": schema}).stdout)
            return all(p["kafka_mirror"] == "in-sync" and p["owner"] == lifetime
                       and p["owner_state"] == "running" for p in status["partitions"])
        wait_until(mirrored, timeout_s=30, what="Kafka's committed offsets at the frontiers")
        w.terminate()
        assert w.wait(30) == 0, w.log()[-3000:]
    finally:
        w.ensure_dead()
    log = w.log()
    assert " ERROR " not in log and "lifetime ends" not in log, log[-4000:]
    pickups = log.count("claimed again after an operator's reset")
    if log.count("assigned {") == 1:
        assert pickups == 2, log[-4000:]
    else:  # the group rebalanced meanwhile: the assignment's own claim may take a reset up
        assert 1 <= pickups <= 2, log[-4000:]
    # a measurement, not a bound (the wait above is the bound): printed for the docs' figure
    print(f"{setup.name}: idle partition picked up {idle_pickup_s:.2f} s after the reset")
