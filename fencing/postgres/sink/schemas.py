"""Tables from writer schemas: the columns an Avro, Protobuf or JSON Schema record maps to,
and whether a present table can hold them (pure, no I/O; ``catalog`` creates and checks).

Rules
- Avro: ``boolean`` bool, ``int`` int4, ``long`` int8, ``float`` float4, ``double`` float8,
  ``bytes``/``fixed`` bytea, ``string`` text, ``enum`` text; logical ``decimal(p, s)``
  numeric(p, s), ``date`` date, ``time-*`` time, ``timestamp-*`` timestamptz,
  ``local-timestamp-*`` timestamp, ``uuid`` uuid; ``record`` and ``map`` jsonb; an
  ``array`` of a primitive that type's array, of anything else jsonb; ``["null", T]`` is
  T, nullable; any other union jsonb. A field is NOT NULL unless it can be null.
- Protobuf (the schema's first message): int32/sint32/sfixed32 int4, int64/sint64/sfixed64
  and uint32/fixed32 int8, uint64/fixed64 numeric(20, 0), float float4, double float8,
  bool, string text, bytes bytea, enum text; ``google.protobuf.Timestamp`` timestamptz,
  ``google.type.Date`` date, ``confluent.type.Decimal`` numeric, a wrapper its value's
  type (nullable); other messages and maps jsonb; repeated scalars arrays. A scalar
  without presence is NOT NULL.
- JSON Schema (an object's ``properties``): integer int8, number numeric, boolean bool,
  string text (format date-time timestamptz, date date, time time, uuid uuid), object
  jsonb, an array of a primitive its array, else jsonb; NOT NULL when ``required`` and
  not nullable.
- A present table fits a field when its column's type can take what the field decodes
  to (``ACCEPTS``); a column that cannot, or a required column no field fills (and that
  is no key column nor filled from the record), is a misfit named at start.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fencing.postgres.sink.messages import WELL_KNOWN

__all__ = ["ACCEPTS", "Field", "avro_fields", "envelope_image", "fits", "json_schema_fields",
           "protobuf_fields"]


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a writer schema as a column: its name, PostgreSQL type (as in a CREATE
    TABLE) and whether it is NOT NULL."""

    name: str
    pg_type: str
    not_null: bool

    @property
    def base(self) -> str:
        """The type's name without modifiers (``numeric(12,2)`` -> ``numeric``)."""
        return self.pg_type.split("(")[0]


_AVRO = {"boolean": "bool", "int": "int4", "long": "int8", "float": "float4",
         "double": "float8", "bytes": "bytea", "string": "text"}
_AVRO_LOGICAL = {"date": "date", "time-millis": "time", "time-micros": "time",
                 "timestamp-millis": "timestamptz", "timestamp-micros": "timestamptz",
                 "timestamp-nanos": "timestamptz", "local-timestamp-millis": "timestamp",
                 "local-timestamp-micros": "timestamp", "local-timestamp-nanos": "timestamp",
                 "uuid": "uuid"}
_NAMED = {"record": "jsonb", "enum": "text", "fixed": "bytea", "error": "jsonb"}
#: Kafka Connect's and Debezium's logical types (``connect.name``: a change event's fields,
#: read by ``connect_types``) -> the column type that holds them
_CONNECT = {
    "io.debezium.time.Date": "date", "io.debezium.time.Time": "time",
    "io.debezium.time.MicroTime": "time", "io.debezium.time.NanoTime": "time",
    "io.debezium.time.Timestamp": "timestamp", "io.debezium.time.MicroTimestamp": "timestamp",
    "io.debezium.time.NanoTimestamp": "timestamp",
    "io.debezium.time.ZonedTimestamp": "timestamptz", "io.debezium.time.ZonedTime": "timetz",
    "io.debezium.time.MicroDuration": "interval", "io.debezium.data.Xml": "xml",
    "org.apache.kafka.connect.data.Date": "date", "org.apache.kafka.connect.data.Time": "time",
    "org.apache.kafka.connect.data.Timestamp": "timestamp",
    "io.debezium.data.VariableScaleDecimal": "numeric", "io.debezium.data.Json": "jsonb",
    "io.debezium.data.Uuid": "uuid", "io.debezium.data.Bits": "varbit",
    "io.debezium.data.Enum": "text", "io.debezium.data.EnumSet": "text[]",
}


