"""The table sink's keys: the Kafka key converted to the key columns' types (tombstones and
records whose value lacks the key), composite keys, ``--sink-key-format``, the order of a
batch's operations."""

from __future__ import annotations

import decimal
import json
import uuid
from typing import Any

import pytest

from fencing.postgres.sink.keys import Format, from_object, key_reader
from fencing.postgres.sink.order import sets_then_rest
from fencing.postgres.sink.rows import (
    Column,
    Delete,
    Layout,
    Misfit,
    Upsert,
    converter,
)
from fencing.postgres.sink.values import key_from_text
from fencing.types import SourceRecord

BIGINT = Layout((Column("id", "int8", not_null=True), Column("name", "text"),
                 Column("kafka_offset", "int8")), keys=("id",))


def rec(value: Any, key: bytes | None, offset: int = 3) -> SourceRecord:
    raw = value if value is None or isinstance(value, bytes) else json.dumps(value).encode()
    return SourceRecord("t", 0, offset, key, raw)


def test_a_tombstone_with_a_decimal_text_key_deletes_the_bigint_row() -> None:
    convert = converter(BIGINT)
    assert convert(rec(None, b"214")) == Delete(214)
    assert convert(rec(None, b"-9223372036854775808")) == Delete(-(2**63))
    op = convert(rec({"name": "x"}, b"214"))  # the value lacks the key: the Kafka key's
    assert isinstance(op, Upsert) and op.key == 214 and op.values[0] == 214
    assert convert(rec({"id": 5, "name": "x"}, b"214")).key == 5  # the value's field wins


@pytest.mark.parametrize(("key", "reason"), [
    (b"21.4", "key column id (int8): the key '21.4' is not an integer"),
    (b" 214", "is not an integer"),
    (b"1_000", "is not an integer"),
    (b"9223372036854775808", "column id (int8): 9223372036854775808 is out of range"),
    (b"\xff", "the Kafka key is not UTF-8"),
    (None, "key column id: neither the value nor the Kafka key holds it"),
])
def test_a_key_that_does_not_convert_is_a_misfit_with_the_reason(key: bytes | None,
                                                                  reason: str) -> None:
    with pytest.raises(Misfit) as info:
        converter(BIGINT)(rec(None, key))
    assert reason in str(info.value)


@pytest.mark.parametrize(("type_name", "text", "value"), [
    ("int2", "-7", -7), ("int4", "+12", 12), ("int8", "214", 214),
    ("numeric", "12.50", decimal.Decimal("12.50")),
    ("uuid", "0b6a3c3e-8a1c-4bde-9d37-61ef4f3cb0a2",
     uuid.UUID("0b6a3c3e-8a1c-4bde-9d37-61ef4f3cb0a2")),
    ("text", "214", "214"), ("varchar", "k", "k"), ("float8", "1.5", 1.5),
    ("bool", "true", True),
])
def test_key_from_text_parses_into_the_columns_type(type_name: str, text: str,
                                                    value: Any) -> None:
    assert key_from_text(Column("k", type_name), text) == value


@pytest.mark.parametrize(("type_name", "text"), [
    ("numeric", "NaN"), ("numeric", "x"), ("uuid", "nope"), ("int2", "40000"),
    ("float8", "inf"), ("bool", "maybe"), ("jsonb", "{}"),
])
def test_key_from_text_refuses_what_does_not_parse(type_name: str, text: str) -> None:
    with pytest.raises(Misfit, match="column k"):
        key_from_text(Column("k", type_name), text)


COMPOSITE = Layout((Column("region", "text", not_null=True), Column("id", "int8", not_null=True),
                    Column("v", "int4")), keys=("region", "id"))


