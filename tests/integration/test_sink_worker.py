"""``fencectl run --sink`` as a real worker process: a missing table is created at start and
each record applied once (upsert: last wins, tombstones delete, misfits quarantined with
their reason); a table that does not fit stops the start with exit 2 saying why."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import pytest

from ops.reference.generate import GeneratedRecord
from tests.integration.observability_support import run_fencectl
from tests.integration.workers import (
    GROUP_SETUPS,
    WorkerProc,
    committed_total,
    create_topic,
    fresh_schema,
    produce,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration

SETUP = next(s for s in GROUP_SETUPS if s.name == "cooperative-sticky")


async def _fetch(dsn: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = await asyncpg.connect(dsn)
    try:
        return [tuple(r) for r in await conn.fetch(sql, *args)]
    finally:
        await conn.close()


def test_sink_creates_the_table_and_applies_each_record_once(services: Any) -> None:
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    topic, group = unique("sinkw"), unique("gsinkw")
    create_topic(bootstrap, topic, 2)
    schema = asyncio.run(fresh_schema(dsn))
    recs: list[GeneratedRecord] = []
    last: dict[str, int] = {}
    for i in range(300):  # keys k0..k19, each always in the same partition
        key = f"k{i % 20}"
        value: bytes | None = json.dumps({"n": i}).encode()
        if i % 50 == 49:
            value = None  # tombstone: deletes the key's row
        elif i % 37 == 3:
            value = b"[1, 2]"
        recs.append(GeneratedRecord(topic, (i % 20) % 2, key.encode(), value))  # type: ignore[arg-type]
        if value is None:
            last.pop(key, None)
        elif i % 37 != 3:
            last[key] = i
    produce(bootstrap, recs)
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP, name="sink",
                   extra=("--sink", f"table={schema}.orders", "--sink-key", "id"))
    try:
        wait_until(lambda: committed_total(dsn, schema, group, topic) >= len(recs),
                   timeout_s=60, what="every record committed")
        w.terminate()
        assert w.wait(30) == 0, w.log()[-3000:]
    finally:
        w.ensure_dead()
    rows = asyncio.run(_fetch(dsn, f'SELECT id, (payload->>\'n\')::int FROM "{schema}".orders'))
    assert dict(rows) == last
    quarantined = asyncio.run(_fetch(dsn, f'SELECT reason FROM "{schema}".quarantine '
                                          "WHERE group_id = $1", group))
    assert len(quarantined) == sum(1 for i in range(300) if i % 37 == 3 and i % 50 != 49)
    assert {r[0] for r in quarantined} == {"table sink: value is a JSON list, not an object"}


def test_sink_refuses_a_table_that_does_not_fit_with_exit_2(services: Any) -> None:
    topic = unique("sinkbad")
    create_topic(services.kafka_bootstrap, topic, 1)
    schema = asyncio.run(fresh_schema(services.dsn))
    asyncio.run(_fetch(services.dsn, f'CREATE TABLE "{schema}".orders (id text, n int)'))
    done = run_fencectl("run", "--topic", topic, "--group", unique("g"), "--schema", schema,
                        "--sink", f"table={schema}.orders", "--sink-key", "id",
                        env={"OTEL_TRACES_EXPORTER": "none"})
    assert done.returncode == 2, done.stderr[-2000:]
    assert (f"fencectl run: --sink table={schema}.orders: the table does not fit: key column "
            "id has no unique index or primary key on exactly it") in done.stderr


def test_a_schemad_sink_without_an_answering_registry_or_a_schema_exits_2(services: Any
                                                                           ) -> None:
    topic = unique("sinkreg")
    create_topic(services.kafka_bootstrap, topic, 1)
    schema = asyncio.run(fresh_schema(services.dsn))
    argv = ("run", "--topic", topic, "--group", unique("g"), "--schema", schema,
            "--sink", f"table={schema}.t", "--sink-key", "id", "--sink-format", "avro")
    down = run_fencectl(*argv, env={"OTEL_TRACES_EXPORTER": "none",
                                    "SCHEMA_REGISTRY_URL": "http://u:pw@127.0.0.1:1/ccompat"})
    assert down.returncode == 2, down.stderr[-2000:]
    assert "SCHEMA_REGISTRY_URL http://127.0.0.1:1/ccompat: schema registry" in down.stderr
    assert "pw" not in down.stderr
    no_schema = run_fencectl(*argv, env={"OTEL_TRACES_EXPORTER": "none"})
    assert no_schema.returncode == 2, no_schema.stderr[-2000:]
    assert (f"the table does not exist and no schema is registered under {topic}-value"
            in no_schema.stderr)
    missing = run_fencectl(*argv, env={"OTEL_TRACES_EXPORTER": "none",
                                       "SCHEMA_REGISTRY_URL": ""})
    assert missing.returncode == 2
    assert "avro needs a schema registry: set SCHEMA_REGISTRY_URL" in missing.stderr
