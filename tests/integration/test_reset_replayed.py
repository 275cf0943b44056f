"""A reset backwards over a record that was quarantined and then replayed processes it again,
as the plan says (``offsets 0..N are processed again``): one real sink worker, real Kafka and
PostgreSQL, the operator's path of docs/reset-and-replay.md.

- The table sink quarantines offset 1 (it does not fit the table: a NOT NULL column the
  value leaves null, or an integer out of the column's range), the operator fixes the table
  (``DROP NOT NULL``, a wider type) while the worker runs, ``fencectl quarantine replay``
  applies the record, ``fencectl reset frontier --to-offset 0`` moves the frontier back, the
  table's rows are deleted and one more record is produced.
- The running worker claims the partition again and writes every record of 0..3 (rows 1-4),
  offset 1 included: the replayed quarantine row does not suppress it, and the sink judges
  it against the table as it is now, not as it was when the worker read it first. The
  quarantine row stays ``replayed`` (nothing was quarantined again), the same lifetime runs
  throughout, and SIGTERM afterwards exits 0.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from confluent_kafka import Producer

from tests.integration.observability_support import run_fencectl
from tests.integration.workers import (
    GROUP_SETUPS,
    WorkerProc,
    create_topic,
    durable_rows,
    fresh_schema,
    journal_rows,
    unique,
)
from tests.polling import wait_until

pytestmark = pytest.mark.integration

SETUP = next(s for s in GROUP_SETUPS if s.name == "cooperative-sticky")
HEARTBEAT_S = 1.0
KAFKA_TIMEOUT_S = "20"  # fencectl reset reads Kafka's watermarks (see test_reset_pickup)


@dataclass(frozen=True, slots=True)
class Misfit:
    """How offset 1 does not fit the table at first, and the operator's fix."""

    name: str
    column: str  # the amount column's definition
    amount: int | None  # offset 1's amount
    fix: str  # ALTER TABLE {t} ...
    reason: str  # the start of the quarantine reason


MISFITS = (
    Misfit("not-null", "amount int NOT NULL", None, "ALTER COLUMN amount DROP NOT NULL",
           "table sink: column amount is NOT NULL but the value holds null"),
    Misfit("out-of-range", "amount int2", 70_000, "ALTER COLUMN amount TYPE int4",
           "table sink: column amount (int2): 70000 is out of range"),
)


async def _sql(dsn: str, sql: str, *args: Any) -> list[Any]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


def _produce(bootstrap: str, topic: str, values: list[dict[str, Any]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 0})
    for value in values:
        producer.produce(topic, json.dumps(value).encode(), partition=0)
    assert producer.flush(30) == 0


def _frontier(dsn: str, schema: str, group: str, topic: str) -> int | None:
    rows = asyncio.run(durable_rows(dsn, schema, group, topic))
    return rows[0][1] if 0 in rows else None


