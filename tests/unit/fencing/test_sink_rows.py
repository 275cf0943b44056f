"""The table sink's pure half: JSON values -> rows, misfits with their reason, last wins."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from typing import Any

import pytest

from fencing.postgres.sink.order import last_wins
from fencing.postgres.sink.rows import (
    Column,
    Delete,
    Layout,
    Misfit,
    Upsert,
    convert,
    converter,
    supported,
)
from fencing.types import SourceRecord

LAYOUT = Layout((
    Column("id", "text", not_null=True), Column("n", "int4"),
    Column("amount", "numeric", not_null=True), Column("ok", "bool"),
    Column("at", "timestamptz", has_default=True), Column("u", "uuid"),
    Column("tag", "varchar", max_chars=3), Column("doc", "jsonb"),
    Column("payload", "jsonb", not_null=True), Column("kafka_offset", "int8"),
    Column("kafka_key", "text"),
), keys=("id",))


def rec(value: Any, *, key: bytes | None = b"k1", offset: int = 7) -> SourceRecord:
    raw = value if value is None or isinstance(value, bytes) else json.dumps(value).encode()
    return SourceRecord("t", 0, offset, key, raw)


def test_fields_map_to_columns_by_name_and_reserved_columns_come_from_the_record() -> None:
    u = str(uuid.uuid4())
    op = convert(LAYOUT, rec({"id": "a", "n": 5, "amount": 1.5, "ok": True, "u": u, "tag": "ab",
                              "doc": {"x": [1]}, "extra": 1, "kafka_offset": 99}))
    assert isinstance(op, Upsert) and op.key == "a"
    got = dict(zip(op.columns, op.values, strict=True))
    assert got == {"id": "a", "n": 5, "amount": decimal.Decimal("1.5"), "ok": True,
                   "u": uuid.UUID(u), "tag": "ab", "doc": '{"x":[1]}',
                   "payload": json.dumps({"id": "a", "n": 5, "amount": 1.5, "ok": True, "u": u,
                                          "tag": "ab", "doc": {"x": [1]}, "extra": 1,
                                          "kafka_offset": 99}),  # jsonb: the value's own text
                   "kafka_offset": 7, "kafka_key": "k1"}
    assert "at" not in got  # absent with a default: the database's default


def test_a_json_or_text_payload_and_a_value_not_in_utf8_get_the_compact_re_encoding() -> None:
    value = {"id": "a", "amount": 1}
    compact = '{"id":"a","amount":1}'
    for type_name in ("json", "text"):
        op = convert(Layout((Column("payload", type_name),)), rec(value))
        assert isinstance(op, Upsert) and op.values == (compact,), type_name
    for raw in (b"\xef\xbb\xbf" + json.dumps(value).encode(), json.dumps(value).encode("utf-16")):
        op = convert(Layout((Column("payload", "jsonb"),)), rec(raw))  # json.loads reads both
        assert isinstance(op, Upsert) and op.values == (compact,), raw


def test_timestamps_naive_read_as_utc() -> None:
    op = convert(LAYOUT, rec({"id": "a", "amount": 1, "at": "2024-05-01T10:00:00"}))
    assert isinstance(op, Upsert)
    assert dict(zip(op.columns, op.values, strict=True))["at"] == dt.datetime(
        2024, 5, 1, 10, tzinfo=dt.UTC)


@pytest.mark.parametrize(("value", "reason"), [
    (b"{nope", "value is not JSON"),
    (b"\xff", "value is not JSON"),
    ([1], "value is a JSON list, not an object"),
    ({"id": "a"}, "missing required column amount"),
    ({"id": "a", "amount": None}, "column amount is NOT NULL but the value holds null"),
    ({"id": "a", "amount": "x"}, "column amount (numeric): 'x' is not a number"),
    ({"id": "a", "amount": 1, "n": 1.5}, "column n (int4): expected an integer"),
    ({"id": "a", "amount": 1, "n": 2**31}, "column n (int4): 2147483648 is out of range"),
    ({"id": "a", "amount": 1, "n": True}, "column n (int4): expected an integer"),
    ({"id": "a", "amount": 1, "ok": 1}, "column ok (bool): expected true or false"),
    ({"id": "a", "amount": 1, "u": "zz"}, "column u (uuid): 'zz' is not a UUID"),
    ({"id": "a", "amount": 1, "tag": "long"}, "4 characters is too long"),
    ({"id": "a", "amount": 1, "at": "yesterday"}, "column at (timestamptz): 'yesterday'"),
    ({"id": {"a": 1}, "amount": 1}, "column id (text): expected a string"),
])
def test_misfits_name_their_reason(value: Any, reason: str) -> None:
    with pytest.raises(Misfit) as info:
        convert(LAYOUT, rec(value))
    assert reason in str(info.value)


def test_the_key_falls_back_to_the_kafka_key_and_a_tombstone_deletes_it() -> None:
    op = convert(LAYOUT, rec({"amount": 1}, key=b"k9"))
    assert isinstance(op, Upsert) and op.key == "k9"
    assert convert(LAYOUT, rec(None, key=b"k9")) == Delete("k9")
    with pytest.raises(Misfit, match="neither the value nor the Kafka key"):
        convert(LAYOUT, rec(None, key=None))
    with pytest.raises(Misfit, match="not UTF-8"):
        convert(LAYOUT, rec(None, key=b"\xff"))


def test_insert_mode_rejects_tombstones() -> None:
    with pytest.raises(Misfit, match="nothing to insert"):
        convert(Layout((Column("payload", "jsonb"),)), rec(None))


def test_last_wins_keeps_the_last_operation_per_key_in_last_occurrence_order() -> None:
    a1, b1, a2 = Upsert("a", ("id",), ("a",)), Upsert("b", ("id",), ("b",)), Delete("a")
    assert last_wins([a1, b1, a2]) == [b1, a2]
    assert last_wins([a2, b1, a1]) == [b1, a1]


def test_supported_types() -> None:
    assert supported("jsonb") and supported("int8") and not supported("point")


@pytest.mark.parametrize("raw", [b'{"id": "a", "amount": NaN}',
                                 b'{"id": "a", "amount": 1, "doc": {"x": [-Infinity]}}'])
def test_a_non_finite_number_at_any_depth_is_a_misfit_not_a_refusal_later(raw: bytes) -> None:
    with pytest.raises(Misfit, match="value holds a non-finite number"):
        convert(LAYOUT, rec(raw))


def test_reserved_columns_keep_their_checks_where_the_column_is_narrower_than_kafka() -> None:
    narrow = Layout((Column("payload", "jsonb"), Column("kafka_offset", "int4"),
                     Column("kafka_key", "text", not_null=True)))
    with pytest.raises(Misfit, match=r"column kafka_offset \(int4\): 2147483648 is out of range"):
        convert(narrow, rec({"a": 1}, offset=2**31))
    with pytest.raises(Misfit, match="column kafka_key is NOT NULL but the value holds null"):
        convert(narrow, rec({"a": 1}, key=None))
    op = convert(narrow, rec({"a": 1}, offset=5))
    assert op == Upsert(None, ("payload", "kafka_offset", "kafka_key"), ('{"a": 1}', 5, "k1"))
    assert hash(op) == hash(Upsert(None, op.columns, op.values))


TS_LAYOUT = Layout((Column("id", "text", not_null=True),
                    Column("kafka_timestamp", "timestamptz"),
                    Column("kafka_offset", "int8")), keys=("id",))


def test_kafka_timestamp_is_a_utc_datetime_or_milliseconds_for_a_writer_that_converts() -> None:
    r = SourceRecord("t", 0, 7, b"k", b'{"id": "a"}', timestamp_ms=1_700_000_000_123)
    as_datetime = converter(TS_LAYOUT)(r)
    as_ms = converter(TS_LAYOUT, epoch_ms=True)(r)
    assert isinstance(as_datetime, Upsert) and isinstance(as_ms, Upsert)
    assert as_datetime.values == ("a", dt.datetime(2023, 11, 14, 22, 13, 20, 123000,
                                                   tzinfo=dt.UTC), 7)
    assert as_ms.values == ("a", 1_700_000_000_123, 7)
    no_time = SourceRecord("t", 0, 8, b"k", b'{"id": "a"}', timestamp_ms=None)
    assert converter(TS_LAYOUT)(no_time).values[1] is None  # type: ignore[union-attr]
    assert converter(TS_LAYOUT, epoch_ms=True)(no_time).values[1] is None  # type: ignore[union-attr]


@pytest.mark.parametrize("ms", [10**16, -10**16, 253_402_300_800_000])  # the last: year 10000
def test_a_kafka_timestamp_past_pythons_datetime_is_a_misfit_unless_sql_converts_it(
        ms: int) -> None:
    r = SourceRecord("t", 0, 7, b"k", b'{"id": "a"}', timestamp_ms=ms)
    with pytest.raises(Misfit, match=rf"kafka_timestamp: Kafka timestamp {ms} ms is out of"):
        converter(TS_LAYOUT)(r)
    assert converter(TS_LAYOUT, epoch_ms=True)(r).values[1] == ms  # type: ignore[union-attr]


@pytest.mark.parametrize("epoch_ms", [False, True])
@pytest.mark.parametrize("partition_type,offset_type,ts_type,ts_not_null", [
    ("int4", "int8", "timestamptz", False), ("int8", "int8", "timestamptz", True),
    ("int2", "int4", "timestamp", False), ("int4", "int8", "timestamp", True)])
def test_the_row_reads_record_attributes_inline_exactly_as_the_reserved_fills(
        epoch_ms: bool, partition_type: str, offset_type: str, ts_type: str,
        ts_not_null: bool) -> None:
    """The generated row (``rows._row``) reads a reserved column inline only where its fill
    returns the record's attribute unchanged; every other column keeps its checks."""
    from fencing.postgres.sink.rows import _fill, _no_key

    layout = Layout((Column("id", "text", not_null=True), Column("kafka_topic", "text"),
                     Column("kafka_partition", partition_type),
                     Column("kafka_offset", offset_type),
                     Column("kafka_timestamp", ts_type, not_null=ts_not_null),
                     Column("n", "int8")), keys=("id",))
    convert_one = converter(layout, epoch_ms=epoch_ms)
    for timestamp_ms in (1_700_000_000_123, None):
        r = SourceRecord("topic", 3, 9, b"k", b'{"id": "a", "n": 4}', timestamp_ms=timestamp_ms)
        fills = [_fill(c, layout, epoch_ms, _no_key) for c in layout.columns]
        try:
            expected: Any = tuple(f(r, {"id": "a", "n": 4}, '{"id": "a", "n": 4}')
                                  for f in fills)
        except Misfit as exc:
            expected = str(exc)
        try:
            got: Any = convert_one(r).values  # type: ignore[union-attr]
        except Misfit as exc:
            got = str(exc)
        assert got == expected
    if ts_not_null:
        no_time = SourceRecord("topic", 3, 9, b"k", b'{"id": "a"}', timestamp_ms=None)
        with pytest.raises(Misfit, match="kafka_timestamp is NOT NULL"):
            convert_one(no_time)


@pytest.mark.parametrize("column,value,reason", [
    (Column("v", "int2"), 2**15, r"column v \(int2\): 32768 is out of range"),
    (Column("v", "int8"), True, r"column v \(int8\): expected an integer, got true"),
    (Column("v", "text"), "a\x00b", "column v: text cannot hold a NUL character"),
    (Column("v", "varchar", max_chars=2), "abc", r"column v \(varchar\(2\)\): 3 characters"),
    (Column("v", "text", not_null=True), None, "column v is NOT NULL but the value holds null"),
])
def test_a_fields_inline_common_case_keeps_every_check(column: Column, value: Any,
                                                      reason: str) -> None:
    layout = Layout((Column("id", "text", not_null=True), column), keys=("id",))
    with pytest.raises(Misfit, match=reason):
        convert(layout, rec({"id": "a", "v": value}))
    inline = {"int2": 2**15 - 1, "int8": -(2**63), "text": "ab", "varchar": "ab"}
    op = convert(layout, rec({"id": "a", "v": inline[column.type_name]}))
    assert op.values == ("a", inline[column.type_name])  # type: ignore[union-attr]
