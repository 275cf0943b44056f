"""The table sink's pure half: a record's JSON value -> a row of the target table, or the
reason it does not fit.

Rules
- A value must be a JSON object; its fields map to columns by name. Fields without a
  column are ignored (the ``payload`` column, when present, keeps the whole value).
- Reserved columns are filled from the record, never from the JSON: ``payload`` (the value
  as JSON: a ``jsonb`` payload gets the value's own text, which jsonb parses exactly as a
  re-encoding; ``json``/``text`` payloads get the re-encoded compact JSON), ``kafka_topic``,
  ``kafka_partition``, ``kafka_offset``, ``kafka_key``, ``kafka_timestamp``. A Kafka
  timestamp a ``datetime`` cannot hold (years 1 to 9999) rejects the record; a writer that
  converts the milliseconds in SQL (``EPOCH_MS``) leaves that to PostgreSQL's range.
- A column absent from the value gets its default (or NULL); a *required* column (NOT NULL,
  no default) that is absent or null rejects the record. A value of the wrong JSON type for
  its column (or out of its range, or too long) rejects the record with the column named.
- With key columns (upsert; one, or several for a composite key): each key column is the
  value's field of that name, else the Kafka key's (``fencing.postgres.sink.keys``: read
  per ``--sink-key-format`` and converted to the column's type, so a ``bigint`` key column
  takes the key ``"214"``); a tombstone (null value) deletes the row of the Kafka key.
  Without a key column (insert) a tombstone is rejected: there is nothing to insert. An
  operation's ``key`` is the key column's value, or the tuple of them for a composite key.
- An upsert replaces the whole row (columns the record lacks get their default); in which
  order a batch's operations reach the table: ``fencing.postgres.sink.order``.
- ``convert`` is the sink's per-record cost: ``converter(layout)`` decides what depends
  only on the layout (which column is reserved, the key, the converter of each type) once.
  A value decoded by a schema'd format (``fencing.postgres.sink.formats``) is handed to the
  converter as its mapping; fields map to columns the same way.
- Nothing here does I/O; ``fencing.postgres.sink.table`` reads the layout and writes.

Long because the converter is the sink's per-record cost: each column's fill keeps its
common case inline beside every rule above (one call per column per record).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from fencing.jsontext import reader
from fencing.postgres.sink.keys import Format, KeyReader, key_reader
from fencing.postgres.sink.values import (
    _INT_BOUNDS,
    _TEXT_TYPES,
    CONVERT,
    Column,
    Misfit,
    integer_value,
    json_text,
    key_text,
    supported,
    text_value,
    writable,
)
from fencing.types import SourceRecord

__all__ = [
    "EPOCH_MS",
    "RESERVED",
    "Column",
    "Delete",
    "Layout",
    "Misfit",
    "Patch",
    "Upsert",
    "convert",
    "converter",
    "in_epoch_ms",
    "parse_json",
    "supported",
    "writable",
]

RESERVED = ("payload", "kafka_topic", "kafka_partition", "kafka_offset", "kafka_key",
            "kafka_timestamp")

#: A writer whose SQL turns the record's milliseconds into the ``timestamptz`` itself (the
#: staged upsert: ``fencing.postgres.sink.table``) asks ``converter(layout, epoch_ms=True)``
#: for ``kafka_timestamp`` as the record's ``timestamp_ms``: building a ``datetime`` per
#: record and asyncpg's binary encoding of it cost ~1.5 µs per record, against ~0.2 µs for
#: an ``int8`` (COPY of 200,000 rows measured on PostgreSQL 15, asyncpg 0.32). This SQL
#: expression, of the milliseconds ``{}``, is exact (integer microseconds) and refuses a
#: time PostgreSQL cannot hold with SQLSTATE 22008, which quarantines that record.
EPOCH_MS = "(timestamptz 'epoch' + {} * interval '1 millisecond')"


def in_epoch_ms(col: Column) -> bool:
    """Whether ``converter(layout, epoch_ms=True)`` fills ``col`` with milliseconds."""
    return col.name == "kafka_timestamp" and col.type_name == "timestamptz"


@dataclass(frozen=True, slots=True)
class Layout:
    """The target table: its writable columns (supported types) and the key columns (none:
    insert)."""

    columns: tuple[Column, ...]
    keys: tuple[str, ...] = ()

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)

    @property
    def key_columns(self) -> tuple[Column, ...]:
        return tuple(self.column(k) for k in self.keys)


@dataclass(frozen=True, slots=True)
class Upsert:
    """Write ``values`` into ``columns`` (insert, or update the row of ``key``: the key
    column's value, a tuple of them for a composite key)."""

    key: Any
    columns: tuple[str, ...]
    values: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Patch:
    """Update the row of ``key``: ``values`` into ``columns``, its other columns kept as
    they are; no row of ``key``, nothing written. What a change event asks that lacks some
    of its row's values (Debezium's placeholder for an unchanged TOASTed value)."""

    key: Any
    columns: tuple[str, ...]
    values: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete the row of ``key`` (a tombstone); with a version guard (``--sink-version-column``)
    only when the stored row's version is not newer than ``version`` (None: unguarded)."""

    key: Any
    version: Any = None


def _reserved(col: Column, *, epoch_ms: bool = False
              ) -> Callable[[SourceRecord, Any, str | None], Any]:
    """How the reserved column ``col`` is filled from the record (the value's ``obj`` and its
    UTF-8 ``text``, None when the value was not UTF-8); with ``epoch_ms`` a ``timestamptz``
    ``kafka_timestamp`` is the record's milliseconds, which the writer's SQL converts."""
    name = col.name
    if name == "payload" and col.type_name == "jsonb":
        # the value as it came, when UTF-8: jsonb parses it the same as a re-encoding of obj
        return lambda record, obj, text: json_text(col, obj) if text is None else text
    if name == "payload" and col.type_name == "json":
        return lambda record, obj, text: json_text(col, obj)
    if name == "payload":  # text and the like: the compact re-encoding, length-checked
        return lambda record, obj, text: text_value(col, json_text(col, obj))
    attr = _attribute(col, epoch_ms=epoch_ms)
    if attr is not None:  # the record's attribute unchanged (``_row`` reads it inline)
        get = attrgetter(attr)
        return lambda record, obj, text: get(record)
    if name == "kafka_partition":
        return lambda record, obj, text: integer_value(col, record.partition)
    if name == "kafka_offset":
        return lambda record, obj, text: integer_value(col, record.offset)
    if name == "kafka_key":
        return lambda record, obj, text: None if record.key is None else key_text(
            col, record.key)
    if epoch_ms and in_epoch_ms(col):  # see EPOCH_MS
        return lambda record, obj, text: record.timestamp_ms
    at, utc = dt.datetime.fromtimestamp, dt.UTC  # kafka_timestamp

    def timestamp(record: SourceRecord, obj: Any, text: str | None) -> Any:
        ms = record.timestamp_ms
        if ms is None:
            return None
        try:
            return at(ms / 1000, tz=utc)
        except (ValueError, OverflowError, OSError):
            raise Misfit(f"column {name}: Kafka timestamp {ms} ms is out of the range of "
                         "Python's datetime (years 1 to 9999)") from None
    return timestamp


def _nonfinite(constant: str) -> Any:
    raise Misfit(f"value holds a non-finite number ({constant})")


# Python's json reads NaN and +-Infinity (JSON has neither, and PostgreSQL refuses them);
# ``parse_constant`` is called for exactly those, at any depth, so no scan afterwards.
# ``reader``: the decoder's ``decode`` at the cost of its scanner (fencing.jsontext)
JSON_DECODER = _DECODER = json.JSONDecoder(parse_constant=_nonfinite)
_decode = reader(_DECODER.decode, _DECODER)


def parse_json(value: bytes) -> tuple[dict[str, Any], str | None]:
    """The value's JSON object and its text (None when the bytes are not plain UTF-8, e.g.
    with a BOM or in UTF-16, which are read as ``json.loads`` of the bytes reads them)."""
    text: str | None
    try:
        text = value.decode()
        obj = _decode(text)
    except (UnicodeDecodeError, json.JSONDecodeError):
        text = None
        try:
            obj = _decode(value.decode(json.detect_encoding(value), "surrogatepass"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise Misfit(f"value is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise Misfit(f"value is a JSON {type(obj).__name__}, not an object")
    return obj, text


Fill = Callable[[SourceRecord, dict[str, Any], "str | None"], Any]


def _key_field(col: Column, at: int, kafka_key: KeyReader) -> Fill:
    """A key column: the value's field, else the Kafka key's (``at``: the column's place
    among the key columns), with the column's converter looked up once."""
    name, to_column = col.name, CONVERT[col.kind]
    plain_text = col.type_name in _TEXT_TYPES and col.max_chars is None

    def fill(record: SourceRecord, obj: dict[str, Any], text: str | None) -> Any:
        raw = obj.get(name)
        if plain_text and type(raw) is str and "\x00" not in raw:
            return raw  # the common case inline (see ``_field``)
        return kafka_key(record)[at] if raw is None else to_column(col, raw)
    return fill


_ABSENT: Any = object()  # a field the value lacks: the column gets its default


def _not_null(col: Column, fill: Fill) -> Fill:
    def checked(record: SourceRecord, obj: dict[str, Any], text: str | None) -> Any:
        v = fill(record, obj, text)
        if v is None:
            raise Misfit(f"column {col.name} is NOT NULL but the value holds null")
        return v
    return checked


def _field(col: Column) -> Fill:
    """A field's column. The common case is tested inline, without a call to the column's
    converter: a str without NUL for a text column with no length limit, an int in range
    for an integer column — the values the converter returns unchanged."""
    name, required, not_null, to_column = col.name, col.required, col.not_null, \
        CONVERT[col.kind]
    plain_text = col.type_name in _TEXT_TYPES and col.max_chars is None
    bound = _INT_BOUNDS.get(col.type_name, 0)  # 0: no int is inline
    low = -bound

    def fill(record: SourceRecord, obj: dict[str, Any], text: str | None) -> Any:
        v = obj.get(name, _ABSENT)
        if plain_text:
            if type(v) is str and "\x00" not in v:
                return v
        elif type(v) is int and low <= v < bound:
            return v
        if v is None:
            if not_null:
                raise Misfit(f"column {name} is NOT NULL but the value holds null")
            return None
        if v is _ABSENT:
            if required:
                raise Misfit(f"missing required column {name}")
            return _ABSENT
        return to_column(col, v)
    return fill


def _fill(col: Column, layout: Layout, epoch_ms: bool, kafka_key: KeyReader) -> Fill:
    """How ``col`` is filled: from the record (reserved), the key, or the value's field."""
    if col.name in RESERVED:
        fill = _reserved(col, epoch_ms=epoch_ms)
        # payload, topic, partition and offset are never None; the key and timestamp may be
        return _not_null(col, fill) if col.not_null and col.name in (
            "kafka_key", "kafka_timestamp") else fill
    if col.name in layout.keys:
        return _key_field(col, layout.keys.index(col.name), kafka_key)
    return _field(col)


def _attribute(col: Column, *, epoch_ms: bool) -> str | None:
    """The ``SourceRecord`` attribute a reserved column's fill returns unchanged (no check,
    no conversion: what ``_reserved`` and ``_fill`` decide for it), else None."""
    name = col.name
    if name == "kafka_topic":
        return "topic"
    # Kafka's partition is an int32 and its offset an int64: no range to check in those
    if name == "kafka_partition" and col.type_name in ("int4", "int8"):
        return "partition"
    if name == "kafka_offset" and col.type_name == "int8":
        return "offset"
    if name == "kafka_timestamp" and epoch_ms and in_epoch_ms(col) and not col.not_null:
        return "timestamp_ms"
    return None


def _row(layout: Layout, fills: tuple[Fill, ...], epoch_ms: bool
         ) -> Callable[[SourceRecord, Any, str | None], tuple[Any, ...]]:
    """One function per layout that returns a record's values as one tuple display: a
    reserved column that is a record attribute read inline, one call per other column's
    fill. Generated from a fixed vocabulary (``record.<attribute>``, ``f<i>(…)``; no name
    from the catalog enters the source), as ``dataclasses`` makes its methods."""
    env: dict[str, Any] = {}
    parts = []
    for i, (col, fill) in enumerate(zip(layout.columns, fills, strict=True)):
        attr = _attribute(col, epoch_ms=epoch_ms) if col.name in RESERVED else None
        if attr is not None:
            parts.append(f"record.{attr}")
        else:
            env[f"f{i}"] = fill
            parts.append(f"f{i}(record, obj, text)")
    values = f"({', '.join(parts)},)" if parts else "()"
    exec(f"def row(record, obj, text):\n    return {values}\n", env)
    row: Callable[[SourceRecord, Any, str | None], tuple[Any, ...]] = env["row"]
    return row


_set_op = tuple(getattr(Upsert, name).__set__ for name in ("key", "columns", "values"))


def _upsert(key: Any, columns: tuple[str, ...], values: tuple[Any, ...]) -> Upsert:
    """``Upsert(key, columns, values)`` without the frozen dataclass's ``__init__``, which
    sets each field through ``object.__setattr__`` (a sixth of the conversion's time)."""
    op: Upsert = object.__new__(Upsert)
    _set_op[0](op, key)
    _set_op[1](op, columns)
    _set_op[2](op, values)
    return op


_PARSE: Any = object()  # convert_one's default: the value is JSON, parsed here


def converter(layout: Layout, *, epoch_ms: bool = False, kafka_key: KeyReader | None = None,
              known: frozenset[str] = frozenset(), strays: list[Any] | None = None
              ) -> Callable[..., Upsert | Delete]:
    """``convert`` for one layout, with what depends only on the layout decided once: per
    column the function that fills it (checks included), all columns' names, the key's
    position. Per record: one call per column that is not a record attribute (``_row``),
    and a second pass only when a field is absent (its column left to its default).
    ``epoch_ms``: see ``EPOCH_MS``; ``kafka_key``: the key columns from the Kafka key
    (default: a string key, ``keys.key_reader``); ``strays``: each value holding a field
    not in ``known`` is appended to it.

    The function takes the record, and optionally its value already decoded (a mapping,
    ``None`` for a tombstone): a schema'd format's; without it the value is parsed as JSON."""
    key_cols = layout.key_columns
    if kafka_key is None:
        kafka_key = key_reader(key_cols, Format.STRING) if key_cols else _no_key
    fills = tuple(_fill(c, layout, epoch_ms, kafka_key) for c in layout.columns)
    row = _row(layout, fills, epoch_ms)
    names = tuple(c.name for c in layout.columns)
    has_fields = any(c.name not in RESERVED and c.name not in layout.keys
                     for c in layout.columns)
    key_at = names.index(layout.keys[0]) if len(layout.keys) == 1 else -1
    keys_at = tuple(names.index(k) for k in layout.keys) if len(layout.keys) > 1 else ()
    read_key = kafka_key
    is_known = known.issuperset

    def convert_one(record: SourceRecord, decoded: Any = _PARSE) -> Upsert | Delete:
        if decoded is _PARSE:
            if record.value is None:
                decoded = None
            else:
                obj, text = parse_json(record.value)
        else:
            obj, text = decoded, None
        if decoded is None:
            if not key_cols:
                raise Misfit("a tombstone (null value) has nothing to insert without a key "
                             "column")
            got = read_key(record)
            return Delete(got[0] if len(got) == 1 else got)
        if strays is not None and not is_known(obj):
            strays.append(obj)
        values = row(record, obj, text)
        key: Any
        if key_at >= 0:
            key = values[key_at]
        elif keys_at:
            key = tuple([values[i] for i in keys_at])
        else:
            key = None
        if has_fields and _ABSENT in values:
            kept = [(n, v) for n, v in zip(names, values, strict=True) if v is not _ABSENT]
            return _upsert(key, tuple(n for n, _ in kept), tuple(v for _, v in kept))
        return _upsert(key, names, values)

    return convert_one


def _no_key(record: SourceRecord) -> tuple[Any, ...]:
    raise Misfit("no key column")


def convert(layout: Layout, record: SourceRecord) -> Upsert | Delete:
    """The operation ``record`` asks of the table; raises ``Misfit`` with the reason (for
    many records of one layout, ``converter(layout)`` once)."""
    return converter(layout)(record)
