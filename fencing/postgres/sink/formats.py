"""The table sink's schema'd formats: a batch's values, and the Kafka keys it needs, decoded
through the schema registry before conversion (``--sink-format``, ``--sink-key-format``).

Rules
- A record is in Confluent's wire format: magic byte 0 and a 4-byte schema id (or magic
  byte 1 and a schema GUID; or the id in a ``__value_schema_id`` / ``__key_schema_id``
  header), then, for Protobuf, the message indexes, then the payload. Bytes that are not
  in it, an id the registry does not know, and a payload that does not decode (or, for
  JSON Schema, does not validate) make the record a misfit: quarantined with the reason.
  The registry not answering raises ``Unavailable`` out of the batch (``registry``).
- The first record of a schema id waits for the registry (``Registry.reader``); every
  later one decodes without I/O. Avro and JSON Schema records whose id is in the 5-byte
  header take a fast path (no ``SchemaId`` object per record).
- A value must decode to a record (a mapping of fields); a Kafka key may also be a
  primitive (``keys.from_object``). Keys are decoded only where the sink needs them: a
  tombstone, or a value lacking one of the key columns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka.serialization import MessageField, SerializationContext

from fencing.postgres.sink.keys import Format
from fencing.postgres.sink.registry import Registry
from fencing.postgres.sink.values import Misfit
from fencing.types import SourceRecord

__all__ = ["Decoding", "wire"]

_TYPES = {Format.AVRO: "AVRO", Format.PROTOBUF: "PROTOBUF", Format.JSON_SCHEMA: "JSON"}
_FAST = (Format.AVRO, Format.JSON_SCHEMA)  # no message indexes after the schema id
_NAMES = {Format.AVRO: "Avro", Format.PROTOBUF: "Protobuf", Format.JSON_SCHEMA: "JSON Schema"}
_HEADERS = {False: "__value_schema_id", True: "__key_schema_id"}  # confluent-kafka's names


def _id_header(record: SourceRecord, key: bool) -> bool:
    """Whether the record carries its schema id in a header (then the payload is whole)."""
    if not record.headers:
        return False
    name = _HEADERS[key]
    return any(h[0] == name for h in record.headers)


def wire(data: bytes, fmt: Format, record: SourceRecord, *, key: bool = False
         ) -> tuple[Any, tuple[int, ...], bytes]:
    """The schema id (or GUID), the Protobuf message indexes and the payload of ``data``;
    raises ``Misfit`` when it is not in the wire format."""
    if fmt in _FAST and len(data) > 5 and data[0] == 0 and not _id_header(record, key):
        return int.from_bytes(data[1:5], "big"), (), data[5:]
    # the slow path only (GUIDs, Protobuf indexes, a header id): imported on first use, with
    # the registry's client (fencing.postgres.sink.registry)
    from confluent_kafka.schema_registry import dual_schema_id_deserializer
    from confluent_kafka.schema_registry.common.serde import SchemaId

    sid = SchemaId(_TYPES[fmt])
    ctx = SerializationContext(record.topic, MessageField.KEY if key else MessageField.VALUE,
                               list(record.headers) or None)
    try:
        payload = dual_schema_id_deserializer(data, ctx, sid).read()
    except Exception as exc:  # too short, another magic byte, a broken varint
        raise Misfit(f"{'key' if key else 'value'} is not in the schema registry's wire "
                     f"format (magic byte, schema id): {type(exc).__name__}: {exc}") from None
    ref = sid.id if sid.id is not None else sid.guid
    return ref, tuple(sid.message_indexes or ()), payload


def _unread(payload: bytes) -> Any:
    """The fast path's reader before a record's schema id was read."""
    raise ValueError("no schema id read yet")


class _Need:
    """A record whose schema the registry has not been asked for yet."""

    __slots__ = ("indexes", "ref")

    def __init__(self, ref: Any, indexes: tuple[int, ...]) -> None:
        self.ref = ref
        self.indexes = indexes


class Decoding:
    """Decodes batches for one sink (see the module Rules). Batches of several partitions
    decode concurrently (each waits for the registry on its own), so ``values`` returns
    each batch's decoded keys; the sink puts them into ``keys`` (read by
    ``keys.key_reader``) right before its conversion, which does not yield."""

    def __init__(self, registry: Registry, *, value_format: Format, key_format: Format,
                 key_columns: tuple[str, ...], parse_json: Any) -> None:
        self.registry = registry
        self.value_format = value_format
        self.key_format = key_format
        self.key_columns = key_columns
        self._parse_json = parse_json  # rows.parse_json: a JSON value when only keys are schema'd
        self.keys: dict[int, Any] = {}

    def _read(self, data: bytes, fmt: Format, record: SourceRecord, key: bool) -> Any:
        """The decoded value, its ``Misfit``, or ``_Need`` when the schema is not resolved."""
        try:
            ref, indexes, payload = wire(data, fmt, record, key=key)
            read = self.registry.cached(fmt, ref, indexes)
            if read is None:
                return _Need(ref, indexes)
            try:
                return read(payload)
            except Exception as exc:
                raise Misfit(f"{'key' if key else 'value'} does not decode as {_NAMES[fmt]} "
                             f"with schema id {ref}: {type(exc).__name__}: "
                             f"{str(exc)[:200]}") from None
        except Misfit as exc:
            return exc

    async def decode(self, data: bytes, fmt: Format, record: SourceRecord, *,
                     key: bool = False) -> Any:
        """One value or key decoded, or its ``Misfit`` (returned); raises ``Unavailable``."""
        got = self._read(data, fmt, record, key)
        if isinstance(got, _Need):
            try:
                await self.registry.reader(fmt, got.ref, got.indexes)
            except Misfit as exc:
                return exc
            got = self._read(data, fmt, record, key)
        return got

    def _needs_key(self, value: Any) -> bool:
        if not self.key_format.registry or not self.key_columns:
            return False
        if not isinstance(value, Mapping):
            return True  # a tombstone (or a misfit value: its key is not read)
        return any(value.get(k) is None for k in self.key_columns)

    def _value(self, record: SourceRecord) -> Any:
        """The decoded value of a record with a value, its ``Misfit``, or ``_Need``."""
        fmt, data = self.value_format, record.value
        assert data is not None
        if fmt is Format.JSON:
            try:
                return self._parse_json(data)[0]
            except Misfit as exc:
                return exc
        value = self._read(data, fmt, record, False)
        if value is not None and not isinstance(value, Mapping | Misfit | _Need):
            value = Misfit(f"value decodes to {type(value).__name__} {str(value)[:40]!r}, "
                           "not a record of fields")
        return value

    async def values(self, records: Sequence[SourceRecord]
                     ) -> tuple[list[Any], dict[int, Any]]:
        """Per record its value as a mapping, None for a tombstone, or the ``Misfit``; and
        the Kafka keys the batch needs, decoded, by offset. Raises ``Unavailable``."""
        keys: dict[int, Any] = {}
        out: list[Any] = []
        append = out.append
        known = self.registry.by_id(self.value_format) if self.value_format in _FAST else {}
        schemad_key = self.key_format.registry and bool(self.key_columns)
        # the last wire header read fast and its reader
        head: bytes = b"\xff"
        read: Callable[[bytes], Any] = _unread
        for record in records:
            data = record.value
            value: Any
            if data is None:
                value = None
                fast = False
            else:
                # the fast path: the schema id of the record before, or one seen before, in
                # the 5-byte header (module Rules)
                fast = data.startswith(head) and not record.headers
                if not fast and len(data) > 5 and data[0] == 0 and not (
                        record.headers and _id_header(record, False)):
                    seen = known.get(data[1:5])
                    if seen is not None:
                        head, read, fast = data[:5], seen, True
            if fast:
                try:
                    value = read(data[5:])  # type: ignore[index]
                except Exception:
                    value = self._value(record)  # the same failure, named the slow way
                if type(value) is not dict:
                    value = self._value(record)
            elif data is not None:
                value = self._value(record)
                if isinstance(value, _Need):
                    value = await self.decode(data, self.value_format, record)
                    if value is not None and not isinstance(value, Mapping | Misfit):
                        value = self._value(record)
            append(value)
            if schemad_key and record.key is not None and not isinstance(value, Misfit) \
                    and self._needs_key(value):
                keys[record.offset] = await self.decode(record.key, self.key_format, record,
                                                        key=True)
        return out, keys
