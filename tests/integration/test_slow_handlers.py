"""Slow handlers with real Kafka, PostgreSQL and ``fencectl run``, default settings (an 8 s
idle-in-transaction timeout, a 20 s call budget: a handler call may last 7.2 s):

- a handler that waits 12 s per full batch of 500 for a slow downstream (24 ms a record,
  idle in transaction meanwhile): its batches are split until they fit and the topic drains,
  every record applied once, no lifetime ending;
- a handler that takes 25 s for one record: the record is reported once (a WARNING naming
  the settings, the ``too-slow`` metric, a status note) and quarantined as too slow, or the
  worker fail-stops (exit 1) when the handler is declared ``on_failure="stop"``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import pytest
from confluent_kafka import Producer

from tests.integration.observability_support import free_port, http_get, metric, run_fencectl
from tests.integration.workers import (
    GROUP_SETUPS,
    WorkerProc,
    create_topic,
    durable_rows,
    fresh_schema,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration

SETUP = GROUP_SETUPS[1]  # cooperative-sticky
HANDLER = ("--handler", "tests.integration.handlers:failing_handler")


def _topic(services: Any, count: int) -> tuple[str, str, str]:
    topic, group = unique("slow"), unique("gslow")
    create_topic(services.kafka_bootstrap, topic, 1)
    p = Producer({"bootstrap.servers": services.kafka_bootstrap, "enable.idempotence": True})
    for o in range(count):
        p.produce(topic, f"v{o}".encode(), f"k{o}".encode(), partition=0)
    assert p.flush(60) == 0
    return topic, group, asyncio.run(fresh_schema(services.dsn))


async def _fetch(dsn: str, sql: str, *args: Any) -> list[Any]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


def _frontier(services: Any, schema: str, group: str, topic: str) -> int | None:
    row = asyncio.run(durable_rows(services.dsn, schema, group, topic)).get(0)
    return None if row is None else row[1]


def test_a_handler_slower_than_the_idle_timeout_per_batch_drains_without_ending_a_lifetime(
        services: Any) -> None:
    topic, group, schema = _topic(services, 598)
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP, name="slow12",
                   extra=(*HANDLER, "--handler-setting", "per_record_s=0.024"))
    try:
        wait_until(lambda: _frontier(services, schema, group, topic) == 598, timeout_s=150,
                   what="the topic drained")
        w.terminate()
        code = w.wait(30)
    finally:
        w.ensure_dead()
    log = w.log()
    assert code == 0, log[-4000:]
    rows = asyncio.run(_fetch(services.dsn, f'SELECT "offset", n FROM "{schema}".applied'))
    assert {r["offset"]: r["n"] for r in rows} == {o: 1 for o in range(598)}
    assert asyncio.run(_fetch(services.dsn, f'SELECT 1 FROM "{schema}".quarantine')) == []
    assert log.count("lifetime.start") == 1 and "lifetime ends" not in log
    splits = [ln for ln in log.splitlines() if "is split into halves" in ln]
    assert len(splits) == 1, splits  # once per partition and lifetime
    assert "--batch-max-records" in splits[0] and "--db-idle-in-transaction-timeout-s" \
        in splits[0] and "--call-budget-s" in splits[0]


@pytest.mark.parametrize("on_failure", ["quarantine", "stop"])
def test_a_record_slower_than_the_budget_alone_is_reported_once_and_handled_per_declaration(
        services: Any, on_failure: str) -> None:
    topic, group, schema = _topic(services, 1)
    port = free_port()
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP,
                   name=f"slow25-{on_failure}",
                   extra=(*HANDLER, "--handler-setting", "per_record_s=25",
                          "--handler-setting", f"on_failure={on_failure}",
                          "--http-port", str(port)))
    try:
        if on_failure == "stop":
            code = w.wait(90)
        else:
            wait_until(lambda: _frontier(services, schema, group, topic) == 1, timeout_s=90,
                       what="the record settled")
            got = http_get(f"http://127.0.0.1:{port}/metrics")
            assert got is not None and got[0] == 200
            metrics = got[1]
            w.terminate()
            code = w.wait(30)
    finally:
        w.ensure_dead()
    log = w.log()
    reports = [ln for ln in log.splitlines() if "(too slow)" in ln and "WARNING" in ln]
    assert len(reports) == 1, reports
    assert "--db-idle-in-transaction-timeout-s" in reports[0] and "--call-budget-s" in reports[0]
    quarantine = asyncio.run(_fetch(services.dsn, f'SELECT "offset", error_type, reason FROM '
                                                  f'"{schema}".quarantine'))
    if on_failure == "stop":
        assert code == 1, log[-4000:]
        assert "TooSlow" in log and quarantine == []
        assert _frontier(services, schema, group, topic) == 0
        return
    assert code == 0, log[-4000:]
    [q] = quarantine
    assert (q["offset"], q["error_type"]) == (0, "TooSlow") and q["reason"].startswith("too slow")
    assert metric(metrics, "fence_handler_failures_total", kind="too-slow", topic=topic) == 1
    assert metric(metrics, "fence_handler_failures_total", kind="quarantine", cause="too-slow",
                  topic=topic) == 1
    out = run_fencectl("status", "--json", "--group", group, "--schema", schema,
                       env={"FENCE_DSN": services.dsn})
    assert out.returncode == 0, out.stderr
    [part] = json.loads(out.stdout)["partitions"]
    assert part["quarantine_causes"] == {"too-slow": 1}
    assert "1 record(s) quarantined: 1 too slow" in part["notes"]
    assert log.count("lifetime.start") == 1 and "lifetime ends" not in log
