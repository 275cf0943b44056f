"""The table sink's pure half: a record's JSON value -> a row of the target table, or the
reason it does not fit.

Rules
- A value must be a JSON object; its fields map to columns by name. Fields without a
  column are ignored (the ``payload`` column, when present, keeps the whole value).
- Reserved columns are filled from the record, never from the JSON: ``payload`` (the value
  as JSON: a ``jsonb`` payload gets the value's own text, which jsonb parses exactly as a
  re-encoding; ``json``/``text`` payloads get the re-encoded compact JSON), ``kafka_topic``,
  ``kafka_partition``, ``kafka_offset``, ``kafka_key``, ``kafka_timestamp``.
- A column absent from the value gets its default (or NULL); a *required* column (NOT NULL,
  no default) that is absent or null rejects the record. A value of the wrong JSON type for
  its column (or out of its range, or too long) rejects the record with the column named.
- With a key column (upsert): the key is the JSON field of that name, else the Kafka key
  (UTF-8); a tombstone (null value) deletes the row with the Kafka key. Without a key column
  (insert) a tombstone is rejected: there is nothing to insert.
- ``last_wins`` keeps, per key, only the batch's last operation (upsert or delete); an
  upsert replaces the whole row (columns the record lacks get their default).
- ``convert`` is the sink's per-record cost: ``converter(layout)`` decides what depends
  only on the layout (which column is reserved, the key, the converter of each type) once.
- Nothing here does I/O; ``fencing.postgres.sink.table`` reads the layout and writes.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fencing.postgres.sink.values import (
    CONVERT,
    Column,
    Misfit,
    integer_value,
    json_text,
    key_text,
    supported,
    text_value,
)
from fencing.types import SourceRecord

__all__ = [
    "RESERVED",
    "Column",
    "Delete",
    "Layout",
    "Misfit",
    "Upsert",
    "convert",
    "converter",
    "last_wins",
    "supported",
]

RESERVED = ("payload", "kafka_topic", "kafka_partition", "kafka_offset", "kafka_key",
            "kafka_timestamp")


@dataclass(frozen=True, slots=True)
class Layout:
    """The target table: its writable columns (supported types) and the key column."""

    columns: tuple[Column, ...]
    key: str | None = None

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)


@dataclass(frozen=True, slots=True)
class Upsert:
    """Write ``values`` into ``columns`` (insert, or update the row of ``key``)."""

    key: Any
    columns: tuple[str, ...]
    values: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete the row of ``key`` (a tombstone)."""

    key: Any


def _payload(col: Column, record: SourceRecord, obj: Any, text: str | None) -> Any:
    if col.type_name == "jsonb" and text is not None:
        return text  # the value as it came: jsonb parses it the same as a re-encoding of obj
    return json_text(col, obj) if col.type_name in ("json", "jsonb") else text_value(
        col, json_text(col, obj))


def _reserved(col: Column) -> Callable[[SourceRecord, Any, str | None], Any]:
    """How the reserved column ``col`` is filled from the record (the value's ``obj`` and its
    UTF-8 ``text``, None when the value was not UTF-8)."""
    name = col.name
    if name == "payload":
        return lambda record, obj, text: _payload(col, record, obj, text)
    if name == "kafka_topic":
        return lambda record, obj, text: record.topic
    if name == "kafka_partition":
        return lambda record, obj, text: integer_value(col, record.partition)
    if name == "kafka_offset":
        return lambda record, obj, text: integer_value(col, record.offset)
    if name == "kafka_key":
        return lambda record, obj, text: None if record.key is None else key_text(
            col, record.key)
    return lambda record, obj, text: None if record.timestamp_ms is None else (  # timestamp
        dt.datetime.fromtimestamp(record.timestamp_ms / 1000, tz=dt.UTC))


def _parse(value: bytes) -> tuple[dict[str, Any], str | None]:
    """The value's JSON object and its text (None when the bytes are not plain UTF-8, e.g.
    with a BOM or in UTF-16, which ``json.loads`` of the bytes still reads)."""
    text: str | None
    try:
        text = value.decode()
        obj = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError):
        text = None
        try:
            obj = json.loads(value)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise Misfit(f"value is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise Misfit(f"value is a JSON {type(obj).__name__}, not an object")
    if any(isinstance(v, float) and not math.isfinite(v) for v in obj.values()):
        raise Misfit("value holds a non-finite number")
    return obj, text


def _key_of(col: Column, record: SourceRecord, obj: dict[str, Any] | None) -> Any:
    raw: Any
    if obj is not None and obj.get(col.name) is not None:
        raw = obj[col.name]
    elif record.key is not None:
        raw = key_text(col, record.key)
    else:
        raise Misfit(f"key column {col.name}: neither the value nor the Kafka key holds it")
    return CONVERT[col.type_name](col, raw)


_RESERVED, _KEY, _FIELD = 0, 1, 2


def converter(layout: Layout) -> Callable[[SourceRecord], Upsert | Delete]:
    """``convert`` for one layout, with what depends only on the layout decided once: per
    column how it is filled (reserved, key or field) and the function that fills it."""
    plan: tuple[tuple[Column, int, Callable[..., Any]], ...] = tuple(
        (c, _RESERVED, _reserved(c)) if c.name in RESERVED
        else (c, _KEY, CONVERT[c.type_name]) if c.name == layout.key
        else (c, _FIELD, CONVERT[c.type_name]) for c in layout.columns)
    key_col = layout.column(layout.key) if layout.key is not None else None

    def convert_one(record: SourceRecord) -> Upsert | Delete:
        if record.value is None:
            if key_col is None:
                raise Misfit("a tombstone (null value) has nothing to insert without a key "
                             "column")
            return Delete(_key_of(key_col, record, None))
        obj, text = _parse(record.value)
        names: list[str] = []
        values: list[Any] = []
        key = None
        for col, kind, fill in plan:
            name = col.name
            if kind == _RESERVED:
                v = fill(record, obj, text)
            elif kind == _KEY:
                v = key = _key_of(col, record, obj)
            elif name not in obj:
                if col.required:
                    raise Misfit(f"missing required column {name}")
                continue
            else:
                v = obj[name]
                if v is not None:
                    v = fill(col, v)
            if v is None and col.not_null:
                raise Misfit(f"column {name} is NOT NULL but the value holds null")
            names.append(name)
            values.append(v)
        return Upsert(key, tuple(names), tuple(values))

    return convert_one


def convert(layout: Layout, record: SourceRecord) -> Upsert | Delete:
    """The operation ``record`` asks of the table; raises ``Misfit`` with the reason (for
    many records of one layout, ``converter(layout)`` once)."""
    return converter(layout)(record)


def last_wins(ops: Sequence[Upsert | Delete]) -> list[Upsert | Delete]:
    """Per key the last operation, in the order of their last occurrence."""
    last: dict[Any, Upsert | Delete] = {}
    for op in ops:
        last.pop(op.key, None)
        last[op.key] = op
    return list(last.values())
