"""The table sink against real PostgreSQL, through the fence store: created on first start,
validated when present, JSON mapped to columns, upsert (last wins, tombstone deletes) or
insert, misfits and database refusals quarantined with their reason, both write methods."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from fencing.errors import ConfigError
from fencing.postgres.schema import migrate
from fencing.postgres.sink import Method, SinkSpec, ensure_table, make_table_sink
from fencing.postgres.store import PgFenceStore
from fencing.types import ClaimRequest, SourceRecord, TopicPartition

pytestmark = pytest.mark.integration

TP = TopicPartition("orders", 0)


@pytest.fixture
async def schema(pg_dsn: str) -> AsyncIterator[str]:
    name = f"sink_t_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(pg_dsn)
    try:
        await migrate(conn, name)
        yield name
    finally:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        await conn.close()


def rec(offset: int, value: Any, key: str | None = None) -> SourceRecord:
    raw = None if value is None else (value if isinstance(value, bytes)
                                      else json.dumps(value).encode())
    return SourceRecord(TP.topic, TP.partition, offset, None if key is None else key.encode(),
                        raw, timestamp_ms=1_700_000_000_000 + offset)


async def apply(dsn: str, schema: str, spec: SinkSpec,
                records: list[SourceRecord]) -> dict[int, str]:
    """Create/validate the table, process ``records`` in one batch; the quarantine reasons."""
    conn = await asyncpg.connect(dsn)
    try:
        await ensure_table(conn, spec)
    finally:
        await conn.close()
    store = await PgFenceStore.connect(dsn, group_id="g", schema=schema, pool_max=2)
    try:
        token = (await store.claim([ClaimRequest(TP, 0)], lifetime="L"))[TP]
        await store.process(TP, token, records, make_table_sink(spec))
    finally:
        await store.close()
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(f'SELECT "offset", reason FROM "{schema}".quarantine')
        return {r["offset"]: r["reason"] for r in rows}
    finally:
        await conn.close()


async def fetch(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    conn = await asyncpg.connect(dsn)
    try:
        return [tuple(r) for r in await conn.fetch(sql)]
    finally:
        await conn.close()


@pytest.mark.parametrize("method", list(Method))
async def test_created_table_upsert_last_wins_and_tombstone_deletes(
        pg_dsn: str, schema: str, method: Method) -> None:
    spec = SinkSpec(f"{schema}.orders", key="id", method=method)
    quarantined = await apply(pg_dsn, schema, spec, [
        rec(0, {"id": "a", "n": 1}), rec(1, {"id": "b", "n": 2}), rec(2, b"{not json"),
        rec(3, {"id": "a", "n": 3}), rec(4, None, key="b"), rec(5, [1, 2]),
        rec(6, {"n": 4}, key="c"), rec(7, None),
    ])
    assert await fetch(pg_dsn, f'SELECT id, payload::text, kafka_offset FROM '
                               f'"{schema}".orders ORDER BY id') == [
        ("a", '{"n": 3, "id": "a"}', 3), ("c", '{"n": 4}', 6)]
    assert set(quarantined) == {2, 5, 7}
    assert quarantined[2].startswith("table sink: value is not JSON")
    assert "not an object" in quarantined[5]
    assert "neither the value nor the Kafka key" in quarantined[7]


@pytest.mark.parametrize("method", list(Method))
async def test_existing_table_columns_by_name_misfits_and_refusals(
        pg_dsn: str, schema: str, method: Method) -> None:
    await fetch(pg_dsn, f'CREATE TABLE "{schema}".t (id bigint PRIMARY KEY, '
                        "amount numeric(8,2) NOT NULL CHECK (amount >= 0), note varchar(5), "
                        "at timestamptz DEFAULT '2000-01-01Z', kafka_offset bigint)")
    spec = SinkSpec(f"{schema}.t", key="id", method=method)
    quarantined = await apply(pg_dsn, schema, spec, [
        rec(0, {"id": 1, "amount": 10.5, "note": "hi", "extra": True}),
        rec(1, {"id": 2}),                                  # missing required column
        rec(2, {"id": 3, "amount": "x"}),                   # type error
        rec(3, {"id": 4, "amount": -1}),                    # CHECK refuses: fallback path
        rec(4, {"id": 5, "amount": 1, "note": "toolong"}),  # too long for varchar(5)
        rec(5, {"id": 1, "amount": 2, "at": "2024-05-01T00:00:00+00:00"}),
        rec(6, {"id": 6, "amount": 7}),
    ])
    assert await fetch(pg_dsn, f'SELECT id, amount::text, note, at::date::text, kafka_offset '
                               f'FROM "{schema}".t ORDER BY id') == [
        (1, "2.00", None, "2024-05-01", 5), (6, "7.00", None, "2000-01-01", 6)]
    assert sorted(quarantined) == [1, 2, 3, 4]
    assert "missing required column amount" in quarantined[1]
    assert "column amount (numeric)" in quarantined[2]
    assert "refused by PostgreSQL [23514]" in quarantined[3]
    assert "too long" in quarantined[4]


async def test_insert_mode_created_table_keeps_every_record(pg_dsn: str, schema: str) -> None:
    spec = SinkSpec(f"{schema}.events")
    quarantined = await apply(pg_dsn, schema, spec, [
        rec(0, {"a": 1}, key="k"), rec(1, {"a": 1}), rec(2, None, key="k")])
    assert await fetch(pg_dsn, f'SELECT kafka_offset, kafka_key, payload::text FROM '
                               f'"{schema}".events ORDER BY kafka_offset') == [
        (0, "k", '{"a": 1}'), (1, None, '{"a": 1}')]
    assert list(quarantined) == [2]


@pytest.mark.parametrize(("ddl", "key", "problem"), [
    ("(id text, v int)", "id", "no single-column unique index"),
    ("(id text PRIMARY KEY, v int)", "nope", "key column nope is missing"),
    ("(id text PRIMARY KEY, p point NOT NULL)", "id", "required column p has type point"),
])
async def test_a_table_that_does_not_fit_is_refused_at_start(
        pg_dsn: str, schema: str, ddl: str, key: str, problem: str) -> None:
    await fetch(pg_dsn, f'CREATE TABLE "{schema}".bad {ddl}')
    conn = await asyncpg.connect(pg_dsn)
    try:
        with pytest.raises(ConfigError, match=problem):
            await ensure_table(conn, SinkSpec(f"{schema}.bad", key=key))
    finally:
        await conn.close()


@pytest.mark.parametrize("method", list(Method))
async def test_insert_mode_refusal_quarantines_only_the_refused_record(
        pg_dsn: str, schema: str, method: Method) -> None:
    await fetch(pg_dsn, f'CREATE TABLE "{schema}".r (n int CHECK (n <> 13), '
                        "kafka_offset bigint UNIQUE)")
    quarantined = await apply(pg_dsn, schema, SinkSpec(f"{schema}.r", method=method),
                              [rec(o, {"n": o + 10}) for o in range(6)])
    assert await fetch(pg_dsn, f'SELECT n FROM "{schema}".r ORDER BY n') == [
        (10,), (11,), (12,), (14,), (15,)]
    assert list(quarantined) == [3] and "refused by PostgreSQL [23514]" in quarantined[3]


def at_ms(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


@pytest.mark.parametrize("refused", [False, True], ids=["fast path", "one at a time"])
@pytest.mark.parametrize("key", ["id", None], ids=["upsert", "insert"])
@pytest.mark.parametrize("method", list(Method))
async def test_kafka_timestamp_is_the_records_instant_on_every_write_path(
        pg_dsn: str, schema: str, method: Method, key: str | None, refused: bool) -> None:
    """The staged upsert sends milliseconds that its SQL converts (``rows.EPOCH_MS``), the
    other writers a ``datetime``; the batch's fast path and the one-record fallback after a
    refusal (the CHECK on ``n``) store the same instant, to the millisecond."""
    await fetch(pg_dsn, f'CREATE TABLE "{schema}".ts (id text{" PRIMARY KEY" if key else ""}, '
                        "n int CHECK (n <> 13), kafka_offset bigint, kafka_timestamp timestamptz)")
    records = [rec(o, {"id": f"d{o}", "n": o + (10 if refused else 0)}) for o in range(5)]
    quarantined = await apply(pg_dsn, schema, SinkSpec(f"{schema}.ts", key=key, method=method),
                              records)
    stored = await fetch(pg_dsn, f'SELECT kafka_offset, kafka_timestamp FROM "{schema}".ts '
                                 "ORDER BY kafka_offset")
    kept = [o for o in range(5) if not (refused and o == 3)]
    assert stored == [(o, at_ms(1_700_000_000_000 + o)) for o in kept]
    assert list(quarantined) == ([3] if refused else [])


@pytest.mark.parametrize("key", ["id", None], ids=["upsert", "insert"])
@pytest.mark.parametrize("method", list(Method))
async def test_a_kafka_timestamp_no_table_can_hold_quarantines_only_its_record(
        pg_dsn: str, schema: str, method: Method, key: str | None) -> None:
    """10**16 ms is past year 300,000: beyond PostgreSQL's timestamptz (refused, SQLSTATE
    22008, on the staged upsert's path) and Python's datetime (a misfit elsewhere)."""
    await fetch(pg_dsn, f'CREATE TABLE "{schema}".far (id text{" PRIMARY KEY" if key else ""}, '
                        "kafka_offset bigint, kafka_timestamp timestamptz)")
    records = [SourceRecord(TP.topic, TP.partition, o, None, json.dumps({"id": f"d{o}"}).encode(),
                            timestamp_ms=ms)
               for o, ms in enumerate([1_700_000_000_000, 10**16, -62_000_000_000_000])]
    quarantined = await apply(pg_dsn, schema, SinkSpec(f"{schema}.far", key=key, method=method),
                              records)
    assert await fetch(pg_dsn, f'SELECT kafka_offset, kafka_timestamp FROM "{schema}".far '
                               "ORDER BY kafka_offset") == [
        (0, at_ms(1_700_000_000_000)), (2, at_ms(-62_000_000_000_000))]
    assert list(quarantined) == [1]
    staged = key is not None and method is Method.COPY
    assert ("refused by PostgreSQL [22008]" if staged else "out of the range of Python's "
            "datetime") in quarantined[1]