def _avro_type(t: Any, named: dict[str, str]) -> tuple[str, bool]:
    """(PostgreSQL type, nullable) of Avro type ``t``; records named types in ``named``."""
    if isinstance(t, list):
        rest = [x for x in t if x != "null"]
        pg = _avro_type(rest[0], named)[0] if len(rest) == 1 else "jsonb"
        return pg, "null" in t
    if isinstance(t, str):
        if t == "null":
            return "jsonb", True
        return _AVRO.get(t) or named.get(t) or named.get(t.rsplit(".", 1)[-1], "jsonb"), False
    logical = t.get("logicalType")
    kind = t.get("type")
    if t.get("connect.name") in _CONNECT:
        return _CONNECT[t["connect.name"]], False
    if logical == "decimal" and "precision" in t:
        return f"numeric({int(t['precision'])},{int(t.get('scale', 0))})", False
    if logical in _AVRO_LOGICAL:
        return _AVRO_LOGICAL[logical], False
    if kind in _NAMED:
        if "name" in t:
            named[t["name"]] = named[t["name"].rsplit(".", 1)[-1]] = _NAMED[kind]
            for f in t.get("fields", ()):  # nested definitions may be referenced later
                _avro_type(f.get("type"), named)
        return _NAMED[kind], False
    if kind == "map":
        _avro_type(t.get("values"), named)
        return "jsonb", False
    if kind == "array":
        item, _ = _avro_type(t.get("items"), named)
        return (item + "[]" if item not in ("jsonb", "bytea") and "[" not in item
                else "jsonb"), False
    return _avro_type(kind, named)


def envelope_image(schema: Any) -> Any:
    """The row's record schema of a Debezium change event's Avro schema: its ``after``
    field's record (``after`` may name the record ``before`` defined); None when it is no
    change event."""
    if not isinstance(schema, dict) or schema.get("type") != "record":
        return None
    records: dict[str, Any] = {}

    def collect(t: Any) -> None:
        for branch in t if isinstance(t, list) else [t]:
            if isinstance(branch, dict) and branch.get("type") == "record":
                records[str(branch.get("name"))] = branch
                records[str(branch.get("name")).rsplit(".", 1)[-1]] = branch

    fields = {f["name"]: f["type"] for f in schema.get("fields", ())}
    if "after" not in fields or "op" not in fields:
        return None
    collect(fields.get("before"))
    collect(fields["after"])
    for branch in fields["after"] if isinstance(fields["after"], list) else [fields["after"]]:
        if isinstance(branch, dict) and branch.get("type") == "record":
            return branch
        if isinstance(branch, str) and branch in records:
            return records[branch]
    return None


def avro_fields(schema: Any) -> list[Field]:
    """The columns of an Avro record schema (parsed JSON); [] for a non-record."""
    if not isinstance(schema, dict) or schema.get("type") != "record":
        return []
    named: dict[str, str] = {}
    _avro_type(schema, named)
    out = []
    for f in schema.get("fields", ()):
        pg, nullable = _avro_type(f["type"], named)
        out.append(Field(f["name"], pg, not nullable))
    return out


_PB_SCALARS = {"TYPE_INT32": "int4", "TYPE_SINT32": "int4", "TYPE_SFIXED32": "int4",
               "TYPE_INT64": "int8", "TYPE_SINT64": "int8", "TYPE_SFIXED64": "int8",
               "TYPE_UINT32": "int8", "TYPE_FIXED32": "int8", "TYPE_UINT64": "numeric(20,0)",
               "TYPE_FIXED64": "numeric(20,0)", "TYPE_FLOAT": "float4",
               "TYPE_DOUBLE": "float8", "TYPE_BOOL": "bool", "TYPE_STRING": "text",
               "TYPE_BYTES": "bytea", "TYPE_ENUM": "text"}
_PB_WELL_KNOWN = {"google.protobuf.Timestamp": "timestamptz", "google.type.Date": "date",
                  "confluent.type.Decimal": "numeric"}


def _pb_scalar(field: Any) -> str:
    names = {getattr(field, n): n for n in _PB_SCALARS}
    return _PB_SCALARS[names[field.type]]


def protobuf_fields(desc: Any) -> list[Field]:
    """The columns of a Protobuf message descriptor."""
    out = []
    for f in desc.fields:
        msg = f.message_type
        if f.is_repeated:
            if msg is not None:
                pg = "jsonb"  # maps and repeated messages
            else:
                pg = _pb_scalar(f) + "[]" if _pb_scalar(f) != "bytea" else "jsonb"
            out.append(Field(f.name, pg, False))
        elif msg is not None:
            if msg.full_name in _PB_WELL_KNOWN:
                pg = _PB_WELL_KNOWN[msg.full_name]
            elif msg.full_name in WELL_KNOWN:  # a wrapper: its value's type
                pg = _pb_scalar(msg.fields_by_name["value"])
            else:
                pg = "jsonb"
            out.append(Field(f.name, pg, False))
        else:
            out.append(Field(f.name, _pb_scalar(f), not f.has_presence))
    return out


