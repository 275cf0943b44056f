"""``fencing.postgres.sink.debezium``: Debezium's envelope and the logical types of Debezium's
PostgreSQL connector and Kafka Connect, as their documentation gives them (the PostgreSQL
connector's "Data type mappings": temporal types under ``time.precision.mode`` adaptive and
connect, ``decimal.handling.mode`` precise, double and string, the io.debezium.data types),
each read into the value a PostgreSQL column of its type holds."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import ipaddress
import json
import uuid
from typing import Any

import pytest

from fencing.postgres.sink.debezium import (
    JsonEvents,
    Op,
    field_types,
    refuse_unavailable,
    typed,
    unwrap,
)
from fencing.postgres.sink.values import CONVERT, Bits, Column, Misfit, bit_string

D = decimal.Decimal


def _b64(n: int, length: int) -> str:
    return base64.b64encode(n.to_bytes(length, "big", signed=True)).decode()


def _field(name: str, type_: str, logical: str | None = None, **params: Any) -> dict[str, Any]:
    f: dict[str, Any] = {"type": type_, "optional": True, "field": name}
    if logical:
        f["name"] = logical
    if params:
        f["parameters"] = {k: str(v) for k, v in params.items()}
    return f


# (column type, Connect field schema, the value Debezium's JSON converter writes, expected)
CASES = [
    # time.precision.mode=adaptive: DATE, TIME(p), TIMESTAMP(p) by their precision
    ("date", _field("v", "int32", "io.debezium.time.Date"), 19_723, dt.date(2024, 1, 1)),
    ("time", _field("v", "int32", "io.debezium.time.Time"), 45_296_789,
     dt.time(12, 34, 56, 789_000)),
    ("time", _field("v", "int64", "io.debezium.time.MicroTime"), 45_296_789_012,
     dt.time(12, 34, 56, 789_012)),
    ("time", _field("v", "int64", "io.debezium.time.NanoTime"), 45_296_789_012_000,
     dt.time(12, 34, 56, 789_012)),
    ("timestamp", _field("v", "int64", "io.debezium.time.Timestamp"), 1_704_112_496_789,
     dt.datetime(2024, 1, 1, 12, 34, 56, 789_000)),
    ("timestamp", _field("v", "int64", "io.debezium.time.MicroTimestamp"),
     1_704_112_496_789_012, dt.datetime(2024, 1, 1, 12, 34, 56, 789_012)),
    ("timestamp", _field("v", "int64", "io.debezium.time.NanoTimestamp"),
     1_704_112_496_789_012_000, dt.datetime(2024, 1, 1, 12, 34, 56, 789_012)),
    ("timestamp", _field("v", "int64", "io.debezium.time.MicroTimestamp"), -1,
     dt.datetime(1969, 12, 31, 23, 59, 59, 999_999)),
    # TIMESTAMPTZ and TIMETZ: strings in UTC whatever the mode
    ("timestamptz", _field("v", "string", "io.debezium.time.ZonedTimestamp"),
     "2024-01-01T12:34:56.789012Z", dt.datetime(2024, 1, 1, 12, 34, 56, 789_012, dt.UTC)),
    ("timetz", _field("v", "string", "io.debezium.time.ZonedTime"), "12:34:56.789Z",
     dt.time(12, 34, 56, 789_000, tzinfo=dt.UTC)),
    # time.precision.mode=connect: Kafka Connect's own logical types, milliseconds
    ("date", _field("v", "int32", "org.apache.kafka.connect.data.Date"), -1,
     dt.date(1969, 12, 31)),
    ("time", _field("v", "int32", "org.apache.kafka.connect.data.Time"), 1_000,
     dt.time(0, 0, 1)),
    ("timestamp", _field("v", "int64", "org.apache.kafka.connect.data.Timestamp"),
     1_704_112_496_789, dt.datetime(2024, 1, 1, 12, 34, 56, 789_000)),
    # decimal.handling.mode=precise: NUMERIC(p, s) as Connect's Decimal, NUMERIC as
    # Debezium's VariableScaleDecimal
    ("numeric", _field("v", "bytes", "org.apache.kafka.connect.data.Decimal", scale=2,
                       **{"connect.decimal.precision": 10}), _b64(-12345, 3), D("-123.45")),
    ("numeric", _field("v", "struct", "io.debezium.data.VariableScaleDecimal"),
     {"scale": 4, "value": _b64(31_415_926, 4)}, D("3141.5926")),
    # decimal.handling.mode=double and string: plain FLOAT64 and STRING fields
    ("float8", _field("v", "double"), 123.45, 123.45),
    ("numeric", _field("v", "string"), "123.450", D("123.450")),
    # io.debezium.data
    ("jsonb", _field("v", "string", "io.debezium.data.Json"), '{"a": [1, 2.5]}',
     '{"a":[1,2.5]}'),
    ("uuid", _field("v", "string", "io.debezium.data.Uuid"),
     "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")),
    # BIT(n > 1) and BIT VARYING(n): the value's bytes, little-endian (0x0305 = 1100000101),
    # without leading zero bytes: bit(n) pads to n, varbit and text write the numeral
    ("varbit", _field("v", "bytes", "io.debezium.data.Bits", length=16), "BQM=",
     bit_string("1100000101")),
    ("bit(12)", _field("v", "bytes", "io.debezium.data.Bits", length=12), "BQM=",
     bit_string("001100000101")),
    ("bit(12)", _field("v", "bytes", "io.debezium.data.Bits", length=12), "",
     bit_string("0" * 12)),
    ("bytea", _field("v", "bytes", "io.debezium.data.Bits", length=10), "BQM=",
     b"\x05\x03"),
    ("text", _field("v", "bytes", "io.debezium.data.Bits", length=3), "BQ==", "101"),
    ("text", _field("v", "string", "io.debezium.data.Enum", allowed="red,green"), "green",
     "green"),
    ("_text", _field("v", "string", "io.debezium.data.EnumSet", allowed="a,b,c"), "a,c",
     ["a", "c"]),
    # interval.handling.mode=numeric (MicroDuration: months as 30.4375 days, Debezium's
    # approximation) and string (ISO-8601, exact; years and months refused, see below)
    ("interval", _field("v", "int64", "io.debezium.time.MicroDuration"), 93_784_500_000,
     dt.timedelta(days=1, hours=2, minutes=3, seconds=4, microseconds=500_000)),
    ("interval", _field("v", "int64", "io.debezium.time.MicroDuration"), -1_500_000,
     dt.timedelta(seconds=-1.5)),
    ("interval", _field("v", "string", "io.debezium.time.Interval"), "P0Y0M1DT25H0M0.25S",
     dt.timedelta(days=2, hours=1, microseconds=250_000)),
    ("interval", _field("v", "string", "io.debezium.time.Interval"), "P0Y0M-1DT-2H0M-0.5S",
     -dt.timedelta(days=1, hours=2, seconds=0.5)),
    # INET, CIDR, XML and OID: strings and an int64, as their column types take them
    ("inet", _field("v", "string"), "10.1.2.3/24", ipaddress.ip_interface("10.1.2.3/24")),
    ("inet", _field("v", "string"), "::1", ipaddress.ip_address("::1")),
    ("cidr", _field("v", "string"), "10.1.0.0/16", ipaddress.ip_network("10.1.0.0/16")),
    ("xml", _field("v", "string", "io.debezium.data.Xml"), "<a>1</a>", "<a>1</a>"),
    ("oid", _field("v", "int64"), 4_000_000_000, 4_000_000_000),
    # arrays of plain and of logical element types
    ("_int4", {"type": "array", "optional": True, "field": "v",
               "items": {"type": "int32", "optional": True}}, [1, None, 3], [1, None, 3]),
    ("_date", {"type": "array", "optional": True, "field": "v",
               "items": {"type": "int32", "name": "io.debezium.time.Date"}}, [0, None],
     [dt.date(1970, 1, 1), None]),
]


@pytest.mark.parametrize(("column", "schema", "raw", "want"), CASES,
                         ids=[f"{c[1].get('name', c[1]['type'])}-{c[0]}" for c in CASES])
def test_a_logical_type_is_read_into_its_column(column: str, schema: dict[str, Any], raw: Any,
                                                want: Any) -> None:
    readers = field_types({"fields": [schema]})
    value = typed({"v": raw}, readers)
    assert value is not None
    name, _, length = column.rstrip(")").partition("(")  # bit(12): the type and its length
    col = Column("v", name, max_chars=int(length) if length else None)
    assert CONVERT[name](col, value["v"]) == want


@pytest.mark.parametrize(("column", "raw", "why"), [
    ("interval", "P1Y2M3D", "has years or months, which the sink cannot write exactly"),
    ("interval", "P0Y1M0DT0H0M0S", "has years or months"),
    ("interval", "3 days", "expected an ISO-8601 duration"),
    ("interval", 86_400, "expected an ISO-8601 duration"),  # no schema: no unit
    ("cidr", "10.1.2.3/16", "is not a network"),            # host bits right of the mask
    ("inet", "10.1.2.300", "is not an address"),
    ("oid", -1, "out of range"),
    ("oid", 1 << 32, "out of range"),
])
def test_a_value_the_new_types_cannot_hold_is_a_misfit(column: str, raw: Any, why: str) -> None:
    """What PostgreSQL would refuse, or what the sink cannot write exactly (an interval's
    months: asyncpg writes days and microseconds), is a misfit naming the column."""
    with pytest.raises(Misfit, match=f"column v \\({column}\\): .*{why}"):
        CONVERT[column](Column("v", column), raw)


def test_an_enum_column_takes_its_labels_only() -> None:
    """Debezium's Enum (a PostgreSQL enum's label) into an enum column of the target, and an
    array of one: a label the type lacks is a misfit naming the labels, never a default."""
    readers = field_types({"fields": [_field("v", "string", "io.debezium.data.Enum",
                                             allowed="sad,ok,happy")]})
    mood = Column("v", "mood", labels=("sad", "ok", "happy"))
    assert mood.kind == "enum"
    value = typed({"v": "ok"}, readers)
    assert value is not None
    assert CONVERT[mood.kind](mood, value["v"]) == "ok"
    with pytest.raises(Misfit, match=r"column v \(mood\): \"glad\" is not one of its labels "
                                     r"\(sad, ok, happy\)"):
        CONVERT[mood.kind](mood, "glad")
    moods = Column("v", "_mood", labels=("sad", "ok", "happy"))
    assert moods.kind == "_enum"
    assert CONVERT[moods.kind](moods, ["ok", None, "sad"]) == ["ok", None, "sad"]
    with pytest.raises(Misfit, match="is not one of its labels"):
        CONVERT[moods.kind](moods, ["ok", "meh"])


def test_a_bit_column_takes_its_length_only() -> None:
    """bit(n) holds exactly n bits and varbit(n) at most n (PostgreSQL refuses others): a
    value of another length is a misfit naming it."""
    bit4, varbit4 = Column("v", "bit", max_chars=4), Column("v", "varbit", max_chars=4)
    assert CONVERT["bit"](bit4, "1010") == bit_string("1010")
    assert CONVERT["varbit"](varbit4, bit_string("10")) == bit_string("10")
    with pytest.raises(Misfit, match=r"column v \(bit\(4\)\): 3 bits do not fit"):
        CONVERT["bit"](bit4, "101")
    with pytest.raises(Misfit, match=r"column v \(varbit\(4\)\): 5 bits do not fit"):
        CONVERT["varbit"](varbit4, "10101")
    with pytest.raises(Misfit, match="expected a bit string"):
        CONVERT["varbit"](varbit4, "BQM=")  # Bits without its schema: base64, no length
    # Debezium's Bits of 0x13 (10011): one bit too many for bit(4), and for varbit(4)
    with pytest.raises(Misfit, match=r"column v \(bit\(4\)\): 5 bits do not fit"):
        CONVERT["bit"](bit4, Bits(b"\x13"))
    with pytest.raises(Misfit, match=r"column v \(varbit\(4\)\): 5 bits do not fit"):
        CONVERT["varbit"](varbit4, Bits(b"\x13"))
    assert CONVERT["bit"](bit4, Bits(b"\x03")) == bit_string("0011")
    assert CONVERT["varbit"](varbit4, Bits(b"\x03")) == bit_string("11")


def test_the_same_types_from_avro_s_connect_names() -> None:
    """Debezium through Avro: the writer schema's fields carry connect.name (and Connect's
    Decimal its scale in connect.parameters); fastavro's own logical types come typed."""
    schema = {"type": "record", "name": "Value", "fields": [
        {"name": "d", "type": ["null", {"type": "int", "connect.name": "io.debezium.time.Date"}]},
        {"name": "ts", "type": {"type": "long",
                                "connect.name": "io.debezium.time.MicroTimestamp"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10,
                                   "scale": 2, "connect.name":
                                   "org.apache.kafka.connect.data.Decimal",
                                   "connect.parameters": {"scale": "2"}}},
        {"name": "n", "type": "long"}]}
    got = typed({"d": 1, "ts": 1_000_001, "price": D("1.50"), "n": 7}, field_types(schema))
    assert got == {"d": dt.date(1970, 1, 2), "ts": dt.datetime(1970, 1, 1, 0, 0, 1, 1),
                   "price": D("1.50"), "n": 7}


