"""The table sink's column values: one decoded field -> the Python value asyncpg writes into
a column of a given PostgreSQL type, or ``Misfit`` naming the column and why (the per-type
half of ``fencing.postgres.sink.rows``; pure, no I/O).

Long because each PostgreSQL type's converter sits with the reasons it refuses a value.

Rules
- A field comes from JSON (str, int, float, bool, list, dict, None) or from a schema'd
  decoder (``fencing.postgres.sink.formats``), which also gives ``Decimal``, ``datetime``,
  ``date``, ``time``, ``UUID`` and ``bytes``. Every converter takes both: a decoder's
  typed value is kept exactly (an Avro ``decimal`` stays a ``Decimal``, never a float).
- ``key_from_text``: a key given as text (the Kafka key's UTF-8, a JSON key's string) is
  parsed into the key column's type: integers (decimal digits with an optional sign,
  range-checked), ``numeric``, floats, ``uuid``, text, ``bool``, ``date`` and timestamps;
  a text that does not parse is a ``Misfit`` naming the column.
- An array column (``_int4``, ``_text``, ...) takes a list of its element type (nulls
  allowed); ``json``/``jsonb`` take anything (typed values as JSON: a ``Decimal`` and a
  time as their exact text, ``bytes`` as base64); ``bytea`` takes bytes or base64 text.
- An enum column (any type of ``pg_enum``, and arrays of one) takes a string that is one of
  its labels; ``bit(n)`` takes exactly n bits, ``varbit(n)`` at most n, as a text of 0s and
  1s or an ``asyncpg.BitString``. Anything else is a ``Misfit`` naming the labels or the
  length: PostgreSQL would refuse it.
- ``interval`` takes a ``timedelta`` or an ISO-8601 duration without years or months
  (asyncpg writes days and microseconds; a month has no fixed length); ``inet`` an address
  with an optional netmask, ``cidr`` a network without bits right of its mask; ``xml`` a
  string (PostgreSQL checks it); ``oid`` an integer of 0 to 2^32 - 1. ``macaddr`` and
  ``money`` are not written: asyncpg has no binary encoder for them, and COPY is binary.
- A change event's ``io.debezium.data.Bits`` (``Bits``) holds a number, not a length: its
  bytes are the bits' value, little-endian, without leading zero bytes. ``bit(n)`` gets it
  padded to n bits (exact: the type's length is n); ``varbit(n)`` and text get its binary
  numeral, without leading zeros (those of the source's value are not in the event);
  ``bytea`` gets the event's bytes.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import ipaddress
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from asyncpg import BitString

__all__ = ["CONVERT", "Bits", "Column", "Misfit", "bit_string", "integer_value", "json_text",
           "key_from_text", "key_text", "supported", "text_value", "writable"]


def bit_string(text: str) -> BitString:
    """``asyncpg.BitString`` of a text of 0s and 1s: its ``__init__`` reads the text character
    by character (``int(bit)``, asyncpg/pgproto/types.py), though annotated ``bytes``."""
    return BitString(text)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Bits:
    """A change event's ``io.debezium.data.Bits``: its bytes (the bits' value,
    little-endian)."""

    raw: bytes

    def numeral(self, width: int = 0) -> str:
        """The value in binary, at least ``width`` digits ("0" for zero without a width)."""
        number = int.from_bytes(self.raw, "little")
        return format(number, "b").zfill(width) if width else format(number, "b")


_INT_BOUNDS = {"int2": 1 << 15, "int4": 1 << 31, "int8": 1 << 63}
_TEXT_TYPES = ("text", "varchar", "bpchar", "name")


class Misfit(ValueError):
    """A record that does not fit the table; its message is the quarantine reason."""


@dataclass(frozen=True, slots=True)
class Column:
    """One writable column of the target table, as the catalog describes it."""

    name: str
    type_name: str  # pg_type.typname of the column's type (int4, text, jsonb, _int8, ...)
    not_null: bool = False
    has_default: bool = False
    max_chars: int | None = None  # varchar(n) / char(n), bit(n) / varbit(n): the length
    #: numeric(p, s)'s s, or a time type's (p) digits of a second's fraction: PostgreSQL
    #: rounds a value with more, so the sink refuses it (None: unconstrained)
    scale: int | None = None
    #: the labels of an enum type (of the column, or of its array's elements); None: no enum
    labels: tuple[str, ...] | None = None

    @property
    def required(self) -> bool:
        return self.not_null and not self.has_default

    @property
    def kind(self) -> str:
        """The name its converter has (``CONVERT``): ``enum`` / ``_enum`` for an enum type
        (its own name is the user's), else the type's name."""
        if self.labels is None:
            return self.type_name
        return "_enum" if self.type_name.startswith("_") else "enum"


def _shown(v: Any) -> str:
    try:
        return json.dumps(v)[:40]
    except (TypeError, ValueError):
        return repr(v)[:40]


def integer_value(col: Column, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        elif isinstance(v, decimal.Decimal) and v.is_finite() and v == v.to_integral_value():
            v = int(v)
        else:
            raise Misfit(f"column {col.name} ({col.type_name}): expected an integer, got "
                         f"{_shown(v)}")
    bound = _INT_BOUNDS[col.type_name]
    if not -bound <= v < bound:
        raise Misfit(f"column {col.name} ({col.type_name}): {v} is out of range")
    return int(v)


def _number(col: Column, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float | decimal.Decimal):
        raise Misfit(f"column {col.name} ({col.type_name}): expected a number, got {_shown(v)}")
    return float(v)


def _numeric(col: Column, v: Any) -> decimal.Decimal:
    if isinstance(v, decimal.Decimal):
        d = v
    elif isinstance(v, bool) or not isinstance(v, int | float | str):
        raise Misfit(f"column {col.name} (numeric): expected a number, got {_shown(v)}")
    else:
        try:
            d = decimal.Decimal(str(v))
        except decimal.InvalidOperation:
            raise Misfit(f"column {col.name} (numeric): {v!r} is not a number") from None
    if not d.is_finite():
        raise Misfit(f"column {col.name} (numeric): {v!r} is not finite")
    scale = col.scale
    exponent = d.as_tuple().exponent  # an int: d is finite
    if scale is not None and 0 <= scale < len(_SCALES) and isinstance(exponent, int) \
            and exponent < -scale and d != d.quantize(_SCALES[scale]):
        raise Misfit(f"column {col.name} (numeric, scale {scale}): {d} has more decimal "
                     "places, which PostgreSQL would round")
    return d


_SCALES = [decimal.Decimal(1).scaleb(-s) for s in range(1001)]  # numeric's scale: 0..1000


def _whole(col: Column, t: Any) -> Any:
    """``t`` (a time or datetime) when ``col``'s fraction of a second holds it whole."""
    digits = col.scale
    if digits is not None and digits < 6 and t.microsecond % 10 ** (6 - digits):
        raise Misfit(f"column {col.name} ({col.type_name}({digits})): {t.isoformat()} has "
                     f"digits below {digits} of a second's fraction, which PostgreSQL would "
                     "round")
    return t


def text_value(col: Column, v: Any) -> str:
    if isinstance(v, str):
        s = v
    elif isinstance(v, bool | int | float):
        s = json.dumps(v)
    elif isinstance(v, decimal.Decimal | uuid.UUID):
        s = str(v)
    elif isinstance(v, dt.date | dt.time):
        s = v.isoformat()
    elif isinstance(v, BitString):
        s = v.as_string()
    elif isinstance(v, Bits):
        s = v.numeral()
    else:
        raise Misfit(f"column {col.name} ({col.type_name}): expected a string, got {_shown(v)}")
    if "\x00" in s:
        raise Misfit(f"column {col.name}: text cannot hold a NUL character")
    if col.max_chars is not None and len(s) > col.max_chars:
        raise Misfit(f"column {col.name} ({col.type_name}({col.max_chars})): {len(s)} "
                     "characters is too long")
    return s


def _boolean(col: Column, v: Any) -> bool:
    if not isinstance(v, bool):
        raise Misfit(f"column {col.name} (bool): expected true or false, got {_shown(v)}")
    return v


def _typed_json(v: Any) -> Any:
    """A decoder's typed value inside a json/jsonb column (``json.dumps``' ``default``)."""
    if isinstance(v, decimal.Decimal | uuid.UUID):
        return str(v)
    if isinstance(v, dt.date | dt.time):
        return v.isoformat()
    if isinstance(v, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(v)).decode()
    if isinstance(v, BitString):
        return v.as_string()
    if isinstance(v, Bits):
        return v.numeral()
    raise TypeError(f"{type(v).__name__} is not JSON")


_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                        default=_typed_json)


