"""FailureRun over the production Lifecycle and the in-memory store: transient retries,
bisection (cost bounded by ceil(log2 n) probe transactions), durable counts, suspects."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Sequence
from typing import Any

import pytest

from consumer import Lifecycle
from consumer.failure_run import FailureRun, RetryInterrupted
from fencing.errors import HandlerFailed, TooSlow, Transient, Unavailable
from fencing.failures import RetryPolicy, handler_failure
from fencing.handler import Declaration, Durability, Effects, OnFailure
from fencing.memory.store import MemoryFenceStore
from fencing.slow import handler_limit_s
from fencing.store import HandlerFn
from fencing.types import (
    ACCEPT,
    SourceCheck,
    SourceFacts,
    SourceRecord,
    Token,
    TopicPartition,
    Verdict,
)
from ops.sim.loop import LogicalClock, run_sync

TP = TopicPartition("t", 0)


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now_s

    async def wait(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now_s += seconds
        await asyncio.sleep(0)


def recs(*offsets: int) -> list[SourceRecord]:
    return [SourceRecord(TP.topic, TP.partition, o, b"k", str(o).encode()) for o in offsets]


def counting(poison: set[int] = frozenset(), transient_failures: int = 0) -> HandlerFn:  # type: ignore[assignment]
    """Counts each record's committed applications in table ``applied``; raises for poison
    offsets; raises ``Transient`` for its first ``transient_failures`` calls."""
    calls = {"n": 0}

    async def handle(conn: Any, records: Sequence[SourceRecord]) -> list[Any]:
        calls["n"] += 1
        if calls["n"] <= transient_failures:
            raise Transient("downstream busy")
        applied = conn.table("applied")
        for r in records:
            if r.offset in poison:
                raise ValueError(f"cannot parse {r.offset}")
            applied[r.offset] = applied.get(r.offset, 0) + 1
        return [ACCEPT] * len(records)

    return handle


async def owner(store: MemoryFenceStore, clock: Clock, lifetime: str, *, high: int = 1000,
                ) -> Lifecycle:
    lc = Lifecycle(store=store, lifetime_id=lifetime, clock=clock, wait=clock.wait)
    await lc.assign([SourceCheck(TP, SourceFacts("id", 0, high))])
    return lc


def failure_run(lc: Lifecycle, handler: HandlerFn, clock: Clock, *,
                decl: Declaration | None = None, window: int = 500,
                **policy: int) -> FailureRun:
    return FailureRun(lifecycle=lc, handler=handler, declaration=decl or Declaration(),
                      policy=RetryPolicy(**policy), rng=random.Random(1), clock=clock,
                      wait=clock.wait, suspect_window=window)


def never() -> bool:
    return False


def processed(store: MemoryFenceStore) -> int:
    return sum(1 for w in store.writes if w.kind == "process")


@pytest.mark.parametrize("bad", [0, 1, 250, 498, 499])
async def test_poison_in_500_is_quarantined_and_499_applied_once_within_log2(bad: int) -> None:
    store, clock = MemoryFenceStore("g"), Clock()
    lc = await owner(store, clock, "L1")
    run = failure_run(lc, counting({bad}), clock)
    token = await run.submit(TP, recs(*range(500)), links=(), stopped=never)
    assert token == Token(1, 500) == store.token_of(TP)
    assert store.tables()["applied"] == {o: 1 for o in range(500) if o != bad}
    [q] = store.quarantine
    assert (q.offset, q.error_type) == (bad, "ValueError") and "cannot parse" in q.reason
    # committed transactions: the bisection's probes that applied records, plus the rest;
    # never more than ceil(log2(500)) = 9 probes, plus the one that moves past the poison
    assert processed(store) <= math.ceil(math.log2(500)) + 1
    assert clock.waits == []  # poison is not retried with backoff


async def test_transient_twice_is_applied_once_after_two_backoffs_and_its_count_cleared() -> None:
    store, clock = MemoryFenceStore("g"), Clock()
    lc = await owner(store, clock, "L1")
    run = failure_run(lc, counting(transient_failures=2), clock, initial_ms=100, max_ms=1000)
    token = await run.submit(TP, recs(0, 1, 2), links=(), stopped=never)
    assert token == Token(1, 3)
    assert store.tables()["applied"] == {0: 1, 1: 1, 2: 1}
    assert store.quarantine == [] and processed(store) == 1
    assert 0.1 <= sum(clock.waits) < 0.1 + 0.2 + 0.1  # ~0.1 then ~0.2 s, jittered down
    assert store.attempt_rows == {}  # deleted in the committing transaction


async def test_transient_past_its_attempts_is_treated_as_poison() -> None:
    store, clock = MemoryFenceStore("g"), Clock()
    lc = await owner(store, clock, "L1")
    run = failure_run(lc, counting(transient_failures=100), clock, retry_max_attempts=2)
    await run.submit(TP, recs(0), links=(), stopped=never)
    [q] = store.quarantine
    assert q.error_type == "Transient" and store.attempt_rows == {}


async def test_a_handler_declared_to_stop_raises_the_failure() -> None:
    store, clock = MemoryFenceStore("g"), Clock()
    lc = await owner(store, clock, "L1")
    run = failure_run(lc, counting({1}), clock,
                      decl=Declaration(on_failure=OnFailure.STOP))
    with pytest.raises(HandlerFailed, match="cannot parse 1"):
        await run.submit(TP, recs(0, 1, 2), links=(), stopped=never)
    assert store.token_of(TP) == Token(1, 0) and store.quarantine == []


async def test_outcome_uncertain_failed_batch_is_quarantined_whole_never_replayed() -> None:
    store, clock = MemoryFenceStore("g"), Clock()
    lc = await owner(store, clock, "L1")
    handler = counting(transient_failures=1)
    run = failure_run(lc, handler, clock, decl=Declaration(
        Durability.DURABLE_CRITICAL, Effects.OUTCOME_UNCERTAIN))
    await run.submit(TP, recs(0, 1), links=(), stopped=never)
    assert [q.offset for q in store.quarantine] == [0, 1]
    assert "applied" not in store.tables() and clock.waits == []


async def test_a_stopped_partition_abandons_its_backoff() -> None:
    store, clock = MemoryFenceStore("g"), Clock()
    lc = await owner(store, clock, "L1")
    run = failure_run(lc, counting(transient_failures=100), clock)
    with pytest.raises(RetryInterrupted):
        await run.submit(TP, recs(0), links=(), stopped=lambda: bool(clock.waits))
    assert store.token_of(TP) == Token(1, 0)


class Death(BaseException):
    """The process died: nothing of the fence's error handling runs."""


