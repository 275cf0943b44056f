"""``--sink-evolve add-columns`` against real Kafka, PostgreSQL and the schema registry, and
the count of ignored fields without it.

- PostgreSQL's answer to two sessions adding one column at once is pinned: the second
  ``ADD COLUMN IF NOT EXISTS`` waits for the first's lock, then skips (no error); without
  ``IF NOT EXISTS`` it fails with ``duplicate_column`` after the same wait.
- Avro v1 -> v2 -> v3 mid-stream, insert mode (a record applied twice shows as a duplicate
  row), the worker running as a least-privilege role and the columns added over
  ``FENCE_DDL_DSN`` (the table's owner): the first member is SIGKILLed right after its
  ALTER (crash point ``sink-after-alter``), before the batch commits; the next member
  writes v2's records with the column; v3's new column is added while a proxy cuts the
  COMMIT of the retried batch after PostgreSQL committed it (its reply lost); v4 changes a
  field's type: those records are quarantined naming the field. The table must hold every
  record exactly once, the new columns filled from their version on.
- JSON with two members meeting new fields at once: both evolve (each logs the retry) and
  the table gets one column per field, typed from the values.
- A routed table made by its topic's first batch gets the new columns in that batch.
- Without the flag: the fields are ignored and counted (the metric and
  ``fencectl status``).

``make test`` runs each group-involved test under one protocol; ``make sink-evolve``
(``FENCE_SINK_EVOLUTION=full``) every protocol ``FENCE_SINK_EVOLUTION_REPEAT`` times
(default 5).
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from fencing.postgres.schema import grant_worker_sql
from fencing.testing.pgproxy import Action
from ops.reference.generate import GeneratedRecord
from tests.integration.observability_support import free_port, http_get, metric, run_fencectl
from tests.integration.registry_support import avro
from tests.integration.workers import (
    GROUP_SETUPS,
    GroupSetup,
    ProxyThread,
    WorkerProc,
    committed_total,
    create_topic,
    fresh_schema,
    produce,
    stop_live,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration

PARTITIONS = 4
V1 = {"type": "record", "name": "Item", "namespace": "evolve", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"}]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "note", "type": ["null", "string"],
                                       "default": None}]}
V3 = {**V2, "fields": [*V2["fields"], {"name": "qty", "type": "long", "default": 0}]}
V4 = {**V3, "fields": [*V2["fields"], {"name": "qty", "type": "string", "default": ""}]}


def _cases() -> list[Any]:
    if os.environ.get("FENCE_SINK_EVOLUTION") == "full":
        repeat = int(os.environ.get("FENCE_SINK_EVOLUTION_REPEAT", "5"))
        return [pytest.param(s, id=f"{s.name}-{n}") for s in GROUP_SETUPS
                for n in range(1, repeat + 1)]
    return [pytest.param(s, id=s.name) for s in GROUP_SETUPS]


async def _sql(dsn: str, *statements: str) -> list[Any]:
    conn = await asyncpg.connect(dsn)
    try:
        out = []
        for s in statements:
            out.append(await conn.fetch(s))
        return out
    finally:
        await conn.close()


@pytest.fixture
def worker_role(services: Any) -> Iterator[tuple[str, str]]:
    """A least-privilege login role (its name and DSN): no DDL right on any table."""
    role, password = f"fence_w_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex

    async def create() -> bool:
        conn = await asyncpg.connect(services.dsn)
        try:
            if not await conn.fetchval("SELECT rolsuper OR rolcreaterole FROM pg_roles "
                                       "WHERE rolname = current_user"):
                return False
            await conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
            return True
        finally:
            await conn.close()
    if not asyncio.run(create()):
        pytest.skip("the FENCE_DSN user may not CREATE ROLE (give it CREATEROLE to run this)")
    parts = urlsplit(services.dsn)
    dsn = urlunsplit((parts.scheme, f"{role}:{password}@{parts.netloc.rpartition('@')[2]}",
                      parts.path, parts.query, ""))
    yield role, dsn


async def _table_for(admin_dsn: str, role: str, schema: str, table: str) -> None:
    """``table`` (owned by the admin) and the worker ``role``'s grants on the schema."""
    await _sql(admin_dsn,
               f'CREATE TABLE "{schema}"."{table}" (id bigint NOT NULL, name text NOT NULL, '
               "kafka_partition int, kafka_offset bigint)",
               *grant_worker_sql(schema, role),
               f'GRANT SELECT, INSERT, UPDATE, DELETE ON "{schema}"."{table}" TO {role}')


