"""The table sink's Kafka key: how it fills the key columns of a tombstone and of a record
whose value lacks a key field (``--sink-key-format``; pure, no I/O).

Rules
- ``string`` (the default): the key is UTF-8 text naming one key column; it is parsed into
  that column's type (``values.key_from_text``: ``"214"`` fills a ``bigint`` with 214). A
  composite key cannot be read from one string: such a record is a misfit.
- ``json``: the key is a JSON object holding the key columns by name (``{"a": 1, "b":
  "x"}``), or, for one key column, a JSON scalar (``214``, ``"214"``).
- ``avro``, ``protobuf``, ``json-schema``: the key was decoded through the schema registry
  before conversion (``fencing.postgres.sink.formats``); the decoded record or primitive is
  read like a JSON key.
- A string given for a non-text column is parsed as ``key_from_text`` parses it; any other
  value goes through the column's converter. A null Kafka key, a key that does not decode,
  or one lacking a key column is a ``Misfit`` with the reason.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping
from typing import Any

from fencing.postgres.sink.values import CONVERT, Column, Misfit, key_from_text
from fencing.types import SourceRecord

__all__ = ["Format", "KeyReader", "key_reader"]

KeyReader = Callable[[SourceRecord], tuple[Any, ...]]


class Format(enum.Enum):
    """How a record's key or value is encoded (``--sink-key-format``, ``--sink-format``)."""

    STRING = "string"  # UTF-8 text (keys only)
    JSON = "json"  # JSON text, no schema
    AVRO = "avro"  # Confluent wire format (magic 0, schema id) + Avro binary
    PROTOBUF = "protobuf"  # Confluent wire format + message indexes + Protobuf binary
    JSON_SCHEMA = "json-schema"  # Confluent wire format + JSON, validated against its schema

    @property
    def registry(self) -> bool:
        """True when decoding needs the schema registry."""
        return self in (Format.AVRO, Format.PROTOBUF, Format.JSON_SCHEMA)


def _one(col: Column, v: Any, where: str) -> Any:
    if v is None:
        raise Misfit(f"key column {col.name}: {where} holds no {col.name}")
    if isinstance(v, str):
        return key_from_text(col, v)
    return CONVERT[col.type_name](col, v)


def from_object(cols: tuple[Column, ...], obj: Any, where: str = "the Kafka key"
                ) -> tuple[Any, ...]:
    """The key columns' values from a decoded key: a mapping by column name (Kafka Connect's
    JSON ``{"schema": …, "payload": {…}}`` read as its payload), or one scalar for one key
    column; raises ``Misfit``."""
    if isinstance(obj, Mapping) and obj.keys() == {"schema", "payload"} \
            and isinstance(obj["payload"], Mapping):
        obj = obj["payload"]
    if isinstance(obj, Mapping):
        return tuple(_one(c, obj.get(c.name), where) for c in cols)
    if len(cols) == 1 and not isinstance(obj, list):
        return (_one(cols[0], obj, where),)
    names = ", ".join(c.name for c in cols)
    raise Misfit(f"key ({names}): {where} holds {str(obj)[:40]!r}, not an object holding "
                 "the key columns")


def _absent(cols: tuple[Column, ...]) -> Misfit:
    names = ", ".join(c.name for c in cols)
    return Misfit(f"key column{'s' if len(cols) > 1 else ''} {names}: neither the value nor "
                  "the Kafka key holds it")


def key_reader(cols: tuple[Column, ...], fmt: Format,
               decoded: Mapping[int, Any] | None = None) -> KeyReader:
    """The Kafka key's values for ``cols`` (see the module Rules). For a registry format,
    ``decoded`` maps a record's offset to its decoded key (or the ``Misfit`` its decoding
    raised), filled per batch by the sink before conversion."""
    if fmt is Format.STRING:
        if len(cols) > 1:
            names = ", ".join(c.name for c in cols)

            def composite(record: SourceRecord) -> tuple[Any, ...]:
                if record.key is None:
                    raise _absent(cols)
                raise Misfit(f"key ({names}): a string Kafka key names one column; a composite "
                             "key needs --sink-key-format json or a schema format")
            return composite
        col = cols[0]

        def text(record: SourceRecord) -> tuple[Any, ...]:
            if record.key is None:
                raise _absent(cols)
            try:
                s = record.key.decode("utf-8")
            except UnicodeDecodeError:
                raise Misfit(f"key column {col.name}: the Kafka key is not UTF-8") from None
            return (key_from_text(col, s),)
        return text
    if fmt is Format.JSON:
        def parsed(record: SourceRecord) -> tuple[Any, ...]:
            if record.key is None:
                raise _absent(cols)
            try:
                obj = json.loads(record.key)
            except (UnicodeDecodeError, ValueError) as exc:
                raise Misfit(f"the Kafka key is not JSON: {exc}") from None
            return from_object(cols, obj)
        return parsed
    table = decoded if decoded is not None else {}

    def schemad(record: SourceRecord) -> tuple[Any, ...]:
        if record.key is None:
            raise _absent(cols)
        obj = table.get(record.offset, _MISSING)
        if obj is _MISSING:
            raise Misfit(f"the Kafka key was not decoded ({fmt.value})")
        if isinstance(obj, Misfit):
            raise obj
        return from_object(cols, obj)
    return schemad


_MISSING: Any = object()
