"""Blame after process deaths, over the production Lifecycle, FailureRun and the in-memory
store: a death is counted only against the record that was alone in flight (the suspect
windows of all partitions of a process run one record at a time, process-wide), and an
``outcome-uncertain`` handler's records are never run a second time (a durable intent before
the handler; store-level retries never re-run it).

Handlers write one table per partition (``applied<p>``): the in-memory store's tables are
copied per transaction, so concurrent transactions must not share one.

A "process" here is one lifetime whose partitions run concurrently as the worker runs them;
its death is a ``Death`` raised by a handler: every other task of the process is cancelled
at once (nothing of theirs commits, no release is journaled), then the next owner claims."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from consumer import Lifecycle
from consumer.failure_run import FailureRun
from fencing.failures import RetryPolicy
from fencing.handler import Declaration, Durability, Effects, OnFailure
from fencing.memory.faults import Fault, FaultOutcome, Operation
from fencing.memory.store import MemoryFenceStore
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

TP0, TP1, TP2 = (TopicPartition("t", p) for p in range(3))
END = 10  # records per partition


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s

    async def wait(self, seconds: float) -> None:
        self.now_s += seconds
        await asyncio.sleep(0)


class Death(BaseException):
    """The process died: nothing of the fence's error handling runs."""


def applied(store: MemoryFenceStore) -> dict[tuple[int, int], int]:
    """Every partition's ``applied<p>`` table, merged."""
    out: dict[tuple[int, int], int] = {}
    for name, rows in store.tables().items():
        if name.startswith("applied"):
            out.update(rows)
    return out


def recs(tp: TopicPartition, offsets: range) -> list[SourceRecord]:
    return [SourceRecord(tp.topic, tp.partition, o, b"k", str(o).encode()) for o in offsets]