def _rows(dsn: str, schema: str, table: str) -> list[dict[str, Any]]:
    got = asyncio.run(_sql(dsn, f'SELECT * FROM "{schema}"."{table}"'))[0]
    return [dict(r) for r in got]


def _columns(dsn: str, schema: str, table: str) -> dict[str, str]:
    got = asyncio.run(_sql(dsn, "SELECT attname::text AS n, format_type(atttypid, atttypmod) "
                                f"AS t FROM pg_attribute WHERE attrelid = "
                                f"'\"{schema}\".\"{table}\"'::regclass AND attnum > 0 "
                                "AND NOT attisdropped"))[0]
    return {r["n"]: r["t"] for r in got}


def test_two_sessions_adding_one_column_the_second_waits_then_skips(services: Any) -> None:
    """What makes two members adding one column both succeed (``evolving`` relies on it)."""
    schema = asyncio.run(fresh_schema(services.dsn))

    async def run() -> tuple[list[str], bool, type[BaseException] | None]:
        a = await asyncpg.connect(services.dsn)
        b = await asyncpg.connect(services.dsn)
        notices: list[str] = []
        b.add_log_listener(lambda _c, msg: notices.append(str(msg)))
        try:
            await a.execute(f'CREATE TABLE "{schema}".t (id int)')
            for if_not_exists in (True, False):
                col = "x" if if_not_exists else "y"
                clause = "IF NOT EXISTS " if if_not_exists else ""
                tx = a.transaction()
                await tx.start()
                await a.execute(f'ALTER TABLE "{schema}".t ADD COLUMN {col} bigint')
                second = asyncio.ensure_future(b.execute(
                    f'ALTER TABLE "{schema}".t ADD COLUMN {clause}{col} bigint'))
                await asyncio.sleep(0.5)
                waiting = await a.fetchval(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted AND pid = $1",
                    b.get_server_pid())
                assert waiting == 1 and not second.done()  # a lock wait, no early error
                await tx.commit()
                if if_not_exists:
                    await second
                    skipped = any("already exists, skipping" in n for n in notices)
                else:
                    with pytest.raises(asyncpg.DuplicateColumnError) as raised:
                        await second
                    failed: type[BaseException] | None = type(raised.value)
            names = [r[0] for r in await a.fetch(
                f"SELECT attname::text FROM pg_attribute WHERE attrelid = "
                f"'\"{schema}\".t'::regclass AND attnum > 0")]
            return names, skipped, failed
        finally:
            await a.close()
            await b.close()
    names, skipped, failed = asyncio.run(run())
    assert names == ["id", "x", "y"] and skipped
    assert failed is asyncpg.DuplicateColumnError  # 42701: taken as done by the sink


def _item(topic: str, p: int, i: int, encode: Any, **extra: Any) -> GeneratedRecord:
    return GeneratedRecord(topic, p, str(i).encode(),
                           encode({"id": i, "name": f"n{i}", **extra}))


