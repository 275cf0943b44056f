"""The table sink's SQL for one target table: the fast path of a batch (binary COPY, staged
upserts in sets, pipelined ``executemany`` for the rest) and a single operation (the rules
are ``fencing.postgres.sink.table``'s; this is its writing half, split from the handler).

Long because each kind of operation (an upsert, a patch of some columns, a delete; with a
version guard or without) has its statement beside the one batch path that orders them."""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

from fencing.postgres.schema import quote_ident as _quote
from fencing.postgres.sink.catalog import Method, Target
from fencing.postgres.sink.keys import KeyReader
from fencing.postgres.sink.order import sets_then_rest
from fencing.postgres.sink.rows import (
    EPOCH_MS,
    RESERVED,
    Delete,
    Layout,
    Patch,
    Upsert,
    converter,
    in_epoch_ms,
)
from fencing.types import SourceRecord

__all__ = ["Writer"]

#: the smallest set of a repeated key's later operations written by a set statement (a DELETE,
#: COPY + INSERT … SELECT: about four round trips); smaller ones and all after them go by
#: pipelined ``executemany`` runs (one round trip each, one statement per row in PostgreSQL)
_SET_MIN = 200
#: a set smaller than this writes each column set's upserts by one prepared INSERT … SELECT
#: FROM unnest(one array per column) (one round trip; cached by asyncpg) instead of COPY
#: into the stage and a set statement (three more round trips and the stage's statement):
#: what a batch costs at a steady rate, where batches are small. Larger sets go by COPY,
#: cheaper per row.
UNNEST_MAX = 200
#: the element type an ``unnest`` array of a column of this type is cast to, where the
#: type's own name means a length (``bit`` is bit(1) in a cast; varchar, bpchar, numeric
#: and the time types without a modifier take any length or precision)
_ARRAY_OF = {"bit": "varbit"}
_BY_KEY = attrgetter("key")  # sorts upserts and deletes by the key columns' values
_ROW = "fence_row"  # the target's alias in a guarded upsert (``--sink-version-column``)