def killing(killers: set[tuple[int, int]], rng: random.Random,
            deaths: list[tuple[int, int]]) -> HandlerFn:
    """Applies each record (table ``applied``), yielding to the loop a random number of
    times per record so partitions interleave; a record in ``killers`` kills the process."""
    async def handle(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        applied = conn.table(f"applied{records[0].partition}")
        for r in records:
            for _ in range(rng.randrange(0, 6)):
                await asyncio.sleep(0)
            if (r.partition, r.offset) in killers:
                deaths.append((r.partition, r.offset))
                raise Death
            applied[(r.partition, r.offset)] = applied.get((r.partition, r.offset), 0) + 1
        return [ACCEPT] * len(records)

    return handle


async def run_process(store: MemoryFenceStore, clock: Clock, lifetime: str,
                      handler: HandlerFn, tps: Sequence[TopicPartition], *,
                      decl: Declaration | None = None, max_attempts: int = 2,
                      window: int = END) -> bool:
    """One process: claim ``tps``, submit each partition's records from its durable
    frontier to END concurrently; True when it drained, False when it died."""
    lc = Lifecycle(store=store, lifetime_id=lifetime, clock=clock, wait=clock.wait)
    await lc.assign([SourceCheck(tp, SourceFacts("id", 0, END)) for tp in tps])
    run = FailureRun(lifecycle=lc, handler=handler, declaration=decl or Declaration(),
                     policy=RetryPolicy(max_attempts=max_attempts), rng=random.Random(1),
                     clock=clock, wait=clock.wait, suspect_window=window)

    async def partition(tp: TopicPartition) -> None:
        token = store.token_of(tp)
        assert token is not None
        if token.frontier < END:
            await run.submit(tp, recs(tp, range(token.frontier, END)), links=(),
                             stopped=lambda: False)

    tasks = [asyncio.create_task(partition(tp)) for tp in tps]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    died = any(isinstance(t.exception(), Death) for t in done if not t.cancelled())
    for t in done:
        if not t.cancelled() and t.exception() is not None and not died:
            raise t.exception()  # type: ignore[misc]
    if died:
        for t in pending:
            t.cancel()  # the process is gone: its other batches never finish
        await asyncio.gather(*pending, return_exceptions=True)
        lc.stop()  # no release, no retire row: the next owner sees an unclean end
        return False
    await lc.revoke(list(tps))
    return True


async def drain(store: MemoryFenceStore, handler: HandlerFn, tps: Sequence[TopicPartition], *,
                decl: Declaration | None = None, max_attempts: int = 2,
                owners: int = 20) -> int:
    """Restart processes until one drains; return the number of deaths."""
    clock = Clock()
    for n in range(owners):
        if await run_process(store, clock, f"L{n}", handler, tps, decl=decl,
                             max_attempts=max_attempts):
            return n
    raise AssertionError(f"still crashing after {owners} processes")


@pytest.mark.parametrize("seed", range(12))
async def test_a_death_is_blamed_only_on_the_record_that_was_alone_in_flight(seed: int) -> None:
    """Two killers on different partitions and an innocent third partition, all suspect
    after the first death: only the killers are quarantined, each after --max-attempts
    counted deaths, whatever the interleaving; every other record is applied once."""
    store, deaths = MemoryFenceStore("g"), list[tuple[int, int]]()
    handler = killing({(0, 5), (1, 2)}, random.Random(seed), deaths)
    died = await drain(store, handler, [TP0, TP1, TP2], max_attempts=2)
    quarantined = sorted((q.tp.partition, q.offset) for q in store.quarantine)
    assert quarantined == [(0, 5), (1, 2)], (quarantined, deaths)
    assert all(q.error_type == "ProcessDeath" and "killed the process" in q.reason
               for q in store.quarantine)
    assert applied(store) == {(p, o): 1 for p in range(3) for o in range(END)
                                         if (p, o) not in {(0, 5), (1, 2)}}
    # each killer: --max-attempts deaths attributed to it, plus one unattributed death: the
    # first process ran several records at once (every later one tries suspects alone)
    assert died <= 2 * 2 + 1, deaths
    assert store.attempt_rows == {}


async def test_an_innocent_record_beside_a_killer_is_never_quarantined() -> None:
    """The innocent partition's suspect record is slow (it is in flight whenever the killer
    runs, were they tried at once); it must not collect the killer's deaths."""
    store, deaths = MemoryFenceStore("g"), list[tuple[int, int]]()

    async def handle(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        applied = conn.table(f"applied{records[0].partition}")
        for r in records:
            if r.partition == 1:
                for _ in range(50):  # slow: any concurrent killer dies while this runs
                    await asyncio.sleep(0)
            if (r.partition, r.offset) == (0, 5):
                deaths.append((0, 5))
                raise Death
            applied[(r.partition, r.offset)] = 1
        return [ACCEPT] * len(records)

    await drain(store, handle, [TP0, TP1], max_attempts=2)
    assert sorted((q.tp.partition, q.offset) for q in store.quarantine) == [(0, 5)]
    assert len(deaths) <= 3


def uncertain(external: Counter[tuple[int, int]], killers: set[tuple[int, int]],
              deaths: list[tuple[int, int]]) -> HandlerFn:
    """An ``outcome-uncertain`` handler: one external effect per record (``external``, outside
    the store's transaction, standing for an HTTP call), then its fenced write."""
    async def handle(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        applied = conn.table(f"applied{records[0].partition}")
        for r in records:
            external[(r.partition, r.offset)] += 1
            await asyncio.sleep(0)
            if (r.partition, r.offset) in killers:
                deaths.append((r.partition, r.offset))
                raise Death
            applied[(r.partition, r.offset)] = 1
        return [ACCEPT] * len(records)

    return handle


UNCERTAIN = Declaration(Durability.DURABLE_CRITICAL, Effects.OUTCOME_UNCERTAIN)


async def test_an_outcome_uncertain_batch_in_flight_at_a_death_is_never_run_again() -> None:
    store, external = MemoryFenceStore("g"), Counter[tuple[int, int]]()
    deaths: list[tuple[int, int]] = []
    handler = uncertain(external, {(0, 5), (1, 7)}, deaths)
    await drain(store, handler, [TP0, TP1], decl=UNCERTAIN, max_attempts=3)
    assert max(external.values()) == 1, [k for k, v in external.items() if v > 1]
    done = applied(store)
    quarantine = {(q.tp.partition, q.offset): q for q in store.quarantine}
    # every record applied once or quarantined as outcome unknown, never both
    assert set(done) | set(quarantine) == {(p, o) for p in (0, 1) for o in range(END)}
    assert not set(done) & set(quarantine)
    assert {(0, 5), (1, 7)} <= set(quarantine)
    for q in quarantine.values():
        assert q.error_type == "OutcomeUnknown" and "outcome unknown" in q.reason, q


@pytest.mark.parametrize("outcome", [FaultOutcome.UNKNOWN_ABORTED, FaultOutcome.ABORT])
async def test_store_level_retries_never_rerun_an_outcome_uncertain_handler(
        outcome: FaultOutcome) -> None:
    """A lost COMMIT resolved as not committed (the handler ran) quarantines the batch as
    outcome unknown; a rollback before the handler ran (``abort``) is retried as before."""
    store, clock = MemoryFenceStore("g"), Clock()
    external, deaths = Counter[tuple[int, int]](), list[tuple[int, int]]()
    lc = Lifecycle(store=store, lifetime_id="L1", clock=clock, wait=clock.wait)
    await lc.assign([SourceCheck(TP0, SourceFacts("id", 0, END))])
    run = FailureRun(lifecycle=lc, handler=uncertain(external, set(), deaths),
                     declaration=UNCERTAIN, policy=RetryPolicy(), rng=random.Random(1),
                     clock=clock, wait=clock.wait)
    store.begin_attempt("faulty", [Fault(Operation.PROCESS, 1, outcome)])
    token = await run.submit(TP0, recs(TP0, range(3)), links=(), stopped=lambda: False)
    assert token == Token(1, 3) == store.token_of(TP0)
    assert max(external.values()) == 1
    if outcome is FaultOutcome.ABORT:  # rolled back before the handler: safe to run it
        assert applied(store) == {(0, 0): 1, (0, 1): 1, (0, 2): 1}
        assert store.quarantine == []
    else:
        assert applied(store) == {}
        assert [(q.offset, q.error_type) for q in store.quarantine] == [
            (0, "OutcomeUnknown"), (1, "OutcomeUnknown"), (2, "OutcomeUnknown")]


async def test_outcome_uncertain_declared_to_stop_fail_stops_on_an_unknown_outcome() -> None:
    store, clock = MemoryFenceStore("g"), Clock()
    external, deaths = Counter[tuple[int, int]](), list[tuple[int, int]]()
    handler = uncertain(external, {(0, 1)}, deaths)
    decl = Declaration(Durability.DURABLE_CRITICAL, Effects.OUTCOME_UNCERTAIN, OnFailure.STOP)
    assert not await run_process(store, clock, "L1", handler, [TP0], decl=decl)
    lc = Lifecycle(store=store, lifetime_id="L2", clock=clock, wait=clock.wait)
    await lc.assign([SourceCheck(TP0, SourceFacts("id", 0, END))])
    run = FailureRun(lifecycle=lc, handler=handler, declaration=decl, policy=RetryPolicy(),
                     rng=random.Random(1), clock=clock, wait=clock.wait)
    with pytest.raises(Exception, match="outcome unknown"):
        await run.submit(TP0, recs(TP0, range(END)), links=(), stopped=lambda: False)
    assert external[(0, 0)] == 1 and store.token_of(TP0) == Token(2, 0)
    assert store.quarantine == []


async def test_a_clean_handover_in_the_middle_of_a_suspect_window_stays_suspect() -> None:
    """Revoked (a release row) or retired while its window is open, the partition stays
    suspect for its next owner: its killer is still tried alone, never in a batch."""
    store, clock = MemoryFenceStore("g"), Clock()
    deaths: list[tuple[int, int]] = []
    handler = killing({(0, 5)}, random.Random(0), deaths)
    assert not await run_process(store, clock, "L0", handler, [TP0])  # dies in a batch
    lc = Lifecycle(store=store, lifetime_id="L1", clock=clock, wait=clock.wait)
    await lc.assign([SourceCheck(TP0, SourceFacts("id", 0, END))])
    run = FailureRun(lifecycle=lc, handler=handler, declaration=Declaration(),
                     policy=RetryPolicy(), rng=random.Random(1), clock=clock, wait=clock.wait,
                     suspect_window=END)
    await run.submit(TP0, recs(TP0, range(0, 2)), links=(), stopped=lambda: False)
    await lc.revoke([TP0])  # a rebalance, two records into the window
    assert [j.detail for j in store.journal_rows if j.event == "release"] == [
        "suspect window open"]
    lc = Lifecycle(store=store, lifetime_id="L2", clock=clock, wait=clock.wait)
    await lc.assign([SourceCheck(TP0, SourceFacts("id", 0, END))])
    marks = lc.take_failure_marks(TP0)
    assert marks is not None and marks.suspect
    await lc.revoke([TP0])  # revoked before its first batch: still suspect
    assert [j.detail for j in store.journal_rows if j.event == "release"] == [
        "suspect window open"] * 2
    lc = Lifecycle(store=store, lifetime_id="L3", clock=clock, wait=clock.wait)
    await lc.assign([SourceCheck(TP0, SourceFacts("id", 0, END))])
    marks = lc.take_failure_marks(TP0)
    assert marks is not None and marks.suspect
    lc.stop()
    # a window that ended before the handover leaves a plain release
    store2 = MemoryFenceStore("g")
    assert not await run_process(store2, clock, "M0", handler, [TP0])
    lc = Lifecycle(store=store2, lifetime_id="M1", clock=clock, wait=clock.wait)
    await lc.assign([SourceCheck(TP0, SourceFacts("id", 0, END))])
    run = FailureRun(lifecycle=lc, handler=killing(set(), random.Random(0), deaths),
                     declaration=Declaration(), policy=RetryPolicy(), rng=random.Random(1),
                     clock=clock, wait=clock.wait, suspect_window=2)
    await run.submit(TP0, recs(TP0, range(0, 4)), links=(), stopped=lambda: False)
    await lc.revoke([TP0])
    assert [j.detail for j in store2.journal_rows if j.event == "release"] == [""]


async def test_a_suspect_record_is_tried_with_nothing_else_of_the_process_in_flight() -> None:
    """Three suspect partitions and a healthy one, interleaving at random: whenever a record
    is tried alone (counted first), no other handler call of the process is running."""
    store, clock = MemoryFenceStore("g"), Clock()
    running: list[tuple[int, bool]] = []  # (partition, tried alone) of each call in flight
    overlaps: list[tuple[tuple[int, bool], ...]] = []
    rng = random.Random(3)

    async def handle(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        tp = records[0].tp
        me = (tp.partition, len(records) == 1 and (tp, records[0].offset) in store.attempt_rows)
        if running and (me[1] or any(alone for _p, alone in running)):
            overlaps.append((*running, me))
        running.append(me)
        for _ in range(rng.randrange(1, 5)):
            await asyncio.sleep(0)
        running.remove(me)
        applied = conn.table(f"applied{records[0].partition}")
        for r in records:
            applied[(r.partition, r.offset)] = 1
        return [ACCEPT] * len(records)

    tps = [TP0, TP1, TP2]
    for n in range(3):  # three owners die idle: every partition is suspect for the next
        lc = Lifecycle(store=store, lifetime_id=f"D{n}", clock=clock, wait=clock.wait)
        await lc.assign([SourceCheck(tp, SourceFacts("id", 0, END)) for tp in tps])
        lc.stop()
    assert await run_process(store, clock, "L", handle, tps, max_attempts=3, window=4)
    assert overlaps == []
    assert applied(store) == {(p, o): 1 for p in range(3) for o in range(END)}
