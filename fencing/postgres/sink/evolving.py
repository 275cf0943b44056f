"""``--sink-evolve add-columns``: a field with no column gets a nullable column, added over
its own connection (``FENCE_DDL_DSN``) outside the fenced transaction, then the batch is
retried (I/O: PostgreSQL DDL, the schema registry).

Rules
- A batch whose values hold fields with no column (``evolve.strays``) asks for one column
  per such field: JSON values typed from the batch's values (``evolve.json_column``), a
  schema'd format's from the latest writer schema registered under ``<topic>-value``
  (``schemas``; the same mapping ``fencectl sink plan`` prints). A field that gets no type
  (null in every record, a name over 63 bytes, absent from the latest schema) is ignored
  and counted (``unknown``), as without the flag.
- The columns are added by ``ALTER TABLE … ADD COLUMN IF NOT EXISTS`` over the DDL
  connection (autocommit; ``lock_timeout`` ``LOCK_TIMEOUT_MS``): the worker's own role needs
  no DDL right. The fenced transaction holds no lock on the table then (nothing of the
  batch was written), so the ALTER waits only for other transactions writing the table,
  which commit. Then ``TableEvolved`` (an ``Unavailable``: not the records' fault, never
  bisected) rolls the batch back and the fence retries it, with the table's layout read
  again. Two members adding one column: PostgreSQL takes the table's ACCESS EXCLUSIVE
  lock before it looks for the column, so the second ALTER waits for the first to commit,
  then finds the column and skips it with a NOTICE (pinned by
  tests/integration/test_sink_evolve.py); a ``duplicate_column`` (42701) would mean the
  same and is taken as done.
- Before any ALTER the table's columns are read again through the batch's connection:
  when another member added them already, the batch is only retried (no lock taken).
- A table this very transaction created (a routed table's first batch) is invisible to
  the DDL connection: its columns are added in the batch's own transaction when the
  retried batch creates it again (the worker's role owns the table it creates).
- A field asked for once per table and process is not asked again: a column that does not
  appear after its ALTER (never expected) cannot loop the batch. A batch converted by a
  writer whose layout was read before a field's column was made sure of (another partition
  of the table, converted meanwhile) is written again by a writer that reads the table
  anew, never with the field dropped.
- The DDL connection failing, or the lock not granted in time, raises ``Unavailable``:
  the batch is retried with backoff until the ALTER goes through.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg

from fencing.crashpoints import crash_point
from fencing.errors import ConfigError, Unavailable
from fencing.postgres.sink.catalog import SinkSpec, Target
from fencing.postgres.sink.evolve import add_columns, json_column
from fencing.postgres.sink.registry import Registry
from fencing.postgres.sink.routes import MAX_NAME_BYTES
from fencing.postgres.sink.schemas import Field
from fencing.postgres.sink.values import Misfit

__all__ = ["LOCK_TIMEOUT_MS", "Evolution", "TableEvolved", "check_ddl"]

log = logging.getLogger("fenceworker.sink")

LOCK_TIMEOUT_MS = 2000  # well below the worker's idle-in-transaction timeout (8 s)
_COLUMN_NAMES = ("SELECT attname::text FROM pg_attribute WHERE attrelid = $1::regclass "
                 "AND attnum > 0 AND NOT attisdropped")


async def check_ddl(dsn: str) -> None:
    """At start: ``FENCE_DDL_DSN`` connects (else ``ConfigError``: exit 2)."""
    try:
        conn = await asyncpg.connect(dsn, timeout=5)
    except ValueError:  # its message may quote the DSN
        raise ConfigError("FENCE_DDL_DSN (--sink-evolve add-columns): not a PostgreSQL "
                          "DSN") from None
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise ConfigError(f"FENCE_DDL_DSN (--sink-evolve add-columns): cannot connect: "
                          f"{type(exc).__name__}: {exc}") from None
    await conn.close()


class TableEvolved(Unavailable):
    """The table gained columns for this batch: retry it with the table's new layout."""


