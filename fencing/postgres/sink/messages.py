"""A decoded Protobuf message -> the mapping of its fields the table sink converts (pure).

Rules
- Fields map by their name in the schema. A field with presence (``optional``, a message,
  a oneof member, proto2) that is not set is left out, so its column gets its default; a
  proto3 scalar without presence always has its value (0, "", false when not sent).
- Scalars are kept: integers, floats, bools, strings, ``bytes``; an enum is its value's
  name (text), or its number when the schema does not know it.
- Well-known messages become typed values: ``google.protobuf.Timestamp`` an aware UTC
  ``datetime`` (microseconds), ``google.type.Date`` a ``date``, the wrappers
  (``google.protobuf.Int64Value`` ...) their value, ``confluent.type.Decimal`` an exact
  ``Decimal``. Any other message, and maps, become nested mappings (for ``jsonb``);
  repeated fields lists (an array column, or ``jsonb``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

__all__ = ["WELL_KNOWN", "message_fields"]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_WRAPPERS = {f"google.protobuf.{n}Value" for n in (
    "Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes")}


def _timestamp(m: Any) -> dt.datetime:
    return _EPOCH + dt.timedelta(seconds=m.seconds, microseconds=m.nanos // 1000)


def _date(m: Any) -> Any:
    return dt.date(m.year, m.month, m.day) if m.year and m.month and m.day else None


def _decimal(m: Any) -> Any:
    from confluent_kafka.schema_registry.confluent.type.decimal_utils import from_proto_decimal
    return from_proto_decimal(m)


#: message full name -> its typed value (the wrappers: their ``value``)
WELL_KNOWN: dict[str, Any] = {
    "google.protobuf.Timestamp": _timestamp,
    "google.type.Date": _date,
    "confluent.type.Decimal": _decimal,
    **{name: (lambda m: m.value) for name in _WRAPPERS},
}


def _scalar(field: FieldDescriptor, v: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_ENUM:
        known = field.enum_type.values_by_number.get(v)
        return known.name if known is not None else v
    return v


def _value(field: FieldDescriptor, v: Any) -> Any:
    if field.message_type is not None:
        typed = WELL_KNOWN.get(field.message_type.full_name)
        return typed(v) if typed is not None else message_fields(v)
    return _scalar(field, v)


def _is_map(desc: Descriptor | None) -> bool:
    return desc is not None and desc.GetOptions().map_entry


def message_fields(msg: Message) -> dict[str, Any]:
    """The fields of ``msg`` by name, typed (see the module Rules)."""
    out: dict[str, Any] = {}
    for field in msg.DESCRIPTOR.fields:
        v = getattr(msg, field.name)
        if field.is_repeated:
            if _is_map(field.message_type):
                value_field = field.message_type.fields_by_name["value"]
                out[field.name] = {str(k): _value(value_field, x) for k, x in v.items()}
            else:
                out[field.name] = [_value(field, x) for x in v]
        elif field.has_presence and not msg.HasField(field.name):
            continue
        else:
            out[field.name] = _value(field, v)
    return out
