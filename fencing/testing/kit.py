"""The handler test kit: does a handler keep exactly-once effects under the faults the fence
survives? Given a handler (or ``@handler_factory``), records and a PostgreSQL DSN -- no Kafka.

Rules
- Two runs, each in its own fresh schema (``fencing.postgres.testkit``): the *clean* run
  applies every record once (batches of up to 500 per partition, no fault); the *faulty*
  run drives the real ``PgFenceStore`` and ``guarded_process`` through a wire proxy
  (``fencing.testing.pgproxy``) with the batches and faults of ``fencing.testing.plan``:
  rollback after the handler ran (abort), COMMIT reply lost after the server applied it,
  COMMIT lost before the server saw it (both resolved by the store's settled re-read), and
  a new owner (epoch + 1) replaying an aborted batch in two smaller batches after the old
  token was refused. Every planned fault must take effect, or the kit says so.
- Checks: (1) the faulty run's tables equal the clean run's (snapshot of every table of
  the run schema and the quarantine); (2) for a ``transactional`` handler, the tables seen
  from another connection do not change while the handler runs -- the kit's run schema has
  no other writer, so any committed change in that window was written outside the given
  connection; (3) every record got the same verdict in every attempt of both runs;
  (4) every partition's frontier ends after its last record.
- ``check_handler`` raises ``HandlerUnsafe`` (an ``AssertionError``, so pytest shows it)
  naming every problem, and returns the ``KitReport`` otherwise; ``check_handler_async``
  is the same for an async test. Both schemas are dropped afterwards unless ``keep``.
- Seen by the kit: writes into the run schema (and the quarantine). A handler writing to
  tables elsewhere must take its schema from ``HandlerContext.schema`` to be checked.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from fencing.handler import Effects, HandlerContext, LoadedHandler, build_from, declaration_of
from fencing.postgres.testkit import RunSchema, connect, snapshot
from fencing.store import BatchCall
from fencing.testing.drive import Watch, run_partition, watched
from fencing.testing.pgproxy import PgProxy
from fencing.testing.plan import ALL_FAULTS, Fault, diff, plan, unstable_verdicts
from fencing.types import ClaimRequest, SourceRecord, Token, TopicPartition

__all__ = ["HandlerUnsafe", "KitReport", "check_handler", "check_handler_async"]

_GROUP = "fence-testkit"


@dataclass(frozen=True, slots=True)
class KitReport:
    """What the kit did and found; ``problems`` empty means the handler passed."""

    problems: tuple[str, ...]
    """What the handler got wrong, one line each."""
    faults: dict[str, int]
    """Each fault and the batches it hit in the faulty run."""
    handler_calls: int
    """Handler calls of the faulty run, aborted ones included."""
    tables: tuple[str, ...]
    """The tables compared."""
    left_out: tuple[str, ...]
    """``table.column`` values that differ between runs by design, left out of the
    comparison."""

    @property
    def ok(self) -> bool:
        """True when the handler passed (no problem)."""
        return not self.problems

    def explain(self) -> str:
        """The report as ``HandlerUnsafe`` says it: a summary line, then one per problem."""
        head = (f"handler test kit: {len(self.problems)} problem(s); faults injected "
                f"{self.faults}; {self.handler_calls} handler calls; tables {list(self.tables)}")
        return "\n".join([head, *(f"- {p}" for p in self.problems)])


class HandlerUnsafe(AssertionError):
    """The handler does not keep exactly-once effects under the kit's faults."""

    def __init__(self, report: KitReport) -> None:
        super().__init__(report.explain())
        self.report = report
        """The run's ``KitReport``, its ``problems`` the message's lines."""


class _Run:
    """One run: its schema, store, handler (built for its context) and watch."""

    def __init__(self, schema: RunSchema, loaded: LoadedHandler, watch: Watch) -> None:
        self.schema, self.loaded, self.watch = schema, loaded, watch


EnsureTables = Callable[[Any], Awaitable[None]] | Callable[[Any, HandlerContext], Awaitable[None]]


def _takes_context(ensure: Callable[..., Any]) -> bool:
    """True when ``ensure`` requires two positional arguments ``(conn, context)``, False for
    ``(conn)`` (also ``(conn, schema="...")``: an optional second argument is not given)."""
    try:
        params = inspect.signature(ensure).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): the plain form
        return False
    required = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                and p.default is p.empty]
    return len(required) >= 2


async def _start(target: Any, dsn: str, settings: dict[str, str], topics: tuple[str, ...],
                 ensure_tables: EnsureTables | None) -> _Run:
    takes_context = ensure_tables is not None and _takes_context(ensure_tables)
    schema = await RunSchema.create(dsn)
    try:
        context = HandlerContext(schema.name, _GROUP, topics, settings)
        loaded = build_from(target, context, label="check_handler")
        conn = await connect(dsn, schema.name)
        try:
            if ensure_tables is not None:
                await (ensure_tables(conn, context) if takes_context  # type: ignore[call-arg]
                       else ensure_tables(conn))  # type: ignore[call-arg]
            if loaded.ensure_tables is not None:
                await loaded.ensure_tables(conn)
        finally:
            await conn.close()
    except BaseException:
        await schema.drop()
        raise
    return _Run(schema, loaded, Watch())


def _by_partition(records: Iterable[SourceRecord]) -> dict[TopicPartition, list[SourceRecord]]:
    out: dict[TopicPartition, list[SourceRecord]] = {}
    for r in records:
        part = out.setdefault(r.tp, [])
        if part and r.offset <= part[-1].offset:
            raise ValueError(f"{r.tp}: offset {r.offset} after {part[-1].offset}; offsets of a "
                             "partition must increase")
        part.append(r)
    return out


