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
  table the Avro run creates from its schema), for the JSON run beside it. A ``{pid}`` in
  ``clock_file`` becomes the process id: the members of one ``fencectl run --processes N``
  share their settings and each writes its own file.
- With ``latency=1`` (the latency runs, ``ops.bench.latency``) each process also records, per
  record, its latency from produce to commit: the worker's wall clock (``time.time()``) when
  the reply to the batch's ``COMMIT`` was read (asyncpg's query logger on the batch's
  connection, which runs on the loop's next turn after the reply) minus the record's Kafka
  timestamp (the producer's ``CreateTime``, set by librdkafka at ``produce()`` on the same
  machine's clock). Also from produce to the batch's handler call (``lat_begin``: what the
  record waited before its transaction began). Both as histograms per second of produce
  time, so a harness picks its window; with ``batches=1`` also one entry per committed batch
  (partition, commit time, records, largest latency): when a partition paused.
- A histogram's buckets are whole milliseconds below 100 ms and two significant digits
  above, each named by its lower edge (``bucket_ms``: 1,234 ms counts as 1,200 ms; a
  quantile of 790 ms lies in 790-799 ms, so it reads up to one step, under 10%, low). Why:
  every flush writes the whole histogram from the member's event loop, and with 1 ms
  buckets its size grew with the spread of latencies: a member seconds behind spread them
  over thousands of buckets per second, and a flush (json of 25 s of them) blocked the loop
  for 50-500 ms every ``FLUSH_S``, which made the measured member fall further behind.
  Two significant digits bound a second's buckets to about 370 up to 100 s.
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

__all__ = ["FLUSH_S", "Histogram", "Latency", "Marks", "accept_all", "add_latencies", "bucket_ms",
           "clocked", "combined", "member_files", "plain_histogram", "sink_spec", "wrap"]

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
        self.latency: Latency | None = None

    def begin(self) -> None:
        if self.first is None:
            self.first = self._clock()
            self.cpu_first = self._cpu()

    def end(self, records: int) -> None:
        self.last = self._clock()
        self.cpu_last = self._cpu()
        self.records += records
        self.batches += 1
        self.changed()

    def changed(self) -> None:
        """Something to write: now if the last write is ``FLUSH_S`` old, else in ``FLUSH_S``."""
        if self._clock() - self._written >= FLUSH_S:
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
        out = {"first": self.first, "last": self.last, "records": self.records,
               "batches": self.batches, "cpu_first": self.cpu_first, "cpu_last": self.cpu_last,
               "pid": os.getpid()}
        if self.latency is not None:
            out.update(self.latency.report())
        tmp.write_text(json.dumps(out))
        os.replace(tmp, self.path)


Histogram = dict[int, dict[int, int]]  # second of produce time -> latency ms -> records


class Latency:
    """Produce-to-commit latencies of one process (see the module Rules)."""

    def __init__(self, *, batches: bool = False, wall: Callable[[], float] = time.time,
                 changed: Callable[[], None] = lambda: None) -> None:
        self.commit: Histogram = {}
        self.begin: Histogram = {}
        self.batch_log: list[tuple[int, float, int, int]] | None = [] if batches else None
        self._wall = wall
        self._changed = changed  # the marks write the commits too (a commit follows end())
        self._open: dict[int, tuple[int, list[int]]] = {}  # backend pid -> the batch in it
        self._watched: set[int] = set()

    def began(self, conn: Any, records: Sequence[SourceRecord]) -> None:
        """A batch's handler call began on ``conn``; its COMMIT reply ends it."""
        pid = conn.get_server_pid()
        if pid not in self._watched:
            conn.add_query_logger(lambda q, pid=pid: self._logged(pid, q))
            self._watched.add(pid)
        now_ms = self._wall() * 1000
        stamps = [r.timestamp_ms for r in records if r.timestamp_ms is not None]
        add_latencies(self.begin, stamps, now_ms)
        self._open[pid] = (records[0].partition, stamps)

    def _logged(self, pid: int, query: Any) -> None:
        if query.query not in ("COMMIT", "ROLLBACK"):
            return
        batch = self._open.pop(pid, None)
        if batch is None or query.query != "COMMIT" or query.exception is not None:
            return
        now_s = self._wall()
        partition, stamps = batch
        worst = add_latencies(self.commit, stamps, now_s * 1000)
        if self.batch_log is not None:
            self.batch_log.append((partition, round(now_s, 4), len(stamps), worst))
        self._changed()

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"lat": plain_histogram(self.commit),
                               "lat_begin": plain_histogram(self.begin)}
        if self.batch_log is not None:
            out["batch_log"] = self.batch_log
        return out