@pytest.mark.parametrize("setup", _cases())
def test_avro_v1_to_v2_mid_stream_under_a_kill_after_the_alter_and_a_lost_commit(
        services: Any, worker_role: tuple[str, str], setup: GroupSetup,
        tmp_path: Path) -> None:
    bootstrap, admin = services.kafka_bootstrap, services.dsn
    registry = services.schema_registry_url
    role, worker_dsn = worker_role
    topic, group, table = unique("evo"), unique("gevo"), "items"
    schema = asyncio.run(fresh_schema(admin))
    asyncio.run(_table_for(admin, role, schema, table))
    create_topic(bootstrap, topic, PARTITIONS)
    v1, v2, v3, v4 = (avro(registry, topic, json.dumps(v)) for v in (V1, V2, V3, V4))
    proxy = ProxyThread(worker_dsn)
    marker = tmp_path / "crash.jsonl"
    procs: list[WorkerProc] = []

    port = free_port()

    def start(name: str, **env: str) -> WorkerProc:
        w = WorkerProc(topic=topic, group=group, schema=schema, setup=setup, name=name,
                       env={"FENCE_DSN": proxy.dsn, "FENCE_DDL_DSN": admin,
                            "SCHEMA_REGISTRY_URL": registry, **env},
                       extra=("--sink", f"table={schema}.{table}", "--sink-format", "avro",
                              "--sink-evolve", "add-columns", "--batch-max-records", "50",
                              "--http-port", str(port)))
        procs.append(w)
        return w

    def committed(n: int) -> None:
        wait_until(lambda: committed_total(admin, schema, group, topic) >= n,
                   timeout_s=120, what=f"{n} records committed")

    try:
        produce(bootstrap, [_item(topic, i % PARTITIONS, i, v1) for i in range(200)])
        w1 = start("w1", FENCE_CRASH_AT="sink-after-alter", FENCE_CRASH_MARKER=str(marker))
        committed(200)
        produce(bootstrap, [_item(topic, i % PARTITIONS, i, v2, note=f"t{i}")
                            for i in range(200, 400)])
        assert w1.wait(60) == -9, w1.log()[-3000:]            # killed right after its ALTER
        assert "note" in _columns(admin, schema, table)       # the ALTER committed ...
        assert committed_total(admin, schema, group, topic) == 200  # ... the batch did not
        start("w2")
        committed(400)
        # the retried batch's COMMIT (exact: a statement that merely holds the word is not it)
        rule = proxy.add_rule("COMMIT", Action.CUT_AFTER, times=1, exact=True)
        produce(bootstrap, [_item(topic, 0, i, v3, note=None, qty=i) for i in range(400, 450)])
        wait_until(lambda: rule.count >= 1, timeout_s=60, what="the COMMIT cut")
        committed(450)
        # the cut COMMIT was a batch's: the retried one, partition 0's first since its
        # records came, whose first attempt rolled back. PostgreSQL committed it before the
        # cut, so the worker resolves its outcome after the frontier already shows it

        def unknown_outcomes() -> float:
            got = http_get(f"http://127.0.0.1:{port}/metrics")
            return -1.0 if got is None else metric(got[1], "fence_unknown_outcomes_total",
                                                   operation="process")
        wait_until(lambda: unknown_outcomes() >= 1, timeout_s=60, what="the outcome resolved")
        assert unknown_outcomes() == 1
        produce(bootstrap, [_item(topic, 1, i, v4, note=None, qty=f"q{i}")
                            for i in range(450, 460)])
        committed(460)
        stop_live(procs)
    finally:
        for w in procs:
            w.ensure_dead()
        proxy.close()
    assert json.loads(marker.read_text().splitlines()[0])["point"] == "sink-after-alter"
    columns = _columns(admin, schema, table)
    assert columns["note"] == "text" and columns["qty"] == "bigint", columns
    rows = _rows(admin, schema, table)
    by_id = {r["id"]: r for r in rows}
    assert len(rows) == len(by_id) == 450, (len(rows), len(by_id))  # once each, v4's not
    assert all(by_id[i]["note"] is None for i in range(200))
    assert all(by_id[i]["note"] == f"t{i}" for i in range(200, 400))
    assert all(by_id[i]["qty"] == i for i in range(400, 450))
    assert all(by_id[i]["qty"] is None for i in range(400))
    quarantined = asyncio.run(_sql(admin, f'SELECT "offset", reason FROM "{schema}".quarantine '
                                          f"WHERE group_id = '{group}'"))[0]
    assert len(quarantined) == 10, quarantined
    assert all("column qty" in r["reason"] for r in quarantined), quarantined[0]["reason"]
    assert not any("lifetime ends" in w.log() for w in procs)
    assert any("gained column(s) qty" in w.log() for w in procs)