def json_text(col: Column, v: Any) -> str:
    try:
        return _JSON.encode(v)
    except (TypeError, ValueError) as exc:
        raise Misfit(f"column {col.name} ({col.type_name}): {exc}") from None


def _uuid(col: Column, v: Any) -> uuid.UUID:
    if isinstance(v, uuid.UUID):
        return v
    if not isinstance(v, str):
        raise Misfit(f"column {col.name} (uuid): expected a string, got {_shown(v)}")
    try:
        return uuid.UUID(v)
    except ValueError:
        raise Misfit(f"column {col.name} (uuid): {v!r} is not a UUID") from None


def _iso(col: Column, v: Any) -> str:
    if not isinstance(v, str):
        raise Misfit(f"column {col.name} ({col.type_name}): expected an ISO-8601 string, got "
                     f"{_shown(v)}")
    return v


def _timestamptz(col: Column, v: Any) -> dt.datetime:
    if isinstance(v, dt.datetime):
        t = v
    else:
        try:
            t = dt.datetime.fromisoformat(_iso(col, v))
        except ValueError:
            raise Misfit(f"column {col.name} (timestamptz): {v!r} is not ISO-8601") from None
    return _whole(col, t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC))  # naive: UTC


def _timestamp(col: Column, v: Any) -> dt.datetime:
    if isinstance(v, dt.datetime):
        t = v
    else:
        try:
            t = dt.datetime.fromisoformat(_iso(col, v))
        except ValueError:
            raise Misfit(f"column {col.name} (timestamp): {v!r} is not ISO-8601") from None
    return _whole(col, t if t.tzinfo is None else t.astimezone(dt.UTC).replace(tzinfo=None))