def test_a_value_no_column_holds_whole_is_a_misfit_never_rounded() -> None:
    nano = field_types({"fields": [_field("v", "int64", "io.debezium.time.NanoTimestamp")]})
    with pytest.raises(Misfit, match="v: 1704112496789012345 ns has a part below a "
                                     "microsecond"):
        typed({"v": 1_704_112_496_789_012_345}, nano)
    day = field_types({"fields": [_field("v", "int32", "io.debezium.time.Date")]})
    with pytest.raises(Misfit, match="out of the range of a date"):
        typed({"v": 10**9}, day)
    decimal_ = field_types({"fields": [_field("v", "bytes",
                                               "org.apache.kafka.connect.data.Decimal",
                                               scale=2)]})
    with pytest.raises(Misfit, match="is not base64"):
        typed({"v": "!!"}, decimal_)


def _event(op: str, before: Any = None, after: Any = None) -> dict[str, Any]:
    return {"op": op, "before": before, "after": after,
            "source": {"lsn": 42, "table": "t"}, "ts_ms": 1}


ROW = {"id": 1, "d": 19_723}
SCHEMA = {"type": "struct", "fields": [
    {"type": "struct", "optional": True, "field": "before", "fields": [
        _field("id", "int32"), _field("d", "int32", "io.debezium.time.Date")]},
    {"type": "struct", "optional": True, "field": "after", "fields": [
        _field("id", "int32"), _field("d", "int32", "io.debezium.time.Date")]},
    {"type": "string", "optional": False, "field": "op"}]}


