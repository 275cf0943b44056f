"""One contract, two stores: the same cases run against MemoryFenceStore and PgFenceStore."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest

from fencing.errors import (
    Fenced,
    HandlerDeclarationError,
    HandlerFailed,
    RecreatedTopic,
    RetentionGap,
)
from fencing.failures import SUSPECT_OPEN
from fencing.memory.store import MemoryFenceStore, MemoryTx
from fencing.postgres.store import PgFenceStore
from fencing.store import BatchCall, FenceStore, LaneStore
from fencing.types import (
    Accept,
    ClaimRequest,
    Reject,
    SourceCheck,
    SourceFacts,
    SourceRecord,
    Token,
    TopicPartition,
    Verdict,
)
from tests.integration.pg_helpers import create_fence_schema, drop_schema, make_records

TP = TopicPartition("contract", 0)
TP1 = TopicPartition("contract", 1)


@dataclass
class Harness:
    """A store plus readers of its committed effects, quarantine and journal."""

    store: FenceStore
    dsn: str | None = None
    schema: str | None = None

    async def handle(self, conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        verdicts: list[Verdict] = [Reject("bad value") if (r.value or b"").startswith(b"bad")
                                   else Accept() for r in records]
        accepted = [r for r, v in zip(records, verdicts, strict=True) if isinstance(v, Accept)]
        if isinstance(conn, MemoryTx):
            table = conn.table("effects")
            for r in accepted:
                table[(r.topic, r.partition, r.offset)] = r.value
        elif accepted:
            await conn.executemany(
                f'INSERT INTO "{self.schema}".effects VALUES ($1, $2, $3, $4)',
                [(r.topic, r.partition, r.offset, r.value) for r in accepted])
        return verdicts

    async def _pg(self, sql: str) -> list[Any]:
        conn = await asyncpg.connect(self.dsn)
        try:
            return list(await conn.fetch(sql))
        finally:
            await conn.close()

    async def effects(self) -> list[tuple[str, int, int]]:
        if isinstance(self.store, MemoryFenceStore):
            return sorted(self.store.tables().get("effects", {}))
        rows = await self._pg(f'SELECT topic, partition, "offset" FROM "{self.schema}".effects')
        return sorted((r[0], r[1], r[2]) for r in rows)

    async def quarantine(self) -> list[tuple[TopicPartition, int, str, int]]:
        if isinstance(self.store, MemoryFenceStore):
            return sorted((q.tp, q.offset, q.reason, q.epoch) for q in self.store.quarantine)
        rows = await self._pg(f'SELECT topic, partition, "offset", reason, epoch'
                              f' FROM "{self.schema}".quarantine')
        return sorted((TopicPartition(r[0], r[1]), r[2], r[3], r[4]) for r in rows)

    async def reset_by_operator(self, tp: TopicPartition, frontier: int) -> None:
        """What ``fencectl reset frontier`` writes (``ops.commands.reset.apply_reset``)."""
        if isinstance(self.store, MemoryFenceStore):
            self.store.reset_by_operator(tp, frontier=frontier, operator="operator:ann@box")
            return
        conn = await asyncpg.connect(self.dsn)
        try:
            q = f'"{self.schema}"'
            async with conn.transaction():
                epoch = await conn.fetchval(
                    f"UPDATE {q}.partitions SET epoch = epoch + 1, frontier = $4, owner = $5"
                    " WHERE group_id = $1 AND topic = $2 AND partition = $3 RETURNING epoch",
                    self.store.group_id, tp.topic, tp.partition, frontier, "operator:ann@box")
                await conn.execute(
                    f"INSERT INTO {q}.journal (group_id, topic, partition, event, epoch,"
                    " lifetime) VALUES ($1, $2, $3, 'reset', $4, $5)", self.store.group_id,
                    tp.topic, tp.partition, epoch, "operator:ann@box")
        finally:
            await conn.close()

    async def journal(self) -> list[tuple[TopicPartition, str, int | None, str]]:
        if isinstance(self.store, MemoryFenceStore):
            return [(j.tp, j.event, j.epoch, j.lifetime) for j in self.store.journal_rows]
        rows = await self._pg(f'SELECT topic, partition, event, epoch, lifetime'
                              f' FROM "{self.schema}".journal ORDER BY id')
        return [(TopicPartition(r[0], r[1]), r[2], r[3], r[4]) for r in rows]


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.integration)])
async def h(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    group = f"g-{uuid.uuid4().hex[:8]}"
    if request.param == "memory":
        yield Harness(MemoryFenceStore(group_id=group))
        return
    dsn = request.getfixturevalue("pg_dsn")
    schema = await create_fence_schema(dsn)
    store = await PgFenceStore.connect(dsn, group_id=group, schema=schema, pool_max=2)
    try:
        yield Harness(store, dsn, schema)
    finally:
        await store.close()
        await drop_schema(dsn, schema)


async def test_claim_creates_at_epoch_one_then_increments(h: Harness) -> None:
    first = await h.store.claim([ClaimRequest(TP, 5, "id"), ClaimRequest(TP1, 0, "id")],
                                lifetime="A")
    assert first == {TP: Token(1, 5), TP1: Token(1, 0)}
    assert await h.store.claim([ClaimRequest(TP, 50, "id")], lifetime="B") == {TP: Token(2, 5)}
    assert await h.store.observe([TP, TP1, TopicPartition("contract", 7)]) == {
        TP: Token(2, 5), TP1: Token(1, 0), TopicPartition("contract", 7): None}
    assert sorted(await h.journal(), key=lambda j: (j[2], j[0])) == [
        (TP, "claim", 1, "A"), (TP1, "claim", 1, "A"), (TP, "claim", 2, "B")]


async def test_process_applies_quarantines_and_advances_past_gaps(h: Harness) -> None:
    token = (await h.store.claim([ClaimRequest(TP, 3)], lifetime="A"))[TP]
    t1 = await h.store.process(BatchCall(TP, make_records(TP, [3, 4, 7], bad=[4]), h.handle), token)
    assert t1 == Token(1, 8)
    t2 = await h.store.process(BatchCall(TP, make_records(TP, [9]), h.handle), t1)
    assert t2 == Token(1, 10)
    assert await h.store.observe([TP]) == {TP: Token(1, 10)}
    assert await h.effects() == [("contract", 0, 3), ("contract", 0, 7), ("contract", 0, 9)]
    assert await h.quarantine() == [(TP, 4, "bad value", 1)]


@pytest.mark.parametrize("token", [Token(1, 0), Token(2, 1), Token(3, 0)])
async def test_stale_token_is_fenced_and_applies_nothing(h: Harness, token: Token) -> None:
    await h.store.claim([ClaimRequest(TP, 0)], lifetime="A")
    await h.store.claim([ClaimRequest(TP, 0)], lifetime="B")  # epoch 2, frontier 0
    with pytest.raises(Fenced):
        await h.store.process(BatchCall(TP, make_records(TP, range(token.frontier, 4), bad=[3]),
                                        h.handle), token)
    assert await h.effects() == [] and await h.quarantine() == []
    assert await h.store.observe([TP]) == {TP: Token(2, 0)}


async def test_process_on_missing_row_is_fenced(h: Harness) -> None:
    with pytest.raises(Fenced):
        await h.store.process(BatchCall(TP, make_records(TP, [0]), h.handle), Token(1, 0))
    assert await h.store.observe([TP]) == {TP: None}


@pytest.mark.parametrize("offsets", [[], [2, 1], [1, 1], [0], [0, 1]],
                         ids=["empty", "out-of-order", "duplicate", "below-frontier",
                              "starts-below-frontier"])
async def test_bad_batches_are_refused(h: Harness, offsets: list[int]) -> None:
    token = (await h.store.claim([ClaimRequest(TP, 1)], lifetime="A"))[TP]  # frontier 1
    with pytest.raises(ValueError):
        await h.store.process(BatchCall(TP, make_records(TP, offsets), h.handle), token)
    assert await h.store.observe([TP]) == {TP: Token(1, 1)}


async def test_skip_moves_frontier_under_token_and_journals(h: Harness) -> None:
    token = (await h.store.claim([ClaimRequest(TP, 2)], lifetime="A"))[TP]
    assert await h.store.skip(TP, token, to_offset=9, reason="gap") == Token(1, 9)
    with pytest.raises(Fenced):
        await h.store.skip(TP, token, to_offset=12, reason="stale")
    assert [(j[1], j[2]) for j in await h.journal()] == [("claim", 1), ("gap-skip", 1)]
    assert await h.store.observe([TP]) == {TP: Token(1, 9)}


async def test_journal_appends_and_refuses_unknown_events(h: Harness) -> None:
    await h.store.journal([TP, TP1], lifetime="A", event="retire", epoch=3, detail="x")
    with pytest.raises(ValueError):
        await h.store.journal([TP], lifetime="A", event="nope")
    assert await h.journal() == [(TP, "retire", 3, "A"), (TP1, "retire", 3, "A")]


async def test_validate(h: Harness) -> None:
    await h.store.claim([ClaimRequest(TP, 5, "id-1")], lifetime="A")
    res = await h.store.validate([SourceCheck(TP, SourceFacts("id-1", 2, 9)),
                                  SourceCheck(TP1, SourceFacts("id-1", 4, 9))])
    assert res[TP].ok and res[TP].durable == Token(1, 5)
    assert res[TP1].ok and res[TP1].durable is None and res[TP1].gap_skipped_to is None
    res = await h.store.validate([SourceCheck(TP, SourceFacts("id-2", 0, 9))])
    assert isinstance(res[TP].refusal, RecreatedTopic) and not res[TP].ok
    res = await h.store.validate([SourceCheck(TP, SourceFacts(None, 0, 9))])
    assert res[TP].ok  # identity unknown to Kafka: nothing to compare
    res = await h.store.validate([SourceCheck(TP, SourceFacts("id-1", 6, 9))])
    assert isinstance(res[TP].refusal, RetentionGap)
    res = await h.store.validate([SourceCheck(TP, SourceFacts("id-1", 6, 9),
                                              allow_retention_gap=True)])
    assert res[TP].ok and res[TP].gap_skipped_to == 6
    assert await h.store.observe([TP]) == {TP: Token(1, 5)}  # validate is read-only


async def test_claim_waits_for_in_flight_process_then_sees_its_frontier(h: Harness) -> None:
    token = (await h.store.claim([ClaimRequest(TP, 0)], lifetime="A"))[TP]
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        verdicts = await h.handle(conn, records)
        entered.set()
        await release.wait()
        return verdicts

    proc = asyncio.ensure_future(h.store.process(BatchCall(TP, make_records(TP, range(4)), slow),
                                                 token))
    await entered.wait()
    claim = asyncio.ensure_future(h.store.claim([ClaimRequest(TP, 0)], lifetime="B"))
    for _ in range(20):  # give the claim every chance to overtake the held row lock
        await asyncio.sleep(0.01)
    assert not claim.done()
    release.set()
    assert await proc == Token(1, 4)
    assert (await claim)[TP] == Token(2, 4)
    assert len(await h.effects()) == 4


@pytest.mark.parametrize("failure", ["raises", "wrong-count"])
async def test_handler_failure_rolls_back_everything(h: Harness, failure: str) -> None:
    token = (await h.store.claim([ClaimRequest(TP, 0)], lifetime="A"))[TP]

    async def broken(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        verdicts = await h.handle(conn, records)  # effects and a reject are written first
        if failure == "raises":
            raise RuntimeError("handler bug")
        return verdicts[:-1]

    # a raise is the handler's failure, typed for the failure handling (poison: not a
    # transient class), with the exception's type and message; misuse stays misuse
    expected = HandlerFailed if failure == "raises" else HandlerDeclarationError
    with pytest.raises(expected) as raised:
        await h.store.process(BatchCall(TP, make_records(TP, range(3), bad=[0]), broken), token)
    if failure == "raises":
        assert isinstance(raised.value, HandlerFailed) and not raised.value.transient
        assert (raised.value.error_type, raised.value.error_message) == (
            "RuntimeError", "handler bug")
    assert await h.effects() == [] and await h.quarantine() == []
    assert await h.store.observe([TP]) == {TP: Token(1, 0)}
    assert await h.store.process(BatchCall(TP, make_records(TP, range(3)), h.handle),
                                 token) == Token(1, 3)


async def test_operator_reset_is_told_from_another_members_claim(h: Harness) -> None:
    """``ResetStore``: only operators above the asker's epoch -> True; a member's claim
    above it (even under a later reset) -> False; the heartbeat names operator-owned rows."""
    store: Any = h.store
    await store.claim([ClaimRequest(TP, 0), ClaimRequest(TP1, 0)], lifetime="A")  # epoch 1
    assert not await store.operator_reset(TP, epoch=1)  # still A's
    beat = {"member_id": None, "host": "h", "pid": 1, "state": "running"}
    assert await store.heartbeat(lifetime="A", **beat) == frozenset()
    await h.reset_by_operator(TP, 0)  # epoch 2
    await h.reset_by_operator(TP, 0)  # epoch 3: two resets in a row
    assert await store.operator_reset(TP, epoch=1)
    assert await store.heartbeat(lifetime="A", **beat) == frozenset({TP})
    await store.claim([ClaimRequest(TP1, 0)], lifetime="B")  # epoch 2 of TP1: B's
    await h.reset_by_operator(TP1, 0)  # epoch 3 of TP1
    assert not await store.operator_reset(TP1, epoch=1)  # A was fenced by B first
    assert await store.operator_reset(TP1, epoch=2)  # B was fenced by the operator
    await store.claim([ClaimRequest(TP, 0)], lifetime="A")  # A claims again: epoch 4
    assert not await store.operator_reset(TP, epoch=4)
    assert await store.heartbeat(lifetime="A", **beat) == frozenset({TP1})
    assert not await store.operator_reset(TopicPartition("contract", 9), epoch=0)


async def test_attempts_alone_count_deaths_and_a_scheduled_retry_is_not_counted_twice(
        h: Harness) -> None:
    store: Any = h.store
    t1 = (await store.claim([ClaimRequest(TP, 0)], lifetime="A"))[TP]
    got = await store.record_attempt(TP, t1, offset=0, max_attempts=3, error=None,
                                     next_retry_in_s=None, alone=True)
    assert (got.count, got.alone) == (1, 1)
    # a transient failure schedules a retry (counted before it runs) ...
    got = await store.record_attempt(TP, t1, offset=0, max_attempts=5, error="E: busy",
                                     next_retry_in_s=1.0, at_least=2)
    assert (got.count, got.alone, got.last_error) == (2, 1, "E: busy")
    # ... the process dies while backing off; the next owner's attempt alone is that retry
    t2 = (await store.claim([ClaimRequest(TP, 0)], lifetime="B"))[TP]
    marks = (await store.attempts({TP: t2}))[TP]
    assert (marks.unclean, marks.count, marks.alone, marks.uncertain_to) == (True, 2, 1, None)
    got = await store.record_attempt(TP, t2, offset=0, max_attempts=3, error=None,
                                     next_retry_in_s=None, alone=True)
    assert (got.count, got.alone) == (2, 2)
    got = await store.record_attempt(TP, t2, offset=0, max_attempts=3, error=None,
                                     next_retry_in_s=None, alone=True)
    assert (got.count, got.alone) == (3, 3)  # nothing scheduled any more: a new attempt
    with pytest.raises(Fenced):
        await store.record_attempt(TP, t1, offset=0, max_attempts=3, error=None,
                                   next_retry_in_s=None, alone=True)


async def test_an_intent_is_fenced_and_read_back_only_while_it_starts_at_the_frontier(
        h: Harness) -> None:
    store: Any = h.store
    t1 = (await store.claim([ClaimRequest(TP, 0)], lifetime="A"))[TP]
    await store.record_intent(TP, t1, last_offset=2)
    t2 = (await store.claim([ClaimRequest(TP, 0)], lifetime="B"))[TP]  # A died
    assert (await store.attempts({TP: t2}))[TP].uncertain_to == 2
    with pytest.raises(Fenced):
        await store.record_intent(TP, t1, last_offset=5)
    with pytest.raises(ValueError):
        await store.record_intent(TP, Token(t2.epoch, 3), last_offset=2)
    # B settles them (the frontier moves past): the intent no longer counts
    t2 = await store.process(BatchCall(TP, make_records(TP, range(3)), h.handle), t2)
    assert (await store.attempts({TP: t2}))[TP].uncertain_to is None
    await store.record_intent(TP, t2, last_offset=4)
    t2 = await store.process(BatchCall(TP, make_records(TP, range(3, 5)), h.handle),
                             t2)  # committed
    t3 = (await store.claim([ClaimRequest(TP, 0)], lifetime="C"))[TP]
    assert t3.frontier == 5 and (await store.attempts({TP: t3}))[TP].uncertain_to is None


@pytest.mark.parametrize("detail, unclean", [("", False), (SUSPECT_OPEN, True),
                                             (f"{SUSPECT_OPEN}; Fenced: moved", True)])
async def test_a_release_with_an_open_suspect_window_leaves_the_next_owner_suspicious(
        h: Harness, detail: str, unclean: bool) -> None:
    store: Any = h.store
    t1 = (await store.claim([ClaimRequest(TP, 0)], lifetime="A"))[TP]
    await store.journal([TP], lifetime="A", event="release", epoch=t1.epoch, detail=detail)
    t2 = (await store.claim([ClaimRequest(TP, 0)], lifetime="B"))[TP]
    assert (await store.attempts({TP: t2}))[TP].unclean is unclean


async def test_an_attempt_alone_by_a_lifetime_that_ended_cleanly_is_no_death(
        h: Harness) -> None:
    """A flaky suspect record whose owner is revoked while it backs off: the next owner's
    attempt alone replaces that one (no death, no attempt spent); after a real death it
    adds up."""
    store: Any = h.store
    t1 = (await store.claim([ClaimRequest(TP, 0)], lifetime="A"))[TP]
    got = await store.record_attempt(TP, t1, offset=0, max_attempts=3, error=None,
                                     next_retry_in_s=None, alone=True)
    assert (got.count, got.alone) == (1, 1)
    await store.journal([TP], lifetime="A", event="release", epoch=t1.epoch,
                        detail=SUSPECT_OPEN)  # revoked cleanly, mid-window
    t2 = (await store.claim([ClaimRequest(TP, 0)], lifetime="B"))[TP]
    got = await store.record_attempt(TP, t2, offset=0, max_attempts=3, error=None,
                                     next_retry_in_s=None, alone=True)
    assert (got.count, got.alone) == (1, 1)
    await store.journal([TP], lifetime="B", event="retire", epoch=t2.epoch,
                        detail="OutcomeUnknown: lost reply")  # retired cleanly, mid-window
    t3 = (await store.claim([ClaimRequest(TP, 0)], lifetime="C"))[TP]
    got = await store.record_attempt(TP, t3, offset=0, max_attempts=3, error=None,
                                     next_retry_in_s=None, alone=True)
    assert (got.count, got.alone) == (1, 1)
    t4 = (await store.claim([ClaimRequest(TP, 0)], lifetime="D"))[TP]  # C died
    got = await store.record_attempt(TP, t4, offset=0, max_attempts=3, error=None,
                                     next_retry_in_s=None, alone=True)
    assert (got.count, got.alone) == (2, 2)
    # a retry count by the same owner keeps the attempt alone where it is
    got = await store.record_attempt(TP, t4, offset=0, max_attempts=5, error="E",
                                     next_retry_in_s=1.0, at_least=3)
    assert (got.count, got.alone) == (3, 2)


def lane_records(tp: TopicPartition, offsets: Sequence[int],
                 bad: Sequence[int] = ()) -> list[SourceRecord]:
    return make_records(tp, offsets, bad=bad)


async def test_lanes_commit_their_spans_and_the_frontier_follows_the_prefix(h: Harness) -> None:
    assert isinstance(h.store, LaneStore)
    token = (await h.store.claim([ClaimRequest(TP, 10)], lifetime="A"))[TP]
    # partition offsets 10, 11, 13 (12 is a gap of Kafka's), 14; lane A has 10 and 13
    await h.store.process_lane(BatchCall(TP, lane_records(TP, [11, 14], bad=[14]), h.handle),
                               token, [(11, 11), (14, 14)])
    got = (await h.store.completions([TP]))[TP]
    assert got is not None and (got.base, got.spans, got.epoch) == (10, ((11, 11), (14, 14)), 1)
    assert got.frontier == 10 and not got.done(10) and got.done(11)
    await h.store.process_lane(BatchCall(TP, lane_records(TP, [10, 13]), h.handle), token,
                               [(10, 10), (12, 13)])
    got = (await h.store.completions([TP]))[TP]
    assert got is not None and got.frontier == 15 and got.spans == ((10, 14),)
    assert await h.store.observe([TP]) == {TP: Token(1, 10)}  # the row moves only by a fold
    assert await h.effects() == [("contract", 0, 10), ("contract", 0, 11), ("contract", 0, 13)]
    assert await h.quarantine() == [(TP, 14, "bad value", 1)]
    assert (await h.store.completions([TP1])) == {TP1: None}


async def test_a_lane_of_a_stale_epoch_applies_nothing(h: Harness) -> None:
    assert isinstance(h.store, LaneStore)
    token = (await h.store.claim([ClaimRequest(TP, 0)], lifetime="A"))[TP]
    await h.store.claim([ClaimRequest(TP, 0)], lifetime="B")
    with pytest.raises(Fenced):
        await h.store.process_lane(BatchCall(TP, lane_records(TP, [0, 2]), h.handle), token,
                                   [(0, 0), (2, 2)])
    got = (await h.store.completions([TP]))[TP]
    assert got is not None and got.spans == () and got.epoch == 2
    assert await h.effects() == []


async def test_lanes_run_side_by_side_and_a_claim_waits_for_them(h: Harness) -> None:
    assert isinstance(h.store, LaneStore)
    token = (await h.store.claim([ClaimRequest(TP, 0)], lifetime="A"))[TP]
    entered, release = asyncio.Event(), asyncio.Event()

    async def held(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        entered.set()
        await release.wait()
        return await h.handle(conn, records)

    slow = asyncio.create_task(h.store.process_lane(
        BatchCall(TP, lane_records(TP, [0]), held), token, [(0, 0)]))
    await asyncio.wait_for(entered.wait(), 10)
    # another lane of the same partition commits while the first one is in flight
    await asyncio.wait_for(h.store.process_lane(
        BatchCall(TP, lane_records(TP, [1]), h.handle), token, [(1, 1)]), 10)
    claim = asyncio.create_task(h.store.claim([ClaimRequest(TP, 0)], lifetime="B"))
    await asyncio.sleep(0.3)
    assert not claim.done()  # the claim waits for the lane in flight
    release.set()
    await asyncio.wait_for(slow, 10)
    assert (await asyncio.wait_for(claim, 10))[TP] == Token(2, 0)
    got = (await h.store.completions([TP]))[TP]
    assert got is not None and got.frontier == 2 and got.epoch == 2  # the successor sees both
    with pytest.raises(Fenced):  # and the first lifetime's lanes are fenced from now on
        await h.store.process_lane(BatchCall(TP, lane_records(TP, [2]), h.handle), token,
                                   [(2, 2)])


async def test_fold_moves_the_frontier_and_drops_the_spans_below(h: Harness) -> None:
    assert isinstance(h.store, LaneStore)
    token = (await h.store.claim([ClaimRequest(TP, 0)], lifetime="A"))[TP]
    for offsets in ([0, 1], [2], [5]):
        await h.store.process_lane(BatchCall(TP, lane_records(TP, offsets), h.handle), token,
                                   [(o, o) for o in offsets])
    got = (await h.store.completions([TP]))[TP]
    assert got is not None and got.frontier == 3
    folded = await h.store.fold(TP, token, to_frontier=got.frontier)
    assert folded == Token(1, 3)
    after = (await h.store.completions([TP]))[TP]
    assert after is not None and (after.base, after.spans) == (3, ((5, 5),))
    with pytest.raises(Fenced):
        await h.store.fold(TP, token, to_frontier=6)  # the frontier moved: a stale token
    with pytest.raises(ValueError):
        await h.store.fold(TP, folded, to_frontier=2)


@pytest.mark.parametrize(("offsets", "spans"), [
    ([], []), ([3, 2], [(3, 3), (2, 2)]), ([4], [(3, 5)]), ([4], [(5, 4)]), ([0], [(0, 0)]),
    ([2, 4], [(2, 2)]),
], ids=["empty", "out-of-order", "span-past-record", "reversed", "below-frontier",
        "one-span-short"])
async def test_bad_lane_batches_are_refused(h: Harness, offsets: list[int],
                                            spans: list[tuple[int, int]]) -> None:
    assert isinstance(h.store, LaneStore)
    token = (await h.store.claim([ClaimRequest(TP, 1)], lifetime="A"))[TP]
    with pytest.raises(ValueError):
        await h.store.process_lane(BatchCall(TP, lane_records(TP, offsets), h.handle), token,
                                   spans)
    assert await h.effects() == []