def _json(topic: str, p: int, i: int, **extra: Any) -> GeneratedRecord:
    return GeneratedRecord(topic, p, str(i).encode(),
                           json.dumps({"id": i, "name": f"n{i}", **extra}).encode())


@pytest.mark.parametrize("setup", _cases())
def test_json_two_members_meeting_new_fields_at_once_both_evolve(
        services: Any, worker_role: tuple[str, str], setup: GroupSetup) -> None:
    bootstrap, admin = services.kafka_bootstrap, services.dsn
    role, worker_dsn = worker_role
    topic, group, table = unique("evoj"), unique("gevoj"), "items"
    schema = asyncio.run(fresh_schema(admin))
    asyncio.run(_table_for(admin, role, schema, table))
    create_topic(bootstrap, topic, PARTITIONS)
    procs = [WorkerProc(topic=topic, group=group, schema=schema, setup=setup, name=name,
                        env={"FENCE_DSN": worker_dsn, "FENCE_DDL_DSN": admin,
                             "FENCE_SINK_EVOLVE": "add-columns"},
                        extra=("--sink", f"table={schema}.{table}")) for name in ("w1", "w2")]
    try:
        # both own partitions before v1, so each writes v1 rows and holds the table's v1
        # layout when v2's fields arrive (a member whose first batch came after the other's
        # ALTER would read the new layout and never meet the fields without columns)
        wait_until(lambda: all(w.owns_partitions() for w in procs), timeout_s=90,
                   what="both members owning partitions")
        produce(bootstrap, [_json(topic, i % PARTITIONS, i) for i in range(100)])
        wait_until(lambda: committed_total(admin, schema, group, topic) >= 100, timeout_s=120,
                   what="v1 committed")
        produce(bootstrap, [_json(topic, i % PARTITIONS, i, note=f"t{i}", score=i / 4,
                                  tags=["a"]) for i in range(100, 300)])
        wait_until(lambda: committed_total(admin, schema, group, topic) >= 300, timeout_s=120,
                   what="v2 committed")
        for w in procs:
            w.terminate()
        for w in procs:
            assert w.wait(30) == 0, w.log()[-3000:]
    finally:
        for w in procs:
            w.ensure_dead()
    columns = _columns(admin, schema, table)
    assert (columns["note"], columns["score"], columns["tags"]) == ("text", "numeric",
                                                                     "jsonb"), columns
    rows = {r["id"]: r for r in _rows(admin, schema, table)}
    assert len(rows) == 300 and len(_rows(admin, schema, table)) == 300
    assert all(rows[i]["note"] == f"t{i}" and float(rows[i]["score"]) == i / 4
               and json.loads(rows[i]["tags"]) == ["a"] for i in range(100, 300))
    assert all(rows[i]["note"] is None for i in range(100))
    for w in procs:  # both met the fields before they had columns, both wrote after
        assert "gained column(s)" in w.log(), w.log()[-3000:]