def bucket_ms(ms: int) -> int:
    """The histogram bucket of a latency: ``ms`` below 100, else its two significant digits."""
    if ms < 100:
        return ms
    step = 10 if ms < 1_000 else 100 if ms < 10_000 else 1_000 if ms < 100_000 else 10_000
    return ms - ms % step


def add_latencies(hist: Histogram, stamps: Sequence[int], now_ms: float) -> int:
    """Add each stamp's latency to ``now_ms`` (whole ms, at least 0, in its ``bucket_ms``);
    the largest (exact)."""
    worst = 0
    for ts in stamps:
        ms = max(int(now_ms - ts), 0)
        worst = max(worst, ms)
        per = hist.setdefault(ts // 1000, {})
        ms = bucket_ms(ms)
        per[ms] = per.get(ms, 0) + 1
    return worst


def plain_histogram(hist: Histogram) -> dict[str, dict[str, int]]:
    return {str(s): {str(ms): n for ms, n in per.items()} for s, per in hist.items()}


def wrap(inner: HandlerFn, marks: Marks) -> HandlerFn:
    """``inner`` timed by ``marks`` (keeps its declaration)."""

    async def timed(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
        marks.begin()
        if marks.latency is not None:
            marks.latency.began(conn, records)
        out = await inner(conn, records)
        marks.end(len(records))
        return list(out)

    decl = declaration_of(inner)
    return handler(durability=decl.durability.value, effects=decl.effects.value)(timed)


@handler(durability="durable-critical", effects="transactional")
async def accept_all(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
    """Accepts every record and writes nothing (the fence row still moves)."""
    return [ACCEPT] * len(records)


_OWN = ("clock_file", "handler", "layout", "latency", "batches")  # the rest: the sink's


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
        elif context.settings.get("layout") == "typed_versioned":  # + the version guard's
            await conn.execute(TYPED_DDL.replace("PRIMARY KEY", "lsn bigint, PRIMARY KEY")
                               .format(spec.quoted))
        for one, topics in ([(spec.for_topic(t), (t,)) for t in context.topics]
                             if spec.routed else [(spec, context.topics)]):
            await ensure_table(conn, one, topics=topics)
    else:
        await ensure_tables(conn, context.schema)


@handler_factory(ensure_tables=_ensure)
def clocked(context: HandlerContext) -> HandlerFn:
    """The timed handler of a benchmark worker run (see the module Rules)."""
    kind = context.settings.get("handler")
    inner = (accept_all if kind == "accept"
             else make_table_sink(sink_spec(context.settings, context.schema)) if kind == "sink"
             else make_pg_handler(schema=context.schema))
    settings = context.settings
    marks = Marks(settings["clock_file"].replace("{pid}", str(os.getpid())))
    if settings.get("latency") == "1":
        marks.latency = Latency(batches=settings.get("batches") == "1", changed=marks.changed)
    return wrap(inner, marks)


def read(paths: Iterable[Path]) -> list[dict[str, Any]]:
    out = []
    for p in paths:
        try:
            out.append(json.loads(p.read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            continue
    return out


def member_files(folder: Path) -> list[Path]:
    """The marks files of a run whose ``clock_file`` was ``folder/member-{pid}.json``."""
    return sorted(folder.glob("member-*.json"))


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
