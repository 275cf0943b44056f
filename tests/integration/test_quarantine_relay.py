"""``fencectl quarantine relay``: quarantined records on a dead-letter topic, against real
Kafka and PostgreSQL.

- Rows quarantined by a real ``--sink`` worker are relayed with their key, value, headers
  and timestamp and the dead-letter headers (Kafka Connect's, Spring Kafka's, fenceworker's).
  The relay is SIGKILLed after the broker acknowledged a flush and before its rows were
  marked (crash point ``relay-after-ack``): the next run publishes those again, so every
  row is on the topic at least once, exactly once by ``fenceworker.dlq.id``, none lost, and
  every row is marked with where its (last) copy landed. Replay and purge then work on the
  relayed rows.
- The relay runs as a role holding only ``grant_relay_sql``; that role cannot delete rows.
- ``--follow`` keeps relaying while the dead-letter partition's leader is SIGKILLed and
  restarted (three-node cluster): every row delivered, none twice (idempotent producer),
  every row marked.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import struct
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from confluent_kafka import Consumer

from ops.operator.relay import DEDUPE_HEADER, grant_relay_sql
from ops.reference.generate import GeneratedRecord
from tests.integration.workers import (
    FENCECTL,
    GROUP_SETUPS,
    ROOT,
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
COUNT, PARTITIONS = 300, 3


def _relay(*args: str, env: dict[str, str] | None = None, timeout_s: float = 120
           ) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([*FENCECTL, "quarantine", "relay", *args], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=timeout_s)


def _read_all(bootstrap: str, topic: str, expect: int, timeout_s: float = 60
              ) -> list[Any]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("read"),
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                if len(out) >= expect:
                    break
                continue
            if msg.error() is None:
                out.append(msg)
    finally:
        c.close()
    return out


async def _fetch(dsn: str, sql: str, *args: Any) -> list[Any]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


def _quarantine_by_a_worker(services: Any) -> tuple[str, str, str, dict[int, int]]:
    """A ``--sink`` worker quarantines every 10th record (no ``amount``) of a topic whose
    records carry a header; the schema, group, topic and each row's record timestamp."""
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    topic, group = unique("dlsrc"), unique("gdl")
    create_topic(bootstrap, topic, PARTITIONS)
    schema = asyncio.run(fresh_schema(dsn))
    asyncio.run(_fetch(dsn, f'CREATE TABLE "{schema}".t (id text PRIMARY KEY, amount bigint '
                            "NOT NULL)"))
    recs = [GeneratedRecord(topic, i % PARTITIONS, f"k{i}".encode(), json.dumps(
        {"id": f"k{i}", **({} if i % 10 == 3 else {"amount": i})}).encode())
        for i in range(COUNT)]
    produce(bootstrap, recs, headers=[("origin", b"test")])
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP, name="sink",
                   extra=("--sink", f"table={schema}.t", "--sink-key", "id"))
    try:
        wait_until(lambda: committed_total(dsn, schema, group, topic) >= COUNT, timeout_s=60,
                   what="every record committed")
        w.terminate()
        assert w.wait(30) == 0, w.log()[-2000:]
    finally:
        w.ensure_dead()
    rows = asyncio.run(_fetch(dsn, f'SELECT partition, "offset", record_timestamp_ms FROM '
                                   f'"{schema}".quarantine WHERE group_id = $1', group))
    assert len(rows) == COUNT // 10
    return schema, group, topic, {r["offset"] * PARTITIONS + r["partition"]:
                                  r["record_timestamp_ms"] for r in rows}


def _headers(msg: Any) -> dict[str, bytes]:
    return dict(msg.headers() or [])


