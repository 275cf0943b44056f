"""Tables from writer schemas (Avro, Protobuf, JSON Schema -> columns), the check of a present
table, typed values from the schema'd decoders, Protobuf messages as fields."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, timestamp_pb2, wrappers_pb2
from google.protobuf.message_factory import GetMessageClass

from fencing.postgres.sink.messages import message_fields
from fencing.postgres.sink.rows import Column, Layout, Misfit, Upsert, converter
from fencing.postgres.sink.schemas import (
    Field,
    avro_fields,
    fits,
    json_schema_fields,
    protobuf_fields,
)
from fencing.types import SourceRecord

F = descriptor_pb2.FieldDescriptorProto


def test_avro_types_map_to_columns() -> None:
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "a", "type": "long"}, {"name": "b", "type": ["null", "string"]},
        {"name": "c", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9,
                               "scale": 3}},
        {"name": "d", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "e", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "f", "type": {"type": "enum", "name": "E", "symbols": ["X"]}},
        {"name": "g", "type": "E"}, {"name": "h", "type": {"type": "array", "items": "int"}},
        {"name": "i", "type": {"type": "array", "items": {"type": "map", "values": "int"}}},
        {"name": "j", "type": ["int", "string"]},
        {"name": "k", "type": {"type": "fixed", "name": "Md5", "size": 16}},
        {"name": "l", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "m", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "n", "type": "double"}]}
    assert [(f.name, f.pg_type, f.not_null) for f in avro_fields(schema)] == [
        ("a", "int8", True), ("b", "text", False), ("c", "numeric(9,3)", True),
        ("d", "timestamptz", True), ("e", "timestamp", True), ("f", "text", True),
        ("g", "text", True), ("h", "int4[]", True), ("i", "jsonb", True),
        ("j", "jsonb", True), ("k", "bytea", True), ("l", "time", True), ("m", "uuid", True),
        ("n", "float8", True)]
    assert avro_fields("string") == []


def test_json_schema_types_map_to_columns() -> None:
    schema = {"type": "object", "required": ["a", "b", "f"], "properties": {
        "a": {"type": "integer"}, "b": {"type": ["number", "null"]},
        "c": {"type": "string", "format": "date-time"}, "d": {"type": "object"},
        "e": {"type": "array", "items": {"type": "string"}}, "f": {"type": "boolean"},
        "g": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}}
    assert [(f.name, f.pg_type, f.not_null) for f in json_schema_fields(schema)] == [
        ("a", "int8", True), ("b", "numeric", False), ("c", "timestamptz", False),
        ("d", "jsonb", False), ("e", "text[]", False), ("f", "bool", True),
        ("g", "jsonb", False)]


def _message() -> Any:
    name = f"m{uuid.uuid4().hex[:8]}"
    fdp = descriptor_pb2.FileDescriptorProto(name=f"{name}.proto", package=name,
                                             syntax="proto3")
    fdp.dependency.extend(["google/protobuf/timestamp.proto", "google/protobuf/wrappers.proto"])
    e = fdp.enum_type.add(name="St")
    for i, v in enumerate(["NEW", "PAID"]):
        e.value.add(name=v, number=i)
    m = fdp.message_type.add(name="M")
    for fname, num, ftype, tname, label in [
            ("id", 1, F.TYPE_INT64, "", F.LABEL_OPTIONAL),
            ("at", 2, F.TYPE_MESSAGE, ".google.protobuf.Timestamp", F.LABEL_OPTIONAL),
            ("qty", 3, F.TYPE_MESSAGE, ".google.protobuf.Int32Value", F.LABEL_OPTIONAL),
            ("st", 4, F.TYPE_ENUM, f".{name}.St", F.LABEL_OPTIONAL),
            ("tags", 5, F.TYPE_STRING, "", F.LABEL_REPEATED),
            ("u", 6, F.TYPE_UINT64, "", F.LABEL_OPTIONAL),
            ("raw", 7, F.TYPE_BYTES, "", F.LABEL_OPTIONAL)]:
        f = m.field.add(name=fname, number=num, type=ftype, label=label)
        if tname:
            f.type_name = tname
    _ = (timestamp_pb2, wrappers_pb2)
    pool = descriptor_pool.Default()
    pool.Add(fdp)
    return GetMessageClass(pool.FindMessageTypeByName(f"{name}.M"))


def test_protobuf_fields_and_a_messages_typed_values() -> None:
    cls = _message()
    assert [(f.name, f.pg_type, f.not_null) for f in protobuf_fields(cls.DESCRIPTOR)] == [
        ("id", "int8", True), ("at", "timestamptz", False), ("qty", "int4", False),
        ("st", "text", True), ("tags", "text[]", False), ("u", "numeric(20,0)", True),
        ("raw", "bytea", True)]
    m = cls(id=7, st=1, tags=["a"], u=2**64 - 1, raw=b"\x00\x01")
    m.at.FromMicroseconds(1_700_000_000_000_001)
    got = message_fields(m)
    assert got == {"id": 7, "at": dt.datetime(2023, 11, 14, 22, 13, 20, 1, tzinfo=dt.UTC),
                   "st": "PAID", "tags": ["a"], "u": 2**64 - 1, "raw": b"\x00\x01"}
    m.qty.value = 0  # a wrapper that is set holds its value, even the default
    assert message_fields(m)["qty"] == 0
    assert "qty" not in message_fields(cls(id=1)) and "at" not in message_fields(cls(id=1))


def test_a_present_table_fits_or_is_named_field_by_field() -> None:
    fields = [Field("id", "int8", True), Field("name", "text", True),
              Field("amount", "numeric(9,2)", True), Field("nums", "int8[]", True)]
    columns = {"id": ("int8", True), "name": ("int4", False), "amount": ("float8", False),
               "nums": ("_int4", False), "note": ("text", True), "kafka_offset": ("int8", True)}
    assert fits(fields, columns, ("id", "kafka_offset"), "Avro schema id 3") == [
        "column name (int4) cannot hold field name (text in Avro schema id 3)",
        "required column note is no field of Avro schema id 3"]
    assert fits(fields, {"nums": ("_text", False)}, (), "s") == []
    assert fits(fields, {"nums": ("bool", False)}, (), "s") == [
        "column nums (bool) cannot hold field nums (int8[] in s)"]


def test_debeziums_interval_address_xml_and_oid_fields_fit_their_columns() -> None:
    """A change event's MicroDuration (interval), a string (inet, cidr, or an ISO-8601
    interval), Xml and an int64 (oid) fit the columns Debezium read them from; a duration
    does not fit a text or integer column (it is no string nor a count there)."""
    fields = [Field("span", "interval", False), Field("addr", "text", False),
              Field("net", "text", False), Field("page", "xml", False),
              Field("obj", "int8", False), Field("iso", "text", False)]
    columns = {"span": ("interval", False), "addr": ("inet", False), "net": ("cidr", False),
               "page": ("xml", False), "obj": ("oid", False), "iso": ("interval", False)}
    assert fits(fields, columns, (), "s") == []
    assert fits(fields, {"span": ("text", False), "obj": ("interval", False)}, (), "s") == [
        "column span (text) cannot hold field span (interval in s)",
        "column obj (interval) cannot hold field obj (int8 in s)"]


TYPED = Layout((Column("id", "int8", not_null=True), Column("amount", "numeric"),
                Column("at", "timestamptz"), Column("day", "date"), Column("u", "uuid"),
                Column("raw", "bytea"), Column("nums", "_int4"), Column("doc", "jsonb"),
                Column("t", "time"), Column("payload", "jsonb")), keys=("id",))


def test_typed_values_from_a_decoder_are_kept_exactly() -> None:
    u = uuid.uuid4()
    at = dt.datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=dt.UTC)
    obj = {"id": 1, "amount": decimal.Decimal("12345678901234567890.123456789"), "at": at,
           "day": dt.date(2024, 5, 1), "u": u, "raw": b"\xff", "nums": [1, None, 3],
           "doc": {"fee": decimal.Decimal("1.005"), "when": at, "b": b"\x01"},
           "t": dt.time(10, 30)}
    op = converter(TYPED)(SourceRecord("t", 0, 5, None, b"ignored"), obj)
    assert isinstance(op, Upsert) and op.key == 1
    got = dict(zip(op.columns, op.values, strict=True))
    assert got["amount"] == decimal.Decimal("12345678901234567890.123456789")
    assert (got["at"], got["day"], got["u"], got["raw"], got["nums"], got["t"]) == (
        at, dt.date(2024, 5, 1), u, b"\xff", [1, None, 3], dt.time(10, 30))
    assert got["doc"] == ('{"fee":"1.005","when":"2024-05-01T10:00:00.123456+00:00",'
                          '"b":"AQ=="}')
    with pytest.raises(Misfit, match=r"column nums \(int4\[\]\): expected an array"):
        converter(TYPED)(SourceRecord("t", 0, 5, None, b""), {"id": 1, "nums": 5})
    with pytest.raises(Misfit, match=r"column day \(date\)"):
        converter(TYPED)(SourceRecord("t", 0, 5, None, b""), {"id": 1, "day": at})