class Evolution:
    """The columns asked of each table (see the module Rules); one per sink."""

    def __init__(self, spec: SinkSpec, registry: Registry | None) -> None:
        assert spec.ddl_dsn is not None
        self._dsn = spec.ddl_dsn
        self._spec = spec
        self._registry = registry
        self._conn: Any = None
        self._lock: asyncio.Lock | None = None
        #: (table, field) -> when its column was made sure of (``time.monotonic_ns``)
        self._asked: dict[tuple[str, str], int] = {}
        #: statements for a table a batch creates (routed, first sight), run in that batch
        self.pending: dict[str, tuple[str, ...]] = {}

    async def fields(self, writer: Any, topic: str, strays: Mapping[str, Sequence[Any]]
                     ) -> tuple[list[Field], bool]:
        """The columns to add for ``strays`` (field -> values) of a batch converted by
        ``writer``, and whether ``writer`` is older than a column asked for them (then the
        batch is only written again, by a writer that reads the table anew)."""
        table = writer.t.quoted
        asked = [self._asked.get((table, n)) for n in strays]
        if any(at is not None and at >= writer.born for at in asked):
            return [], True
        todo = {n: v for (n, v), at in zip(strays.items(), asked, strict=True)
                if at is None and len(n.encode()) <= MAX_NAME_BYTES}
        if not todo:
            return [], False
        if self._registry is None or not self._spec.value_format.registry:
            typed = ((n, json_column(v)) for n, v in todo.items())
            return [Field(n, t, False) for n, t in typed if t is not None], False
        try:
            got = await self._registry.latest_fields(self._spec.value_format, f"{topic}-value")
        except Misfit:
            got = None
        have = {f.name: f for f in (got[0] if got else ())}
        # a field the latest schema lacks is not looked up again for each batch
        now = time.monotonic_ns()
        self._asked.update(((table, n), now) for n in todo if n not in have)
        return [Field(n, have[n].pg_type, False) for n in todo if n in have], False

    async def evolve(self, conn: Any, target: Target, fields: Sequence[Field], *,
                     created: bool) -> None:
        """Add ``fields`` to ``target`` (none: only retry) and raise ``TableEvolved`` (see
        the module Rules)."""
        names = [f.name for f in fields]
        statements = add_columns(target.quoted, fields)
        if created:  # asked again if another member's table is found on the retry
            self.pending[target.quoted] = statements
        elif fields:
            have = {r[0] for r in await conn.fetch(_COLUMN_NAMES, target.quoted)}
            missing = [s for f, s in zip(fields, statements, strict=True) if f.name not in have]
            if missing:
                await self._run(missing)
                log.info("table sink: added to %s: %s", target.quoted,
                         ", ".join(f"{f.name} {f.pg_type}" for f in fields
                                   if f.name not in have))
                crash_point("sink-after-alter", table=target.quoted, added=len(missing))
            now = time.monotonic_ns()  # after the columns exist: writers born later see them
            self._asked.update(((target.quoted, n), now) for n in names)
        raise TableEvolved(f"table sink: {target.quoted} gained column(s) "
                           f"{', '.join(names) or '(added by another member)'}: the batch is "
                           "written again")

    async def _run(self, statements: Sequence[str]) -> None:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            try:
                if self._conn is None or self._conn.is_closed():
                    self._conn = await asyncpg.connect(
                        self._dsn, timeout=5, server_settings={
                            "application_name": "fenceworker-ddl",
                            "lock_timeout": str(LOCK_TIMEOUT_MS),
                            "client_min_messages": "warning"})
                for statement in statements:
                    try:
                        await self._conn.execute(statement)
                    except asyncpg.DuplicateColumnError:
                        pass  # another session added it: what was wanted
            except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                if self._conn is not None and not isinstance(exc, asyncpg.PostgresError):
                    self._conn.terminate()
                    self._conn = None
                raise Unavailable(f"table sink: FENCE_DDL_DSN: {type(exc).__name__}: "
                                  f"{exc}") from None

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