@pytest.mark.parametrize("setup", _cases())
def test_without_the_flag_unknown_fields_are_ignored_and_counted(
        services: Any, setup: GroupSetup) -> None:
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    topic, group, table = unique("evon"), unique("gevon"), "items"
    schema = asyncio.run(fresh_schema(dsn))
    asyncio.run(_sql(dsn, f'CREATE TABLE "{schema}"."{table}" (id bigint NOT NULL, name text '
                          "NOT NULL, kafka_partition int, kafka_offset bigint)"))
    create_topic(bootstrap, topic, 2)
    port = free_port()
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=setup, name="w",
                   env={"FENCE_DSN": dsn, "FENCE_SINK_EVOLVE": ""},
                   extra=("--sink", f"table={schema}.{table}", "--http-port", str(port),
                          "--heartbeat-interval-s", "1"))
    name = f"{schema}.{table}"

    def unknown() -> float:
        got = http_get(f"http://127.0.0.1:{port}/metrics")
        return -1.0 if got is None else metric(got[1], "fence_sink_unknown_fields_total",
                                               table=name)

    try:
        produce(bootstrap, [_json(topic, i % 2, i) for i in range(50)])
        wait_until(lambda: committed_total(dsn, schema, group, topic) >= 50, timeout_s=120,
                   what="v1 committed")
        assert unknown() == 0  # exported from the table's first batch on
        produce(bootstrap, [_json(topic, i % 2, i, color="red") for i in range(50, 80)])
        wait_until(lambda: committed_total(dsn, schema, group, topic) >= 80, timeout_s=120,
                   what="v2 committed")
        assert unknown() == 30
        env = {"FENCE_DSN": dsn, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}

        def status() -> dict[str, Any]:
            got = run_fencectl("status", "--group", group, "--schema", schema, "--json",
                               env=env)
            assert got.returncode == 0, got.stderr
            return dict(json.loads(got.stdout))
        wait_until(lambda: any(m["sink_unknown_fields"] for m in status()["members"]),
                   timeout_s=30, what="the count in a member row")
        member = next(m for m in status()["members"] if m["sink_unknown_fields"])
        assert member["sink_unknown_fields"] == {name: {"records": 30, "fields": ["color"]}}
        text = run_fencectl("status", "--group", group, "--schema", schema, env=env).stdout
        assert f"{name}: 30 records held fields with no column, ignored: color" in text
        w.terminate()
        assert w.wait(30) == 0, w.log()[-3000:]
    finally:
        w.ensure_dead()
    assert "color" not in _columns(dsn, schema, table)
    assert len(_rows(dsn, schema, table)) == 80


@pytest.mark.parametrize("setup", _cases())
def test_a_routed_table_made_by_its_first_batch_gets_the_new_columns_in_that_batch(
        services: Any, setup: GroupSetup) -> None:
    """A topic known only by ``--topic-pattern``: its table is created inside its first
    batch's transaction, invisible to the DDL connection; the columns come in the same
    transaction when the batch is written again."""
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    prefix, group = unique("evor"), unique("gevor")
    topic = f"{prefix}-a"
    schema = asyncio.run(fresh_schema(dsn))
    create_topic(bootstrap, topic, 2)
    produce(bootstrap, [_json(topic, i % 2, i, note=f"t{i}") for i in range(40)])
    w = WorkerProc(topic=None, group=group, schema=schema, setup=setup, name="w",
                   env={"FENCE_DSN": dsn, "FENCE_DDL_DSN": dsn},
                   extra=("--topic-pattern", f"{prefix}-.*", "--sink", f"table={schema}.{{topic}}",
                          "--sink-key", "id", "--sink-evolve", "add-columns"))
    try:
        wait_until(lambda: committed_total(dsn, schema, group, topic) >= 40, timeout_s=120,
                   what="committed")
        w.terminate()
        assert w.wait(30) == 0, w.log()[-3000:]
    finally:
        w.ensure_dead()
    columns = _columns(dsn, schema, topic)
    assert (columns["id"], columns["name"], columns["note"]) == ("text", "text", "text")
    rows = {r["id"]: r for r in _rows(dsn, schema, topic)}
    assert len(rows) == 40 and all(rows[str(i)]["note"] == f"t{i}" for i in range(40))
    assert "created table" in w.log() and "gained column(s)" in w.log()


def test_an_unreachable_ddl_connection_stops_the_start_with_exit_2(services: Any) -> None:
    topic = unique("evox")
    create_topic(services.kafka_bootstrap, topic, 1)
    schema = asyncio.run(fresh_schema(services.dsn))
    got = run_fencectl("run", "--topic", topic, "--group", unique("gevox"), "--schema", schema,
                       "--sink", f"table={schema}.items", "--sink-evolve", "add-columns",
                       env={"FENCE_DSN": services.dsn,
                            "KAFKA_BOOTSTRAP_SERVERS": services.kafka_bootstrap,
                            "FENCE_DDL_DSN": "postgresql://owner:s3cret@127.0.0.1:1/app"})
    assert got.returncode == 2, got.stderr[-2000:]
    assert "FENCE_DDL_DSN (--sink-evolve add-columns): cannot connect" in got.stderr
    assert "s3cret" not in got.stderr + got.stdout