@pytest.mark.parametrize("misfit", MISFITS, ids=lambda m: m.name)
def test_a_reset_over_a_replayed_record_applies_it_again(services: Any, misfit: Misfit) -> None:
    dsn, bootstrap = services.dsn, services.kafka_bootstrap
    schema = asyncio.run(fresh_schema(dsn))
    table = f'"{schema}".orders'
    asyncio.run(_sql(dsn, f"CREATE TABLE {table} (id int PRIMARY KEY, {misfit.column})"))
    topic, group = unique("rreplay"), unique("g-rreplay")
    create_topic(bootstrap, topic, 1)
    _produce(bootstrap, topic, [{"id": 1, "amount": 10}, {"id": 2, "amount": misfit.amount},
                                {"id": 3, "amount": 30}])
    env = {"FENCE_SCHEMA": schema}
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP, name="rreplay",
                   extra=("--sink", f"table={schema}.orders", "--sink-key", "id",
                          "--heartbeat-interval-s", str(HEARTBEAT_S)))

    def rows() -> dict[int, int | None]:
        return {r["id"]: r["amount"] for r in asyncio.run(_sql(
            dsn, f"SELECT id, amount FROM {table}"))}

    def quarantine() -> dict[int, tuple[str, int]]:
        return {r["offset"]: (r["state"], r["replays"]) for r in asyncio.run(_sql(
            dsn, f'SELECT "offset", state, replays, reason FROM "{schema}".quarantine'
                 " WHERE group_id = $1", group))}

    try:
        wait_until(lambda: _frontier(dsn, schema, group, topic) == 3, timeout_s=60,
                   what="offsets 0..2 processed")
        assert rows() == {1: 10, 3: 30}
        (reason,) = [r["reason"] for r in asyncio.run(_sql(
            dsn, f'SELECT reason FROM "{schema}".quarantine WHERE "offset" = 1'))]
        assert reason.startswith(misfit.reason), reason
        (lifetime,) = {r["lifetime"] for r in asyncio.run(journal_rows(
            dsn, schema, group, topic)) if r["event"] == "claim"}

        asyncio.run(_sql(dsn, f"ALTER TABLE {table} {misfit.fix}"))  # the operator's fix
        replay = run_fencectl("quarantine", "replay", "--group", group, "--json", env=env)
        assert replay.returncode == 0, replay.stderr
        assert [(r["offset"], r["outcome"]) for r in json.loads(replay.stdout)["results"]] \
            == [(1, "applied")]
        assert rows() == {1: 10, 2: misfit.amount, 3: 30}
        assert quarantine() == {1: ("replayed", 1)}

        reset = run_fencectl("reset", "frontier", "--group", group, "--topic", topic,
                             "--partition", "0", "--to-offset", "0", "--kafka-timeout-s",
                             KAFKA_TIMEOUT_S, "--yes-i-understand", "--json", env=env)
        assert reset.returncode == 0, reset.stderr
        (plan,) = json.loads(reset.stdout)["plans"]
        assert plan["detail"] == "frontier 3 -> 0: offsets 0..2 are processed again"
        asyncio.run(_sql(dsn, f"DELETE FROM {table}"))
        _produce(bootstrap, topic, [{"id": 4, "amount": 40}])

        wait_until(lambda: _frontier(dsn, schema, group, topic) == 4, timeout_s=60,
                   what="offsets 0..3 processed again from the reset frontier")
        claims = [r for r in asyncio.run(journal_rows(dsn, schema, group, topic))
                  if r["event"] == "claim"]
        assert [c["lifetime"] for c in claims] == [lifetime, lifetime]
        assert claims[1]["detail"] == "frontier=0"
        assert rows() == {1: 10, 2: misfit.amount, 3: 30, 4: 40}
        assert quarantine() == {1: ("replayed", 1)}  # not quarantined again
        w.terminate()
        assert w.wait(30) == 0, w.log()[-3000:]
    finally:
        w.ensure_dead()
    log = w.log()
    assert " ERROR " not in log and "lifetime ends" not in log, log[-4000:]
    assert "claimed again after an operator's reset" in log, log[-4000:]


def test_a_table_fixed_while_the_sink_runs_takes_the_next_records(services: Any) -> None:
    """Without a reset: after the operator's fix, the running worker writes the next record
    of the shape it quarantined before the fix (it reads the table again)."""
    dsn, bootstrap = services.dsn, services.kafka_bootstrap
    schema = asyncio.run(fresh_schema(dsn))
    table = f'"{schema}".orders'
    asyncio.run(_sql(dsn, f"CREATE TABLE {table} (id int PRIMARY KEY, amount int NOT NULL)"))
    topic, group = unique("rfixed"), unique("g-rfixed")
    create_topic(bootstrap, topic, 1)
    _produce(bootstrap, topic, [{"id": 1, "amount": None}])
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP, name="rfixed",
                   extra=("--sink", f"table={schema}.orders", "--sink-key", "id"))
    try:
        wait_until(lambda: _frontier(dsn, schema, group, topic) == 1, timeout_s=60,
                   what="offset 0 processed")
        asyncio.run(_sql(dsn, f"ALTER TABLE {table} ALTER COLUMN amount DROP NOT NULL"))
        _produce(bootstrap, topic, [{"id": 2, "amount": None}])
        wait_until(lambda: _frontier(dsn, schema, group, topic) == 2, timeout_s=60,
                   what="offset 1 processed")
        rows = asyncio.run(_sql(dsn, f"SELECT id, amount FROM {table}"))
        assert [(r["id"], r["amount"]) for r in rows] == [(2, None)]
        quarantined = asyncio.run(_sql(dsn, f'SELECT "offset" FROM "{schema}".quarantine'
                                            " WHERE group_id = $1", group))
        assert [r["offset"] for r in quarantined] == [0]
        w.terminate()
        assert w.wait(30) == 0, w.log()[-3000:]
    finally:
        w.ensure_dead()