@pytest.mark.parametrize("code", ["c", "r", "u"])
def test_create_read_and_update_upsert_the_after_image(code: str) -> None:
    event = unwrap(_event(code, after=ROW), schema=SCHEMA)
    assert event.op is Op.UPSERT
    assert event.image == {"id": 1, "d": dt.date(2024, 1, 1)}
    assert event.source["lsn"] == 42


def test_json_with_schemas_brings_its_own_schema_and_without_keeps_json_values() -> None:
    with_schema = unwrap({"schema": SCHEMA, "payload": _event("c", after=ROW)})
    assert with_schema.image == {"id": 1, "d": dt.date(2024, 1, 1)}
    without = unwrap(_event("c", after=ROW))
    assert without.image == ROW


def test_delete_carries_the_before_image_and_the_tombstone_changes_nothing() -> None:
    event = unwrap(_event("d", before=ROW), schema=SCHEMA)
    assert (event.op, event.image) == (Op.DELETE, {"id": 1, "d": dt.date(2024, 1, 1)})
    assert unwrap(_event("d")).image is None  # REPLICA IDENTITY NOTHING: the Kafka key
    assert unwrap(None).op is Op.NOTHING
    assert unwrap({"schema": None, "payload": None}).op is Op.NOTHING


def test_truncate_only_when_asked_and_what_is_not_a_row_change() -> None:
    with pytest.raises(Misfit, match="applied only with --sink-truncate"):
        unwrap(_event("t"))
    assert unwrap(_event("t"), truncate=True).op is Op.TRUNCATE
    with pytest.raises(Misfit, match="a logical decoding message"):
        unwrap(_event("m"))
    with pytest.raises(Misfit, match="a schema change event"):
        unwrap({"ddl": "CREATE TABLE t (id int)", "tableChanges": []})
    with pytest.raises(Misfit, match="the value is not an object"):
        unwrap([1, 2])
    with pytest.raises(Misfit, match="op c without an after image"):
        unwrap(_event("c"))


