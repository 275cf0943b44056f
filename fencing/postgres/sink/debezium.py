"""Debezium change events for the table sink (``--sink-envelope debezium``): an event's
envelope -> the table operation it stands for, with Debezium's and Kafka Connect's logical
types read into the Python values the sink's converters write (pure, no I/O).

Rules
- An event's value is Debezium's envelope: ``op``, ``before``, ``after``, ``source``,
  ``ts_ms``. With Kafka Connect's JSON converter and ``schemas.enable=true`` it comes as
  ``{"schema": S, "payload": P}``; without schemas as ``P`` alone; through the schema
  registry (Avro, Protobuf, JSON Schema) as the decoded record, with the writer schema's
  Connect names (``connect.name``) as its schema.
- ``op`` ``c`` (create), ``r`` (read: the snapshot) and ``u`` (update) upsert the ``after``
  image; ``d`` deletes the row of the key (``before``'s key columns, else the Kafka key);
  ``t`` (truncate) truncates the table, only when the sink is told to (else the event is a
  ``Misfit`` naming why); ``m`` (a logical decoding message) is not a row change: a
  ``Misfit``. A null value is the tombstone Debezium writes after a delete, for Kafka's
  compaction: it changes nothing (``NOTHING``).
- A field's logical type is its schema's name: ``io.debezium.time.{Date, Time, MicroTime,
  NanoTime, Timestamp, MicroTimestamp, NanoTimestamp, ZonedTimestamp, ZonedTime}``,
  ``org.apache.kafka.connect.data.{Decimal, Date, Time, Timestamp}``,
  ``io.debezium.data.{VariableScaleDecimal, Json, Uuid, Bits, Enum, EnumSet}``; arrays of
  them element by element. Each is read from every representation a converter gives it
  (days or a ``date``, base64 text or bytes or a ``Decimal`` or a JSON number for a
  decimal), into ``date``, ``time``, ``datetime`` (naive for a timestamp without time
  zone, aware UTC for a zoned one), ``Decimal``, a parsed JSON value, ``UUID``, the bits'
  value (``values.Bits``: Bits needs the schema; a ``varbit``'s leading zeros are not in
  the event), text (an enum's label), a list of text. A value no PostgreSQL type holds
  whole (nanoseconds below a microsecond) is a ``Misfit``: never rounded or cut.
- Without a schema (JSON without ``schemas.enable``) fields keep their JSON values: a
  temporal or decimal column then needs the schema, and a record whose integer does not
  fit its column is quarantined with the reason.
- Kafka Connect's JSON converter repeats the schema in every record (``{"schema": S,
  "payload": P}``, S first: about 1.5 KB of a 2 KB event for a table of four columns).
  ``JsonEvents`` parses S once per distinct text: a record that begins with the bytes of
  the last schema seen is read from its payload on (the same value: the head compared
  byte for byte, the rest parsed whole), and the readers of its images are kept with it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fencing.postgres.sink.connect_types import Reader, connect_typer, field_types, typed
from fencing.postgres.sink.rows import JSON_DECODER, parse_json
from fencing.postgres.sink.values import Misfit

__all__ = ["Event", "JsonEvents", "Op", "connect_typer", "field_types", "not_a_table_topic",
           "typed", "unwrap"]


class Op(enum.Enum):
    """What a change event asks of the target table."""

    UPSERT = "upsert"  # c, r, u: write the after image
    DELETE = "delete"  # d: delete the row of the key
    TRUNCATE = "truncate"  # t
    NOTHING = "nothing"  # the tombstone after a delete


@dataclass(frozen=True, slots=True)
class Event:
    """One change event read: the operation, its row image (typed; ``after`` for an upsert,
    ``before`` for a delete, which may be None), and its ``source`` block (the version
    guard's position, e.g. ``source.lsn``)."""

    op: Op
    image: Mapping[str, Any] | None
    source: Mapping[str, Any]


_OPS = {"c": Op.UPSERT, "r": Op.UPSERT, "u": Op.UPSERT, "d": Op.DELETE, "t": Op.TRUNCATE}
_NOTHING = Event(Op.NOTHING, None, {})


def _image_schema(schema: Mapping[str, Any] | None, which: str) -> Mapping[str, Any] | None:
    """The struct schema of the envelope's ``before`` or ``after`` field."""
    for f in (schema or {}).get("fields") or ():
        if f.get("field") == which or f.get("name") == which:
            inner = f if "field" in f else f.get("type")
            if isinstance(inner, list):
                inner = next((s for s in inner if isinstance(s, Mapping)), None)
            return inner if isinstance(inner, Mapping) else None
    return None


#: topics of Debezium's that carry no row changes: heartbeats, transaction metadata, schema
#: history (the MySQL-family connectors'), the signalling and notification channels
_NOT_TABLE_TOPICS = ("__debezium-heartbeat", "__debezium_heartbeat")
_NOT_TABLE_SUFFIXES = (".transaction", "-schema-changes", ".schema-changes", "dbhistory",
                       "schema-history", ".signal", ".notification")


def not_a_table_topic(topic: str) -> str | None:
    """Why ``topic`` is one of Debezium's topics without row changes (a heartbeat,
    transaction metadata, schema history), None for a table's topic."""
    if topic.startswith(_NOT_TABLE_TOPICS):
        return "Debezium's heartbeat topic"
    for suffix in _NOT_TABLE_SUFFIXES:
        if topic.endswith(suffix):
            return "one of Debezium's topics without row changes (" + suffix.strip(".-") + ")"
    return None


_NO_READERS: Mapping[str, Reader] = {}
_HEAD = '{"schema":'
_PAYLOAD = ',"payload":'
Types = Callable[[Mapping[str, Any] | None, str], Mapping[str, Reader]]


def _types(schema: Mapping[str, Any] | None, which: str) -> Mapping[str, Reader]:
    return field_types(_image_schema(schema, which))


class JsonEvents:
    """Change events of Kafka Connect's JSON converter read from a record's bytes, each
    distinct schema parsed once (see the module Rules). One per sink: not thread-safe."""

    def __init__(self) -> None:
        self._head: bytes | None = None  # '{"schema":' + the last schema's text + ',"payload":'
        self._schema: Mapping[str, Any] | None = None
        self._readers: dict[str, Mapping[str, Reader]] = {}
        # the scanner of the sink's own JSON decoder (``rows.parse_json``): NaN refused alike
        self._scan: Callable[[str, int], tuple[Any, int]] = JSON_DECODER.scan_once  # type: ignore[attr-defined]

    def read(self, raw: bytes, *, truncate: bool = False) -> Event:
        """``unwrap`` of the record's value ``raw`` (not None)."""
        head = self._head
        if head is not None and raw.startswith(head) and raw.endswith(b"}"):
            try:
                text = raw[len(head):].decode()
                payload, end = self._scan(text, 0)
            except (UnicodeDecodeError, StopIteration, ValueError, Misfit):
                end = -1  # not this schema's envelope whole: read below, naming the error
            if end == len(text) - 1:  # nothing but the closing brace follows the payload
                if payload is None:
                    return _NOTHING
                if type(payload) is dict:  # else the whole value's read names the mistake
                    return unwrap(payload, schema=self._schema, truncate=truncate,
                                  types=self.types)
        value = parse_json(raw)[0]
        if "payload" in value and "schema" in value and "op" not in value:
            self._learn(raw, value["schema"])
        return unwrap(value, truncate=truncate, types=self.types)

    def _learn(self, raw: bytes, schema: Any) -> None:
        """Keep ``raw``'s head when its schema comes first, as the converter writes it."""
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            return
        if not text.startswith(_HEAD) or not isinstance(schema, Mapping):
            return
        try:
            _obj, end = self._scan(text, len(_HEAD))
        except StopIteration:
            return
        if text.startswith(_PAYLOAD, end):
            self._head = text[:end + len(_PAYLOAD)].encode()
            self._schema = schema
            self._readers = {}

    def types(self, schema: Mapping[str, Any] | None, which: str) -> Mapping[str, Reader]:
        """The readers of ``schema``'s ``which`` image, kept for the schema last learnt."""
        if schema is None:
            return _NO_READERS  # JSON without schemas: the fields as they are
        if schema is not self._schema:
            return _types(schema, which)
        got = self._readers.get(which)
        if got is None:
            got = self._readers[which] = _types(schema, which)
        return got


def unwrap(value: Any, *, schema: Mapping[str, Any] | None = None,
           truncate: bool = False, types: Types = _types) -> Event:
    """The event ``value`` (decoded; None for a tombstone) stands for; ``schema`` is the
    writer schema of a registry format (a JSON value with ``schemas.enable`` brings its
    own); ``types`` gives the readers of an image's fields. Raises ``Misfit`` naming why
    when it is not a row change the sink applies."""
    if value is None:
        return _NOTHING
    if type(value) is not dict and not isinstance(value, Mapping):
        raise Misfit("not a Debezium change event: the value is not an object")
    if "payload" in value and "schema" in value and "op" not in value:
        schema, value = value["schema"], value["payload"]
        if value is None:
            return _NOTHING
        if not isinstance(value, Mapping):
            raise Misfit("not a Debezium change event: its payload is not an object")
    code = value.get("op")
    op = _OPS.get(code) if isinstance(code, str) else None
    if op is None:
        if code == "m":
            raise Misfit("a logical decoding message (op m) is not a row change")
        if "ddl" in value or "tableChanges" in value:
            raise Misfit("a schema change event is not a row change: subscribe to the "
                         "tables' topics only")
        raise Misfit(f"not a Debezium change event: op {code!r}")
    source = value.get("source")
    source = source if type(source) is dict or isinstance(source, Mapping) else {}
    if op is Op.TRUNCATE:
        if not truncate:
            raise Misfit("a truncate of the source table (op t): applied only with "
                         "--sink-truncate")
        return Event(op, None, source)
    which = "after" if op is Op.UPSERT else "before"
    image = value.get(which)
    is_map = type(image) is dict or isinstance(image, Mapping)
    if op is Op.UPSERT and not is_map:
        raise Misfit(f"op {code} without an after image")
    if image is not None and not is_map:
        raise Misfit(f"op {code}: its {which} image is not an object")
    return Event(op, typed(image, types(schema, which)), source)
