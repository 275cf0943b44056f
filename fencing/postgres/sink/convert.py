"""The table sink's records of one batch -> each record's verdict and the operations the
fitting ones ask of the table, in order (pure but for what the records' decoding shared
with the batch; the rules are ``fencing.postgres.sink.table``'s and, for change events,
``fencing.postgres.sink.debezium``'s)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fencing.postgres.sink.catalog import SinkSpec
from fencing.postgres.sink.debezium import (
    DELETE,
    UPSERT,
    Event,
    JsonEvents,
    Op,
    refuse_unavailable,
    unwrap,
)
from fencing.postgres.sink.formats import Decoding
from fencing.postgres.sink.keys import from_object
from fencing.postgres.sink.rows import Delete, Misfit, Upsert
from fencing.postgres.sink.writer import Writer
from fencing.types import ACCEPT, Reject, SourceRecord, Verdict

__all__ = ["TRUNCATE", "convert_batch", "segments"]


#: a truncate event's place among a batch's operations (``--sink-truncate``)
TRUNCATE: Any = object()


def _change(writer: Writer, record: SourceRecord, event: Event, spec: SinkSpec) -> Any:
    """The operation of a Debezium change event (``debezium.unwrap``): an upsert of its
    after image (a ``Patch`` of the columns it holds when it lacks some, ``Event.kept``), a
    delete of its key (the before image's key columns, else the Kafka key), ``TRUNCATE``,
    or None (the tombstone after a delete changes nothing). With a version
    guard an upsert carries its version in the version column and a delete its version
    (``source.FIELD``, or the before image's version column when it has one)."""
    field = spec.version_source
    op = event.op
    version = None
    if spec.version is not None and (op is UPSERT or op is DELETE):
        version = event.source.get(field) if field is not None else (
            (event.image or {}).get(spec.version))
        if version is None and (field is not None or op is UPSERT):
            raise Misfit(f"no version for --sink-version-column {spec.version}: the event has "
                         f"no {spec.version_from if field else 'value for it'}")
    if op is UPSERT:
        image = event.image
        if field is not None and spec.version is not None:
            image = {**(image or {}), spec.version: version}
        return writer.patch(record, image) if event.kept else writer.convert(record, image)
    if op is DELETE:
        cols = writer.t.layout.key_columns
        image = event.image
        if image is not None and all(image.get(c.name) is not None for c in cols):
            key = from_object(cols, image, "the before image")
            return Delete(key[0] if len(key) == 1 else key, version)
        deleted = writer.convert(record, None)  # the Kafka key's columns
        return Delete(deleted.key, version) if version is not None else deleted
    return TRUNCATE if op is Op.TRUNCATE else None


def _versioned(op: Any, spec: SinkSpec) -> Any:
    """A record's upsert with a version guard: its version column must have a value (a
    tombstone deletes unguarded: it carries no version)."""
    if spec.version is not None and isinstance(op, Upsert):
        try:
            got = op.values[op.columns.index(spec.version)]
        except ValueError:
            got = None
        if got is None:
            raise Misfit(f"no version for --sink-version-column {spec.version}: the record "
                         "has no value for it")
    return op


def convert_batch(writer: Writer, records: Sequence[SourceRecord], decoding: Decoding | None,
             decoded: tuple[Sequence[Any], dict[int, Any]] | None, spec: SinkSpec,
             events: JsonEvents | None = None,
             ) -> tuple[list[Verdict], list[tuple[int, Any]], int, list[Any]]:
    """The batch converted by ``writer``: each record's verdict, the operations of those
    that fit (with their index), how many ``writer``'s layout refused (a misfit of the
    conversion, not of the decoding) and the values holding fields with no column. Never
    yields: the decoded keys it sets and the writer's strays it reads are shared with the
    other partitions' batches (see ``Decoding``). ``events`` reads JSON change events
    (``--sink-envelope``; its schemas kept from batch to batch)."""
    verdicts: list[Verdict] = [ACCEPT] * len(records)
    ops: list[tuple[int, Any]] = []
    misfits = 0
    convert = writer.convert
    strays = writer.strays  # filled by convert
    strays.clear()
    if spec.envelope is not None:
        values = decoded[0] if decoding is not None and decoded is not None else None
        if decoding is not None and decoded is not None:
            decoding.keys.clear()
            decoding.keys.update(decoded[1])
        events = events or JsonEvents(source=spec.version_source is not None)
        truncate, plain = spec.truncate, spec.version is None  # plain: an upsert is its image
        read: Any = events.image if plain else events.read  # image: an upsert may be a dict
        for i, record in enumerate(records):
            try:
                if values is not None:
                    value = values[i]
                    if isinstance(value, Misfit):
                        raise value
                    event = unwrap(value, truncate=truncate)
                elif record.value is None:
                    event = unwrap(None)
                else:
                    event = read(record.value, truncate=truncate)
                    if type(event) is dict:  # an upsert's image: _change's first case
                        if record.headers:
                            refuse_unavailable(record.headers, event)
                        ops.append((i, convert(record, event)))
                        continue
                if event.op is UPSERT and record.headers:
                    refuse_unavailable(record.headers, event.image)
                if plain and event.op is UPSERT and not event.kept:  # _change's first case
                    op = convert(record, event.image)
                else:
                    op = _change(writer, record, event, spec)
            except Misfit as exc:
                verdicts[i] = Reject(f"table sink: {exc}")
                misfits += 1
                continue
            if op is not None:
                ops.append((i, op))
    elif decoding is not None and decoded is not None:
        values, batch_keys = decoded
        decoding.keys.clear()
        decoding.keys.update(batch_keys)
        for i, record in enumerate(records):
            value = values[i]
            if isinstance(value, Misfit):
                verdicts[i] = Reject(f"table sink: {value}")
                continue
            try:
                ops.append((i, _versioned(convert(record, value), spec)))
            except Misfit as exc:
                verdicts[i] = Reject(f"table sink: {exc}")
                misfits += 1
    else:
        for i, record in enumerate(records):
            try:
                ops.append((i, _versioned(convert(record), spec)))
            except Misfit as exc:
                verdicts[i] = Reject(f"table sink: {exc}")
                misfits += 1
    found = list(strays)
    strays.clear()
    return verdicts, ops, misfits, found


def segments(ops: list[tuple[int, Any]]) -> list[tuple[list[tuple[int, Any]], bool]]:
    """The batch's operations cut at each ``TRUNCATE``: (operations, truncate after them)."""
    parts: list[tuple[list[tuple[int, Any]], bool]] = []
    current: list[tuple[int, Any]] = []
    for i, op in ops:
        if op is TRUNCATE:
            parts.append((current, True))
            current = []
        else:
            current.append((i, op))
    parts.append((current, False))
    return parts


