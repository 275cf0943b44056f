"""The table sink's column values: one JSON value -> the Python value asyncpg writes into a
column of a given PostgreSQL type, or ``Misfit`` naming the column and why (the per-type
half of ``fencing.postgres.sink.rows``; pure, no I/O)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["CONVERT", "Column", "Misfit", "integer_value", "json_text", "key_text", "supported",
           "text_value"]

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


def integer_value(col: Column, v: Any) -> int:
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


def text_value(col: Column, v: Any) -> str:
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


def json_text(col: Column, v: Any) -> str:
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


CONVERT: dict[str, Callable[[Column, Any], Any]] = {
    "int2": integer_value, "int4": integer_value, "int8": integer_value,
    "float4": _number, "float8": _number, "numeric": _numeric,
    "text": text_value, "varchar": text_value, "bpchar": text_value, "name": text_value,
    "bool": _boolean, "json": json_text, "jsonb": json_text, "uuid": _uuid,
    "timestamptz": _timestamptz, "timestamp": _timestamp, "date": _date,
}


def supported(type_name: str) -> bool:
    """True when the sink can write a column of this ``pg_type.typname``."""
    return type_name in CONVERT


def key_text(col: Column, key: bytes) -> str:
    try:
        return text_value(col, key.decode("utf-8"))
    except UnicodeDecodeError:
        raise Misfit(f"column {col.name}: the Kafka key is not UTF-8") from None
