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
import decimal
import json
import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

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
_INT_BOUNDS = {"int2": 1 << 15, "int4": 1 << 31, "int8": 1 << 63}


class Misfit(ValueError):
    """A record that does not fit the table; its message is the quarantine reason."""


@dataclass(frozen=True, slots=True)
class Column:
    """One writable column of the target table, as the catalog describes it."""

    name: str
    type_name: str  # pg_type.typname of the column's type (int4, text, jsonb, ...)
    not_null: bool = False
    has_default: bool = False
    max_chars: int | None = None  # varchar(n) / char(n)

    @property
    def required(self) -> bool:
        return self.not_null and not self.has_default


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


def _integer(col: Column, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        else:
            raise Misfit(f"column {col.name} ({col.type_name}): expected an integer, got "
                         f"{json.dumps(v)[:40]}")
    bound = _INT_BOUNDS[col.type_name]
    if not -bound <= v < bound:
        raise Misfit(f"column {col.name} ({col.type_name}): {v} is out of range")
    return int(v)


def _number(col: Column, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise Misfit(f"column {col.name} ({col.type_name}): expected a number, got "
                     f"{json.dumps(v)[:40]}")
    return float(v)


def _numeric(col: Column, v: Any) -> decimal.Decimal:
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise Misfit(f"column {col.name} (numeric): expected a number, got {json.dumps(v)[:40]}")
    try:
        d = decimal.Decimal(str(v))
    except decimal.InvalidOperation:
        raise Misfit(f"column {col.name} (numeric): {v!r} is not a number") from None
    if not d.is_finite():
        raise Misfit(f"column {col.name} (numeric): {v!r} is not finite")
    return d


def _text(col: Column, v: Any) -> str:
    if isinstance(v, str):
        s = v
    elif isinstance(v, bool | int | float):
        s = json.dumps(v)
    else:
        raise Misfit(f"column {col.name} ({col.type_name}): expected a string, got "
                     f"{json.dumps(v)[:40]}")
    if "\x00" in s:
        raise Misfit(f"column {col.name}: text cannot hold a NUL character")
    if col.max_chars is not None and len(s) > col.max_chars:
        raise Misfit(f"column {col.name} ({col.type_name}({col.max_chars})): {len(s)} "
                     "characters is too long")
    return s


def _boolean(col: Column, v: Any) -> bool:
    if not isinstance(v, bool):
        raise Misfit(f"column {col.name} (bool): expected true or false, got "
                     f"{json.dumps(v)[:40]}")
    return v


def _json(col: Column, v: Any) -> str:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def _uuid(col: Column, v: Any) -> uuid.UUID:
    if not isinstance(v, str):
        raise Misfit(f"column {col.name} (uuid): expected a string, got {json.dumps(v)[:40]}")
    try:
        return uuid.UUID(v)
    except ValueError:
        raise Misfit(f"column {col.name} (uuid): {v!r} is not a UUID") from None


def _iso(col: Column, v: Any) -> str:
    if not isinstance(v, str):
        raise Misfit(f"column {col.name} ({col.type_name}): expected an ISO-8601 string, got "
                     f"{json.dumps(v)[:40]}")
    return v


def _timestamptz(col: Column, v: Any) -> dt.datetime:
    try:
        t = dt.datetime.fromisoformat(_iso(col, v))
    except ValueError:
        raise Misfit(f"column {col.name} (timestamptz): {v!r} is not ISO-8601") from None
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)  # naive: read as UTC


def _timestamp(col: Column, v: Any) -> dt.datetime:
    try:
        t = dt.datetime.fromisoformat(_iso(col, v))
    except ValueError:
        raise Misfit(f"column {col.name} (timestamp): {v!r} is not ISO-8601") from None
    return t if t.tzinfo is None else t.astimezone(dt.UTC).replace(tzinfo=None)


def _date(col: Column, v: Any) -> dt.date:
    try:
        return dt.date.fromisoformat(_iso(col, v))
    except ValueError:
        raise Misfit(f"column {col.name} (date): {v!r} is not an ISO-8601 date") from None


_CONVERT: dict[str, Callable[[Column, Any], Any]] = {
    "int2": _integer, "int4": _integer, "int8": _integer,
    "float4": _number, "float8": _number, "numeric": _numeric,
    "text": _text, "varchar": _text, "bpchar": _text, "name": _text,
    "bool": _boolean, "json": _json, "jsonb": _json, "uuid": _uuid,
    "timestamptz": _timestamptz, "timestamp": _timestamp, "date": _date,
}


def supported(type_name: str) -> bool:
    """True when the sink can write a column of this ``pg_type.typname``."""
    return type_name in _CONVERT


def _payload(col: Column, record: SourceRecord, obj: Any, text: str | None) -> Any:
    if col.type_name == "jsonb" and text is not None:
        return text  # the value as it came: jsonb parses it the same as a re-encoding of obj
    return _json(col, obj) if col.type_name in ("json", "jsonb") else _text(col, _json(col, obj))


def _reserved(col: Column) -> Callable[[SourceRecord, Any, str | None], Any]:
    """How the reserved column ``col`` is filled from the record (the value's ``obj`` and its
    UTF-8 ``text``, None when the value was not UTF-8)."""
    name = col.name
    if name == "payload":
        return lambda record, obj, text: _payload(col, record, obj, text)
    if name == "kafka_topic":
        return lambda record, obj, text: record.topic
    if name == "kafka_partition":
        return lambda record, obj, text: _integer(col, record.partition)
    if name == "kafka_offset":
        return lambda record, obj, text: _integer(col, record.offset)
    if name == "kafka_key":
        return lambda record, obj, text: None if record.key is None else _key_text(
            col, record.key)
    return lambda record, obj, text: None if record.timestamp_ms is None else (  # timestamp
        dt.datetime.fromtimestamp(record.timestamp_ms / 1000, tz=dt.UTC))


def _key_text(col: Column, key: bytes) -> str:
    try:
        return _text(col, key.decode("utf-8"))
    except UnicodeDecodeError:
        raise Misfit(f"column {col.name}: the Kafka key is not UTF-8") from None


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
        raw = _key_text(col, record.key)
    else:
        raise Misfit(f"key column {col.name}: neither the value nor the Kafka key holds it")
    return _CONVERT[col.type_name](col, raw)


_RESERVED, _KEY, _FIELD = 0, 1, 2


def converter(layout: Layout) -> Callable[[SourceRecord], Upsert | Delete]:
    """``convert`` for one layout, with what depends only on the layout decided once: per
    column how it is filled (reserved, key or field) and the function that fills it."""
    plan: tuple[tuple[Column, int, Callable[..., Any]], ...] = tuple(
        (c, _RESERVED, _reserved(c)) if c.name in RESERVED
        else (c, _KEY, _CONVERT[c.type_name]) if c.name == layout.key
        else (c, _FIELD, _CONVERT[c.type_name]) for c in layout.columns)
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
