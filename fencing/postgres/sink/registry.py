"""The table sink's schema registry side: one asynchronous client, and per schema id the
reader confluent-kafka's deserializers resolve for it (I/O: HTTP to the registry).

Rules
- Only ``confluent_kafka.schema_registry`` (pure Python: httpx, fastavro, protobuf,
  jsonschema) is used here, never librdkafka; ``tests/unit/test_import_boundaries.py`` pins
  that this module and ``formats`` are the only ones in ``fencing`` that import it.
- A schema is fetched once per id and cached for the process (the client's cache and the
  readers here). Each registry call has ``CALL_TIMEOUT_S`` and the client retries nothing
  itself: the call runs inside the batch's transaction, which must stay well below the
  worker's idle-in-transaction timeout (8 s by default).
- Errors are classified once: the registry answering that the schema id does not exist
  (HTTP 404 with Confluent error code 40403) is the record's fault: ``Misfit`` (the record
  is quarantined with the reason); anything else — no answer, a timeout, a 5xx, a 401 —
  is ``Unavailable``: the batch is retried with backoff until the registry answers, and
  nothing is quarantined for it. A record whose schema is of another type than the sink
  expects (an Avro sink given a Protobuf schema id) is a ``Misfit``.
- Readers decode the payload after the wire header the way the deserializer would, with
  the schema the deserializer resolved (references included): Avro by fastavro's
  ``schemaless_reader`` with the parsed writer schema (the deserializer adds ~15 µs per
  record of subject and rule machinery around that same call, measured with
  ``python -m ops.bench.hotpath``), Protobuf by the writer message's class
  (``messages.message_fields``), JSON Schema by ``json`` (numbers with a fraction as
  ``Decimal``, exact) and the deserializer's validator of the schema.
- The registry URL may hold credentials: messages name the registry without them.
"""

from __future__ import annotations

import asyncio
import decimal
import io
import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from fencing.errors import Unavailable
from fencing.postgres.sink.keys import Format
from fencing.postgres.sink.messages import message_fields
from fencing.postgres.sink.schemas import (
    Field,
    avro_fields,
    envelope_image,
    json_schema_fields,
    protobuf_fields,
)
from fencing.postgres.sink.values import Misfit

__all__ = ["CALL_TIMEOUT_S", "Registry", "redacted"]

CALL_TIMEOUT_S = 3.0
# Confluent error codes of an HTTP 404 (Apicurio's ccompat API answers the same)
_NO_SUBJECT, _NO_VERSION, _NO_SCHEMA = 40401, 40402, 40403
_TYPES = {Format.AVRO: "AVRO", Format.PROTOBUF: "PROTOBUF", Format.JSON_SCHEMA: "JSON"}
_NAMES = {Format.AVRO: "Avro", Format.PROTOBUF: "Protobuf", Format.JSON_SCHEMA: "JSON Schema"}


def redacted(url: str) -> str:
    """``url`` without user and password."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _no_subject(*_args: Any) -> None:
    """Subject name strategy of the sink's deserializers: none. The writer schema comes from
    the record's id alone (no reader schema, no subject look-ups, no rules per record)."""
    return None


Reader = Callable[[bytes], Any]


