"""Kafka Connect's and Debezium's logical types: a field's schema name -> how its value is
read into the Python value a PostgreSQL column of its type holds (pure, no I/O; the rules
are ``fencing.postgres.sink.debezium``'s, which reads change events with them).

Rules
- The names read: ``io.debezium.time.{Date, Time, MicroTime, NanoTime, Timestamp,
  MicroTimestamp, NanoTimestamp, ZonedTimestamp, ZonedTime, MicroDuration}``,
  ``org.apache.kafka.connect.data.{Decimal, Date, Time, Timestamp}``,
  ``io.debezium.data.{VariableScaleDecimal, Json, Uuid, Bits, Enum, EnumSet}``, and arrays of
  them element by element. A schema is Kafka Connect's JSON one (``name``,
  ``parameters``) or an Avro one (``connect.name``, ``connect.parameters``).
- Each reader takes every representation a converter gives its value and raises ``Misfit``
  naming the field when the value cannot be read, or no PostgreSQL type holds it whole.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import json
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from fencing.postgres.sink.values import Bits, Misfit

__all__ = ["Reader", "connect_typer", "field_types", "typed"]

_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_DAY = dt.date(1970, 1, 1)


def _micros(value: Any, per_second: int, name: str) -> int:
    """An integer count of ``1/per_second`` seconds as whole microseconds."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise Misfit(f"{name}: expected an integer, got {value!r}")
    if per_second <= 1_000_000:
        return value * (1_000_000 // per_second)
    whole, rest = divmod(value, per_second // 1_000_000)
    if rest:
        raise Misfit(f"{name}: {value} ns has a part below a microsecond, which no "
                     "PostgreSQL time type holds")
    return whole


def _since_epoch(per_second: int) -> Callable[[Any, str], Any]:
    def read(value: Any, name: str) -> Any:
        if isinstance(value, dt.datetime):
            return value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo else value
        try:
            return _EPOCH + dt.timedelta(microseconds=_micros(value, per_second, name))
        except OverflowError:
            raise Misfit(f"{name}: {value} is out of the range of a timestamp") from None
    return read


def _time_of_day(per_second: int) -> Callable[[Any, str], Any]:
    def read(value: Any, name: str) -> Any:
        if isinstance(value, dt.time):
            return value
        if isinstance(value, dt.timedelta):  # fastavro's reading of some time encodings
            value = value // dt.timedelta(microseconds=1)
            per = 1_000_000
        else:
            per = per_second
        us = _micros(value, per, name)
        if not 0 <= us < 86_400_000_000:
            raise Misfit(f"{name}: {value} is not a time of day")
        return (dt.datetime.min + dt.timedelta(microseconds=us)).time()
    return read


def _days(value: Any, name: str) -> dt.date:
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise Misfit(f"{name}: expected days since 1970-01-01, got {value!r}")
    try:
        return _EPOCH_DAY + dt.timedelta(days=value)
    except OverflowError:
        raise Misfit(f"{name}: {value} days is out of the range of a date") from None


def _zoned_timestamp(value: Any, name: str) -> dt.datetime:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    try:
        t = dt.datetime.fromisoformat(str(value))
    except ValueError:
        raise Misfit(f"{name}: {value!r} is not an ISO-8601 timestamp") from None
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def _zoned_time(value: Any, name: str) -> dt.time:
    if isinstance(value, dt.time):
        return value
    try:
        return dt.time.fromisoformat(str(value))
    except ValueError:
        raise Misfit(f"{name}: {value!r} is not an ISO-8601 time") from None


def _unscaled(value: Any, name: str) -> int:
    """Connect's decimal bytes (big-endian two's complement), from bytes or base64 text."""
    if isinstance(value, str):
        try:
            value = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise Misfit(f"{name}: {value!r} is not base64") from None
    if not isinstance(value, bytes | bytearray):
        raise Misfit(f"{name}: expected the decimal's bytes, got {value!r}")
    return int.from_bytes(value, "big", signed=True)


def _decimal(value: Any, name: str, scale: int) -> decimal.Decimal:
    if isinstance(value, decimal.Decimal):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):  # decimal.format=NUMERIC
        return decimal.Decimal(str(value))
    return decimal.Decimal(_unscaled(value, name)).scaleb(-scale)


def _variable_scale(value: Any, name: str) -> decimal.Decimal:
    if isinstance(value, decimal.Decimal):
        return value
    if not isinstance(value, Mapping) or "value" not in value:
        raise Misfit(f"{name}: expected {{scale, value}}, got {value!r}")
    return decimal.Decimal(_unscaled(value["value"], name)).scaleb(-int(value["scale"]))


def _bits(value: Any, name: str) -> Bits:
    """``io.debezium.data.Bits``: a bit string's value as bytes, little-endian, without
    leading zero bytes (its schema's ``length`` is the column's, not the value's)."""
    if isinstance(value, bytes | bytearray):
        return Bits(bytes(value))
    try:
        return Bits(base64.b64decode(str(value), validate=True))
    except (binascii.Error, ValueError):
        raise Misfit(f"{name}: {value!r} is not base64") from None


def _json(value: Any, name: str) -> Any:
    try:
        return json.loads(value) if isinstance(value, str) else value
    except ValueError:
        raise Misfit(f"{name}: the JSON text does not parse") from None


def _duration(value: Any, name: str) -> dt.timedelta:
    """``io.debezium.time.MicroDuration`` (``interval.handling.mode=numeric``): microseconds,
    Debezium's months counted as 30.4375 days and years as 365.25 (its approximation, as
    the event holds it)."""
    if isinstance(value, dt.timedelta):
        return value
    try:
        return dt.timedelta(microseconds=_micros(value, 1_000_000, name))
    except OverflowError:
        raise Misfit(f"{name}: {value} is out of the range of an interval") from None


def _uuid(value: Any, name: str) -> uuid.UUID:
    try:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    except ValueError:
        raise Misfit(f"{name}: {value!r} is not a UUID") from None


def _enum_set(value: Any, name: str) -> list[str]:
    return [] if value == "" else str(value).split(",")


_READERS: dict[str, Callable[[Any, str], Any]] = {
    "io.debezium.time.Date": _days,
    "io.debezium.time.Time": _time_of_day(1_000),
    "io.debezium.time.MicroTime": _time_of_day(1_000_000),
    "io.debezium.time.NanoTime": _time_of_day(1_000_000_000),
    "io.debezium.time.Timestamp": _since_epoch(1_000),
    "io.debezium.time.MicroTimestamp": _since_epoch(1_000_000),
    "io.debezium.time.NanoTimestamp": _since_epoch(1_000_000_000),
    "io.debezium.time.ZonedTimestamp": _zoned_timestamp,
    "io.debezium.time.ZonedTime": _zoned_time,
    "io.debezium.time.MicroDuration": _duration,
    "org.apache.kafka.connect.data.Date": _days,
    "org.apache.kafka.connect.data.Time": _time_of_day(1_000),
    "org.apache.kafka.connect.data.Timestamp": _since_epoch(1_000),
    "io.debezium.data.VariableScaleDecimal": _variable_scale,
    "io.debezium.data.Json": _json,
    "io.debezium.data.Uuid": _uuid,
    "io.debezium.data.Bits": _bits,
    "io.debezium.data.Enum": lambda value, name: str(value),
    "io.debezium.data.EnumSet": _enum_set,
}

#: a field's reader: (value, field name) -> the typed value
Reader = Callable[[Any, str], Any]


def _reader(schema: Mapping[str, Any]) -> Reader | None:
    """How to read a value of this Connect field schema, None when it is kept as it is."""
    name = schema.get("name") or schema.get("connect.name")
    if name == "org.apache.kafka.connect.data.Decimal":
        params = schema.get("parameters") or schema.get("connect.parameters") or {}
        scale = int(params.get("scale", schema.get("scale", 0)))
        return lambda value, field: _decimal(value, field, scale)
    if name in _READERS:
        return _READERS[name]
    items = schema.get("items")
    if schema.get("type") == "array" and isinstance(items, Mapping):
        inner = _reader(items)
        if inner is not None:
            return lambda value, field: None if value is None else [
                None if v is None else inner(v, field) for v in value]
    return None


def field_types(struct: Mapping[str, Any] | None) -> dict[str, Reader]:
    """The readers of a Connect struct schema's fields that carry a logical type (a field
    without one is kept as it is). Takes Kafka Connect's JSON schema (``fields`` with
    ``field`` names) and an Avro record schema (``fields`` with ``name`` and ``type``)."""
    readers: dict[str, Reader] = {}
    for f in (struct or {}).get("fields") or ():
        if "field" in f:  # Connect JSON: the field's schema is the entry itself
            name, schema = f["field"], f
        else:  # Avro: name + type (a union with null holds the type)
            name, schema = f["name"], f["type"]
            if isinstance(schema, list):
                schema = next((s for s in schema if s != "null"), "null")
        if isinstance(schema, Mapping) and (reader := _reader(schema)) is not None:
            readers[name] = reader
    return readers


def _avro_branch(schema: Any) -> Any:
    """The non-null branch of an Avro ``["null", T]`` union (T itself otherwise)."""
    if isinstance(schema, list):
        rest = [s for s in schema if s != "null"]
        return rest[0] if len(rest) == 1 else None
    return schema


def _avro_transform(schema: Any, named: dict[str, Any]) -> Callable[[Any], Any] | None:
    """How to type a value of this Avro schema by its Connect names (None: as it is);
    ``named`` holds the transforms of the named records met so far (a later field may name
    one: Debezium's ``after`` names the record ``before`` defined)."""
    schema = _avro_branch(schema)
    if isinstance(schema, str):
        return named.get(schema)
    if not isinstance(schema, Mapping):
        return None
    connect_name = schema.get("connect.name")
    logical_reader = _reader({**schema, "name": connect_name}) if isinstance(
        connect_name, str) else None
    if logical_reader is not None:
        # a logical type, also one written as a record (VariableScaleDecimal: scale, value)
        def logical(value: Any, read: Reader = logical_reader, name: Any = connect_name
                    ) -> Any:
            return read(value, str(name))
        if schema.get("type") == "record":
            _name(schema, named, logical)
        return logical
    if schema.get("type") == "record":
        fields = [(f["name"], t) for f in schema.get("fields") or ()
                  if (t := _avro_transform(f["type"], named)) is not None]
        if not fields:
            _name(schema, named, None)
            return None

        def record(value: Any) -> Any:
            if isinstance(value, dict):
                for name, transform in fields:
                    got = value.get(name)
                    if got is not None:
                        value[name] = transform(got)
            return value
        _name(schema, named, record)
        return record
    if schema.get("type") == "array":
        inner = _avro_transform(schema.get("items"), named)
        return None if inner is None else (
            lambda value: [None if v is None else inner(v) for v in value])
    reader = _reader(schema)
    if reader is None:
        return None
    name = str(schema.get("connect.name"))
    return lambda value: reader(value, name)


def _name(schema: Mapping[str, Any], named: dict[str, Any], transform: Any) -> None:
    """Keep a named record's transform under its name and its full name (a later field
    may refer to it by either)."""
    name = str(schema.get("name"))
    named[name] = transform
    if schema.get("namespace") and "." not in name:
        named[f"{schema['namespace']}.{name}"] = transform


def connect_typer(avro_schema: Any) -> Callable[[Any], Any] | None:
    """For a registry reader (``Registry(typer=...)``): a function typing a decoded Avro value
    in place by the Connect names of its writer schema (``connect.name`` on the fields of
    its records, the envelope's ``before`` and ``after`` included), or None when no field
    has one. A value that cannot be read raises ``Misfit``."""
    return _avro_transform(avro_schema, {})


def typed(image: Mapping[str, Any] | None, readers: Mapping[str, Reader]
          ) -> Mapping[str, Any] | None:
    """``image`` with each field of a logical type read (``Misfit`` naming the field when a
    value cannot be read); None stays None, and an image without such fields is itself."""
    if image is None:
        return None
    if not readers:
        return image
    return {k: (readers[k](v, k) if v is not None and k in readers else v)
            for k, v in image.items()}


