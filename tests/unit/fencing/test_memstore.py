"""MemoryFenceStore: contract semantics, copy-on-write transactions, fault hooks."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from fencing.errors import (
    Fenced,
    HandlerDeclarationError,
    HandlerFailed,
    NotCommitted,
    OutcomeUnknown,
    ReadFailed,
    RecreatedTopic,
    RetentionGap,
)
from fencing.memory.faults import Fault, FaultOutcome, Interleave, InterleavePoint, Operation
from fencing.memory.store import MemoryFenceStore
from fencing.store import BatchCall
from fencing.types import (
    ACCEPT,
    ClaimRequest,
    Reject,
    SourceCheck,
    SourceFacts,
    SourceRecord,
    Token,
    TopicPartition,
    Verdict,
)

TP = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


def recs(*offsets: int, bad: Sequence[int] = ()) -> list[SourceRecord]:
    return [SourceRecord("t", 0, o, b"k", b"bad" if o in bad else b"ok") for o in offsets]


async def handler(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
    table = conn.table("effects")
    out: list[Verdict] = []
    for r in records:
        if r.value == b"bad":
            out.append(Reject("bad value"))
        else:
            table[r.offset] = r.value
            out.append(ACCEPT)
    return out


async def claimed(store: MemoryFenceStore, tp: TopicPartition = TP, frontier: int = 0) -> Token:
    return (await store.claim([ClaimRequest(tp, frontier, "id")], lifetime="L"))[tp]


def snapshot(store: MemoryFenceStore) -> tuple[Any, ...]:
    return (store.tables(), list(store.quarantine), dict(store.rows), len(store.writes))


async def test_epochs_start_at_zero_and_each_claim_adds_one() -> None:
    store = MemoryFenceStore("g")
    assert await store.observe([TP]) == {TP: None}
    assert await claimed(store, frontier=7) == Token(1, 7)
    assert await claimed(store, frontier=99) == Token(2, 7)  # initial frontier only when new
    assert [(j.event, j.epoch, j.lifetime) for j in store.journal_rows] == [
        ("claim", 1, "L"), ("claim", 2, "L")]
    both = await store.claim([ClaimRequest(TP, 0), ClaimRequest(TP1, 3)], lifetime="M")
    assert both == {TP: Token(3, 7), TP1: Token(1, 3)}
    assert store.rows[TP].owner == "M"


async def test_process_commits_effects_quarantine_and_frontier_together() -> None:
    store = MemoryFenceStore("g")
    token = await claimed(store)
    new = await store.process(BatchCall(TP, recs(0, 1, 4, bad=[1]), handler), token)
    assert new == Token(1, 5) == store.token_of(TP)  # visible offset 4 -> frontier 5
    assert store.tables() == {"effects": {0: b"ok", 4: b"ok"}}
    assert [(q.offset, q.reason, q.epoch) for q in store.quarantine] == [(1, "bad value", 1)]


@pytest.mark.parametrize("stale", [Token(0, 0), Token(1, 3)])
async def test_stale_epoch_or_frontier_is_fenced_and_applies_nothing(stale: Token) -> None:
    store = MemoryFenceStore("g")
    await claimed(store)
    before = snapshot(store)
    with pytest.raises(Fenced):
        await store.process(BatchCall(TP, recs(3, 4, bad=[4]), handler), stale)
    assert snapshot(store) == before
    assert store.events[-1].observed == "fenced" and not store.events[-1].applied


async def test_handler_writes_are_invisible_unless_the_transaction_commits() -> None:
    store = MemoryFenceStore("g")
    token = await claimed(store)

    async def boom(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
        conn.table("effects")[0] = b"written"
        raise RuntimeError("handler bug")

    async def short(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
        conn.table("effects")[0] = b"written"
        return []

    with pytest.raises(HandlerFailed) as info:  # the store's contract: typed, rolled back
        await store.process(BatchCall(TP, recs(0), boom), token)
    assert isinstance(info.value.__cause__, RuntimeError) and not info.value.transient
    with pytest.raises(HandlerDeclarationError):
        await store.process(BatchCall(TP, recs(0), short), token)
    assert store.tables() == {} and store.token_of(TP) == token


async def test_reads_abort_as_read_failed() -> None:
    store = MemoryFenceStore("g")
    store.begin_attempt("a", [Fault(Operation.OBSERVE, 1, FaultOutcome.ABORT),
                              Fault(Operation.VALIDATE, 2, FaultOutcome.ABORT)])
    with pytest.raises(ReadFailed):
        await store.observe([TP])
    assert await store.observe([TP]) == {TP: None}  # call 2 is not selected
    check = SourceCheck(TP, SourceFacts("id", 0, 5))
    assert (await store.validate([check]))[TP].ok
    with pytest.raises(ReadFailed):
        await store.validate([check])


@pytest.mark.parametrize(("outcome", "error", "applied"), [
    (FaultOutcome.COMMIT, None, True),
    (FaultOutcome.ABORT, NotCommitted, False),
    (FaultOutcome.UNKNOWN_COMMITTED, OutcomeUnknown, True),
    (FaultOutcome.UNKNOWN_ABORTED, OutcomeUnknown, False),
])
async def test_process_outcomes(outcome: FaultOutcome, error: Any, applied: bool) -> None:
    store = MemoryFenceStore("g")
    token = await claimed(store)
    store.begin_attempt("p", [Fault(Operation.PROCESS, 1, outcome)])
    if error is None:
        await store.process(BatchCall(TP, recs(0, 1, bad=[1]), handler), token)
    else:
        with pytest.raises(error):
            await store.process(BatchCall(TP, recs(0, 1, bad=[1]), handler), token)
    assert store.token_of(TP) == (Token(1, 2) if applied else token)
    assert len(store.quarantine) == (1 if applied else 0)  # atomic with the frontier
    assert store.tables() == ({"effects": {0: b"ok"}} if applied else {})
    ev = store.events[-1]
    assert (ev.attempt, ev.operation, ev.call, ev.requested, ev.applied) == (
        "p", "process", 1, outcome.value, applied)


@pytest.mark.parametrize(("outcome", "error", "epoch"), [
    (FaultOutcome.ABORT, NotCommitted, 0),
    (FaultOutcome.UNKNOWN_COMMITTED, OutcomeUnknown, 1),
    (FaultOutcome.UNKNOWN_ABORTED, OutcomeUnknown, 0),
])
async def test_claim_outcomes(outcome: FaultOutcome, error: Any, epoch: int) -> None:
    store = MemoryFenceStore("g")
    store.begin_attempt("c", [Fault(Operation.CLAIM, 1, outcome)])
    with pytest.raises(error):
        await claimed(store)
    token = store.token_of(TP)
    assert (token.epoch if token else 0) == epoch
    assert await claimed(store) == Token(epoch + 1, 0)  # call 2: not selected


async def test_call_numbers_restart_per_attempt_and_nested_attempts_restore() -> None:
    store = MemoryFenceStore("g")
    faults = [Fault(Operation.CLAIM, 2, FaultOutcome.ABORT)]
    store.begin_attempt("a", faults)
    await claimed(store)
    with store.attempt("nested"):
        await claimed(store)  # nested attempt: its own call 1, no faults
    with pytest.raises(NotCommitted):
        await claimed(store)  # the outer attempt's call 2
    store.begin_attempt("b", faults)
    await claimed(store)  # call 1 again
    assert [(e.attempt, e.call, e.observed) for e in store.events] == [
        ("a", 1, "ok"), ("nested", 1, "ok"), ("a", 2, "not-committed"), ("b", 1, "ok")]


async def test_a_fault_never_overrides_the_storage_fence() -> None:
    store = MemoryFenceStore("g")
    await claimed(store)
    store.begin_attempt("z", [Fault(Operation.PROCESS, 1, FaultOutcome.UNKNOWN_COMMITTED)])
    with pytest.raises(Fenced):
        await store.process(BatchCall(TP, recs(0), handler), Token(0, 0))
    ev = store.events[-1]
    assert (ev.requested, ev.applied, ev.observed) == ("unknown-committed", False, "fenced")


async def test_delay_is_logical_through_the_injected_wait() -> None:
    now = [0.0]

    async def wait(seconds: float) -> None:
        now[0] += seconds

    store = MemoryFenceStore("g", clock=lambda: now[0], wait=wait)
    store.begin_attempt("d", [Fault(Operation.CLAIM, 1, delay_ms=250)])
    await claimed(store)
    assert now[0] == 0.25 and store.events[-1].at_s == 0.25 and store.events[-1].delay_ms == 250


@pytest.mark.parametrize(("at", "applied"), [("before", False), ("after", True)])
async def test_cancellation_at_an_interleave_point(at: str, applied: bool) -> None:
    store = MemoryFenceStore("g")
    token = await claimed(store)
    points: list[tuple[str, str]] = []
    fault = Fault(Operation.PROCESS, 1, FaultOutcome.COMMIT, interleave=Interleave(at, stop=True))
    store.begin_attempt("i", [fault])

    async def hook(point: InterleavePoint) -> None:
        points.append((point.operation.value, point.at))
        if point.fault is not None and point.at == at:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()

    store.interleave_hook = hook
    task = asyncio.ensure_future(store.process(BatchCall(TP, recs(0), handler), token))
    with pytest.raises(asyncio.CancelledError):
        await task
    assert points[-1] == ("process", at)
    ev = store.events[-1]
    assert (ev.requested, ev.applied, ev.observed) == ("commit", applied, "cancelled")
    assert store.token_of(TP) == (Token(1, 1) if applied else token)


async def test_process_holds_the_row_lock_so_a_claim_waits_for_commit() -> None:
    store = MemoryFenceStore("g")
    token = await claimed(store)
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
        entered.set()
        await release.wait()
        return [ACCEPT] * len(records)

    proc = asyncio.ensure_future(store.process(BatchCall(TP, recs(0, 1), slow), token))
    await entered.wait()
    claim = asyncio.ensure_future(claimed(store))
    await asyncio.sleep(0)
    assert not claim.done()
    release.set()
    assert await proc == Token(1, 2)
    assert await claim == Token(2, 2)  # the claim reads the advanced frontier


async def test_validate_refusals_and_gap_skip() -> None:
    store = MemoryFenceStore("g")
    token = await claimed(store, frontier=2)
    same = SourceCheck(TP, SourceFacts("id", 0, 9))
    assert (await store.validate([same]))[TP].durable == token
    recreated = (await store.validate([SourceCheck(TP, SourceFacts("other", 0, 9))]))[TP]
    assert isinstance(recreated.refusal, RecreatedTopic)
    gap = (await store.validate([SourceCheck(TP, SourceFacts("id", 5, 9))]))[TP]
    assert isinstance(gap.refusal, RetentionGap)
    allowed = (await store.validate([SourceCheck(TP, SourceFacts("id", 5, 9), True)]))[TP]
    assert allowed.ok and allowed.gap_skipped_to == 5
    assert await store.skip(TP, token, to_offset=5, reason="retention-gap") == Token(1, 5)
    assert store.journal_rows[-1].event == "gap-skip"
    assert store.journal_rows[-1].detail == "retention-gap: 2..5"


def test_fault_choices_are_validated() -> None:
    with pytest.raises(ValueError, match="only for claim, process, skip, heartbeat and attempt"):
        Fault(Operation.OBSERVE, 1, FaultOutcome.UNKNOWN_ABORTED)
    with pytest.raises(ValueError, match="only for claim, process, skip, heartbeat and attempt"):
        Fault(Operation.JOURNAL, 1, FaultOutcome.UNKNOWN_COMMITTED)
    with pytest.raises(ValueError, match="interleave is only"):
        Fault(Operation.SKIP, 1, interleave=Interleave("after", stop=True))
    with pytest.raises(ValueError, match="interleave is only"):
        Fault(Operation.HEARTBEAT, 1, interleave=Interleave("before", stop=True))
    # a read has a point before it, none after (stop in flight of validate and seek)
    Fault(Operation.VALIDATE, 1, interleave=Interleave("before", stop=True))
    with pytest.raises(ValueError, match="'after' is only for claim and process"):
        Fault(Operation.OBSERVE, 1, interleave=Interleave("after", stop=True))
    with pytest.raises(ValueError):
        Fault(Operation.CLAIM, 0)
    with pytest.raises(ValueError):
        Interleave("during", stop=True)
    with pytest.raises(ValueError):
        Interleave("after")


async def test_journal_rejects_unknown_events_and_logs_writes() -> None:
    store = MemoryFenceStore("g")
    await store.journal([TP], lifetime="L", event="release", epoch=3)
    assert [(w.kind, w.lifetime, w.epoch) for w in store.writes] == [("journal", "L", 3)]
    with pytest.raises(ValueError):
        await store.journal([TP], lifetime="L", event="nonsense")


async def test_heartbeat_upserts_the_member_row() -> None:
    now = [1.0]
    store = MemoryFenceStore("g", clock=lambda: now[0])
    await store.heartbeat(lifetime="L", member_id=None, host="h", pid=7, state="live")
    now[0] = 2.5
    await store.heartbeat(lifetime="L", member_id="m", host="h", pid=7, state="stopped",
                          detail={"reason": "sigterm"})
    row = store.members["L"]
    assert (row.member_id, row.state, row.detail, row.last_seen_s) == (
        "m", "stopped", {"reason": "sigterm"}, 2.5)
    assert store.writes == []  # status only: not a fenced write