class Registry:
    """The registry at ``url`` for one sink (see the module Rules)."""

    def __init__(self, url: str, *, typer: Callable[[Any], Callable[[Any], Any] | None]
                 | None = None) -> None:
        """``typer``: given an Avro writer schema, a function to apply to each value it
        decodes (None: none), e.g. ``debezium.connect_typer`` for change events."""
        # the registry's client (httpx, authlib, jsonschema, protobuf: ~0.3 s) is imported
        # by the first Registry, not by every command that imports the sink
        from confluent_kafka.schema_registry import AsyncSchemaRegistryClient

        self.url = url
        self.where = redacted(url)
        self.client = AsyncSchemaRegistryClient(
            {"url": url, "timeout": CALL_TIMEOUT_S, "max.retries": 0})
        self._conf = {"subject.name.strategy": _no_subject}
        self._deserializers: dict[Format, Any] = {}
        self._readers: dict[tuple[Format, Any, tuple[int, ...]], Reader] = {}
        self._by_id: dict[Format, dict[bytes, Reader]] = {}
        self._typer = typer

    async def call(self, what: str, call: Callable[[], Awaitable[Any]], *,
                   absent: tuple[int, ...] = (_NO_SCHEMA,)) -> Any:
        """``await call()`` with the module's timeout and error classes; a 404 with one of
        the Confluent error codes ``absent`` is a ``Misfit``."""
        from confluent_kafka.schema_registry import SchemaRegistryError

        try:
            async with asyncio.timeout(CALL_TIMEOUT_S + 1.0):
                return await call()
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404 and exc.error_code in absent:
                raise Misfit(f"{what}: the schema registry has no such "
                             f"{'schema' if exc.error_code == _NO_SCHEMA else 'subject'}"
                             ) from None
            raise Unavailable(f"schema registry {self.where}: {what}: HTTP "
                              f"{exc.http_status_code} ({exc.error_message})") from None
        except (Misfit, Unavailable):
            raise
        except Exception as exc:  # transport errors, timeouts: the registry did not answer
            raise Unavailable(f"schema registry {self.where}: {what}: "
                              f"{type(exc).__name__}: {self._clean(exc)}") from None

    def _clean(self, exc: BaseException) -> str:
        return str(exc).replace(self.url, self.where)[:300]

    async def subjects(self) -> list[str]:
        """The registry's subjects (a request that proves it answers as a registry)."""
        return list(await self.call("list subjects", self.client.get_subjects))

    async def versions(self, subject: str) -> list[int]:
        """The versions registered under ``subject`` (none: no such subject)."""
        try:
            return list(await self.call(f"subject {subject}",
                                        lambda: self.client.get_versions(subject),
                                        absent=(_NO_SUBJECT, _NO_VERSION)))
        except Misfit:
            return []

    async def latest_fields(self, fmt: Format, subject: str, version: int | None = None,
                            *, envelope: bool = False) -> tuple[list[Field], str] | None:
        """The columns of the latest schema registered under ``subject`` (or of ``version``)
        and a name for it (None: no such subject); raises ``Misfit`` for a schema of another
        type."""
        try:
            got = await self.call(f"subject {subject}",
                                  (lambda: self.client.get_latest_version(subject))
                                  if version is None else
                                  (lambda: self.client.get_version(subject, version)),
                                  absent=(_NO_SUBJECT, _NO_VERSION))
        except Misfit:
            return None
        what = f"{_NAMES[fmt]} schema id {got.schema_id} (subject {subject})"
        kind = got.schema.schema_type or "AVRO"
        if kind != _TYPES[fmt]:
            raise Misfit(f"subject {subject} holds a {kind} schema, not {_TYPES[fmt]}")
        if envelope and fmt is not Format.AVRO:
            return None  # a change event's image is read from Avro schemas only
        if fmt is Format.PROTOBUF:
            de = await self._deserializer(fmt)
            fd_proto, pool = await self.call(what, lambda: de._get_parsed_schema(got.schema))
            desc = de._get_message_desc(pool, pool.FindFileByName(fd_proto.name), [0])
            return protobuf_fields(desc), what
        parsed = json.loads(got.schema.schema_str or "null")
        if envelope:  # a change event: the row is its after image (Avro only)
            image = envelope_image(parsed) if fmt is Format.AVRO else None
            return (avro_fields(image), what) if image is not None else None
        return (avro_fields(parsed) if fmt is Format.AVRO else json_schema_fields(parsed)), what

    async def _deserializer(self, fmt: Format) -> Any:
        de = self._deserializers.get(fmt)
        if de is None:
            from confluent_kafka.schema_registry._async.avro import AsyncAvroDeserializer
            from confluent_kafka.schema_registry._async.json_schema import AsyncJSONDeserializer
            from confluent_kafka.schema_registry._async.protobuf import AsyncProtobufDeserializer
            from google.protobuf import empty_pb2

            if fmt is Format.AVRO:
                de = await AsyncAvroDeserializer(self.client, conf=self._conf)
            elif fmt is Format.PROTOBUF:  # its message type is only used by __call__
                de = await AsyncProtobufDeserializer(
                    empty_pb2.Empty, {**self._conf, "use.deprecated.format": False},
                    self.client)
            else:
                de = await AsyncJSONDeserializer(None, schema_registry_client=self.client,
                                                 conf=self._conf)
            self._deserializers[fmt] = de
        return de

    async def schema(self, ref: Any, fmt: Format) -> Any:
        """The registered schema of id (or GUID) ``ref``, of the type ``fmt`` needs."""
        what = f"schema id {ref}"
        schema = await self.call(what, (lambda: self.client.get_schema(ref)) if isinstance(
            ref, int) else (lambda: self.client.get_schema_by_guid(str(ref))))
        kind = schema.schema_type or "AVRO"
        if kind != _TYPES[fmt]:
            raise Misfit(f"{what} is a {kind} schema, not {_TYPES[fmt]}")
        return schema

    def by_id(self, fmt: Format) -> dict[bytes, Reader]:
        """The readers of ``fmt`` resolved so far by the 4 bytes of their schema id in the
        wire header (the same dict each time: it grows as schemas are resolved)."""
        return self._by_id.setdefault(fmt, {})

    def cached(self, fmt: Format, ref: Any, indexes: tuple[int, ...] = ()) -> Reader | None:
        """The reader resolved before for this schema (and Protobuf message), else None."""
        return self._readers.get((fmt, ref, indexes))

    async def reader(self, fmt: Format, ref: Any, indexes: tuple[int, ...] = ()) -> Reader:
        """The payload reader of schema id (or GUID) ``ref`` (see the module Rules): payload
        bytes after the wire header -> the decoded value; it raises on bytes that do not
        decode (or, for JSON Schema, do not validate)."""
        got = self._readers.get((fmt, ref, indexes))
        if got is None:
            de = await self._deserializer(fmt)
            schema = await self.schema(ref, fmt)
            what = f"schema id {ref}"
            # the deserializer's own resolution: references fetched, parsed, cached
            parsed = await self.call(what, lambda: de._get_parsed_schema(schema))
            if fmt is Format.AVRO:
                got = _avro(parsed)
                typer = self._typer(parsed) if self._typer is not None else None
                if typer is not None:
                    got = _typed(got, typer)
            elif fmt is Format.PROTOBUF:
                got = _protobuf(de, parsed, indexes, what)
            else:
                got = _json(await self.call(what, lambda: de._get_validator(schema, *parsed)))
            self._readers[(fmt, ref, indexes)] = got
            if isinstance(ref, int) and not indexes:
                self.by_id(fmt)[ref.to_bytes(4, "big")] = got
        return got

    async def close(self) -> None:
        await self.client.__aexit__()