class Writer:
    """The SQL of one target; ``write`` runs the fast path, ``one`` a single operation."""

    def __init__(self, target: Target, method: Method, *, kafka_key: KeyReader | None = None,
                 born: int = 0, version: str | None = None) -> None:
        self.t = target
        self.unnest_max = UNNEST_MAX  # sets smaller than this go by unnest (see UNNEST_MAX)
        self._unnest: dict[tuple[str, ...], str | None] = {}  # columns -> its INSERT, or None
        #: the version column (``--sink-version-column``): an upsert or a versioned delete
        #: older than the stored row changes nothing, and is counted (``write``'s answer)
        self.version = version
        self.born = born  # ``time.monotonic_ns`` before its layout was read (``evolving``)
        self.method = method
        self.keys = target.layout.keys
        # the staged upsert passes a timestamptz kafka_timestamp as milliseconds, converted
        # by its SQL (rows.EPOCH_MS): the stage holds them as int8
        staged = bool(self.keys) and method is Method.COPY
        self.ms = next((c.name for c in target.layout.columns if in_epoch_ms(c)),
                       None) if staged else None
        #: the values of the last conversion run that hold a field with no column (the
        #: sink empties it before each run; a run does not yield, see the sink's handler)
        self.strays: list[Any] = []
        self.known = target.names | frozenset(RESERVED)
        self.convert = converter(target.layout, epoch_ms=self.ms is not None,
                                 kafka_key=kafka_key, known=self.known, strays=self.strays)
        self._kafka_key = kafka_key
        self._patch_convert: Any = None  # made by the first ``patch`` (change events only)
        self._updates: dict[tuple[str, ...], str | None] = {}  # ``update_one`` per columns
        # per table, column set and types: a table that gained a column, or whose column
        # changed its type, gets a stage that has it as the table has it now
        shape = "|".join([target.quoted, *(f"{c.name}:{c.type_name}"
                                           for c in target.layout.columns)])
        self.stage = f"fence_sink_stage_{zlib.crc32(shape.encode()):08x}"
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
        if version is not None:
            self.delete_versioned = self._delete_versioned(version)

    def _delete_versioned(self, version: str) -> str:
        """Delete the rows of the keys (one array per key column) whose stored version is
        not newer than the delete's (the last array); answers how many were newer: the
        stale deletes, counted from the statement's snapshot (a key not there is not
        stale)."""
        layout = self.t.layout
        names = [*self.keys, version]
        arrays = ", ".join(f"${i}::{_quote(layout.column(c).type_name)}[]"
                           for i, c in enumerate(names, 1))
        cols = ", ".join(f"k{i}" for i in range(len(self.keys)))
        match = " AND ".join(f"t.{_quote(k)} = d.k{i}" for i, k in enumerate(self.keys))
        v = _quote(version)
        return (f"WITH d({cols}, v) AS (SELECT * FROM unnest({arrays})), "
                f"gone AS (DELETE FROM {self.t.quoted} AS t USING d WHERE {match} AND "
                f"(t.{v} IS NULL OR t.{v} <= d.v) RETURNING 1) "
                f"SELECT count(*) FROM d JOIN {self.t.quoted} AS t ON {match} WHERE t.{v} > d.v")

    def patch(self, record: SourceRecord, image: Any) -> Patch:
        """The update of the row of ``record``'s key by the fields ``image`` holds, its other
        columns kept (a change event that lacks some values: ``debezium.Event.kept``)."""
        if self._patch_convert is None:  # it leaves the columns it lacks: none is required
            layout = self.t.layout
            self._patch_convert = converter(
                Layout(tuple(dataclasses.replace(c, has_default=True) for c in layout.columns),
                       layout.keys), epoch_ms=self.ms is not None, kafka_key=self._kafka_key,
                known=self.known, strays=self.strays)
        op = self._patch_convert(record, image)
        return Patch(op.key, op.columns, op.values)

    def update_one(self, columns: tuple[str, ...]) -> str | None:
        """The update of one row by ``columns``' values ($1.. in their order): the key
        columns find the row, the others are set (None: nothing to set). With a version
        column only a row whose stored version is not newer, and it answers how many rows
        of the key it left alone (0 or 1). Made once per column set."""
        got = self._updates.get(columns, ...)
        if got is not ...:
            return got
        self._updates[columns] = sql = self._update_sql(columns)
        return sql

    def _update_sql(self, columns: tuple[str, ...]) -> str | None:
        sets = ", ".join(
            f"{_quote(c)} = {self._value(c, f'${i}::int8' if c == self.ms else f'${i}')}"
            for i, c in enumerate(columns, 1) if c not in self.keys)
        if not sets or not self.keys:
            return None
        where = " AND ".join(f"{_ROW}.{_quote(c)} = ${i}" for i, c in enumerate(columns, 1)
                             if c in self.keys)
        update = f"UPDATE {self.t.quoted} AS {_ROW} SET {sets} WHERE {where}"
        if self.version is None:
            return update
        v, at = _quote(self.version), columns.index(self.version) + 1
        return (f"WITH up AS ({update} AND ({_ROW}.{v} IS NULL OR {_ROW}.{v} <= ${at})) "
                f"SELECT count(*) FROM {self.t.quoted} AS {_ROW} WHERE {where} AND "
                f"{_ROW}.{v} > ${at}")

    async def _patched(self, conn: Any, op: Patch) -> int:
        """``op`` written; 1 when a version guard left it alone (older), else 0."""
        update = self.update_one(op.columns)
        if update is None:
            return 0
        if self.version is None:
            await conn.execute(update, *op.values)
            return 0
        return int(await conn.fetchval(update, *op.values))

    def _conflict(self) -> str:
        """Upsert replaces the whole row: a column the record lacks gets its default (the
        proposed row, EXCLUDED, holds it), never the previous record's value. With a
        version column, only a row whose stored version is not newer (``_ROW`` is the
        target's alias, see ``_into``)."""
        if not self.keys:
            return ""
        sets = [f"{_quote(c.name)} = EXCLUDED.{_quote(c.name)}"
                for c in self.t.layout.columns if c.name not in self.keys]
        action = f"DO UPDATE SET {', '.join(sets)}" if sets else "DO NOTHING"
        if self.version is not None and sets:
            v = _quote(self.version)
            action += f" WHERE {_ROW}.{v} IS NULL OR {_ROW}.{v} <= EXCLUDED.{v}"
        return f" ON CONFLICT ({self.key_list}) {action}"

    def _into(self, columns: Sequence[str]) -> str:
        alias = f" AS {_ROW}" if self.version is not None else ""
        return f"INSERT INTO {self.t.quoted}{alias} ({', '.join(map(_quote, columns))})"

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
        returning = " RETURNING 1" if self.version is not None else ""
        return f"{self._into(columns)} VALUES ({marks}){self._conflict()}{returning}"

    def unnest_insert(self, columns: tuple[str, ...]) -> str | None:
        """The upsert of ``columns``' rows passed as one array per column, in key order (an
        insert without key columns); None when a column's type cannot go as an array
        parameter that way: an array column (``unnest`` flattens an array of arrays) or an
        enum (its type is named by the table's schema, not by ``pg_catalog``'s name the cast
        uses)."""
        got = self._unnest.get(columns, ...)
        if got is not ...:
            return got
        layout = self.t.layout
        kinds = ["int8" if c == self.ms else layout.column(c).type_name for c in columns]
        sql = None
        if all(layout.column(c).kind == k and not k.startswith("_") for c, k in
               zip(columns, kinds, strict=True) if c != self.ms):
            # each array's element type without a length: a cast to ``bit`` is one to
            # bit(1), which cuts a longer string; varbit keeps it (its length checked)
            arrays = ", ".join(f"${i}::{_ARRAY_OF.get(k, k)}[]" for i, k in enumerate(kinds, 1))
            names = ", ".join(map(_quote, columns))
            values = ", ".join(self._value(c, _quote(c)) for c in columns)
            order = f" ORDER BY {self.key_list}" if self.keys else ""
            sql = (f"{self._into(columns)} SELECT {values} FROM unnest({arrays}) AS "
                   f"fence_rows({names}){order}{self._conflict()}")
        self._unnest[columns] = sql
        return sql

    async def write(self, conn: Any, ops: Sequence[Upsert | Patch | Delete], savepoint: str
                    ) -> int:
        """The fast path inside SAVEPOINT ``savepoint``: opened by the first statement and
        released by the last (left open for the COMMIT when the last is an ``unnest``
        statement, see below). Every operation is applied, in order: with key columns they go
        in sets (``order.sets_then_rest``: a key's n-th operation in the n-th set), each one
        DELETE of its tombstones and one set statement per column set, upserts in key order,
        while a set holds ``_SET_MIN`` operations; the rest in their order, each run of one
        kind and column set by one pipelined ``executemany``. An upsert by COPY sends the
        SAVEPOINT with the staging table's statement and the RELEASE with its last set
        statement (one simple query each: a batch of upserts without a repeated key costs
        four round trips, the COPY's two included, not six); a set smaller than
        ``unnest_max`` writes each column set by one prepared INSERT … SELECT FROM unnest
        (``unnest_insert``; one round trip) and needs no stage. A refusal inside leaves the
        savepoint open, for ``ROLLBACK TO``.

        With a version column every operation goes in sets (each set statement answers how
        many of its rows it left alone); the answer is how many operations were older than
        the stored row (0 without a version column)."""
        guarded = self.version is not None
        sets, rest = sets_then_rest(ops, min_set=1 if guarded else _SET_MIN) if self.keys \
            else ([list(ops)], [])
        stale = 0
        small = self.unnest_max
        staged = bool(self.keys) and self.method is Method.COPY and any(
            isinstance(op, Upsert) and (len(one) >= small or self.unnest_insert(op.columns)
                                        is None) for one in sets for op in one)
        opened = f"SAVEPOINT {savepoint}"
        release = f"RELEASE SAVEPOINT {savepoint}"
        await conn.execute(f"{opened}; {self.make_stage}" if staged else opened)
        released = False
        for g, one in enumerate(sets, 1):
            groups: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}
            deletes, patches = [], []
            for op in sorted(one, key=_BY_KEY) if self.keys else one:
                if isinstance(op, Delete):
                    deletes.append(op)
                elif isinstance(op, Patch):
                    patches.append(op)
                else:
                    groups.setdefault(op.columns, []).append(op.values)
            if deletes:
                stale += await self._deletes(conn, deletes)
            for patch in patches:  # no key repeats in a set: before its upserts, whose last
                stale += await self._patched(conn, patch)  # statement may end the savepoint
            for n, (columns, rows) in enumerate(groups.items(), 1):
                last = not rest and g == len(sets) and n == len(groups)
                if self.method is Method.EXECUTEMANY:
                    await conn.executemany(self.insert_values(columns), rows)
                elif len(one) < small and (insert := self.unnest_insert(columns)) is not None:
                    arrays = [list(values) for values in zip(*rows, strict=True)]
                    if guarded:
                        stale += len(rows) - await _written(conn, insert, *arrays)
                    else:
                        await conn.execute(insert, *arrays)
                    # the last statement written: its savepoint stays open to the COMMIT,
                    # which ends it with the transaction (nothing rolls back to it now; a
                    # RELEASE would cost a round trip of its own, see UNNEST_MAX)
                    released = released or last
                elif not self.keys:
                    await conn.copy_records_to_table(self.t.name, schema_name=self.t.schema,
                                                     columns=list(columns), records=rows)
                else:
                    await conn.copy_records_to_table(self.stage, schema_name="pg_temp",
                                                     columns=list(columns), records=rows)
                    values = ", ".join(self._value(c, _quote(c)) for c in columns)
                    released = last
                    tail = f"; {release}" if released else ""
                    insert = (f"{self._into(columns)} SELECT {values} FROM pg_temp."
                              f"{_quote(self.stage)} ORDER BY {self.key_list}{self._conflict()}")
                    empty = f"DELETE FROM pg_temp.{_quote(self.stage)}{tail}"
                    if guarded:
                        stale += len(rows) - await _written(conn, insert)
                        await conn.execute(empty)
                    else:
                        await conn.execute(f"{insert}; {empty}")
        for run in _runs(rest):
            if isinstance(run[0], Delete):
                await conn.executemany(self.delete_one, [
                    op.key if len(self.keys) > 1 else (op.key,) for op in run])
            elif isinstance(run[0], Patch):
                for one_patch in run:
                    stale += await self.one(conn, one_patch)
            else:
                await conn.executemany(self.insert_values(run[0].columns),
                                       [op.values for op in run])  # type: ignore[union-attr]
        if not released:
            await conn.execute(release)
        return stale

    async def _deletes(self, conn: Any, ops: list[Delete]) -> int:
        """One set's deletes (no key repeats): the unversioned by ``delete``, the versioned
        by ``delete_versioned``; how many of those were older than their stored row."""
        plain = [op.key for op in ops if op.version is None or self.version is None]
        versioned = [op for op in ops if op.version is not None and self.version is not None]
        if plain:
            await conn.execute(self.delete, *self._delete_args(plain))
        if not versioned:
            return 0
        return int(await conn.fetchval(self.delete_versioned, *self._delete_args(
            [op.key for op in versioned]), [op.version for op in versioned]))

    async def one(self, conn: Any, op: Upsert | Patch | Delete) -> int:
        """A single operation; 1 when a version guard left it alone (older), else 0."""
        if isinstance(op, Patch):
            return await self._patched(conn, op)
        if isinstance(op, Delete):
            if op.version is not None and self.version is not None:
                return await self._deletes(conn, [op])
            await conn.execute(self.delete_one, *(op.key if len(self.keys) > 1 else (op.key,)))
            return 0
        if self.version is not None and self.keys:
            return 0 if await conn.fetchval(self.insert_values(op.columns), *op.values) else 1
        await conn.execute(self.insert_values(op.columns), *op.values)
        return 0


def _runs(ops: Sequence[Upsert | Patch | Delete]) -> list[list[Upsert | Patch | Delete]]:
    """``ops`` in order, cut where the kind (or an upsert's column set) changes."""
    out: list[list[Upsert | Patch | Delete]] = []
    for op in ops:
        if out and type(op) is type(out[-1][0]) and (
                isinstance(op, Delete) or op.columns == out[-1][0].columns):  # type: ignore[union-attr]
            out[-1].append(op)
        else:
            out.append([op])
    return out


async def _written(conn: Any, insert: str, *args: Any) -> int:
    """How many rows the upsert ``insert`` wrote: those a version guard left alone (older
    than the stored row) are the rest of its rows."""
    return int(await conn.fetchval(f"WITH w AS ({insert} RETURNING 1) SELECT count(*) FROM w",
                                   *args))
