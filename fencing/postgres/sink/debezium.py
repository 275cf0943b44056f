"""Debezium change events for the table sink (``--sink-envelope debezium``): an event's
envelope -> the table operation it stands for, with Debezium's and Kafka Connect's logical
types read into the Python values the sink's converters write (pure, no I/O).

Long because the skim keeps the JSON converter's per-record path inline beside the rules
of every other shape an event comes in.

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
- An update (``u``) whose image holds Debezium's placeholder for an unchanged TOASTed
  value (``UNAVAILABLE``, in any of its forms) in a field lacks that value (REPLICA
  IDENTITY DEFAULT): the field leaves the image and is named in the event's ``kept``, and
  the sink updates the row's other columns (``rows.Patch``), the placeholder never
  written. Debezium writes a primary-key change as a delete and a create of the new key
  (its record has the header ``__debezium.oldkey``), and that create lacks the TOASTed
  values the update kept (seen on Debezium 3.6.1): holding the placeholder, it is a
  ``Misfit`` (``refuse_unavailable``, which needs the record's headers). Other creates and
  snapshot reads hold the row's values whole.
- A field's logical type is its schema's name: ``io.debezium.time.{Date, Time, MicroTime,
  NanoTime, Timestamp, MicroTimestamp, NanoTimestamp, ZonedTimestamp, ZonedTime,
  MicroDuration}``,
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
  "payload": P}``, S first: about 2.3 KB of a 2.8 KB event for a table of four columns).
  ``JsonEvents`` parses S once per distinct text: a record that begins with the bytes of
  the last schema seen is read from its payload on (the same value: the head compared
  byte for byte, the rest parsed whole), and the readers of its images are kept with it.
- The ``source`` block is read only when something needs it (``JsonEvents(source=True)``:
  ``--sink-version-from source.FIELD``). Otherwise a JSON payload in Debezium's field order
  -- ``before``, ``after``, ``source``, then ``transaction``, ``op`` and the timestamps --
  is read without it: ``before`` and ``after`` are parsed where they stand; ``source`` ends
  at its first closing brace, which must be followed by ``,"transaction":``; the tail from
  there is matched whole when it is the one Debezium writes without transaction metadata
  (``_PLAIN_REST``: the check the scanner would make of it), parsed otherwise, and must end
  where the payload ends. ``source`` is about 40 % of the text and 60 % of the parse of an
  event of a narrow table (``python -m ops.bench.hotpath``: ``cdc_convert_ns`` against
  ``cdc_source_read_convert_ns``). A payload of any other shape (a key out of that order,
  an object nested in ``source``, a brace in one of its strings, a key of the envelope
  repeated in the tail) is parsed whole. A ``source`` block that is not valid JSON inside
  its braces is not noticed when nothing reads it (Kafka Connect's converters write JSON
  with Jackson and never produce one).
"""

from __future__ import annotations

import base64
import enum
import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from fencing.postgres.sink.connect_types import Reader, connect_typer, field_types, typed
from fencing.postgres.sink.rows import JSON_DECODER, parse_json
from fencing.postgres.sink.values import Misfit

__all__ = ["DELETE", "NOTHING", "TRUNCATE", "UPSERT", "Event", "JsonEvents", "Op",
           "connect_typer", "field_types", "not_a_table_topic", "refuse_unavailable", "typed",
           "unwrap"]


class Op(enum.Enum):
    """What a change event asks of the target table."""

    UPSERT = "upsert"  # c, r, u: write the after image
    DELETE = "delete"  # d: delete the row of the key
    TRUNCATE = "truncate"  # t
    NOTHING = "nothing"  # the tombstone after a delete


class Event(NamedTuple):
    """One change event read: the operation, its row image (typed; ``after`` for an upsert,
    ``before`` for a delete, which may be None), and its ``source`` block (the version
    guard's position, e.g. ``source.lsn``; empty when it was not read, see ``JsonEvents``).
    A tuple: built once per record, it costs a third less than a frozen dataclass."""

    op: Op
    image: Mapping[str, Any] | None
    source: Mapping[str, Any]
    #: an update's columns whose values the event lacks (Debezium's placeholder, see
    #: ``UNAVAILABLE``): not in ``image``, their stored values kept
    kept: tuple[str, ...] = ()