def _date(col: Column, v: Any) -> dt.date:
    if isinstance(v, dt.date) and not isinstance(v, dt.datetime):
        return v
    try:
        return dt.date.fromisoformat(_iso(col, v))
    except ValueError:
        raise Misfit(f"column {col.name} (date): {v!r} is not an ISO-8601 date") from None


def _time(col: Column, v: Any) -> dt.time:
    if isinstance(v, dt.time):
        return _whole(col, v)
    try:
        t = dt.time.fromisoformat(_iso(col, v))
    except ValueError:
        raise Misfit(f"column {col.name} (time): {v!r} is not an ISO-8601 time") from None
    return _whole(col, t)


def _timetz(col: Column, v: Any) -> dt.time:
    t = _time(col, v)
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)  # naive: read as UTC


def _bytea(col: Column, v: Any) -> bytes:
    if isinstance(v, bytes | bytearray | memoryview):
        return bytes(v)
    if isinstance(v, BitString):
        return v.bytes  # the bits in PostgreSQL's order, the last byte padded with zeros
    if isinstance(v, Bits):
        return v.raw  # as the event holds them
    if isinstance(v, str):
        try:
            return base64.b64decode(v, validate=True)
        except (binascii.Error, ValueError):
            raise Misfit(f"column {col.name} (bytea): a string must be base64") from None
    raise Misfit(f"column {col.name} (bytea): expected bytes or base64, got {_shown(v)}")


def _enum(col: Column, v: Any) -> str:
    labels = col.labels or ()
    if not isinstance(v, str) or v not in labels:
        raise Misfit(f"column {col.name} ({col.type_name}): {_shown(v)} is not one of its "
                     f"labels ({', '.join(labels)[:200]})")
    return v


def _bit(col: Column, v: Any) -> BitString:
    n = col.max_chars
    if isinstance(v, Bits):  # a number: padded for bit(n), without leading zeros for varbit
        text = v.numeral(n if col.type_name == "bit" and n is not None else 0)
        bits = bit_string(text)
    elif isinstance(v, BitString):
        bits = v
    elif isinstance(v, str) and not v.strip("01"):
        bits = bit_string(v)
    else:
        raise Misfit(f"column {col.name} ({col.type_name}): expected a bit string (0s and 1s),"
                     f" got {_shown(v)}")
    if n is not None and (len(bits) != n if col.type_name == "bit" else len(bits) > n):
        raise Misfit(f"column {col.name} ({col.type_name}({n})): {len(bits)} bits do not fit")
    return bits


_DURATION = re.compile(
    r"P(?!\Z)(?:([+-]?\d+)Y)?(?:([+-]?\d+)M)?(?:([+-]?\d+)W)?(?:([+-]?\d+)D)?"
    r"(?:T(?=[+-]?\d)(?:([+-]?\d+)H)?(?:([+-]?\d+)M)?(?:([+-]?\d+(?:\.\d{1,6})?)S)?)?\Z")


def _interval(col: Column, v: Any) -> dt.timedelta:
    """A ``timedelta``, or an ISO-8601 duration (``P3DT4H5M6.78S``; Debezium's
    ``interval.handling.mode=string``) without years or months: asyncpg writes an interval
    as days and microseconds, and a month is no fixed number of days."""
    if isinstance(v, dt.timedelta):
        return v
    m = _DURATION.match(v) if isinstance(v, str) else None
    if m is None:
        raise Misfit(f"column {col.name} (interval): expected an ISO-8601 duration, got "
                     f"{_shown(v)}")
    years, months, weeks, days, hours, minutes, seconds = m.groups()
    if int(years or 0) or int(months or 0):
        raise Misfit(f"column {col.name} (interval): {v} has years or months, which the "
                     "sink cannot write exactly (a month is no fixed number of days)")
    whole, _, fraction = (seconds or "0").partition(".")
    micros = int(whole) * 1_000_000 + (-1 if whole.startswith("-") else 1) * int(
        (fraction + "000000")[:6])
    return dt.timedelta(weeks=int(weeks or 0), days=int(days or 0), hours=int(hours or 0),
                        minutes=int(minutes or 0), microseconds=micros)


