"""Every durability class keeps its promise, with real Kafka, PostgreSQL and ``fencectl run``
(the declaration grammar over all 15 pairs is ``tests/unit/fencing/test_failures.py``):

- ``durable-critical`` (the reference handler): a SIGKILL mid-run and a restart, every
  effect exactly once; status claims completeness.
- ``derived-reconcilable`` + ``convergent`` (``tests.integration.handlers:convergent_handler``,
  writing over its own connection, so replays after SIGKILLs write again): the derived table
  equals the fold of the source; wiped and rebuilt from the source by a fresh process after
  ``fencectl reset frontier --to-offset 0``, it converges to the same table.
- ``best-effort`` + ``loss-tolerant``: ``fencectl status`` and the metrics say completeness is
  not claimed.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
from typing import Any

import asyncpg
import pytest
from confluent_kafka import Producer

from tests.integration.observability_support import free_port, http_get, metric, run_fencectl
from tests.integration.workers import (
    GROUP_SETUPS,
    WorkerProc,
    committed_total,
    create_topic,
    durable_rows,
    exactly_once_problems,
    fresh_schema,
    generated,
    produce,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration

SETUP = GROUP_SETUPS[1]  # cooperative-sticky


def _status(services: Any, group: str, schema: str) -> dict[str, Any]:
    out = run_fencectl("status", "--json", "--group", group, "--schema", schema,
                       env={"FENCE_DSN": services.dsn})
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def _complete(services: Any, schema: str, group: str, topic: str, ends: dict[int, int]) -> bool:
    rows = asyncio.run(durable_rows(services.dsn, schema, group, topic))
    return {p: f for p, (_e, f) in rows.items()} == ends


def _run_killing(services: Any, *, topic: str, group: str, schema: str, extra: tuple[str, ...],
                 ends: dict[int, int], kills_at: list[int],
                 env: dict[str, str] | None = None) -> None:
    """One member at a time: SIGKILLed once ``kills_at[i]`` records are committed, then
    started again; stopped with SIGTERM (exit 0) once every partition is complete and the
    last one owns its partitions."""
    marks = list(kills_at)
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP, extra=extra, env=env)
    try:
        def step() -> bool:
            nonlocal w
            if marks and committed_total(services.dsn, schema, group, topic) >= marks[0]:
                marks.pop(0)
                w.kill()
                assert w.wait(30) == -signal.SIGKILL
                w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP,
                               extra=extra, env=env)
            return not marks and _complete(services, schema, group, topic, ends) \
                and w.owns_partitions()

        wait_until(step, timeout_s=240, what="every partition complete", interval_s=0.1)
        w.terminate()
        assert w.wait(30) == 0, w.log()[-4000:]
    finally:
        w.ensure_dead()


def test_durable_critical_applies_every_effect_exactly_once_and_claims_completeness(
        services: Any) -> None:
    topic, group = unique("dc"), unique("gdc")
    create_topic(services.kafka_bootstrap, topic, 2)
    records, source = generated(topic, count=600, partitions=2)
    produce(services.kafka_bootstrap, records)
    schema = asyncio.run(fresh_schema(services.dsn))
    ends: dict[int, int] = {}
    for r in source:
        ends[r.partition] = max(ends.get(r.partition, 0), r.offset + 1)
    _run_killing(services, topic=topic, group=group, schema=schema,  # 0.1 s a batch
                 extra=("--handler", "tests.integration.handlers:slow_handler",
                        "--batch-max-records", "20"), ends=ends, kills_at=[200],
                 env={"FENCE_TEST_BATCH_DELAY_S": "0.1"})
    assert asyncio.run(exactly_once_problems(services.dsn, schema, group, topic, source)) == []
    parts = _status(services, group, schema)["partitions"]
    assert {(p["durability"], p["completeness"]) for p in parts} == {
        ("durable-critical", "claimed")}


async def _derived(dsn: str, schema: str, *, wipe: bool = False) -> dict[str, tuple[int, str]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(f'SELECT key, last_offset, value FROM "{schema}".derived')
        if wipe:
            await conn.execute(f'TRUNCATE "{schema}".derived')
    finally:
        await conn.close()
    return {r["key"]: (r["last_offset"], r["value"]) for r in rows}


def test_derived_reconcilable_converges_under_kills_and_again_from_a_fresh_process(
        services: Any) -> None:
    topic, group = unique("dr"), unique("gdr")
    partitions, per_partition = 3, 300
    create_topic(services.kafka_bootstrap, topic, partitions)
    rng = random.Random(11)
    p = Producer({"bootstrap.servers": services.kafka_bootstrap, "enable.idempotence": True})
    fold: dict[str, tuple[int, str]] = {}
    for part in range(partitions):
        for o in range(per_partition):
            key, value = f"k{part}-{rng.randrange(40)}", f"v{rng.randrange(10**6)}"
            p.produce(topic, value.encode(), key.encode(), partition=part)
            fold[key] = (o, value)  # the last record of a key wins
    assert p.flush(60) == 0
    schema = asyncio.run(fresh_schema(services.dsn))
    ends = dict.fromkeys(range(partitions), per_partition)
    extra = ("--handler", "tests.integration.handlers:convergent_handler",
             "--handler-setting", "per_batch_s=0.05", "--batch-max-records", "20")
    _run_killing(services, topic=topic, group=group, schema=schema, extra=extra, ends=ends,
                 kills_at=[250, 600])
    assert asyncio.run(_derived(services.dsn, schema, wipe=True)) == fold
    for part in range(partitions):  # rebuild the derived table from the source
        out = run_fencectl("reset", "frontier", "--group", group, "--topic", topic,
                           "--partition", str(part), "--to-offset", "0", "--schema", schema,
                           "--reason", "rebuild the derived table", "--yes-i-understand",
                           env={"FENCE_DSN": services.dsn})
        assert out.returncode == 0, out.stderr
    assert asyncio.run(_derived(services.dsn, schema)) == {}
    _run_killing(services, topic=topic, group=group, schema=schema, extra=extra, ends=ends,
                 kills_at=[])
    assert asyncio.run(_derived(services.dsn, schema)) == fold
    parts = _status(services, group, schema)["partitions"]
    assert {(p["durability"], p["completeness"]) for p in parts} == {
        ("derived-reconcilable", "claimed")}


def test_best_effort_never_claims_completeness_in_status_or_metrics(services: Any) -> None:
    topic, group = unique("be"), unique("gbe")
    create_topic(services.kafka_bootstrap, topic, 1)
    records, _source = generated(topic, count=50, partitions=1)
    produce(services.kafka_bootstrap, records)
    schema = asyncio.run(fresh_schema(services.dsn))
    port = free_port()
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP,
                   extra=("--handler", "tests.integration.handlers:best_effort_handler",
                          "--http-port", str(port), "--heartbeat-interval-s", "1"))

    def scrape() -> str:
        got = http_get(f"http://127.0.0.1:{port}/metrics")
        return "" if got is None or got[0] != 200 else got[1]

    try:
        wait_until(lambda: _complete(services, schema, group, topic, {0: 50}), timeout_s=60,
                   what="drained")
        wait_until(lambda: metric(scrape(), "fence_partition_lag", topic=topic,
                                  completeness="not-claimed") == 0 and "fence_partition_lag{"
                   in scrape(), timeout_s=30, what="a lag sample")
        text = scrape()
        status = _status(services, group, schema)
        plain = run_fencectl("status", "--group", group, "--schema", schema,
                             env={"FENCE_DSN": services.dsn})
        w.terminate()
        assert w.wait(30) == 0, w.log()[-4000:]
    finally:
        w.ensure_dead()
    assert metric(text, "fence_handler_declaration", durability="best-effort",
                  effects="loss-tolerant", completeness="not-claimed") == 1
    [part] = status["partitions"]
    assert (part["durability"], part["completeness"], part["lag"]) == (
        "best-effort", "not-claimed", 0)
    assert any("completeness is not claimed" in n for n in part["notes"])
    assert plain.returncode == 0 and "0 (best-effort)" in plain.stdout