# The members as module constants: in CPython 3.11 every ``Op.X`` is a lookup through the
# enum's class (~0.1 µs), several per record on the sink's path
UPSERT, DELETE, TRUNCATE, NOTHING = Op.UPSERT, Op.DELETE, Op.TRUNCATE, Op.NOTHING
_OPS = {"c": UPSERT, "r": UPSERT, "u": UPSERT, "d": DELETE, "t": TRUNCATE}
_NO_SOURCE: Mapping[str, Any] = {}
_NOTHING = Event(NOTHING, None, _NO_SOURCE)


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


#: Debezium's placeholder for a value an update left unchanged and the source did not log
#: (PostgreSQL's TOASTed values under REPLICA IDENTITY DEFAULT; ``unavailable.value
#: .placeholder``'s default), in each form a field holds it, read from Debezium 3.6.1's
#: events: text and JSON as the string, bytea as its bytes (base64 through the JSON
#: converter), a text array as ``[placeholder]``, an integer array as the bytes' codes
UNAVAILABLE = "__debezium_unavailable_value"
_UNAVAILABLE_BYTES = UNAVAILABLE.encode()
_UNAVAILABLE_FORMS = (UNAVAILABLE, _UNAVAILABLE_BYTES, base64.b64encode(_UNAVAILABLE_BYTES)
                      .decode(), [UNAVAILABLE], [_UNAVAILABLE_BYTES], list(_UNAVAILABLE_BYTES))
#: the forms as a JSON payload's text holds them: an update holding none is read as it is
_UNAVAILABLE_TEXTS = (UNAVAILABLE, _UNAVAILABLE_FORMS[2],
                      "[" + ",".join(map(str, _UNAVAILABLE_BYTES)) + "]")
_NO_READERS: Mapping[str, Reader] = {}
_HEAD = '{"schema":'
_PAYLOAD = ',"payload":'
_BEFORE = '{"before":'
_AFTER = ',"after":'
_SOURCE = ',"source":{'
_TAIL = ',"transaction":'
_IMAGES = frozenset({"before", "after", "source"})
_INT = "-?(?:0|[1-9][0-9]*+)"  # a JSON integer (possessive: nothing to backtrack into)
#: ``source`` up to its first closing brace, then the tail as Debezium writes it without
#: transaction metadata, matched whole: the same check as the scanner's of that tail, at a
#: third of its cost (no dict, no ints built)
_PLAIN_REST = re.compile(r',"source":\{[^}]*+\},"transaction":null,"op":"([a-z])"'
                         f'(?:,"ts_ms":{_INT})?+(?:,"ts_us":{_INT})?+(?:,"ts_ns":{_INT})?+}}')
Types = Callable[[Mapping[str, Any] | None, str], Mapping[str, Reader]]


def _types(schema: Mapping[str, Any] | None, which: str) -> Mapping[str, Reader]:
    """The readers of ``schema``'s ``which`` image; ``Misfit`` when ``schema`` (the event's
    own, with ``schemas.enable``: any JSON) is not a Connect struct schema."""
    try:
        return field_types(_image_schema(schema, which))
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise Misfit(f"the event's schema is not a Kafka Connect struct schema "
                     f"({type(exc).__name__}: {exc})") from None