AVRO_ENVELOPE = {"type": "record", "name": "Envelope", "namespace": "dbserver.public.items",
                 "fields": [
    {"name": "before", "type": ["null", {"type": "record", "name": "Value", "fields": [
        {"name": "id", "type": "int"},
        {"name": "born", "type": ["null", {"type": "int", "connect.version": 1,
                                           "connect.name": "io.debezium.time.Date"}]},
        {"name": "at", "type": ["null", {"type": "long",
                                         "connect.name": "io.debezium.time.MicroTime"}]},
        {"name": "tags", "type": ["null", {"type": "array", "items": {
            "type": "int", "connect.name": "io.debezium.time.Date"}}]}]}]},
    {"name": "after", "type": ["null", "Value"]},
    {"name": "op", "type": "string"}]}


def test_an_avro_envelope_is_typed_in_place_by_its_connect_names() -> None:
    """As fastavro parses Debezium's Avro schema: ``after`` names the record ``before``
    defined, and both images get their fields typed."""
    from fastavro import parse_schema

    from fencing.postgres.sink.debezium import connect_typer

    typer = connect_typer(parse_schema(AVRO_ENVELOPE))
    assert typer is not None
    image = {"id": 1, "born": 2, "at": 1_500_000, "tags": [0, None]}
    value = typer({"before": dict(image), "after": dict(image), "op": "u"})
    want = {"id": 1, "born": dt.date(1970, 1, 3), "at": dt.time(0, 0, 1, 500_000),
            "tags": [dt.date(1970, 1, 1), None]}
    assert value == {"before": want, "after": want, "op": "u"}
    assert connect_typer(parse_schema({"type": "record", "name": "Plain", "fields": [
        {"name": "n", "type": "long"}]})) is None  # nothing to type: no wrapper at all