#: ``schemaless_reader``'s own steps, split: its per-call set-up (named-schema tables, the
#: schema re-checked, an options dict) done once per schema id, its ``_read_data`` per
#: record — for a record schema (every sink value's) the ``read_record`` that
#: ``_read_data`` dispatches to, called directly: 1.33 µs instead of 1.45 µs
#: (``_read_data``) and 2.3 µs (``schemaless_reader``) of CPU for the benchmark's record
#: (fastavro 1.13, ``python -m ops.bench.sink --decode``). Without those internals
#: (another fastavro), ``schemaless_reader`` itself.
_OPTIONS = {"return_record_name": False, "return_record_name_override": False,
            "return_named_type": False, "return_named_type_override": False,
            "handle_unicode_errors": "strict"}


def _typed(read: Reader, typer: Callable[[Any], Any]) -> Reader:
    return lambda payload: typer(read(payload))


def _avro(parsed: Any) -> Reader:
    from fastavro import schemaless_reader

    try:
        from fastavro import _read
        inner: Any = _read  # its stub declares the public names only
        named = inner._default_named_schemas()
        writer = inner.parse_schema(parsed, named["writer"])
        read_data, options, bytes_io = inner._read_data, dict(_OPTIONS), io.BytesIO
        if isinstance(writer, dict) and writer.get("type") == "record":
            read_data = inner.read_record
    except (ImportError, AttributeError, TypeError):
        return lambda payload: schemaless_reader(io.BytesIO(payload), parsed, None)

    def read(payload: bytes) -> Any:
        return read_data(bytes_io(payload), writer, named, None, options)
    return read


def _protobuf(de: Any, parsed: Any, indexes: tuple[int, ...], what: str) -> Reader:
    from google.protobuf.message_factory import GetMessageClass

    fd_proto, pool = parsed
    try:
        desc = de._get_message_desc(pool, pool.FindFileByName(fd_proto.name), list(indexes))
    except Exception as exc:
        raise Misfit(f"{what} has no message at index {list(indexes)}: {exc}") from None
    parse = GetMessageClass(desc).FromString
    return lambda payload: message_fields(parse(payload))


def _json(validator: Any) -> Reader:
    loads, validate = json.JSONDecoder(parse_float=decimal.Decimal).decode, validator.validate

    def read(payload: bytes) -> Any:
        obj = loads(payload.decode("utf-8"))
        validate(obj)
        return obj
    return read