def test_a_composite_key_from_the_values_fields_and_from_a_json_kafka_key() -> None:
    convert = converter(COMPOSITE, kafka_key=key_reader(COMPOSITE.key_columns, Format.JSON))
    op = convert(rec({"region": "eu", "id": 7, "v": 1}, None))
    assert isinstance(op, Upsert) and op.key == ("eu", 7)
    assert convert(rec(None, b'{"region": "eu", "id": "7"}')) == Delete(("eu", 7))
    assert convert(rec(None, b'{"id": 7, "region": "us", "x": 1}')) == Delete(("us", 7))
    op = convert(rec({"v": 2}, b'{"region": "eu", "id": 8}'))  # fields absent: the key's
    assert isinstance(op, Upsert) and op.key == ("eu", 8)
    with pytest.raises(Misfit, match="key column id: the Kafka key holds no id"):
        convert(rec(None, b'{"region": "eu"}'))
    with pytest.raises(Misfit, match=r"holds '7', not an object holding the key columns"):
        convert(rec(None, b"7"))
    with pytest.raises(Misfit, match="the Kafka key is not JSON"):
        convert(rec(None, b"eu:7"))


def test_a_composite_key_cannot_come_from_a_string_kafka_key() -> None:
    convert = converter(COMPOSITE)  # the default: --sink-key-format string
    with pytest.raises(Misfit, match="a composite key needs --sink-key-format json"):
        convert(rec(None, b"eu:7"))
    op = convert(rec({"region": "eu", "id": 7}, b"eu:7"))  # the fields are in the value
    assert isinstance(op, Upsert) and op.key == ("eu", 7)


def test_a_json_key_may_be_a_scalar_for_one_key_column() -> None:
    reader = key_reader(BIGINT.key_columns, Format.JSON)
    assert reader(rec(None, b"214")) == (214,)
    assert reader(rec(None, b'"214"')) == (214,)
    assert reader(rec(None, b'{"id": 214}')) == (214,)
    with pytest.raises(Misfit, match=r"column id \(int8\): expected an integer"):
        reader(rec(None, b"true"))


def test_a_schemad_key_is_read_from_what_the_sink_decoded() -> None:
    decoded: dict[int, Any] = {1: {"id": 214}, 2: 215, 3: Misfit("unknown schema id 9")}
    reader = key_reader(BIGINT.key_columns, Format.AVRO, decoded)
    assert reader(rec(None, b"\x00", offset=1)) == (214,)
    assert reader(rec(None, b"\x00", offset=2)) == (215,)
    with pytest.raises(Misfit, match="unknown schema id 9"):
        reader(rec(None, b"\x00", offset=3))
    with pytest.raises(Misfit, match="was not decoded"):
        reader(rec(None, b"\x00", offset=4))


def test_from_object_takes_typed_values_as_they_are() -> None:
    cols = (Column("n", "numeric"), Column("u", "uuid"))
    u = uuid.uuid4()
    assert from_object(cols, {"n": decimal.Decimal("1.10"), "u": u}) == (
        decimal.Decimal("1.10"), u)


def test_sets_then_rest_keep_every_operation_in_order() -> None:
    a1, b1, a2, c1, a3, b2 = (Upsert("a", (), (1,)), Upsert("b", (), (1,)), Delete("a"),
                              Upsert("c", (), (1,)), Upsert("a", (), (3,)), Delete("b"))
    ops: list[Upsert | Delete] = [a1, b1, a2, c1, a3, b2]
    assert sets_then_rest(ops, min_set=1) == ([[a1, b1, c1], [a2, b2], [a3]], [])
    assert sets_then_rest(ops, min_set=2) == ([[a1, b1, c1], [a2, b2]], [a3])
    assert sets_then_rest(ops, min_set=3) == ([[a1, b1, c1]], [a2, a3, b2])  # in order
    assert sets_then_rest([], min_set=1) == ([], [])
    composite: list[Upsert | Delete] = [Upsert(("eu", 1), (), ()), Upsert(("eu", 2), (), ()),
                                        Delete(("eu", 1))]
    assert sets_then_rest(composite, min_set=5) == ([composite[:2]], composite[2:])