_JSON = {"integer": "int8", "number": "numeric", "boolean": "bool", "object": "jsonb"}
_JSON_FORMATS = {"date-time": "timestamptz", "date": "date", "time": "time", "uuid": "uuid"}


def _json_type(s: Any) -> tuple[str, bool]:
    if not isinstance(s, dict):
        return "jsonb", True
    kind = s.get("type")
    nullable = False
    if isinstance(kind, list):
        rest = [k for k in kind if k != "null"]
        nullable = "null" in kind
        kind = rest[0] if len(rest) == 1 else None
    if kind == "string":
        return _JSON_FORMATS.get(s.get("format", ""), "text"), nullable
    if kind == "array":
        item, _ = _json_type(s.get("items"))
        return (item + "[]" if item not in ("jsonb",) and "[" not in item else "jsonb"), \
            nullable
    return _JSON.get(kind or "", "jsonb"), nullable or kind is None


def json_schema_fields(schema: Any) -> list[Field]:
    """The columns of a JSON Schema object (parsed); [] when it has no properties."""
    if not isinstance(schema, dict):
        return []
    required = set(schema.get("required", ()))
    out = []
    for name, sub in (schema.get("properties") or {}).items():
        pg, nullable = _json_type(sub)
        out.append(Field(name, pg, name in required and not nullable))
    return out


_TEXT = ("text", "varchar", "bpchar", "name", "json", "jsonb")
_NUMBERS = ("int2", "int4", "int8", "numeric", "float4", "float8")
#: a field's base type -> the column types (pg_type names) that can take what it decodes to
ACCEPTS: dict[str, tuple[str, ...]] = {
    "int4": (*_NUMBERS, *_TEXT, "oid"), "int8": (*_NUMBERS, *_TEXT, "oid"),
    "numeric": ("numeric", "float4", "float8", *_TEXT),
    "float4": ("float4", "float8", "numeric", *_TEXT),
    "float8": ("float4", "float8", "numeric", *_TEXT),
    "bool": ("bool", *_TEXT), "bytea": ("bytea", "json", "jsonb"),
    "text": (*_TEXT, "uuid", "date", "time", "timestamp", "timestamptz", "numeric", "bytea",
             "enum", "bit", "varbit", "interval", "inet", "cidr", "xml"),
    "varbit": ("bit", "varbit", "bytea", *_TEXT),
    "uuid": ("uuid", *_TEXT), "date": ("date", *_TEXT), "time": ("time", *_TEXT),
    "timestamptz": ("timestamptz", "timestamp", *_TEXT),
    "timestamp": ("timestamp", "timestamptz", *_TEXT), "jsonb": ("json", "jsonb", "text"),
    "timetz": ("timetz", "time", *_TEXT),
    "interval": ("interval",), "xml": ("xml", *_TEXT),
}


def _accepts(field: Field, column_type: str) -> bool:
    if field.pg_type.endswith("[]"):
        element = Field(field.name, field.pg_type[:-2], False)
        return column_type in ("json", "jsonb") or (
            column_type.startswith("_") and _accepts(element, column_type[1:]))
    return column_type in ACCEPTS.get(field.base, ())


def fits(fields: Iterable[Field], columns: dict[str, tuple[str, bool]],
         filled_elsewhere: Iterable[str], what: str) -> list[str]:
    """The misfits of a table (``columns``: name -> (pg_type name, required)) for the
    ``fields`` of ``what`` (e.g. "Avro schema id 3"); ``filled_elsewhere``: columns the
    record fills without a field (key columns from the Kafka key, reserved columns)."""
    problems = []
    by_name = {f.name: f for f in fields}
    for name, f in by_name.items():
        if name in columns and not _accepts(f, columns[name][0]):
            problems.append(f"column {name} ({columns[name][0]}) cannot hold field {name} "
                            f"({f.pg_type} in {what})")
    skip = set(filled_elsewhere)
    for name, (_type, required) in columns.items():
        if required and name not in by_name and name not in skip:
            problems.append(f"required column {name} is no field of {what}")
    return problems
