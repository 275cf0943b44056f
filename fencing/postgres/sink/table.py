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
- Per batch: every record is converted in Python first (``rows.convert``); a misfit is
  rejected (quarantined with its reason) and never reaches the database. The fitting rows
  are written inside one SAVEPOINT by the fast path (``Method``): insert = binary COPY into
  the table; upsert = binary COPY into a per-session temporary staging table, one
  ``INSERT ... SELECT ... ON CONFLICT DO UPDATE`` per column set, one ``DELETE`` for the
  tombstones; upserts go in key order, so two partitions' batches that share keys lock them
  in one order (a deadlock PostgreSQL still finds, e.g. a tombstone against an upsert, rolls
  the batch back as not committed and the fence retries it).
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
- Only the given connection is used; the sink never commits.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import asyncpg

from fencing.errors import ConfigError
from fencing.handler import HandlerContext, handler, handler_factory
from fencing.postgres.schema import quote_ident as _quote
from fencing.postgres.sink.catalog import Method, SinkSpec, Target, ensure_table, read_layout
from fencing.postgres.sink.formats import Decoding
from fencing.postgres.sink.keys import KeyReader, key_reader
from fencing.postgres.sink.order import sets_then_rest
from fencing.postgres.sink.registry import Registry
from fencing.postgres.sink.rows import (
    EPOCH_MS,
    Delete,
    Misfit,
    Upsert,
    converter,
    in_epoch_ms,
    parse_json,
)
from fencing.store import HandlerFn
from fencing.types import ACCEPT, Reject, SourceRecord, Verdict

__all__ = ["make_table_sink", "table_sink"]

_REFUSED_CLASSES = ("22", "23", "P0")  # data, integrity, raised by a trigger: the record's fault
_SAVEPOINT = "fence_sink"
#: the smallest set of a repeated key's later operations written by a set statement (a DELETE,
#: COPY + INSERT … SELECT: about four round trips); smaller ones and all after them go by
#: pipelined ``executemany`` runs (one round trip each, one statement per row in PostgreSQL)
_SET_MIN = 200
_BY_KEY = attrgetter("key")  # sorts upserts and deletes by the key columns' values


