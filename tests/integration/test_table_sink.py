"""The table sink against real PostgreSQL, through the fence store: created on first start,
validated when present, JSON mapped to columns, upsert (last wins, tombstone deletes) or
insert, misfits and database refusals quarantined with their reason, both write methods."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import asyncpg
import pytest

from fencing.errors import ConfigError
from fencing.postgres.sink import Method, SinkSpec, ensure_table
from fencing.postgres.sink.keys import Format
from fencing.types import SourceRecord
from tests.integration.sink_support import SINK_TP, apply, fetch, write_path  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("write_path")]

TP = SINK_TP


def rec(offset: int, value: Any, key: str | None = None) -> SourceRecord:
    raw = None if value is None else (value if isinstance(value, bytes)
                                      else json.dumps(value).encode())
    return SourceRecord(TP.topic, TP.partition, offset, None if key is None else key.encode(),
                        raw, timestamp_ms=1_700_000_000_000 + offset)


@pytest.mark.parametrize("method", list(Method))
async def test_created_table_upsert_last_wins_and_tombstone_deletes(
        pg_dsn: str, schema: str, method: Method) -> None:
    spec = SinkSpec(f"{schema}.orders", keys=("id",), method=method)
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
    spec = SinkSpec(f"{schema}.t", keys=("id",), method=method)
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


@pytest.mark.parametrize("method", list(Method))
async def test_enum_and_bit_columns_take_their_labels_and_lengths_only(
        pg_dsn: str, schema: str, method: Method) -> None:
    """An enum type of the table (and an array of it), bit(n) and varbit(n): written from
    JSON; a label the type lacks and a bit string of another length are quarantined with
    the reason, the rest of the batch written."""
    await fetch(pg_dsn, f'CREATE TYPE "{schema}".mood AS ENUM (\'sad\', \'ok\', \'happy\')')
    await fetch(pg_dsn, f'CREATE TABLE "{schema}".e (id int PRIMARY KEY, m "{schema}".mood, '
                        f'ms "{schema}".mood[], b bit(4), v varbit(6))')
    spec = SinkSpec(f"{schema}.e", keys=("id",), method=method)
    quarantined = await apply(pg_dsn, schema, spec, [
        rec(0, {"id": 1, "m": "ok", "ms": ["sad", None], "b": "1010", "v": "11"}),
        rec(1, {"id": 2, "m": "glad"}),                    # not a label
        rec(2, {"id": 3, "b": "101"}),                     # bit(4) holds exactly 4
        rec(3, {"id": 4, "v": "1111111"}),                 # varbit(6) at most 6
        rec(4, {"id": 5, "ms": ["happy", "meh"]}),
        rec(5, {"id": 1, "m": "happy", "b": "0001", "v": ""}),
    ])
    assert await fetch(pg_dsn, f'SELECT id, m::text, ms::text, b::text, v::text '
                               f'FROM "{schema}".e ORDER BY id') == [
        (1, "happy", None, "0001", "")]
    assert sorted(quarantined) == [1, 2, 3, 4]
    assert 'column m (mood): "glad" is not one of its labels (sad, ok, happy)' in quarantined[1]
    assert "column b (bit(4)): 3 bits do not fit" in quarantined[2]
    assert "column v (varbit(6)): 7 bits do not fit" in quarantined[3]
    assert '"meh" is not one of its labels' in quarantined[4]


@pytest.mark.parametrize("method", list(Method))
async def test_interval_inet_cidr_xml_oid_columns_and_one_the_sink_cannot_write(
        pg_dsn: str, schema: str, method: Method, caplog: pytest.LogCaptureFixture) -> None:
    """interval (an ISO-8601 duration), inet, cidr, xml and oid written from JSON, arrays of
    them too; a duration with months and a network with host bits are quarantined with the
    reason; a macaddr column (no binary encoder in asyncpg) keeps its default, its field
    is ignored, and a WARNING names it."""
    await fetch(pg_dsn, f'CREATE TABLE "{schema}".n (id int PRIMARY KEY, d interval, '
                        f'ds interval[], a inet, c cidr, x xml, o oid, '
                        f"m macaddr DEFAULT '00:00:00:00:00:01')")
    spec = SinkSpec(f"{schema}.n", keys=("id",), method=method)
    with caplog.at_level("WARNING", logger="fenceworker.sink"):
        quarantined = await apply(pg_dsn, schema, spec, [
            rec(0, {"id": 1, "d": "P1DT2H3.5S", "ds": ["PT1M", None], "a": "10.0.0.1/8",
                    "c": "10.0.0.0/8", "x": "<a/>", "o": 7, "m": "08:00:2b:01:02:03"}),
            rec(1, {"id": 2, "d": "P1M"}),                       # a month: no fixed length
            rec(2, {"id": 3, "c": "10.0.0.1/8"}),                # host bits right of /8
            rec(3, {"id": 4, "a": "::1", "d": "-PT1S"}),         # a sign before P: not ISO
            rec(4, {"id": 5, "a": "::1", "d": "PT-1S", "o": 4_294_967_295}),
        ])
    assert await fetch(pg_dsn, f'SELECT id, d::text, ds::text, a::text, c::text, x::text, o, '
                               f'm::text FROM "{schema}".n ORDER BY id') == [
        (1, "1 day 02:00:03.5", '{00:01:00,NULL}', "10.0.0.1/8", "10.0.0.0/8", "<a/>", 7,
         "00:00:00:00:00:01"),
        (5, "-1 days +23:59:59", None, "::1/128", None, None, 4_294_967_295,  # inet::text:
         "00:00:00:00:00:01")]     # with its mask; the interval equal to -00:00:01
    assert sorted(quarantined) == [1, 2, 3]
    assert "column d (interval): P1M has years or months" in quarantined[1]
    assert "column c (cidr): \"10.0.0.1/8\" is not a network" in quarantined[2]
    assert "column d (interval): expected an ISO-8601 duration" in quarantined[3]
    assert [r.getMessage() for r in caplog.records if "macaddr" in r.getMessage()] == [
        f"table sink: column m of {schema}.n has type macaddr, which the sink cannot write: "
        "it keeps its default, and a field named m is ignored"]


async def test_insert_mode_created_table_keeps_every_record(pg_dsn: str, schema: str) -> None:
    spec = SinkSpec(f"{schema}.events")
    quarantined = await apply(pg_dsn, schema, spec, [
        rec(0, {"a": 1}, key="k"), rec(1, {"a": 1}), rec(2, None, key="k")])
    assert await fetch(pg_dsn, f'SELECT kafka_offset, kafka_key, payload::text FROM '
                               f'"{schema}".events ORDER BY kafka_offset') == [
        (0, "k", '{"a": 1}'), (1, None, '{"a": 1}')]
    assert list(quarantined) == [2]


@pytest.mark.parametrize(("ddl", "key", "problem"), [
    ("(id text, v int)", "id", "key column id has no unique index or primary key on exactly it"),
    ("(id text PRIMARY KEY, v int)", "nope", "key column nope is missing"),
    ("(id text PRIMARY KEY, p point NOT NULL)", "id", "required column p has type point"),
])
async def test_a_table_that_does_not_fit_is_refused_at_start(
        pg_dsn: str, schema: str, ddl: str, key: str, problem: str) -> None:
    await fetch(pg_dsn, f'CREATE TABLE "{schema}".bad {ddl}')
    conn = await asyncpg.connect(pg_dsn)
    try:
        with pytest.raises(ConfigError, match=problem):
            await ensure_table(conn, SinkSpec(f"{schema}.bad", keys=(key,)))
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
    spec = SinkSpec(f"{schema}.ts", keys=(key,) if key else (), method=method)
    quarantined = await apply(pg_dsn, schema, spec, records)
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
    spec = SinkSpec(f"{schema}.far", keys=(key,) if key else (), method=method)
    quarantined = await apply(pg_dsn, schema, spec, records)
    assert await fetch(pg_dsn, f'SELECT kafka_offset, kafka_timestamp FROM "{schema}".far '
                               "ORDER BY kafka_offset") == [
        (0, at_ms(1_700_000_000_000)), (2, at_ms(-62_000_000_000_000))]
    assert list(quarantined) == [1]
    staged = key is not None and method is Method.COPY
    assert ("refused by PostgreSQL [22008]" if staged else "out of the range of Python's "
            "datetime") in quarantined[1]


@pytest.mark.parametrize("method", list(Method))
async def test_a_bigint_key_from_the_kafka_keys_text_deletes_and_fills_rows(
        pg_dsn: str, schema: str, method: Method) -> None:
    """The key column is ``bigint`` and the Kafka key its decimal text: tombstones delete,
    a value without the key field is keyed by the Kafka key, a key that is no integer is
    quarantined with the reason."""
    await fetch(pg_dsn, f'CREATE TABLE "{schema}".acct (id bigint PRIMARY KEY, name text '
                        "NOT NULL, kafka_offset bigint)")
    spec = SinkSpec(f"{schema}.acct", keys=("id",), method=method)
    quarantined = await apply(pg_dsn, schema, spec, [
        rec(0, {"id": 214, "name": "a"}, key="214"), rec(1, {"id": 215, "name": "b"}, key="215"),
        rec(2, {"name": "c"}, key="216"), rec(3, None, key="214"), rec(4, None, key="21x"),
        rec(5, {"id": 217, "name": "d"}, key="217"), rec(6, None, key="999")])
    assert await fetch(pg_dsn, f'SELECT id, name, kafka_offset FROM "{schema}".acct '
                               "ORDER BY id") == [(215, "b", 1), (216, "c", 2), (217, "d", 5)]
    assert quarantined == {4: "table sink: key column id (int8): the key '21x' is not an "
                              "integer"}


@pytest.mark.parametrize("method", list(Method))
async def test_a_composite_key_upserts_and_deletes_with_a_json_kafka_key(
        pg_dsn: str, schema: str, method: Method) -> None:
    await fetch(pg_dsn, f'CREATE TABLE "{schema}".stock (site text, sku bigint, n int, '
                        "PRIMARY KEY (sku, site))")
    spec = SinkSpec(f"{schema}.stock", keys=("site", "sku"), method=method,
                    key_format=Format.JSON)
    quarantined = await apply(pg_dsn, schema, spec, [
        rec(0, {"site": "a", "sku": 1, "n": 1}), rec(1, {"site": "a", "sku": 2, "n": 2}),
        rec(2, {"site": "b", "sku": 1, "n": 3}), rec(3, None, key='{"site": "a", "sku": 1}'),
        rec(4, {"n": 5}, key='{"site": "c", "sku": "9"}'), rec(5, None, key='{"site": "b"}'),
        rec(6, {"site": "a", "sku": 2, "n": 6})])
    assert await fetch(pg_dsn, f'SELECT site, sku, n FROM "{schema}".stock ORDER BY site, '
                               "sku") == [("a", 2, 6), ("b", 1, 3), ("c", 9, 5)]
    assert quarantined == {5: "table sink: key column sku: the Kafka key holds no sku"}


async def test_a_composite_key_needs_a_unique_index_on_exactly_its_columns(
        pg_dsn: str, schema: str) -> None:
    await fetch(pg_dsn, f'CREATE TABLE "{schema}".wide (a text, b text, c text, '
                        "PRIMARY KEY (a, b, c))")
    conn = await asyncpg.connect(pg_dsn)
    try:
        with pytest.raises(ConfigError, match=r"key columns \(a, b\) has no unique index or "
                                              "primary key on exactly them"):
            await ensure_table(conn, SinkSpec(f"{schema}.wide", keys=("a", "b")))
        await conn.execute(f'CREATE UNIQUE INDEX ON "{schema}".wide (b, a) INCLUDE (c)')
        await ensure_table(conn, SinkSpec(f"{schema}.wide", keys=("a", "b")))
    finally:
        await conn.close()


CHECKED = "(id bigint PRIMARY KEY, amount numeric CHECK (amount >= 0), kafka_offset bigint)"


@pytest.mark.parametrize("split", [False, True], ids=["one batch", "two batches"])
@pytest.mark.parametrize("bad_first", [True, False], ids=["refused first", "refused last"])
@pytest.mark.parametrize("method", list(Method))
async def test_every_record_meets_the_tables_checks_in_order_wherever_a_batch_ends(
        pg_dsn: str, schema: str, method: Method, bad_first: bool, split: bool) -> None:
    """A record PostgreSQL refuses (a CHECK) is quarantined even when a later record of its
    key follows in the same batch: the outcome does not depend on where batches end."""
    await fetch(pg_dsn, f'CREATE TABLE "{schema}".chk {CHECKED}')
    amounts = [-1, 5] if bad_first else [5, -1]
    records = [rec(o, {"id": 7, "amount": a}) for o, a in enumerate(amounts)]
    records += [rec(2, {"id": 8, "amount": 1})]
    quarantined = await apply(pg_dsn, schema, SinkSpec(f"{schema}.chk", keys=("id",),
                                                       method=method), records,
                              batches=[records[:1], records[1:]] if split else None)
    bad = 0 if bad_first else 1
    assert list(quarantined) == [bad] and "refused by PostgreSQL [23514]" in quarantined[bad]
    assert await fetch(pg_dsn, f'SELECT id, amount::int, kafka_offset FROM "{schema}".chk '
                               "ORDER BY id") == [(7, 5, 0 if bad else 1), (8, 1, 2)]


@pytest.mark.parametrize("method", list(Method))
async def test_a_keys_upserts_and_deletes_in_one_batch_apply_in_order(
        pg_dsn: str, schema: str, method: Method) -> None:
    """Upsert, delete, upsert, refused upsert, delete of one key and others in between: each
    is applied in order (the table ends as their fold), the refused one quarantined."""
    await fetch(pg_dsn, f'CREATE TABLE "{schema}".seq {CHECKED}')
    ops: list[tuple[int, int | None]] = [(1, 1), (2, 1), (1, None), (1, 3), (2, 2), (1, -4),
                                         (3, 9), (2, None), (3, 8), (1, 6)]
    records = [rec(o, None if a is None else {"id": k, "amount": a}, key=str(k))
               for o, (k, a) in enumerate(ops)]
    quarantined = await apply(pg_dsn, schema, SinkSpec(f"{schema}.seq", keys=("id",),
                                                       method=method), records)
    assert list(quarantined) == [5]
    assert await fetch(pg_dsn, f'SELECT id, amount::int FROM "{schema}".seq ORDER BY id') == [
        (1, 6), (3, 8)]
