"""Guarded operations: the three-call policy plus resolution, over a scripted fake store."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from fencing.errors import (
    EffectUncertain,
    Fenced,
    NotCommitted,
    OutcomeUnknown,
    ReadFailed,
    Retired,
    Unresolved,
)
from fencing.guarded import CallHooks, guarded_claim, guarded_observe, guarded_process
from fencing.store import BatchCall
from fencing.types import ClaimRequest, SourceRecord, Token, TopicPartition

TP = TopicPartition("t", 0)
RECORDS = [SourceRecord("t", 0, o, None, b"v") for o in (10, 11, 14)]  # batch end 15


async def _unused(conn: Any, records: Sequence[SourceRecord]) -> list[Any]:
    raise AssertionError("the fake store never runs the handler")
TOKEN = Token(3, 10)


class FakeStore:
    """Replies scripted per operation: an exception to raise or a value to return."""

    group_id = "g"

    def __init__(self, **script: list[Any]) -> None:
        self.script = {k: list(v) for k, v in script.items()}
        self.calls: list[str] = []
        self.settled: list[bool] = []

    async def _next(self, op: str) -> Any:
        self.calls.append(op)
        reply = self.script[op].pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    async def observe(self, tps: Sequence[TopicPartition], *,
                      settled: bool = False) -> Mapping[TopicPartition, Any]:
        self.settled.append(settled)
        return {TP: await self._next("observe")}

    async def process(self, call: BatchCall, token: Token) -> Token:
        return await self._next("process")  # type: ignore[no-any-return,unused-ignore]

    async def claim(self, claims: Sequence[ClaimRequest], *,
                    lifetime: str) -> Mapping[TopicPartition, Token]:
        return {TP: await self._next("claim")}


class Rec:
    def __init__(self) -> None:
        self.waits: list[float] = []
        self.resolved: list[tuple[str, str]] = []
        self.live_checks = 0
        self.stop_after_checks: int | None = None

    async def wait(self, seconds: float) -> None:
        self.waits.append(seconds)

    def check_live(self) -> None:
        self.live_checks += 1
        if self.stop_after_checks is not None and self.live_checks > self.stop_after_checks:
            raise Retired("stopped")

    def on_resolve(self, op: str, outcome: str) -> None:
        self.resolved.append((op, outcome))


async def _process(store: FakeStore, rec: Rec) -> Token:
    return await guarded_process(store, BatchCall(TP, RECORDS, _unused),  # type: ignore[arg-type]
                                 TOKEN, wait=rec.wait, check_live=rec.check_live,
                                 hooks=CallHooks(on_resolve=rec.on_resolve))


async def test_process_commits_first_call() -> None:
    store, rec = FakeStore(process=[Token(3, 15)]), Rec()
    assert await _process(store, rec) == Token(3, 15)
    assert store.calls == ["process"] and rec.waits == []


async def test_process_unknown_resolved_committed_no_second_call() -> None:
    store, rec = FakeStore(process=[OutcomeUnknown("lost")], observe=[Token(3, 15)]), Rec()
    assert await _process(store, rec) == Token(3, 15)
    assert store.calls == ["process", "observe"]
    assert rec.resolved == [("process", "committed")] and rec.waits == []
    assert store.settled == [True]  # the re-read waits for a COMMIT still in progress


async def test_process_unknown_resolved_not_committed_retries_same_batch() -> None:
    store = FakeStore(process=[OutcomeUnknown("lost"), Token(3, 15)], observe=[Token(3, 10)])
    rec = Rec()
    assert await _process(store, rec) == Token(3, 15)
    assert store.calls == ["process", "observe", "process"] and rec.waits == [0.1]
    assert rec.resolved == [("process", "not-committed")]


@pytest.mark.parametrize("observed", [Token(4, 10), Token(3, 12), None])
async def test_process_unknown_resolved_fenced(observed: Token | None) -> None:
    store, rec = FakeStore(process=[OutcomeUnknown("lost")], observe=[observed]), Rec()
    with pytest.raises(Fenced):
        await _process(store, rec)
    assert store.calls == ["process", "observe"] and rec.resolved == [("process", "fenced")]


async def test_process_unknown_observe_fails_three_times_is_unresolved() -> None:
    store = FakeStore(process=[OutcomeUnknown("lost")],
                      observe=[ReadFailed("a"), ReadFailed("b"), ReadFailed("c")])
    rec = Rec()
    with pytest.raises(Unresolved):
        await _process(store, rec)
    assert store.calls == ["process", "observe", "observe", "observe"]
    assert rec.waits == [0.1, 0.2]


async def test_process_not_committed_three_calls() -> None:
    store = FakeStore(process=[NotCommitted("1"), NotCommitted("2"), NotCommitted("3")])
    rec = Rec()
    with pytest.raises(NotCommitted):
        await _process(store, rec)
    assert store.calls == ["process"] * 3 and rec.waits == [0.1, 0.2]


async def test_process_fenced_is_not_retried() -> None:
    store, rec = FakeStore(process=[Fenced("moved")]), Rec()
    with pytest.raises(Fenced):
        await _process(store, rec)
    assert store.calls == ["process"]


async def test_process_stop_during_wait_prevents_next_call() -> None:
    store, rec = FakeStore(process=[NotCommitted("1"), Token(3, 15)]), Rec()
    rec.stop_after_checks = 1  # the check after the first wait fails
    with pytest.raises(Retired):
        await _process(store, rec)
    assert store.calls == ["process"] and rec.waits == [0.1]


async def _claim(store: FakeStore, rec: Rec) -> Mapping[TopicPartition, Token]:
    return await guarded_claim(store, [ClaimRequest(TP, 0)],  # type: ignore[arg-type]
                               lifetime="L", wait=rec.wait, check_live=rec.check_live,
                               hooks=CallHooks(on_resolve=rec.on_resolve))


async def test_claim_unknown_observes_then_claims_afresh() -> None:
    store = FakeStore(claim=[OutcomeUnknown("lost"), Token(5, 0)], observe=[Token(4, 0)])
    rec = Rec()
    assert await _claim(store, rec) == {TP: Token(5, 0)}  # never adopts the observed epoch 4
    assert store.calls == ["claim", "observe", "claim"] and rec.waits == [0.1]
    assert rec.resolved == [("claim", "reclaim")]


async def test_claim_unknown_not_reclaimed_when_stopped() -> None:
    store = FakeStore(claim=[OutcomeUnknown("lost"), Token(5, 0)], observe=[Token(4, 0)])
    rec = Rec()
    rec.stop_after_checks = 1  # alive for the first call only
    with pytest.raises(Retired):
        await _claim(store, rec)
    assert "claim" not in store.calls[1:]


async def test_claim_third_call_unknown_is_unresolved() -> None:
    store = FakeStore(claim=[OutcomeUnknown("1"), OutcomeUnknown("2"), OutcomeUnknown("3")],
                      observe=[Token(1, 0), Token(2, 0), Token(3, 0)])
    rec = Rec()
    with pytest.raises(Unresolved):
        await _claim(store, rec)
    assert store.calls.count("claim") == 3 and rec.waits == [0.1, 0.2]


async def test_observe_read_failed_three_calls() -> None:
    store = FakeStore(observe=[ReadFailed("1"), ReadFailed("2"), ReadFailed("3")])
    rec = Rec()
    with pytest.raises(ReadFailed):
        await guarded_observe(store, [TP], wait=rec.wait,  # type: ignore[arg-type]
                              check_live=rec.check_live)
    assert store.calls == ["observe"] * 3 and rec.waits == [0.1, 0.2]


async def test_resolution_span_records_its_outcome_through_the_tracing_port() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from consumer.observability.otel_tracing import OtelTracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    store, rec = FakeStore(process=[OutcomeUnknown("lost")], observe=[Token(3, 15)]), Rec()
    await guarded_process(store, BatchCall(TP, RECORDS, _unused),  # type: ignore[arg-type]
                          TOKEN, wait=rec.wait, check_live=rec.check_live,
                          hooks=CallHooks(tracing=OtelTracing(provider.get_tracer("t"))))
    (span,) = exporter.get_finished_spans()
    assert span.name == "fence.resolve" and span.attributes is not None
    assert span.attributes["fence.outcome"] == "committed"  # not overwritten with "ok"
    assert span.attributes["fence.operation"] == "process"


class HandlerStore(FakeStore):
    """Like ``FakeStore``, but a scripted reply ``("after", reply)`` first runs the handler."""

    async def process(self, call: BatchCall, token: Token) -> Token:
        reply = self.script["process"][0]
        if isinstance(reply, tuple):
            self.script["process"][0] = reply[1]
            await call.handler(None, call.records)
        return await self._next("process")  # type: ignore[no-any-return,unused-ignore]


async def _once(store: FakeStore, rec: Rec, ran: list[int]) -> Token:
    async def handler(conn: Any, records: Sequence[SourceRecord]) -> list[Any]:
        ran.append(len(records))
        return []

    return await guarded_process(store,  # type: ignore[arg-type]
                                 BatchCall(TP, RECORDS, handler, uncertain=True), TOKEN,
                                 wait=rec.wait, check_live=rec.check_live,
                                 hooks=CallHooks(on_resolve=rec.on_resolve))


@pytest.mark.parametrize("reply, observed", [
    (OutcomeUnknown("lost COMMIT reply"), [Token(3, 10)]),  # resolved: not committed
    (NotCommitted("refused after the handler ran"), [])])
async def test_an_outcome_uncertain_handler_that_ran_is_never_called_again(
        reply: BaseException, observed: list[Token]) -> None:
    store, rec = HandlerStore(process=[("after", reply), Token(3, 15)], observe=observed), Rec()
    ran: list[int] = []
    with pytest.raises(EffectUncertain, match="after the handler ran"):
        await _once(store, rec, ran)
    assert ran == [3] and store.calls.count("process") == 1


async def test_an_outcome_uncertain_call_refused_before_the_handler_ran_is_retried() -> None:
    store = HandlerStore(process=[NotCommitted("no connection"), ("after", Token(3, 15))])
    rec, ran = Rec(), list[int]()
    assert await _once(store, rec, ran) == Token(3, 15)
    assert ran == [3] and store.calls == ["process", "process"]


async def test_an_outcome_uncertain_lost_reply_that_committed_is_committed() -> None:
    store = HandlerStore(process=[("after", OutcomeUnknown("lost"))], observe=[Token(3, 15)])
    rec, ran = Rec(), list[int]()
    assert await _once(store, rec, ran) == Token(3, 15)
    assert ran == [3] and rec.resolved == [("process", "committed")]