class _Writer:
    """The SQL of one target; ``write`` runs the fast path, ``one`` a single operation."""

    def __init__(self, target: Target, method: Method, *, kafka_key: KeyReader | None = None
                 ) -> None:
        self.t = target
        self.method = method
        self.keys = target.layout.keys
        # the staged upsert passes a timestamptz kafka_timestamp as milliseconds, converted
        # by its SQL (rows.EPOCH_MS): the stage holds them as int8
        staged = bool(self.keys) and method is Method.COPY
        self.ms = next((c.name for c in target.layout.columns if in_epoch_ms(c)),
                       None) if staged else None
        self.convert = converter(target.layout, epoch_ms=self.ms is not None,
                                 kafka_key=kafka_key)
        self.stage = f"fence_sink_stage_{zlib.crc32(target.quoted.encode()):08x}"
        cols = ", ".join(f"NULL::int8 AS {_quote(c.name)}" if c.name == self.ms else
                         _quote(c.name) for c in target.layout.columns)
        self.make_stage = (f"SET LOCAL client_min_messages = warning; CREATE TEMP TABLE IF NOT "
                           f"EXISTS {_quote(self.stage)} AS SELECT {cols} FROM {target.quoted} "
                           "WITH NO DATA")
        self.key_list = ", ".join(map(_quote, self.keys))
        if len(self.keys) == 1:
            self.delete = f"DELETE FROM {target.quoted} WHERE {self.key_list} = ANY($1)"
        elif self.keys:
            arrays = ", ".join(f"${i}::{_quote(target.layout.column(k).type_name)}[]"
                               for i, k in enumerate(self.keys, 1))
            self.delete = (f"DELETE FROM {target.quoted} WHERE ({self.key_list}) IN "
                           f"(SELECT * FROM unnest({arrays}))")
        self.delete_one = f"DELETE FROM {target.quoted} WHERE " + " AND ".join(
            f"{_quote(k)} = ${i}" for i, k in enumerate(self.keys, 1))

    def _conflict(self) -> str:
        """Upsert replaces the whole row: a column the record lacks gets its default (the
        proposed row, EXCLUDED, holds it), never the previous record's value."""
        if not self.keys:
            return ""
        sets = [f"{_quote(c.name)} = EXCLUDED.{_quote(c.name)}"
                for c in self.t.layout.columns if c.name not in self.keys]
        action = f"DO UPDATE SET {', '.join(sets)}" if sets else "DO NOTHING"
        return f" ON CONFLICT ({self.key_list}) {action}"

    def _delete_args(self, keys: list[Any]) -> list[Any]:
        """``self.delete``'s arguments: the keys, or one array per column of a composite."""
        if len(self.keys) == 1:
            return [keys]
        return [list(column) for column in zip(*keys, strict=True)]

    def _value(self, name: str, expr: str) -> str:
        """``expr`` as the value of column ``name`` (the milliseconds converted, see ms)."""
        return EPOCH_MS.format(expr) if name == self.ms else expr

    def insert_values(self, columns: Sequence[str]) -> str:
        marks = ", ".join(self._value(c, f"${i}::int8" if c == self.ms else f"${i}")
                          for i, c in enumerate(columns, 1))
        return (f"INSERT INTO {self.t.quoted} ({', '.join(map(_quote, columns))}) "
                f"VALUES ({marks}){self._conflict()}")

    async def write(self, conn: Any, ops: Sequence[Upsert | Delete], savepoint: str) -> None:
        """The fast path inside SAVEPOINT ``savepoint``: opened by the first statement and
        released by the last. Every operation is applied, in order: with key columns they go
        in sets (``order.sets_then_rest``: a key's n-th operation in the n-th set), each one
        DELETE of its tombstones and one set statement per column set, upserts in key order,
        while a set holds ``_SET_MIN`` operations; the rest in their order, each run of one
        kind and column set by one pipelined ``executemany``. An upsert by COPY sends the
        SAVEPOINT with the staging table's statement and the RELEASE with its last set
        statement (one simple query each: a batch of upserts without a repeated key costs
        four round trips, the COPY's two included, not six); a refusal inside leaves the
        savepoint open, for ``ROLLBACK TO``."""
        sets, rest = sets_then_rest(ops, min_set=_SET_MIN) if self.keys else ([list(ops)], [])
        staged = bool(self.keys) and self.method is Method.COPY and any(
            isinstance(op, Upsert) for one in sets for op in one)
        opened = f"SAVEPOINT {savepoint}"
        release = f"RELEASE SAVEPOINT {savepoint}"
        await conn.execute(f"{opened}; {self.make_stage}" if staged else opened)
        released = False
        for g, one in enumerate(sets, 1):
            groups: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}
            deletes = []
            for op in sorted(one, key=_BY_KEY) if self.keys else one:
                if isinstance(op, Delete):
                    deletes.append(op.key)
                else:
                    groups.setdefault(op.columns, []).append(op.values)
            if deletes:
                await conn.execute(self.delete, *self._delete_args(deletes))
            for n, (columns, rows) in enumerate(groups.items(), 1):
                if self.method is Method.EXECUTEMANY:
                    await conn.executemany(self.insert_values(columns), rows)
                elif not self.keys:
                    await conn.copy_records_to_table(self.t.name, schema_name=self.t.schema,
                                                     columns=list(columns), records=rows)
                else:
                    await conn.copy_records_to_table(self.stage, schema_name="pg_temp",
                                                     columns=list(columns), records=rows)
                    names = ", ".join(map(_quote, columns))
                    values = ", ".join(self._value(c, _quote(c)) for c in columns)
                    released = not rest and g == len(sets) and n == len(groups)
                    tail = f"; {release}" if released else ""
                    await conn.execute(
                        f"INSERT INTO {self.t.quoted} ({names}) SELECT {values} FROM pg_temp."
                        f"{_quote(self.stage)} ORDER BY {self.key_list}{self._conflict()}; "
                        f"DELETE FROM pg_temp.{_quote(self.stage)}{tail}")
        for run in _runs(rest):
            if isinstance(run[0], Delete):
                await conn.executemany(self.delete_one, [
                    op.key if len(self.keys) > 1 else (op.key,) for op in run])
            else:
                await conn.executemany(self.insert_values(run[0].columns),
                                       [op.values for op in run])  # type: ignore[union-attr]
        if not released:
            await conn.execute(release)

    async def one(self, conn: Any, op: Upsert | Delete) -> None:
        if isinstance(op, Delete):
            await conn.execute(self.delete_one, *(op.key if len(self.keys) > 1 else (op.key,)))
        else:
            await conn.execute(self.insert_values(op.columns), *op.values)


