"""The built-in table sink: a handler factory writing each record into one PostgreSQL table
inside the fenced transaction (``fencectl run --sink table=NAME [--sink-key COL]``, or
``--handler fencing.postgres.sink:table_sink --handler-setting table=NAME [key=COL]``).

It lives in ``fencing/postgres/`` because it speaks asyncpg (binary COPY, server error
classes), and only ``fencing/postgres/`` may import asyncpg in ``fencing``; it imports
nothing of ``consumer`` or ``ops``, so a library user can load it like any factory.

Rules
- ``ensure_tables`` creates the table when it is missing (``payload jsonb`` + the Kafka
  coordinates; with key columns, those ``text`` and the primary key) under an advisory lock,
  then validates it: the key columns must exist with a unique index on exactly them (for
  ``ON CONFLICT``) and every required column (NOT NULL, no default) must be of a type the
  sink writes. A table that does not fit raises ``ConfigError`` (``fencectl run`` exits 2).
- Routing (``--sink table='{topic}'``, ``fencing.postgres.sink.routes``): each topic's
  records go to its own table, made the same way at start for each ``--topic`` and on the
  first batch of any other topic (a ``--topic-pattern``'s, also one created later) inside
  that batch's fenced transaction, so it exists exactly when the batch commits. A routed
  table that does not fit rejects every record of its topic with the reason (quarantined,
  to replay once the table is fixed); it is checked again on the next batch.
- Per batch: every record is converted in Python first (``rows.convert``); a misfit is
  rejected (quarantined with its reason) and never reaches the database. The fitting rows
  are written inside one SAVEPOINT by the fast path (``Method``): insert = binary COPY into
  the table; upsert = binary COPY into a per-session temporary staging table, one
  ``INSERT ... SELECT ... ON CONFLICT DO UPDATE`` per column set, one ``DELETE`` for the
  tombstones (a set of fewer than ``writer.UNNEST_MAX`` rows: one ``INSERT ... SELECT ...
  FROM unnest`` of one array per column instead of the COPY); upserts go in key order, so
  two partitions' batches that share keys lock them in one order (a deadlock PostgreSQL
  still finds, e.g. a tombstone against an upsert, rolls the batch back as not committed
  and the fence retries it).
- Every record is applied, in order: none is skipped because a later record of its key
  follows in the batch, so a record PostgreSQL refuses (a CHECK) is quarantined wherever
  the batch ends. A batch whose keys repeat is written in sets (a key's n-th operation in
  the n-th) while they are large, then the rest in their order by pipelined
  ``executemany`` (one round trip per run of one kind; ``order.sets_then_rest``). What it
  costs against writing only each key's last record: ``python -m ops.bench.sink
  --in-order`` (``docs/table-sink-formats.md``).
- When PostgreSQL refuses the fast path with a data, integrity or trigger error (SQLSTATE
  class 22, 23, P0), it is rolled back to the SAVEPOINT and the records are written one by
  one in order, each in its own SAVEPOINT; a refused record is rejected with PostgreSQL's
  message, the others applied. Every other error propagates: the fence rolls the whole
  batch back and retries it.
- A field with no column is ignored and counted (``unknown``), or with ``--sink-evolve
  add-columns`` gets a column, added outside the batch's transaction, and the batch is
  written again (``evolving``).
- A table's layout is read on its first batch and kept; a batch in which a record misfits
  a layout read before the batch reads the table again inside the batch's transaction, and
  when its columns changed (an operator's ``ALTER TABLE``: a column made nullable, a wider
  type) converts the batch again by the new layout, which is kept. So a record is judged
  by the table as it is when its batch runs: one that fits the table now (as
  ``fencectl quarantine replay``, a fresh process, saw it) is written, also when a reset
  brings it back, never quarantined again by a layout the worker read before the fix.
- Only the given connection is used (but for ``evolving``'s DDL connection); the sink never
  commits.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import asyncpg

from fencing.errors import ConfigError
from fencing.handler import HandlerContext, handler, handler_factory
from fencing.postgres.sink.catalog import SinkSpec, ensure_in_batch, ensure_table, read_layout
from fencing.postgres.sink.convert import convert_batch, segments
from fencing.postgres.sink.debezium import JsonEvents, connect_typer
from fencing.postgres.sink.evolve import strays as stray_fields
from fencing.postgres.sink.evolving import Evolution, check_ddl
from fencing.postgres.sink.formats import Decoding
from fencing.postgres.sink.keys import key_reader
from fencing.postgres.sink.registry import Registry
from fencing.postgres.sink.rows import Delete, Patch, Upsert, parse_json
from fencing.postgres.sink.unknown import STALE_CHANGES, UNKNOWN_FIELDS
from fencing.postgres.sink.writer import Writer
from fencing.store import HandlerFn
from fencing.types import Reject, SourceRecord, Verdict

__all__ = ["make_table_sink", "table_sink"]

_REFUSED_CLASSES = ("22", "23", "P0")  # data, integrity, raised by a trigger: the record's fault
_SAVEPOINT = "fence_sink"


def _refused(exc: BaseException) -> bool:
    state = str(getattr(exc, "sqlstate", "") or "")
    return isinstance(exc, asyncpg.PostgresError) and state[:2] in _REFUSED_CLASSES


async def _in_savepoint(conn: Any, write: Any) -> tuple[BaseException | None, int]:
    """Run ``write(savepoint)`` (which opens the SAVEPOINT itself and releases it or leaves
    it to the COMMIT, see ``Writer.write``); the refusal it was rolled back for (None:
    kept) and, when kept, how many operations the version guard left alone."""
    try:
        stale = await write(_SAVEPOINT)
    except asyncpg.PostgresError as exc:
        if not _refused(exc):
            raise
        await conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
        return exc, 0
    return None, stale


async def _one(conn: Any, writer: Writer, op: Upsert | Patch | Delete, savepoint: str) -> int:
    await conn.execute(f"SAVEPOINT {savepoint}")
    stale = await writer.one(conn, op)
    await conn.execute(f"RELEASE SAVEPOINT {savepoint}")
    return stale


def _changed(a: Writer, b: Writer) -> bool:
    """Whether two writers of one table were read from different table definitions."""
    return a.t.layout != b.t.layout or a.t.names != b.t.names


class _Targets:
    """The writer of each table the sink writes, made on its table's first sight (one for an
    unrouted ``--sink table=T``; one per topic for ``table='{topic}'``, see ``routes``)."""

    def __init__(self, spec: SinkSpec) -> None:
        self.spec = spec
        self.writers: dict[str, Writer] = {}
        self.registry = Registry(spec.registry, typer=connect_typer if spec.envelope else None
                                 ) if spec.registry and (
            spec.value_format.registry or spec.key_format.registry) else None
        self.decoding: Decoding | None = None
        self.events = JsonEvents(source=spec.version_source is not None) \
            if spec.envelope else None  # change events' schemas
        self.evolution = Evolution(spec, self.registry) if spec.evolve else None

    async def writer(self, conn: Any, topic: str) -> tuple[Writer | str, bool]:
        """The writer of ``topic``'s table, or why its records cannot be written (the table
        does not fit), and whether this transaction created the table. A routed table
        missing is created inside this batch's transaction (``catalog.ensure_in_batch``;
        with the columns ``evolving`` asked of it); its writer is kept only from the next
        batch on, once the table is known to outlive this transaction."""
        spec = self.spec.for_topic(topic)
        got = self.writers.get(spec.table)
        if got is not None:
            return got, False
        born = time.monotonic_ns()  # before the layout is read (see ``evolving``)
        created = False
        if spec.routed or self.spec.routed:
            try:
                target, created = await ensure_in_batch(conn, spec, topic)
                adds = self.evolution.pending.pop(target.quoted, ()) if (
                    created and self.evolution is not None) else ()
                for statement in adds:
                    await conn.execute(statement)
                if adds:
                    target, _ = await ensure_in_batch(conn, spec, topic)
            except ConfigError as exc:
                return str(exc), False
        else:
            found, problems = await read_layout(conn, spec)
            if problems or found is None:
                raise ConfigError(f"--sink table={spec.table}: {'; '.join(problems)}")
            target = found
        keys = target.layout.keys
        if self.registry is not None and self.decoding is None:
            self.decoding = Decoding(self.registry, value_format=spec.value_format,
                                     key_format=spec.key_format, key_columns=keys,
                                     parse_json=parse_json)
        reader = key_reader(target.layout.key_columns, spec.key_format,
                            self.decoding.keys if self.decoding else None) if keys else None
        writer = Writer(target, spec.method, kafka_key=reader, born=born, version=spec.version)
        UNKNOWN_FIELDS.add(f"{target.schema}.{target.name}", (), 0)  # exported from 0
        if spec.version is not None:
            STALE_CHANGES.add(f"{target.schema}.{target.name}", 0)
        if not created:
            self.writers[spec.table] = writer
        return writer, created

    async def reread(self, conn: Any, topic: str, writer: Writer) -> Writer | None:
        """The writer of ``topic``'s table read again from the catalog, when its columns
        differ from ``writer``'s (kept for the next batches); None when they do not (the
        cached writer stays) or the table no longer fits (the database judges the write)."""
        table = self.spec.for_topic(topic).table
        cached = self.writers.get(table)
        if cached is not None and cached is not writer:  # another batch read it already
            return cached if _changed(cached, writer) else None
        self.writers.pop(table, None)
        try:
            fresh, _created = await self.writer(conn, topic)
        except ConfigError:
            fresh = "does not fit"
        if isinstance(fresh, str) or not _changed(fresh, writer):
            self.writers[table] = writer
            return None
        return fresh

    async def strays(self, conn: Any, writer: Writer, topic: str, found: list[Any],
                     created: bool) -> None:
        """The batch's values in ``found`` hold fields with no column: evolve the table
        (raises ``TableEvolved``), or count what is ignored (``unknown``)."""
        table = f"{writer.t.schema}.{writer.t.name}"
        if self.evolution is None:  # to count, the names are enough (a payload layout:
            # every record has fields without a column; their values are not gathered)
            UNKNOWN_FIELDS.add(table, sorted(set().union(*found).difference(writer.known)),
                               len(found))
            return
        fields = stray_fields(found, writer.known)
        adds, stale = await self.evolution.fields(writer, topic, fields)
        if adds or stale:
            if self.writers.get(self.spec.for_topic(topic).table) is writer:
                self.writers.pop(self.spec.for_topic(topic).table)
            await self.evolution.evolve(conn, writer.t, adds, created=created)
        UNKNOWN_FIELDS.add(table, fields, len(found))


async def _write(conn: Any, writer: Writer, ops: list[tuple[int, Any]],
                 verdicts: list[Verdict]) -> int:
    """Write ``ops`` by the fast path; when PostgreSQL refuses a row, one at a time, each
    refused record's verdict a ``Reject`` with PostgreSQL's message. How many operations
    the version guard left alone (older than the stored row)."""
    if not ops:
        return 0
    refused, stale = await _in_savepoint(
        conn, lambda sp: writer.write(conn, [o for _, o in ops], sp))
    if refused is None:
        return stale
    for i, op in ops:  # the database refused a row: find it, one record at a time
        refusal, older = await _in_savepoint(conn, lambda sp, op=op: _one(conn, writer, op, sp))
        stale += older
        if refusal is not None:
            verdicts[i] = Reject(f"table sink: refused by PostgreSQL "
                                 f"[{getattr(refusal, 'sqlstate', '')}]: {refusal}")
    return stale


def make_table_sink(spec: SinkSpec) -> HandlerFn:
    """The sink handler for ``spec`` (a table is read from the catalog on the first batch of
    a topic it takes; with a schema'd format records are decoded through ``spec.registry``
    first). A batch holds one partition's records, so one topic's: one table per batch."""
    targets = _Targets(spec)

    @handler(durability="durable-critical", effects="transactional")
    async def sink(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
        if not records:
            return []
        batch_ns = time.monotonic_ns()
        writer, created = await targets.writer(conn, records[0].topic)
        if isinstance(writer, str):  # a routed table that does not fit: every record says so
            return [Reject(f"table sink: {writer}")] * len(records)
        decoded = None
        if targets.decoding is not None:  # raises Unavailable when the registry does not answer
            decoded = await targets.decoding.values(records)
        verdicts, ops, misfits, found = convert_batch(writer, records, targets.decoding, decoded,
                                                      spec, targets.events)
        if misfits and writer.born < batch_ns:  # judged by a layout read before this batch
            fresh = await targets.reread(conn, records[0].topic, writer)
            if fresh is not None:
                writer = fresh
                verdicts, ops, _misfits, found = convert_batch(
                    writer, records, targets.decoding, decoded, spec, targets.events)
        if found:
            await targets.strays(conn, writer, records[0].topic, found, created)
        stale = 0
        for part, truncate in segments(ops):
            stale += await _write(conn, writer, part, verdicts)
            if truncate:  # in order with the batch's other operations, in its transaction
                await conn.execute(f"TRUNCATE {writer.t.quoted}")
        if spec.version is not None:
            STALE_CHANGES.add(f"{writer.t.schema}.{writer.t.name}", stale)
        return verdicts

    sink.__qualname__ = f"table_sink[{spec.table}]"
    return sink


async def _ensure(conn: Any, context: HandlerContext) -> None:
    """At start: the table, or with a routed table the table of each ``--topic`` (those of a
    ``--topic-pattern`` are not known yet: each is made on its first sight)."""
    spec = SinkSpec.from_settings(context.settings)
    if spec.ddl_dsn is not None and spec.evolve:
        await check_ddl(spec.ddl_dsn)
    if not spec.routed:
        await ensure_table(conn, spec, topics=context.topics)
        return
    for topic in context.topics:
        await ensure_table(conn, spec.for_topic(topic), topics=(topic,))


@handler_factory(ensure_tables=_ensure)
def table_sink(context: HandlerContext) -> HandlerFn:
    """The table sink for ``context.settings`` (``table``, ``key``, ``method``)."""
    return make_table_sink(SinkSpec.from_settings(context.settings))