def killer(victim: int, died: list[int]) -> HandlerFn:
    """Accepts, except that handling ``victim`` "kills the process": it records the death and
    raises ``Death`` (the transaction never commits, nothing after it runs)."""
    inner = counting()

    async def handle(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        if any(r.offset == victim for r in records):
            died.append(victim)
            raise Death
        return await inner(conn, records)

    return handle


async def test_a_killer_record_is_quarantined_after_max_attempts_deaths_across_owners() -> None:
    """Each owner dies without a release; the next one sees the unclean end, tries the
    window's records one by one, each counted first; the killer's count reaches the limit."""
    store, clock = MemoryFenceStore("g"), Clock()
    died: list[int] = []
    for n in range(8):
        lc = await owner(store, clock, f"L{n}")
        run = failure_run(lc, killer(5, died), clock, max_attempts=2, window=10)
        token = store.token_of(TP)
        assert token is not None
        try:
            await run.submit(TP, recs(*range(token.frontier, 10)), links=(), stopped=never)
        except Death:
            lc.stop()  # the death: no release, no retire
            continue
        break
    # the first death (in a 10-record batch) is not attributed; then 2 attributed deaths
    assert died == [5, 5, 5]
    [q] = store.quarantine
    assert q.offset == 5 and "2 attempts" in q.reason and "killed the process" in q.reason
    assert store.tables()["applied"] == {o: 1 for o in range(10) if o != 5}
    assert store.token_of(TP) == Token(4, 10) and store.attempt_rows == {}  # 4th owner


async def test_idle_crashes_never_quarantine() -> None:
    store, clock = MemoryFenceStore("g"), Clock()
    for n in range(6):  # six owners die idle, none released
        await owner(store, clock, f"L{n}")
    lc = await owner(store, clock, "L6")
    run = failure_run(lc, counting(), clock, max_attempts=1, window=2)
    before = processed(store)
    await run.submit(TP, recs(0, 1, 2), links=(), stopped=never)
    assert store.quarantine == [] and store.tables()["applied"] == {0: 1, 1: 1, 2: 1}
    assert processed(store) - before == 3  # the window's 2 records alone, then the rest
    assert store.attempt_rows == {}
    await run.submit(TP, recs(3, 4), links=(), stopped=never)
    assert processed(store) - before == 4  # healthy again: one transaction per batch


async def test_a_clean_handover_is_not_suspect() -> None:
    store, clock = MemoryFenceStore("g"), Clock()
    first = await owner(store, clock, "L1")
    await first.revoke([TP])  # journals the release
    lc = await owner(store, clock, "L2")
    assert lc.take_failure_marks(TP) is None


async def test_bisection_is_visible_as_metrics_and_span_events() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from consumer.observability.instruments import Instruments
    from consumer.observability.otel_tracing import OtelTracing

    exporter, spans = InMemorySpanExporter(), TracerProvider()
    spans.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    instruments = Instruments(MeterProvider(metric_readers=[reader]).get_meter("test"))
    store, clock = MemoryFenceStore("g"), Clock()
    lc = await owner(store, clock, "L1")
    run = FailureRun(lifecycle=lc, handler=counting({3}), declaration=Declaration(),
                     policy=RetryPolicy(), rng=random.Random(1), clock=clock, wait=clock.wait,
                     instruments=instruments, tracing=OtelTracing(spans.get_tracer("t")))
    await run.submit(TP, recs(*range(8)), links=(), stopped=never)
    [span] = [s for s in exporter.get_finished_spans() if s.name == "fence.handler_failure"]
    events = [(e.name, dict(e.attributes or {})) for e in span.events]
    assert [n for n, _ in events].count("fence.bisection") == 3  # ceil(log2(8))
    [quarantined] = [a for n, a in events if n == "fence.quarantine"]
    assert quarantined["messaging.kafka.offset"] == 3
    assert quarantined["exception.type"] == "ValueError"
    data = reader.get_metrics_data()
    points: dict[tuple[str, Any], Any] = {}
    for rm in data.resource_metrics:  # type: ignore[union-attr]
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    key = (m.name, dict(p.attributes or {}).get("kind"))
                    points[key] = points.get(key, 0) + p.value  # type: ignore[union-attr]
    assert points[("fence.handler.failures", "bisection")] == 3
    assert points[("fence.handler.failures", "quarantine")] == 1


async def test_a_partition_lost_during_a_failure_writes_nothing_more() -> None:
    """The partition closed (lost, revoked) while its batch failed: no attempt count, no
    retry, no probe; the batch stays unapplied for whoever owns the partition next."""
    store, clock = MemoryFenceStore("g"), Clock()
    lc = await owner(store, clock, "L1")
    for handler in (counting(transient_failures=1), counting({0})):
        run = failure_run(lc, handler, clock)
        with pytest.raises(RetryInterrupted):
            await run.submit(TP, recs(0, 1), links=(), stopped=lambda: True)
        assert store.attempt_rows == {} and store.quarantine == []
        assert store.token_of(TP) == Token(1, 0) and clock.waits == []


async def test_a_token_dropped_while_the_failure_is_handled_ends_it_without_retiring() -> None:
    """The lost callback drops the token between the check and the attempt count (a race
    seen with KIP-848): the late ``Fenced`` ends the handling, the lifetime stays live."""
    store, clock = MemoryFenceStore("g"), Clock()
    lc = await owner(store, clock, "L1")

    async def losing(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        lc.lost([TP])  # the lost callback ran while the handler failed
        raise Transient("connection gone")

    checks = iter([False])  # open at the first check, closed from then on
    run = failure_run(lc, losing, clock)
    with pytest.raises(RetryInterrupted):
        await run.submit(TP, recs(0, 1), links=(), stopped=lambda: next(checks, True))
    assert lc.state.value == "live" and store.attempt_rows == {}


async def test_a_batch_lost_while_it_waits_for_the_gate_is_never_attempted() -> None:
    """Another partition's suspect record holds the process's gate alone; this partition's
    batch waits for it and is lost meanwhile: when the gate opens the batch is dropped
    (``RetryInterrupted``), not sent as a late call whose ``Fenced`` would end the lifetime
    (found by the simulator's lost interleave over the failure path)."""
    from consumer.alone_gate import AloneGate
    store, clock = MemoryFenceStore("g"), Clock()
    lc = await owner(store, clock, "L1")
    gate = AloneGate()
    run = FailureRun(lifecycle=lc, handler=counting(), declaration=Declaration(),
                     policy=RetryPolicy(), rng=random.Random(1), clock=clock, wait=clock.wait,
                     gate=gate)
    assert await gate.alone(never)  # the other partition's suspect record runs alone
    task = asyncio.ensure_future(run.submit(TP, recs(0, 1), links=(),
                                            stopped=lambda: lc.token(TP) is None))
    for _ in range(3):
        await asyncio.sleep(0)
    assert not task.done()  # waiting for the gate
    lc.lost([TP])
    gate.release_alone()
    with pytest.raises(RetryInterrupted):
        await task
    assert lc.state.value == "live" and processed(store) == 0


async def test_a_poison_record_counts_as_quarantined_in_the_records_metrics() -> None:
    """``fence_records_rejected_total`` (the quarantine alerts' metric) counts poison records
    too: the bisection's quarantine is a ``Reject`` of the committed batch."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from consumer.observability.instruments import Instruments

    reader = InMemoryMetricReader()
    instruments = Instruments(MeterProvider(metric_readers=[reader]).get_meter("test"))
    store, clock = MemoryFenceStore("g"), Clock()
    lc = Lifecycle(store=store, lifetime_id="L1", clock=clock, wait=clock.wait,
                   instruments=instruments)
    await lc.assign([SourceCheck(TP, SourceFacts("id", 0, 1000))])
    run = FailureRun(lifecycle=lc, handler=counting({3, 6}), declaration=Declaration(),
                     policy=RetryPolicy(), rng=random.Random(1), clock=clock, wait=clock.wait,
                     instruments=instruments)
    await run.submit(TP, recs(*range(8)), links=(), stopped=never)
    data = reader.get_metrics_data()
    assert data is not None
    totals: dict[str, float] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    totals[m.name] = totals.get(m.name, 0) + getattr(p, "value", 0)
    assert totals["fence.records.rejected"] == 2
    assert totals["fence.records.processed"] == 8


def sleeping(per_record_s: float, slow: dict[int, float] | None = None) -> HandlerFn:
    """Applies each record (table ``applied``) after sleeping ``per_record_s`` per record
    (``slow``: longer for some offsets): a slow downstream. The tests below run it on the
    simulator's logical loop (``ops.sim.loop``), so its sleeps and the handler's time limit
    are logical time: the outcome does not depend on the machine's load."""
    async def handle(conn: Any, records: Sequence[SourceRecord]) -> list[Any]:
        await asyncio.sleep(sum((slow or {}).get(r.offset, per_record_s) for r in records))
        applied = conn.table("applied")
        for r in records:
            applied[r.offset] = applied.get(r.offset, 0) + 1
        return [ACCEPT] * len(records)

    return handle


def unavailable_for(calls: int) -> HandlerFn:
    """``counting()``, but its first ``calls`` calls raise ``Unavailable``."""
    inner = counting()
    seen = {"n": 0}

    async def handle(conn: Any, records: Sequence[SourceRecord]) -> Any:
        seen["n"] += 1
        if seen["n"] <= calls:
            raise Unavailable("schema registry: GET /schemas/ids/7 timed out")
        return await inner(conn, records)

    return handle


async def slow_run(store: MemoryFenceStore, clock: LogicalClock, handler: HandlerFn, *,
                   budget_s: float, decl: Declaration | None = None) -> tuple[Lifecycle,
                                                                                FailureRun]:
    lc = Lifecycle(store=store, lifetime_id="L1", clock=clock, wait=asyncio.sleep,
                   budget_s=budget_s)
    await lc.assign([SourceCheck(TP, SourceFacts("id", 0, 1000))])
    return lc, FailureRun(lifecycle=lc, handler=handler, declaration=decl or Declaration(),
                          policy=RetryPolicy(), rng=random.Random(1), clock=clock,
                          wait=asyncio.sleep, suspect_window=40,
                          limit_s=handler_limit_s(budget_s=budget_s,
                                                  idle_in_transaction_s=None))


def test_a_batch_too_slow_for_the_budget_is_split_until_it_fits_and_applied_once() -> None:
    """A call budget of 0.8 s lets a handler call last 0.6 s: 40 records at 50 ms each are
    too slow, halves of 20 too, quarters of 10 fit; the next batch keeps the size that fits."""
    store, clock = MemoryFenceStore("g"), LogicalClock()

    async def body() -> None:
        lc, run = await slow_run(store, clock, sleeping(0.05), budget_s=0.8)
        token = await run.submit(TP, recs(*range(40)), links=(), stopped=never)
        assert token == Token(1, 40) and lc.state.value == "live"
        assert store.tables()["applied"] == {o: 1 for o in range(40)}
        assert store.quarantine == [] and processed(store) == 4  # chunks of 10
        await run.submit(TP, recs(*range(40, 60)), links=(), stopped=never)
        assert store.tables()["applied"] == {o: 1 for o in range(60)}
        assert processed(store) == 6  # the size that fits is kept: no 20-record call

    run_sync(body(), clock=clock)


@pytest.mark.parametrize("on_failure", [OnFailure.QUARANTINE, OnFailure.STOP])
def test_a_record_too_slow_alone_is_quarantined_or_stops_per_declaration(
        on_failure: OnFailure, caplog: pytest.LogCaptureFixture) -> None:
    store, clock = MemoryFenceStore("g"), LogicalClock()

    async def body() -> None:
        lc, run = await slow_run(store, clock, sleeping(0.0, slow={1: 5.0}), budget_s=0.4,
                                 decl=Declaration(on_failure=on_failure))  # 0.3 s a call
        if on_failure is OnFailure.STOP:
            with pytest.raises(TooSlow, match=r"offset 1: the handler took longer than 0\.3 s"):
                await run.submit(TP, recs(0, 1, 2), links=(), stopped=never)
            assert store.quarantine == [] and store.token_of(TP) == Token(1, 1)
            return
        assert await run.submit(TP, recs(0, 1, 2), links=(), stopped=never) == Token(1, 3)
        [q] = store.quarantine
        assert (q.offset, q.error_type) == (1, "TooSlow") and q.reason.startswith("too slow")
        assert store.tables()["applied"] == {0: 1, 2: 1}
        assert lc.state.value == "live"

    run_sync(body(), clock=clock)
    warnings = [r.getMessage() for r in caplog.records if "(too slow)" in r.getMessage()]
    assert len(warnings) == 1 and "--db-idle-in-transaction-timeout-s" in warnings[0]


def test_an_outcome_uncertain_batch_too_slow_is_quarantined_as_outcome_unknown() -> None:
    store, clock = MemoryFenceStore("g"), LogicalClock()

    async def body() -> None:
        _lc, run = await slow_run(store, clock, sleeping(1.0), budget_s=0.4, decl=Declaration(
            Durability.DURABLE_CRITICAL, Effects.OUTCOME_UNCERTAIN))
        assert await run.submit(TP, recs(0, 1), links=(), stopped=never) == Token(1, 2)

    run_sync(body(), clock=clock)
    assert [(q.offset, q.error_type) for q in store.quarantine] == [
        (0, "OutcomeUnknown"), (1, "OutcomeUnknown")]
    assert "applied" not in store.tables()


async def test_an_unavailable_service_is_waited_for_past_every_attempt_limit() -> None:
    """Twelve failures in a row, against a limit of five attempts: no bisection, nothing
    quarantined, no durable count left for a later owner to blame the records with; the
    backoff doubles up to its bound."""
    store, clock = MemoryFenceStore("g"), Clock()
    lc = await owner(store, clock, "L1")
    run = failure_run(lc, unavailable_for(12), clock, initial_ms=100, max_ms=1000,
                      retry_max_attempts=5)
    counted: list[int] = []
    real = lc.record_attempt

    async def spy(*args: Any, **kwargs: Any) -> Any:
        counted.append(kwargs["offset"])
        return await real(*args, **kwargs)

    lc.record_attempt = spy  # type: ignore[method-assign]
    token = await run.submit(TP, recs(0, 1, 2), links=(), stopped=never)
    assert token == Token(1, 3) and store.tables()["applied"] == {0: 1, 1: 1, 2: 1}
    assert store.quarantine == [] and processed(store) == 1 and counted == []
    assert store.attempt_rows == {}
    # 12 backoffs: 0.1, 0.2, 0.4, 0.8, then eight at the 1 s bound, each jittered to [0.5, 1)
    assert 0.5 * 9.5 <= sum(clock.waits) < 9.5


async def test_a_plain_transient_still_stops_at_its_attempt_limit() -> None:
    store, clock = MemoryFenceStore("g"), Clock()
    lc = await owner(store, clock, "L1")
    run = failure_run(lc, counting(transient_failures=50), clock, initial_ms=1, max_ms=2,
                      retry_max_attempts=3)
    await run.submit(TP, recs(0), links=(), stopped=never)
    assert sum(clock.waits) < 0.006  # 2 backoffs of 3 attempts, 2 more in the bisection
    assert [q.offset for q in store.quarantine] == [0]


def test_unavailable_is_a_transient_and_says_so_in_the_failure() -> None:
    failure = handler_failure(Unavailable("registry down"), what="process")
    assert isinstance(failure, HandlerFailed) and failure.transient and failure.unavailable
    assert "(unavailable)" in str(failure)
    plain = handler_failure(Transient("x"), what="p")
    assert isinstance(plain, HandlerFailed) and plain.transient and not plain.unavailable