class JsonEvents:
    """Change events of Kafka Connect's JSON converter read from a record's bytes, each
    distinct schema parsed once (see the module Rules). One per sink: not thread-safe."""

    def __init__(self, *, source: bool = False) -> None:
        self._head: bytes | None = None  # '{"schema":' + the last schema's text + ',"payload":'
        self._schema: Mapping[str, Any] | None = None
        self._readers: dict[str, Mapping[str, Reader]] = {}
        # the scanner of the sink's own JSON decoder (``rows.parse_json``): NaN refused alike
        self._scan: Callable[[str, int], tuple[Any, int]] = JSON_DECODER.scan_once  # type: ignore[attr-defined]
        self._skim = not source  # read payloads without their source block (module Rules)

    def read(self, raw: bytes, *, truncate: bool = False) -> Event:
        """``unwrap`` of the record's value ``raw`` (not None)."""
        got = self.image(raw, truncate=truncate)
        return Event(UPSERT, got, _NO_SOURCE) if isinstance(got, dict) else got

    def image(self, raw: bytes, *, truncate: bool = False) -> dict[str, Any] | Event:
        """``read``, for the sink's per-record path: an upsert read by the skim without a
        schema (module Rules) comes as its ``after`` image alone, the ``Event(UPSERT, image,
        {})`` it stands for, without that tuple built."""
        head = self._head
        if head is not None and raw.startswith(head) and raw.endswith(b"}"):
            try:
                text = raw[len(head):-1].decode()  # the payload, if it is the whole rest
            except UnicodeDecodeError:
                text = ""  # read whole below, naming the error
            if self._skim and text.startswith(_BEFORE):
                got = self._skimmed(text, self._schema, truncate)
                if got is not None:
                    return got
            try:
                payload, end = self._scan(text, 0)
            except (StopIteration, ValueError, Misfit):
                end = -1  # not this schema's envelope whole: read below, naming the error
            if end == len(text):
                if payload is None:
                    return _NOTHING
                if type(payload) is dict:  # else the whole value's read names the mistake
                    return unwrap(payload, schema=self._schema, truncate=truncate,
                                  types=self.types)
        elif self._skim and raw.startswith(b'{"before":'):
            try:
                got = self._skimmed(raw.decode(), None, truncate)
            except UnicodeDecodeError:
                got = None  # read whole below, naming the error
            if got is not None:
                return got
        value = parse_json(raw)[0]
        if "payload" in value and "schema" in value and "op" not in value:
            self._learn(raw, value["schema"])
        return unwrap(value, truncate=truncate, types=self.types)

    def _skimmed(self, text: str, schema: Mapping[str, Any] | None, truncate: bool
                 ) -> dict[str, Any] | Event | None:
        """The event of the payload ``text`` (which starts with ``{"before":`` and must end
        where it ends) read without its ``source`` block (module Rules); ``image``'s dict for
        an upsert without a schema. None when it is not in Debezium's field order, or is
        malformed: then it is read whole, which names the error. Every step inline: this is
        the sink's per-record path (``python -m ops.bench.hotpath``: ``cdc_convert_ns``)."""
        scan = self._scan
        try:
            if text.startswith("null", len(_BEFORE)):  # a create's: what the scanner reads
                before, i = None, len(_BEFORE) + 4
            else:
                before, i = scan(text, len(_BEFORE))
            if not text.startswith(_AFTER, i):
                return None
            after, i = scan(text, i + len(_AFTER))
        except (StopIteration, ValueError, Misfit):
            return None
        # source's end: its first closing brace followed by ``,"transaction":``. Not one in
        # a string (in valid JSON a string's closing quote is never followed by a letter),
        # nor a nested object's (the tail would then end before the payload's end)
        plain = _PLAIN_REST.match(text, i)  # source, the tail without transaction metadata
        if plain is not None:
            if plain.end() != len(text):
                return None
            code = plain[1]
            op = _OPS.get(code)
            if op is UPSERT and schema is None and type(after) is dict and (code != "u" or (
                    _UNAVAILABLE_TEXTS[0] not in text and _UNAVAILABLE_TEXTS[1] not in text
                    and _UNAVAILABLE_TEXTS[2] not in text)):  # a create: see refuse_unavailable
                return after  # _row's first case, without readers or the Event
            if op is not None:
                return _row(op, code, before, after, _NO_SOURCE, schema, truncate, self.types)
            tail: Any = {"op": code}  # not a row change: unwrap names why
        else:
            k = text.find("}", i + len(_SOURCE)) + 1
            if not text.startswith(_SOURCE, i) or k == 0 or not text.startswith(_TAIL, k):
                return None
            try:
                tail, end = scan("{" + text[k + 1:], 0)  # tail's index j is text's k + j
            except (StopIteration, ValueError, Misfit):
                return None
            if k + end != len(text) or type(tail) is not dict or not _IMAGES.isdisjoint(tail):
                return None  # a repeated key: the whole parse keeps the last one
        tail["before"] = before
        tail["after"] = after
        return unwrap(tail, schema=schema, truncate=truncate, types=self.types)

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
    op = _OPS.get(code) if type(code) is str else None
    if op is None:
        if code == "m":
            raise Misfit("a logical decoding message (op m) is not a row change")
        if "ddl" in value or "tableChanges" in value:
            raise Misfit("a schema change event is not a row change: subscribe to the "
                         "tables' topics only")
        raise Misfit(f"not a Debezium change event: op {code!r}")
    source = value.get("source")
    if source is None or (type(source) is not dict and not isinstance(source, Mapping)):
        source = _NO_SOURCE
    return _row(op, code, value.get("before"), value.get("after"), source, schema, truncate,
                types)