def test_relay_killed_between_ack_and_mark_loses_nothing_and_dedupes(
        services: Any, tmp_path: Path) -> None:
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    schema, group, topic, stamps = _quarantine_by_a_worker(services)
    dlq = unique("dlq")
    create_topic(bootstrap, dlq, 2)
    env = {"FENCE_DSN": dsn, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "FENCE_SCHEMA": schema}
    crashed = _relay("--group", group, "--topic", dlq, "--batch", "10",
                     env={**env, "FENCE_CRASH_AT": "relay-after-ack@2",
                          "FENCE_CRASH_MARKER": str(tmp_path / "marker.jsonl")})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    marked = asyncio.run(_fetch(dsn, f'SELECT count(*) FROM "{schema}".quarantine WHERE '
                                     "relayed_at IS NOT NULL"))[0][0]
    assert marked == 10  # the first flush marked, the second acknowledged but not marked
    done = _relay("--group", group, "--topic", dlq, "--batch", "10", env=env)
    assert done.returncode == 0, done.stderr
    assert f"relay: {COUNT // 10 - 10} row(s) of group {group} relayed" in done.stdout
    msgs = _read_all(bootstrap, dlq, COUNT // 10 + 10)
    ids = Counter(_headers(m)[DEDUPE_HEADER].decode() for m in msgs)
    rows = asyncio.run(_fetch(dsn, f'SELECT partition, "offset", epoch, key, value, '
                                   "relayed_to, relayed_partition, relayed_offset FROM "
                                   f'"{schema}".quarantine WHERE group_id = $1', group))
    expected = {f"{group}/{topic}/{r['partition']}/{r['offset']}@{r['epoch']}" for r in rows}
    assert set(ids) == expected                              # none lost, none foreign
    assert len(msgs) == len(expected) + 10                   # the unmarked flush, twice
    assert sorted(ids.values()).count(2) == 10
    by_place = {(m.partition(), m.offset()): m for m in msgs}
    for r in rows:  # each row marked with where a copy of it landed
        assert r["relayed_to"] == dlq
        m = by_place[(r["relayed_partition"], r["relayed_offset"])]
        h = _headers(m)
        assert h[DEDUPE_HEADER].decode() == f"{group}/{topic}/{r['partition']}/{r['offset']}" \
                                            f"@{r['epoch']}"
        assert (m.key(), m.value()) == (r["key"], r["value"])
        assert h["origin"] == b"test"
        assert h["__connect.errors.topic"] == topic.encode()
        assert h["__connect.errors.partition"] == str(r["partition"]).encode()
        assert h["__connect.errors.offset"] == str(r["offset"]).encode()
        assert struct.unpack(">q", h["kafka_dlt-original-offset"])[0] == r["offset"]
        assert struct.unpack(">i", h["kafka_dlt-original-partition"])[0] == r["partition"]
        assert h["fenceworker.dlq.reason"] == b"table sink: missing required column amount"
        assert h["fenceworker.dlq.attempts"] == b"1"
        ts = stamps[r["offset"] * PARTITIONS + r["partition"]]
        assert ts is not None and m.timestamp()[1] == ts
        assert struct.unpack(">q", h["kafka_dlt-original-timestamp"])[0] == ts
    # replay and purge work on relayed rows
    asyncio.run(_fetch(dsn, f'ALTER TABLE "{schema}".t ALTER amount DROP NOT NULL'))
    env_q = {**os.environ, "FENCE_DSN": dsn, "PYTHONPATH": str(ROOT)}
    replay = subprocess.run([*FENCECTL, "quarantine", "replay", "--group", group, "--schema",
                             schema], cwd=ROOT, env=env_q, capture_output=True, text=True,
                            timeout=120)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert f"replay: {COUNT // 10} applied" in replay.stdout
    purge = subprocess.run([*FENCECTL, "quarantine", "purge", "--group", group, "--schema",
                            schema, "--before", "2999-01-01T00:00:00Z"], cwd=ROOT, env=env_q,
                           capture_output=True, text=True, timeout=60)
    assert purge.returncode == 0, purge.stderr
    left = asyncio.run(_fetch(dsn, f'SELECT count(*) FROM "{schema}".quarantine'))[0][0]
    assert left == 0
    again = _relay("--group", group, "--topic", dlq, env=env)  # nothing left to relay
    assert again.returncode == 0 and f"relay: 0 row(s) of group {group}" in again.stdout


def test_relay_runs_with_its_grant_only(services: Any) -> None:
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    schema, group = asyncio.run(fresh_schema(dsn)), unique("gdlg")
    role = unique("relay")
    rows = 25

    async def prepare() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(
                f'INSERT INTO "{schema}".partitions (group_id, topic, partition, epoch, '
                "frontier, owner) VALUES ($1, 't', 0, 1, $2, 'x')", group, rows)
            await conn.execute(
                f'INSERT INTO "{schema}".quarantine (group_id, topic, partition, "offset", '
                "key, value, reason, epoch) SELECT $1, 't', 0, o, NULL, 'v'::bytea, 'bad', 1 "
                "FROM generate_series(0, $2 - 1) o", group, rows)
            await conn.execute(f"CREATE ROLE \"{role}\" LOGIN PASSWORD 'pw'")
            for stmt in grant_relay_sql(schema, role):
                await conn.execute(stmt)
        finally:
            await conn.close()
    asyncio.run(prepare())
    dlq = unique("dlqg")
    create_topic(bootstrap, dlq, 1)
    parts = urlsplit(dsn)
    role_dsn = urlunsplit((parts.scheme, f"{role}:pw@{parts.netloc.rpartition('@')[2]}",
                           parts.path, parts.query, ""))
    done = _relay("--group", group, "--topic", dlq, env={
        "FENCE_DSN": role_dsn, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "FENCE_SCHEMA": schema})
    assert done.returncode == 0, done.stderr
    assert f"relay: {rows} row(s)" in done.stdout
    assert len(_read_all(bootstrap, dlq, rows)) == rows

    async def cannot_delete() -> None:
        conn = await asyncpg.connect(role_dsn)
        try:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(f'DELETE FROM "{schema}".quarantine')
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(f"UPDATE \"{schema}\".quarantine SET reason = 'x'")
        finally:
            await conn.close()
    asyncio.run(cannot_delete())


@pytest.mark.kafka_faults  # make test-kafka-faults: 20 s and a leader's restart on the cluster
def test_follow_relays_through_a_restart_of_the_partition_leader(services: Any,
                                                                cluster: Any) -> None:
    """``--follow`` while the dead-letter partition's leader is SIGKILLed and restarted: no
    row lost, none twice (the idempotent producer's retries are deduplicated by the
    broker), every row marked."""
    dsn, bootstrap = services.dsn, cluster.bootstrap
    schema, group = asyncio.run(fresh_schema(dsn)), unique("gdlr")
    batches, per = 8, 50

    async def add(first: int) -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(
                f'INSERT INTO "{schema}".partitions (group_id, topic, partition, epoch, '
                "frontier, owner) VALUES ($1, 't', 0, 1, 0, 'x') ON CONFLICT DO NOTHING",
                group)
            await conn.execute(
                f'INSERT INTO "{schema}".quarantine (group_id, topic, partition, "offset", '
                "key, value, reason, epoch) SELECT $1, 't', 0, o, NULL, o::text::bytea, "
                "'bad', 1 FROM generate_series($2::bigint, $3::bigint) o", group, first,
                first + per - 1)
        finally:
            await conn.close()
    dlq = unique("dlqr")
    create_topic(bootstrap, dlq, 1, replication=-1)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FENCE_DSN": dsn,
           "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "FENCE_SCHEMA": schema}
    relay = subprocess.Popen([*FENCECTL, "quarantine", "relay", "--group", group, "--topic",
                              dlq, "--follow", "--interval-s", "0.2", "--batch", "20",
                              "--delivery-timeout-s", "120"], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def marked() -> int:
        return asyncio.run(_fetch(dsn, f'SELECT count(*) FROM "{schema}".quarantine WHERE '
                                       "relayed_at IS NOT NULL"))[0][0]
    try:
        asyncio.run(add(0))
        wait_until(lambda: marked() >= per, timeout_s=60, what="the first rows relayed")
        leader = cluster.leader(dlq, 0)
        for b in range(1, batches):
            asyncio.run(add(b * per))
            if b == 2:
                cluster.kill(leader)          # rows keep coming while it is down
            if b == 5:
                cluster.start(leader)
            time.sleep(0.5)
        wait_until(lambda: marked() == batches * per, timeout_s=180,
                   what="every row relayed and marked")
        relay.send_signal(signal.SIGTERM)
        _out, err = relay.communicate(timeout=60)
        assert relay.returncode == 0, err
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.communicate(timeout=30)
        cluster.start_all()
    msgs = _read_all(bootstrap, dlq, batches * per)
    ids = Counter(_headers(m)[DEDUPE_HEADER].decode() for m in msgs)
    assert set(ids) == {f"{group}/t/0/{o}@1" for o in range(batches * per)}
    assert len(msgs) == batches * per, Counter(ids.values())  # none twice