def _runs(ops: Sequence[Upsert | Delete]) -> list[list[Upsert | Delete]]:
    """``ops`` in order, cut where the kind (or an upsert's column set) changes."""
    out: list[list[Upsert | Delete]] = []
    for op in ops:
        if out and type(op) is type(out[-1][0]) and (
                isinstance(op, Delete) or op.columns == out[-1][0].columns):  # type: ignore[union-attr]
            out[-1].append(op)
        else:
            out.append([op])
    return out


def _refused(exc: BaseException) -> bool:
    state = str(getattr(exc, "sqlstate", "") or "")
    return isinstance(exc, asyncpg.PostgresError) and state[:2] in _REFUSED_CLASSES


async def _in_savepoint(conn: Any, write: Any) -> BaseException | None:
    """Run ``write(savepoint)`` (which opens and releases the SAVEPOINT itself, see
    ``_Writer.write``); return the refusal it was rolled back for (None: kept)."""
    try:
        await write(_SAVEPOINT)
    except asyncpg.PostgresError as exc:
        if not _refused(exc):
            raise
        await conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
        return exc
    return None


async def _one(conn: Any, writer: _Writer, op: Upsert | Delete, savepoint: str) -> None:
    await conn.execute(f"SAVEPOINT {savepoint}")
    await writer.one(conn, op)
    await conn.execute(f"RELEASE SAVEPOINT {savepoint}")


def make_table_sink(spec: SinkSpec) -> HandlerFn:
    """The sink handler for ``spec`` (its table is read from the catalog on the first batch;
    with a schema'd format its records are decoded through ``spec.registry`` first)."""
    writers: list[_Writer] = []
    registry = Registry(spec.registry) if spec.registry and (
        spec.value_format.registry or spec.key_format.registry) else None
    decodings: list[Decoding] = []

    @handler(durability="durable-critical", effects="transactional")
    async def sink(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
        if not writers:
            target, problems = await read_layout(conn, spec)
            if problems or target is None:
                raise ConfigError(f"--sink table={spec.table}: {'; '.join(problems)}")
            keys = target.layout.keys
            if registry is not None:
                decodings.append(Decoding(registry, value_format=spec.value_format,
                                          key_format=spec.key_format, key_columns=keys,
                                          parse_json=parse_json))
            reader = key_reader(target.layout.key_columns, spec.key_format,
                                decodings[0].keys if decodings else None) if keys else None
            writers.append(_Writer(target, spec.method, kafka_key=reader))
        writer = writers[0]
        verdicts: list[Verdict] = [ACCEPT] * len(records)
        ops: list[tuple[int, Upsert | Delete]] = []
        convert = writer.convert
        if decodings:  # raises Unavailable when the registry does not answer
            values, batch_keys = await decodings[0].values(records)
            decodings[0].keys.clear()  # from here to the write nothing yields: see Decoding
            decodings[0].keys.update(batch_keys)
            for i, record in enumerate(records):
                try:
                    value = values[i]
                    if isinstance(value, Misfit):
                        raise value
                    ops.append((i, convert(record, value)))
                except Misfit as exc:
                    verdicts[i] = Reject(f"table sink: {exc}")
        else:
            for i, record in enumerate(records):
                try:
                    ops.append((i, convert(record)))
                except Misfit as exc:
                    verdicts[i] = Reject(f"table sink: {exc}")
        if ops and await _in_savepoint(conn, lambda sp: writer.write(conn, [o for _, o in ops],
                                                                     sp)):
            for i, op in ops:  # the database refused a row: find it, one record at a time
                refusal = await _in_savepoint(conn, lambda sp, op=op: _one(conn, writer, op, sp))
                if refusal is not None:
                    verdicts[i] = Reject(f"table sink: refused by PostgreSQL "
                                         f"[{getattr(refusal, 'sqlstate', '')}]: {refusal}")
        return verdicts

    sink.__qualname__ = f"table_sink[{spec.table}]"
    return sink


async def _ensure(conn: Any, context: HandlerContext) -> None:
    await ensure_table(conn, SinkSpec.from_settings(context.settings), topics=context.topics)


@handler_factory(ensure_tables=_ensure)
def table_sink(context: HandlerContext) -> HandlerFn:
    """The table sink for ``context.settings`` (``table``, ``key``, ``method``)."""
    return make_table_sink(SinkSpec.from_settings(context.settings))