def _row(op: Op, code: Any, before: Any, after: Any, source: Mapping[str, Any],
         schema: Mapping[str, Any] | None, truncate: bool, types: Types) -> Event:
    """The event of a row change ``op`` (``code``: its letter) of images ``before`` and
    ``after`` (see ``unwrap``)."""
    if op is UPSERT:
        if type(after) is not dict and not isinstance(after, Mapping):
            raise Misfit(f"op {code} without an after image" if after is None else
                         f"op {code}: its after image is not an object")
        kept = _unavailable(after) if code == "u" else ()  # a create: refuse_unavailable
        if kept:
            after = {k: v for k, v in after.items() if k not in kept}
        try:
            return Event(op, typed(after, types(schema, "after")), source, kept)
        except Misfit:
            # a logical type cannot read the placeholder (a key change's create: the JSON
            # of a jsonb column): named as what it is
            held = _unavailable(after) if code == "c" else ()
            if held:
                raise _key_change_misfit(held) from None
            raise
    if op is TRUNCATE:
        if not truncate:
            raise Misfit("a truncate of the source table (op t): applied only with "
                         "--sink-truncate")
        return Event(op, None, source)
    if before is not None and type(before) is not dict and not isinstance(before, Mapping):
        raise Misfit(f"op {code}: its before image is not an object")
    return Event(op, typed(before, types(schema, "before")), source)


#: the header Debezium puts on the create of a primary-key change's new key
OLD_KEY_HEADER = "__debezium.oldkey"


def refuse_unavailable(headers: Any, image: Mapping[str, Any] | None) -> None:
    """``Misfit`` when ``image`` is the create of a primary-key change's new key (its record
    has ``OLD_KEY_HEADER``) and holds Debezium's placeholder: under REPLICA IDENTITY DEFAULT
    that create lacks the TOASTed values the update kept (seen on Debezium 3.6.1). Other
    creates and snapshot reads hold every value; only a key change's is checked, by its
    header (a few comparisons per record, where a search of the text for each form cost
    0.5 µs)."""
    for name, _value in headers:
        if name == OLD_KEY_HEADER:
            kept = _unavailable(image or {})
            if kept:
                raise _key_change_misfit(kept)
            return


def _key_change_misfit(kept: tuple[str, ...]) -> Misfit:
    return Misfit(f"op c: {', '.join(kept)} hold{'s' * (len(kept) == 1)} Debezium's "
                  f"placeholder {UNAVAILABLE}, not the row's values (the new key of a "
                  "primary-key change under REPLICA IDENTITY DEFAULT lacks the TOASTed values "
                  "it kept): set REPLICA IDENTITY FULL on the source table")


def _unavailable(after: Mapping[str, Any]) -> tuple[str, ...]:
    """The fields of an upsert's image that hold Debezium's placeholder (``UNAVAILABLE``):
    values the event lacks. Per record: a value is compared only when its type and length
    are a form's."""
    kept: tuple[str, ...] = ()
    for k, v in after.items():
        if type(v) in _FORM_TYPES and len(v) in _FORM_LENGTHS and v in _UNAVAILABLE_FORMS:
            kept += (k,)
    return kept


_FORM_TYPES = frozenset({str, bytes, list})
_FORM_LENGTHS = frozenset(len(form) for form in _UNAVAILABLE_FORMS)