async def _clean(run: _Run, parts: dict[TopicPartition, list[SourceRecord]]) -> list[Token]:
    store = await run.schema.store(run.schema.dsn, group_id=_GROUP)
    fn = watched(run.loaded.fn, run.watch, None)
    try:
        tokens = dict(await store.claim([ClaimRequest(tp, 0) for tp in parts], lifetime="clean"))
        for tp, recs in parts.items():
            for i in range(0, len(recs), 500):
                tokens[tp] = await store.process(BatchCall(tp, recs[i:i + 500], fn), tokens[tp])
        return list(tokens.values())
    finally:
        await store.close()


async def _faulty(run: _Run, parts: dict[TopicPartition, list[SourceRecord]],
                  faults: Sequence[Fault], seed: int, transactional: bool,
                  ignore: Sequence[str]) -> tuple[list[Token], dict[str, int], list[str]]:
    url = urlsplit(run.schema.dsn)
    observer = await connect(run.schema.dsn, run.schema.name)
    counts: dict[str, int] = {}
    problems: list[str] = []

    async def outside() -> Any:
        return (await snapshot(observer, run.schema, ignore=ignore))[0]

    applying = watched(run.loaded.fn, run.watch, outside if transactional else None)
    aborting = watched(run.loaded.fn, run.watch, outside if transactional else None,
                        abort=True)
    rng = random.Random(seed)
    async with PgProxy(url.hostname or "127.0.0.1", url.port or 5432) as proxy:
        store = await run.schema.store(proxy.dsn(run.schema.dsn), group_id=_GROUP)
        try:
            tokens = []
            for n, (tp, recs) in enumerate(parts.items()):
                steps = plan(recs, rng=rng, faults=faults, first=n)
                tokens.append(await run_partition(store, proxy, tp, steps, applying, aborting,
                                               counts, problems))
        finally:
            await store.close()
            await observer.close()
    return tokens, counts, problems


async def check_handler_async(
    handler: Any,
    records: Iterable[SourceRecord],
    *,
    dsn: str,
    settings: dict[str, str] | None = None,
    ensure_tables: EnsureTables | None = None,
    faults: Sequence[Fault] = ALL_FAULTS,
    seed: int = 0,
    ignore_columns: Sequence[str] = (),
    keep: bool = False,
) -> KitReport:
    """Run ``handler`` (a handler or a ``@handler_factory``, built with ``settings``) over
    ``records`` cleanly and under ``faults``; raise ``HandlerUnsafe`` naming every problem
    (see the module Rules). ``ensure_tables``: table set-up for a plain handler (a factory
    brings its own), an async callable taking ``(conn, context)`` -- the signature of a
    factory's ``ensure_tables``, so one function serves both -- or ``(conn)``; it runs on a
    connection whose ``search_path`` is the run schema (also ``context.schema``), before
    the factory's. ``ignore_columns``: ``table.column`` values that may differ
    between runs; ``keep``: leave both schemas for inspection."""
    if urlsplit(dsn).scheme not in ("postgres", "postgresql") or not urlsplit(dsn).hostname:
        raise ValueError("check_handler: dsn must be a postgresql://user:password@host:port/db "
                         "URL (the kit puts its proxy in front of that host and port)")
    parts = _by_partition(records)
    if not parts:
        raise ValueError("check_handler needs at least one record")
    topics = tuple(sorted({tp.topic for tp in parts}))
    clean = await _start(handler, dsn, dict(settings or {}), topics, ensure_tables)
    faulty: _Run | None = None
    try:
        faulty = await _start(handler, dsn, dict(settings or {}), topics, ensure_tables)
        transactional = declaration_of(faulty.loaded.fn).effects is Effects.TRANSACTIONAL
        clean_tokens = await _clean(clean, parts)
        tokens, counts, problems = await _faulty(faulty, parts, faults, seed, transactional,
                                                 ignore_columns)
        problems += faulty.watch.problems
        ends = sorted(recs[-1].offset + 1 for recs in parts.values())
        for name, got in (("clean", clean_tokens), ("faulty", tokens)):
            if sorted(t.frontier for t in got) != ends:
                problems.append(f"kit: the {name} run's frontiers {got} are not the batch ends")
        snaps = []
        for run in (clean, faulty):
            conn = await connect(dsn, run.schema.name)
            try:
                snaps.append(await snapshot(conn, run.schema, group_id=_GROUP,
                                            ignore=ignore_columns))
            finally:
                await conn.close()
        problems += [f"after the faults, {d}" for d in diff(snaps[0][0], snaps[1][0])]
        merged = {k: clean.watch.verdicts.get(k, []) + v for k, v in faulty.watch.verdicts.items()}
        problems += unstable_verdicts(merged)
        report = KitReport(tuple(problems), counts, faulty.watch.calls,
                           tuple(sorted(snaps[0][0])), tuple(snaps[0][1]))
    finally:
        if not keep:
            for made in (clean, faulty):
                if made is not None:
                    await made.schema.drop()
    if not report.ok:
        raise HandlerUnsafe(report)
    return report


def check_handler(handler: Any, records: Iterable[SourceRecord], *, dsn: str,
                  **options: Any) -> KitReport:
    """``check_handler_async`` for a plain (synchronous) test; same options."""
    return asyncio.run(check_handler_async(handler, records, dsn=dsn, **options))
