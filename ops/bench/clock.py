"""The benchmark's one clock: every run is timed by the same wrapper around its handler.

Rules
- The clock is ``time.monotonic()`` (Linux ``CLOCK_MONOTONIC``): one system-wide clock, so
  marks taken in several processes (the harness, a baseline, one or three workers) compare
  directly. PostgreSQL's clock would also be shared, but reading it costs a statement per
  batch inside the measured transaction, and run (a) has no database.
- A run's span is first record handed to processing (the first handler call begins) to
  last batch processed (the last handler call returned). Every run with a database pays the
  same single COMMIT round trip after that last return, which the span leaves out (about a
  millisecond against seconds). Run (a) has no handler: it marks around ``to_record``.
- Next to the span each process marks its own CPU time over it (``time.process_time()``:
  every thread of the process, user + system, at the first call and at the last return),
  summed over a run's processes as ``cpu_s``. Wall-clock rates on this shared VM move by
  ±15% between tries (CPU stolen by the host, disk stalls); CPU seconds per record do not
  count time the process waited, so they compare what each run *does* per record (they
  still move by ~±10%: a contended host also runs the same instructions slower).
- ``Marks`` are written atomically (``os.replace``) at most every ``FLUSH_S`` and once more
  ``FLUSH_S`` after the latest batch, so the final marks land without a shutdown hook; the
  harness polls files, never the database, so it takes no CPU from the measured run.
- ``clocked`` is a handler factory (``fencectl run --handler ops.bench.clock:clocked
  --handler-setting clock_file=PATH``): the reference handler for the run's schema, or
  with ``handler=accept`` one that accepts every record and writes nothing (memory runs
  with 1 MiB records), or with ``handler=sink`` the built-in table sink
  (``fencing.postgres.sink:table_sink``) with the remaining settings (``table``, ``key``,
  ``method``, ``format``, ``registry``) passed through as ``fencectl run --sink`` passes
  them; an unqualified ``table`` is placed in the run's schema, so every run writes a fresh
  table. ``layout=typed`` first creates that table with ``ops.bench.sink.TYPED_DDL`` (the
  table the Avro run creates from its schema), for the JSON run beside it.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fencing.handler import HandlerContext, declaration_of, handler, handler_factory
from fencing.postgres.sink import SinkSpec, ensure_table, make_table_sink
from fencing.store import HandlerFn
from fencing.types import ACCEPT, SourceRecord, Verdict
from ops.bench.sink import TYPED_DDL
from ops.reference.pg import ensure_tables, make_pg_handler

__all__ = ["FLUSH_S", "Marks", "accept_all", "clocked", "combined", "sink_spec", "wrap"]

FLUSH_S = 0.5  # a flush costs ~1 ms: 0.1 s took ~1% of the measured CPU (py-spy)


class Marks:
    """First handler call, last handler return and records handled, flushed to ``path``."""

    def __init__(self, path: str | Path, clock: Callable[[], float] = time.monotonic,
                 cpu: Callable[[], float] = time.process_time) -> None:
        self.path = Path(path)
        self.first: float | None = None
        self.last: float | None = None
        self.cpu_first: float | None = None
        self.cpu_last: float | None = None
        self.records = 0
        self.batches = 0
        self._clock = clock
        self._cpu = cpu
        self._written = 0.0
        self._pending: asyncio.TimerHandle | None = None

    def begin(self) -> None:
        if self.first is None:
            self.first = self._clock()
            self.cpu_first = self._cpu()

    def end(self, records: int) -> None:
        self.last = self._clock()
        self.cpu_last = self._cpu()
        self.records += records
        self.batches += 1
        if self.last - self._written >= FLUSH_S:
            self.flush()
        elif self._pending is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self.flush()
                return
            self._pending = loop.call_later(FLUSH_S, self.flush)

    def flush(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        self._written = self._clock()
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"first": self.first, "last": self.last,
                                   "records": self.records, "batches": self.batches,
                                   "cpu_first": self.cpu_first, "cpu_last": self.cpu_last,
                                   "pid": os.getpid()}))
        os.replace(tmp, self.path)


def wrap(inner: HandlerFn, marks: Marks) -> HandlerFn:
    """``inner`` timed by ``marks`` (keeps its declaration)."""

    async def timed(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
        marks.begin()
        out = await inner(conn, records)
        marks.end(len(records))
        return list(out)

    decl = declaration_of(inner)
    return handler(durability=decl.durability.value, effects=decl.effects.value)(timed)


@handler(durability="durable-critical", effects="transactional")
async def accept_all(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
    """Accepts every record and writes nothing (the fence row still moves)."""
    return [ACCEPT] * len(records)


_OWN = ("clock_file", "handler", "layout")  # the clock's settings; the rest are the sink's


def sink_spec(settings: Mapping[str, str], schema: str) -> SinkSpec:
    """The table sink's spec from a run's settings (an unqualified table in ``schema``)."""
    rest = {k: v for k, v in settings.items() if k not in _OWN}
    if "." not in rest.get("table", "."):
        rest["table"] = f"{schema}.{rest['table']}"
    return SinkSpec.from_settings(rest)


async def _ensure(conn: Any, context: HandlerContext) -> None:
    if context.settings.get("handler") == "sink":
        spec = sink_spec(context.settings, context.schema)
        if context.settings.get("layout") == "typed":  # the JSON run's twin of the Avro table
            await conn.execute(TYPED_DDL.format(spec.quoted))
        await ensure_table(conn, spec, topics=context.topics)
    else:
        await ensure_tables(conn, context.schema)


@handler_factory(ensure_tables=_ensure)
def clocked(context: HandlerContext) -> HandlerFn:
    """The timed handler of a benchmark worker run (see the module Rules)."""
    kind = context.settings.get("handler")
    inner = (accept_all if kind == "accept"
             else make_table_sink(sink_spec(context.settings, context.schema)) if kind == "sink"
             else make_pg_handler(schema=context.schema))
    return wrap(inner, Marks(context.settings["clock_file"]))


def read(paths: Iterable[Path]) -> list[dict[str, Any]]:
    out = []
    for p in paths:
        try:
            out.append(json.loads(p.read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            continue
    return out


def combined(paths: Iterable[Path]) -> dict[str, Any]:
    """One run's span over the marks of all its processes: earliest first, latest last."""
    marks = [m for m in read(paths) if m.get("first") is not None]
    if not marks:
        return {"records": 0, "elapsed_s": 0.0}
    first = min(m["first"] for m in marks)
    last = max(m["last"] for m in marks)
    records, batches = sum(m["records"] for m in marks), sum(m.get("batches", 0) for m in marks)
    cpu = sum((m.get("cpu_last") or 0.0) - (m.get("cpu_first") or 0.0) for m in marks)
    return {"records": records, "elapsed_s": last - first, "first": first, "last": last,
            "mean_batch": round(records / batches, 1) if batches else None, "cpu_s": cpu}
