"""The schema registry frozen (SIGSTOP) for 20 s under two Avro sink members: the partitions
whose records carry a schema id their member has not seen wait with backoff, the others
flow, nothing is quarantined, and once the registry answers again every record is applied
once (table = fold)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest

from ops.reference.generate import GeneratedRecord
from ops.stack import control as stack
from ops.stack.config import Service, settings_from
from tests.integration.registry_support import avro
from tests.integration.sink_churn import ACCOUNT_AVRO, account_schema
from tests.integration.workers import (
    GROUP_SETUPS,
    WorkerProc,
    create_topic,
    durable_rows,
    produce,
    unique,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.exclusive]  # freezes the shared registry

SETUP = next(s for s in GROUP_SETUPS if s.name == "cooperative-sticky")
PARTITIONS = 4
FROZEN_S = 20.0


def _registry_pid(url: str) -> int:
    """The pid of the local stack's registry serving ``url``; a registry this session does
    not run (compose, testcontainers) cannot be frozen by it."""
    settings = settings_from()
    row = next(r for r in stack.status(settings) if r.service is Service.REGISTRY)
    if row.pid is None or urlsplit(url).port != settings.ports.schema_registry:
        pytest.skip("the schema registry is not the local stack's: it cannot be SIGSTOPped")
    return row.pid


def _row(i: int, k: int, email: bool) -> dict[str, Any]:
    import datetime as dt
    import decimal
    row = {"id": k, "name": f"n{i}", "amount": decimal.Decimal(f"{i}.50"), "tags": {"i": i},
           "updated": dt.datetime(2024, 5, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=i)}
    return {**row, "email": f"{i}@x"} if email else row


async def _state(dsn: str, schema: str) -> tuple[dict[int, str], int]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(f'SELECT id, name FROM "{schema}".acct')
        quarantined = await conn.fetchval(f'SELECT count(*) FROM "{schema}".quarantine')
    finally:
        await conn.close()
    return {r["id"]: r["name"] for r in rows}, int(quarantined)


def test_a_frozen_registry_holds_only_the_partitions_that_need_it(services: Any) -> None:
    bootstrap, dsn, url = services.kafka_bootstrap, services.dsn, services.schema_registry_url
    pid = _registry_pid(url)
    topic, group = unique("frozen"), unique("gfrozen")
    create_topic(bootstrap, topic, PARTITIONS)
    schema = asyncio.run(account_schema(dsn))
    v1 = avro(url, topic, ACCOUNT_AVRO)
    v2_schema = json.loads(ACCOUNT_AVRO)
    v2_schema["fields"].append({"name": "email", "type": ["null", "string"], "default": None})
    v2 = avro(url, topic, json.dumps(v2_schema))
    key = avro(url, topic, '"long"', key=True)
    fold: dict[int, str] = {}
    ends = [0] * PARTITIONS

    def batch(first: int, count: int, parts: tuple[int, ...], *, email: bool
              ) -> list[GeneratedRecord]:
        out = []
        for i in range(first, first + count):
            k = 1 + i % 40
            k = k - k % PARTITIONS + parts[i % len(parts)]  # a key of one of ``parts``
            p = k % PARTITIONS
            if i % 9 == 7:  # tombstones on every partition: its member knows the key schema
                out.append(GeneratedRecord(topic, p, key(k), None))  # type: ignore[arg-type]
                fold.pop(k, None)
            else:
                out.append(GeneratedRecord(topic, p, key(k), (v2 if email else v1)(
                    _row(i, k, email))))
                fold[k] = f"n{i}"
            ends[p] += 1
        return out

    produce(bootstrap, batch(0, 400, (0, 1, 2, 3), email=False))
    v2(_row(0, 1, True))  # version 2 registered now; no member has seen its id
    procs = [WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP, name=f"w{n}",
                        extra=("--sink", f"table={schema}.acct", "--sink-key", "id",
                               "--sink-format", "avro", "--sink-key-format", "avro",
                               "--batch-max-records", "50", "--retry-max-ms", "2000"))
             for n in (1, 2)]

    def frontiers() -> list[int]:
        rows = asyncio.run(durable_rows(dsn, schema, group, topic))
        return [rows.get(p, (0, 0))[1] for p in range(PARTITIONS)]

    try:
        wait_until(lambda: frontiers() == ends, timeout_s=120, what="the first records")
        before = list(ends)
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            produce(bootstrap, batch(400, 300, (0, 1), email=True) +
                    batch(700, 300, (2, 3), email=False))
            wait_until(lambda: frontiers()[2:] == ends[2:], timeout_s=FROZEN_S - 5,
                       what="the partitions that need no schema to flow")
            time.sleep(max(0.0, FROZEN_S - (time.monotonic() - stopped_at)))
            held = frontiers()
            _rows, quarantined = asyncio.run(_state(dsn, schema))
        finally:
            os.kill(pid, signal.SIGCONT)
        assert held[:2] == before[:2], (held, before)  # waited: no record skipped
        assert quarantined == 0
        wait_until(lambda: frontiers() == ends, timeout_s=120, what="every record after")
        for w in procs:
            w.terminate()
        for w in procs:
            assert w.wait(30) == 0, w.log()[-3000:]
    finally:
        for w in procs:
            w.ensure_dead()
    logs = "".join(w.log() for w in procs)
    assert "lifetime ends" not in logs
    assert "(unavailable)" in logs and "attempt" in logs  # the waits were retries
    rows, quarantined = asyncio.run(_state(dsn, schema))
    assert quarantined == 0 and rows == fold