def _inet(col: Column, v: Any) -> Any:
    """An address with an optional netmask (``10.0.0.1``, ``10.0.0.1/24``, IPv6 alike)."""
    try:
        if col.type_name == "cidr":  # a network: no bits set right of its mask
            return ipaddress.ip_network(v, strict=True)
        if isinstance(v, str) and "/" not in v:  # an interface would be written with /32
            return ipaddress.ip_address(v)
        return ipaddress.ip_interface(v)
    except (TypeError, ValueError) as exc:
        what = "a network" if col.type_name == "cidr" else "an address"
        raise Misfit(f"column {col.name} ({col.type_name}): {_shown(v)} is not {what}: "
                     f"{exc}") from None


def _oid(col: Column, v: Any) -> int:
    n = integer_value(replace(col, type_name="int8"), v)
    if not 0 <= n < 1 << 32:
        raise Misfit(f"column {col.name} (oid): {n} is out of range")
    return n


CONVERT: dict[str, Callable[[Column, Any], Any]] = {
    "int2": integer_value, "int4": integer_value, "int8": integer_value,
    "float4": _number, "float8": _number, "numeric": _numeric,
    "text": text_value, "varchar": text_value, "bpchar": text_value, "name": text_value,
    "bool": _boolean, "json": json_text, "jsonb": json_text, "uuid": _uuid,
    "timestamptz": _timestamptz, "timestamp": _timestamp, "date": _date, "time": _time,
    "timetz": _timetz,
    "bytea": _bytea, "enum": _enum, "bit": _bit, "varbit": _bit,
    "interval": _interval, "inet": _inet, "cidr": _inet, "xml": text_value, "oid": _oid,
}


def _array(element: Callable[[Column, Any], Any], type_name: str
           ) -> Callable[[Column, Any], Any]:
    def convert(col: Column, v: Any) -> list[Any]:
        if not isinstance(v, list | tuple):
            raise Misfit(f"column {col.name} ({type_name}[]): expected an array, got "
                         f"{_shown(v)}")
        inner = replace(col, type_name=type_name, max_chars=None)
        return [None if x is None else element(inner, x) for x in v]
    return convert


for _name, _fn in list(CONVERT.items()):  # arrays of every supported type, as pg_type names them
    CONVERT["_" + _name] = _array(_fn, _name)


def supported(type_name: str) -> bool:
    """True when the sink can write a column of this ``pg_type.typname``."""
    return type_name in CONVERT


def writable(col: Column) -> bool:
    """True when the sink can write ``col`` (its type, or an enum type's labels, known)."""
    return col.kind in CONVERT


_INTEGER = re.compile(r"[+-]?[0-9]+\Z")
_TRUE, _FALSE = frozenset({"true", "t", "1"}), frozenset({"false", "f", "0"})


def key_from_text(col: Column, s: str) -> Any:
    """The key column's value for a key given as text (see the module Rules)."""
    t = col.type_name
    if t in _INT_BOUNDS:
        if not _INTEGER.match(s):
            raise Misfit(f"key column {col.name} ({t}): the key {s[:40]!r} is not an integer")
        return integer_value(col, int(s))
    if t in ("float4", "float8"):
        try:
            f = float(s)
        except ValueError:
            raise Misfit(f"key column {col.name} ({t}): the key {s[:40]!r} is not a "
                         "number") from None
        if f != f or f in (float("inf"), float("-inf")):
            raise Misfit(f"key column {col.name} ({t}): the key {s[:40]!r} is not finite")
        return f
    if t == "bool":
        if s.lower() in _TRUE:
            return True
        if s.lower() in _FALSE:
            return False
        raise Misfit(f"key column {col.name} (bool): the key {s[:40]!r} is not true or false")
    if t in ("numeric", "uuid", "date", "time", "timestamp", "timestamptz", "bit", "varbit") \
            or t in _TEXT_TYPES or col.kind == "enum":
        return CONVERT[col.kind](col, s)
    raise Misfit(f"key column {col.name} ({t}): a key given as text cannot fill this type")


def key_text(col: Column, key: bytes) -> str:
    try:
        return text_value(col, key.decode("utf-8"))
    except UnicodeDecodeError:
        raise Misfit(f"column {col.name}: the Kafka key is not UTF-8") from None