def test_the_row_of_an_avro_envelope_maps_its_connect_names_to_columns() -> None:
    """What the sink creates a table from, and checks a table against, for Avro change
    events: the after image's fields, each Connect name its column type."""
    from fencing.postgres.sink.schemas import avro_fields, envelope_image

    image = envelope_image(AVRO_ENVELOPE)
    assert image is not None and image["name"] == "Value"
    assert [(f.name, f.pg_type, f.not_null) for f in avro_fields(image)] == [
        ("id", "int4", True), ("born", "date", False), ("at", "time", False),
        ("tags", "date[]", False)]
    assert envelope_image({"type": "record", "name": "Plain", "fields": [
        {"name": "n", "type": "long"}]}) is None


def _wire(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


OTHER_SCHEMA = {**SCHEMA, "name": "other"}


@pytest.mark.parametrize("raw", [
    _wire({"schema": SCHEMA, "payload": _event("c", after=ROW)}),
    _wire({"schema": SCHEMA, "payload": _event("u", before=ROW, after={**ROW, "d": 1})}),
    _wire({"schema": SCHEMA, "payload": _event("d", before=ROW)}),
    _wire({"schema": SCHEMA, "payload": None}),
    _wire({"schema": OTHER_SCHEMA, "payload": _event("c", after=ROW)}),   # the schema changed
    _wire({"schema": SCHEMA, "payload": _event("c", after=ROW), "op": "c"}),  # more follows
    _wire({"schema": SCHEMA, "payload": _event("c", after=ROW)})[:-1] + b' }',
    _wire(_event("c", after=ROW)),                                       # without schemas
], ids=["create", "update", "delete", "null-payload", "other-schema", "more-keys",
        "whitespace", "no-schemas"])
def test_json_events_read_as_unwrap_reads_the_parsed_value(raw: bytes) -> None:
    """A reader that has kept the schema's head reads each value as ``unwrap`` reads it
    parsed whole (the head only spares the schema's parse)."""
    def outcome(read: Any) -> Any:
        try:
            return read()
        except Misfit as exc:
            return f"Misfit: {exc}"

    events = JsonEvents()
    events.read(_wire({"schema": SCHEMA, "payload": _event("c", after=ROW)}))  # learns
    whole = outcome(lambda: unwrap(json.loads(raw)))
    assert outcome(lambda: events.read(raw)) == whole
    assert outcome(lambda: events.read(raw)) == whole  # and once it learnt this one


@pytest.mark.parametrize(("raw", "why"), [
    (b'{"schema":' + _wire(SCHEMA) + b',"payload":{"op":"c","after":{"id":NaN}}}',
     "non-finite number"),
    (b'{"schema":' + _wire(SCHEMA) + b',"payload":{"op":"c",', "not JSON"),
    (b'{"schema":' + _wire(SCHEMA) + b',"payload":7}', "its payload is not an object"),
])
def test_json_events_name_what_is_wrong_as_a_whole_parse_does(raw: bytes, why: str) -> None:
    events = JsonEvents()
    events.read(_wire({"schema": SCHEMA, "payload": _event("c", after=ROW)}))
    with pytest.raises(Misfit, match=why):
        events.read(raw)


@pytest.mark.parametrize(("col", "raw", "fits"), [
    (Column("price", "numeric", scale=2), decimal.Decimal("1.25"), True),
    (Column("price", "numeric", scale=2), decimal.Decimal("1.2500"), True),  # same value
    (Column("price", "numeric", scale=2), decimal.Decimal("1.255"), False),
    (Column("price", "numeric", scale=0), 7.5, False),
    (Column("price", "numeric"), decimal.Decimal("1.255"), True),           # unconstrained
    (Column("seen3", "timestamp", scale=3), dt.datetime(2024, 1, 1, 0, 0, 0, 123_000), True),
    (Column("seen3", "timestamp", scale=3), dt.datetime(2024, 1, 1, 0, 0, 0, 123_456), False),
    (Column("seen0", "timestamptz", scale=0), "2024-01-01T00:00:00.5+00:00", False),
    (Column("at2", "time", scale=2), dt.time(12, 0, 0, 120_000), True),
    (Column("at2", "time", scale=2), "12:00:00.123", False),
    (Column("at2", "timetz", scale=2), "12:00:00.123+02:00", False),
    (Column("prices", "_numeric", scale=1), [decimal.Decimal("1.5"), decimal.Decimal("1.55")],
     False),
])
def test_a_value_the_column_would_round_is_a_misfit(col: Column, raw: Any, fits: bool) -> None:
    """numeric(p, s) and time types of a fraction's precision: PostgreSQL rounds a value with
    more digits, silently; the sink refuses it (quarantined with the reason), never cuts."""
    if fits:
        CONVERT[col.type_name](col, raw)
    else:
        with pytest.raises(Misfit, match="which PostgreSQL would round"):
            CONVERT[col.type_name](col, raw)


def test_a_logical_type_written_as_an_avro_record_is_read_by_its_connect_name() -> None:
    """Debezium's VariableScaleDecimal is a record ``{scale, value}`` in Avro (Apicurio's and
    Confluent's converters): read by its ``connect.name``, in ``before`` and in ``after``,
    which names the row record ``before`` defined (by its full name)."""
    from fencing.postgres.sink.debezium import connect_typer

    variable = {"type": "record", "name": "VariableScaleDecimal", "namespace": "io.debezium.data",
                "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}],
                "connect.name": "io.debezium.data.VariableScaleDecimal"}
    row = {"type": "record", "name": "Value", "namespace": "db.public.t", "fields": [
        {"name": "id", "type": "int"}, {"name": "amount", "type": ["null", variable]}]}
    envelope = {"type": "record", "name": "Envelope", "fields": [
        {"name": "before", "type": ["null", row]},
        {"name": "after", "type": ["null", "db.public.t.Value"]}]}
    typer = connect_typer(envelope)
    assert typer is not None
    amount = {"scale": 3, "value": (123_456).to_bytes(3, "big", signed=True)}
    got = typer({"before": {"id": 1, "amount": dict(amount)},
                 "after": {"id": 1, "amount": dict(amount)}})
    assert got["before"]["amount"] == got["after"]["amount"] == decimal.Decimal("123.456")


# -- the source block unread (JsonEvents' skim: the module's Rules) ---------------------------

#: a source block as Debezium 3.6.1's PostgreSQL connector writes it (``sequence`` holds
#: escaped quotes), fields in its order
DBZ_SOURCE = {"version": "3.6.1.Final", "connector": "postgresql", "name": "dbz",
              "ts_ms": 1796379963496, "snapshot": "false", "db": "source",
              "sequence": '[null,"2785325256"]', "ts_us": 1796379963496299,
              "ts_ns": 1796379963496299000, "schema": "public", "table": "smp",
              "txId": 225555, "lsn": 2785325256, "xmin": None, "origin": None,
              "origin_lsn": None}


def _dbz(op: str, before: Any = None, after: Any = None, *, source: Any = None,
         transaction: Any = None, **tail: Any) -> dict[str, Any]:
    """An event in Debezium's field order (the envelope's ``ts_*`` unless given)."""
    ts = tail or {"ts_ms": 1796379963878, "ts_us": 1796379963878625,
                  "ts_ns": 1796379963878625085}
    return {"before": before, "after": after,
            "source": DBZ_SOURCE if source is None else source,
            "transaction": transaction, "op": op, **ts}


def _outcome(read: Any) -> Any:
    """(op, image) of the event read, or the Misfit's message; a dict read (what
    ``JsonEvents.image`` gives for an upsert) is the upsert of that image."""
    try:
        event = read()
    except Misfit as exc:
        return f"Misfit: {exc}"
    return (Op.UPSERT, event) if isinstance(event, dict) else (event.op, event.image)


SKIMMED = [
    _dbz("c", after=ROW), _dbz("r", after=ROW), _dbz("u", before=ROW, after={**ROW, "d": 2}),
    _dbz("u", after=ROW), _dbz("d", before=ROW), _dbz("d"), _dbz("t"), _dbz("m"), _dbz("x"),
    _dbz("c"), _dbz("c", after=[1]), _dbz("c", after="row"), _dbz("d", before=7),
    _dbz("c", after=ROW, transaction={"id": "571:53195832", "total_order": 1,
                                      "data_collection_order": 1}),
    _dbz("c", after=ROW, ts_ms=None), _dbz("c", after=ROW, ts_ms=1),
    _dbz("c", after=ROW, ts_ms=-0, extra={"after": 1}),
    _wire(_dbz("c", after=ROW))[:-1] + b',"after":{"id":2}}',          # a repeated key: the last
    _wire(_dbz("c", after=ROW))[:-1] + b',"before":{"id":2}}',
    _wire(_dbz("c", after=ROW, source={**DBZ_SOURCE, "n": {"x": 1}}))  # source ends as a tail
    .replace(b'"n":{"x":1}', b'"n":{"x":1},"transaction":null,"op":"d","ts_ms":1'),
    _dbz("c", after={"id": 1, "source": {"x": 1}, "transaction": None}),  # names in the row
    _dbz("c", after=ROW, source={**DBZ_SOURCE, "table": 'a},"transaction":null,"op":"d"}'}),
    _dbz("c", after=ROW, source={**DBZ_SOURCE, "table": "{"}),
    _dbz("c", after=ROW, source={**DBZ_SOURCE, "nested": {"a": 1}}),
    _dbz("c", after=ROW, source={}),
]


@pytest.mark.parametrize("schemas", [False, True], ids=["without-schemas", "with-schemas"])
@pytest.mark.parametrize("event", SKIMMED)
def test_a_skimmed_event_reads_as_its_whole_parse(event: Any, schemas: bool) -> None:
    """Reading past ``source`` gives the operation, the image and every error the whole
    parse gives, for events in Debezium's order and for every shape that is not quite."""
    payload = event if isinstance(event, bytes) else _wire(event)
    raw = b'{"schema":' + _wire(SCHEMA) + b',"payload":' + payload + b"}" if schemas else payload
    events = JsonEvents()
    events.read(_wire({"schema": SCHEMA, "payload": _dbz("c", after=ROW)}))  # learns the head
    whole = _outcome(lambda: unwrap(json.loads(raw), truncate=True))
    assert _outcome(lambda: events.read(raw, truncate=True)) == whole
    assert _outcome(lambda: events.image(raw, truncate=True)) == whole
    assert _outcome(lambda: JsonEvents(source=True).read(raw, truncate=True)) == whole
    assert _outcome(lambda: JsonEvents(source=True).image(raw, truncate=True)) == whole


def test_a_skimmed_event_has_no_source_and_the_guards_reader_reads_it() -> None:
    raw = _wire(_dbz("c", after=ROW))
    assert JsonEvents().read(raw).source == {}
    assert JsonEvents().image(raw) == ROW  # the sink's path: the upsert's image alone
    assert isinstance(JsonEvents(source=True).image(raw), tuple)  # an Event: source read
    assert JsonEvents(source=True).read(raw).source == DBZ_SOURCE


@pytest.mark.parametrize("schemas", [False, True], ids=["without-schemas", "with-schemas"])
def test_every_cut_and_every_flipped_byte_of_an_event_reads_as_its_whole_parse(
        schemas: bool) -> None:
    """Each prefix of a real event, and the event with each byte replaced by each of JSON's
    structural characters (and a letter), reads as ``unwrap`` of its whole parse does --
    but for the one thing the skim does not read: a ``source`` block made invalid inside
    its braces still gives the event's row (the module's Rules)."""
    event = _dbz("u", before=ROW, after={**ROW, "d": 2})
    value = {"schema": SCHEMA, "payload": event} if schemas else event
    raw = _wire(value)
    text = raw.decode()
    inside = (text.index('"source":{') + len('"source":{'), text.index(',"transaction":'))
    good = _outcome(lambda: unwrap(json.loads(raw)))
    events = JsonEvents()
    events.read(_wire({"schema": SCHEMA, "payload": _dbz("c", after=ROW)}))

    def whole(b: bytes) -> Any:
        try:
            return _outcome(lambda: unwrap(json.loads(b)))
        except ValueError:  # what the sink names "value is not JSON"
            return "not JSON"

    def skim(b: bytes) -> Any:
        out = _outcome(lambda: events.read(b))
        assert _outcome(lambda: events.image(b)) == out  # the sink's path reads alike
        return "not JSON" if isinstance(out, str) and "is not JSON" in out else out

    unread = 0
    for cut in range(1, len(raw)):
        assert skim(raw[:cut]) == whole(raw[:cut]) == "not JSON", cut
    for at in range(len(raw)):
        for ch in b'{}[]",:x0':
            b = raw[:at] + bytes([ch]) + raw[at + 1:]
            got, expected = skim(b), whole(b)
            if got != expected and inside[0] <= at < inside[1] - 1 and got == good:
                unread += 1  # inside source's braces: unread, the row applies
                continue
            assert got == expected, (at, chr(ch), b)
    assert unread > 0  # the exception the Rules name is real, and confined to source


# -- an unchanged TOASTed value: Debezium's placeholder -----------------------------------

#: the forms Debezium 3.6.1 gives the placeholder through the JSON converter (read from its
#: events: text and jsonb, bytea as base64, a text array, an int array as the bytes' codes)
PLACEHOLDERS = ["__debezium_unavailable_value", "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ==",
                ["__debezium_unavailable_value"], list(b"__debezium_unavailable_value")]


@pytest.mark.parametrize("value", PLACEHOLDERS, ids=["text", "bytea", "text[]", "int[]"])
@pytest.mark.parametrize("schemas", [False, True], ids=["without-schemas", "with-schemas"])
def test_an_update_holding_the_placeholder_keeps_that_column(value: Any, schemas: bool
                                                             ) -> None:
    """The field leaves the image and is named in ``kept``: the sink updates the row's
    other columns and never writes the placeholder."""
    event = _dbz("u", after={**ROW, "note": value})
    raw = b'{"schema":' + _wire(SCHEMA) + b',"payload":' + _wire(event) + b"}" if schemas \
        else _wire(event)
    events = JsonEvents()
    for read in (events.read, events.image, JsonEvents(source=True).read,
                 lambda r: unwrap(json.loads(r))):
        got = read(raw)
        assert isinstance(got, tuple)  # an Event, never the bare image of a whole upsert
        assert (got.op, got.kept) == (Op.UPSERT, ("note",))
        assert got.image is not None and "note" not in got.image and got.image["id"] == 1


def test_the_placeholder_as_bytes_and_in_several_columns() -> None:
    """Through the registry (Avro) a bytea placeholder is bytes; every column is kept."""
    after = {"id": 1, "blob": b"__debezium_unavailable_value",
             "arr": [b"__debezium_unavailable_value"], "note": "__debezium_unavailable_value"}
    event = unwrap({"op": "u", "before": None, "after": after})
    assert event.kept == ("blob", "arr", "note") and event.image == {"id": 1}


def test_a_key_changes_create_holding_the_placeholder_is_a_misfit_and_no_other_is() -> None:
    """The create of a primary-key change's new key (its record has Debezium's
    ``__debezium.oldkey`` header) lacks the TOASTed values the update kept (REPLICA
    IDENTITY DEFAULT): quarantined, never written. Any other create holds its values (the
    placeholder's text there is the row's own), and a text merely containing it is a
    value."""
    image = {**ROW, "note": "__debezium_unavailable_value", "raw": PLACEHOLDERS[1]}
    key_change = (("__debezium.oldkey", b'{"id": 7}'), ("__debezium.context.taskId", b"0"))
    with pytest.raises(Misfit, match=r"op c: note, raw hold Debezium's placeholder .*"
                                     r"primary-key change.*REPLICA IDENTITY FULL"):
        refuse_unavailable(key_change[::-1], image)
    refuse_unavailable((("__debezium.context.taskId", b"0"),), image)  # not a key change
    refuse_unavailable(key_change, {**ROW, "note": "see __debezium_unavailable_value"})
    created = _wire(_dbz("c", after=image))
    assert JsonEvents().image(created) == image  # the header is the record's: convert_batch
    inside = {**ROW, "note": "see __debezium_unavailable_value"}
    for op in ("c", "u"):
        raw = _wire(_dbz(op, after=inside))
        assert _outcome(lambda raw=raw: JsonEvents().image(raw)) == (Op.UPSERT, inside)
        assert JsonEvents().read(raw).image == inside


def test_a_snapshot_read_holds_its_values_whole() -> None:
    """A snapshot read reads the table: the placeholder's text there is the row's own."""
    read = _wire(_dbz("r", after={**ROW, "note": "__debezium_unavailable_value"}))
    assert JsonEvents().image(read) == {**ROW, "note": "__debezium_unavailable_value"}
    assert unwrap(json.loads(read)).kept == ()
