"""The worker's loop side with the in-memory store and a fake Kafka thread (no services).

The fake plays librdkafka's part from its own thread: it calls the blocking rebalance
callbacks and delivers records, and records the commands the worker sends back.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import pytest

from consumer.config import WorkerConfig
from consumer.exits import ExitCode
from consumer.lifecycle import Lifecycle
from consumer.worker import Worker
from fencing.errors import ConfigError, KafkaClientFailed
from fencing.memory.store import MemoryFenceStore
from fencing.types import ACCEPT, SourceFacts, SourceRecord, TopicPartition, Verdict
from tests.polling import until_async

TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)


class FakeKafka:
    def __init__(self, rb: Any) -> None:
        self.rb = rb
        self.commands: list[tuple[str, TopicPartition, int]] = []
        self.closed: Future[None] = Future()
        self.lock = threading.Lock()

    def start(self) -> None:
        pass

    def pause(self, tp: TopicPartition) -> None:
        with self.lock:
            self.commands.append(("pause", tp, -1))

    def resume(self, tp: TopicPartition) -> None:
        with self.lock:
            self.commands.append(("resume", tp, -1))

    def commit(self, tp: TopicPartition, frontier: int) -> None:
        with self.lock:
            self.commands.append(("commit", tp, frontier))

    def reposition(self, tp: TopicPartition, offset: int,
                   then: Callable[[bool | BaseException], None]) -> None:
        with self.lock:
            self.commands.append(("reposition", tp, offset))
        then(True)  # as the Kafka thread does right after its seek

    def mirror(self) -> dict[TopicPartition, Any]:
        return {}

    def freeze_mirror(self) -> None:
        with self.lock:
            self.commands.append(("freeze", TopicPartition("", -1), -1))

    def stop_fetching(self) -> None:
        pass

    def close(self) -> Future[None]:
        if not self.closed.done():
            self.closed.set_result(None)
        return self.closed

    def committed(self, tp: TopicPartition) -> int:
        with self.lock:
            return max([f for c, t, f in self.commands if c == "commit" and t == tp],
                       default=-1)

    def deliver(self, records: list[SourceRecord]) -> None:
        done = threading.Event()
        self.rb.deliver(lambda: records, done.set)
        assert done.wait(10)


class Facts:
    topic_id = "tid"  # a test sets another id to stand for a recreated topic

    def facts(self, tps: list[TopicPartition]) -> dict[TopicPartition, SourceFacts]:
        return {tp: SourceFacts(self.topic_id, 0, 10_000) for tp in tps}


def records(tp: TopicPartition, start: int, count: int) -> list[SourceRecord]:
    return [SourceRecord(tp.topic, tp.partition, o, b"k", b"v" * 10)
            for o in range(start, start + count)]


async def accept_all(conn: Any, recs: Sequence[SourceRecord]) -> list[Verdict]:
    return [ACCEPT] * len(recs)


def make(handler: Callable[..., Any] = accept_all, *, store: MemoryFenceStore | None = None,
         **cfg: Any) -> tuple[Worker, MemoryFenceStore, list[FakeKafka]]:
    """A worker over ``store`` (a fresh one when None; a successor shares its
    predecessor's) and the fake Kafka threads its lifetimes start."""
    store = store if store is not None else MemoryFenceStore("g")
    config = WorkerConfig(topics=("t",), group_id="g", bootstrap_servers="x", dsn="x",
                          handler="m:h",
                          **{"batch_max_records": 50, "shutdown_timeout_s": 1.0, **cfg})
    fakes: list[FakeKafka] = []

    def kafka(rb: Any) -> FakeKafka:
        fakes.append(FakeKafka(rb))
        return fakes[-1]

    worker = Worker(config=config, handler=handler, source=Facts(), kafka_factory=kafka,
                    lifecycle_factory=lambda lid: Lifecycle(
                        store=store, lifetime_id=lid, clock=time.monotonic,
                        wait=asyncio.sleep, budget_s=5.0))
    return worker, store, fakes


async def test_assign_positions_from_store_and_commits_after_each_batch() -> None:
    worker, store, fakes = make()
    run = asyncio.create_task(worker.run())
    await until_async(lambda: bool(fakes))
    kafka = fakes[0]
    positions = await asyncio.to_thread(fakes[-1].rb.assigned, [TP0, TP1])
    assert positions == {TP0: 0, TP1: 0}
    await asyncio.to_thread(kafka.deliver, records(TP0, 0, 120) + records(TP1, 0, 30))
    await until_async(lambda: kafka.committed(TP0) == 120 and kafka.committed(TP1) == 30)
    assert store.token_of(TP0).frontier == 120  # type: ignore[union-attr]
    # every commit is a batch end: batches of at most 50
    assert [f for c, t, f in kafka.commands if c == "commit" and t == TP0] == [50, 100, 120]
    worker.request_stop()
    assert await run is ExitCode.OK


async def test_stale_records_are_dropped_after_positioning() -> None:
    worker, _store, fakes = make()
    run = asyncio.create_task(worker.run())
    await until_async(lambda: bool(fakes))
    await asyncio.to_thread(fakes[-1].rb.assigned, [TP0])
    await asyncio.to_thread(fakes[0].deliver, records(TP0, 0, 10))
    await until_async(lambda: fakes[0].committed(TP0) == 10)
    await asyncio.to_thread(fakes[0].deliver, records(TP0, 5, 10))  # 5..9 already delivered
    await until_async(lambda: fakes[0].committed(TP0) == 15)
    worker.request_stop()
    assert await run is ExitCode.OK


async def test_revoke_returns_only_after_the_in_flight_batch() -> None:
    release = asyncio.Event()
    order: list[str] = []

    async def slow(conn: Any, recs: Sequence[SourceRecord]) -> list[Verdict]:
        order.append("batch-start")
        await release.wait()
        order.append("batch-end")
        return [ACCEPT] * len(recs)

    worker, store, fakes = make(slow)
    run = asyncio.create_task(worker.run())
    await until_async(lambda: bool(fakes))
    await asyncio.to_thread(fakes[-1].rb.assigned, [TP0])
    await asyncio.to_thread(fakes[0].deliver, records(TP0, 0, 10))
    await until_async(lambda: order == ["batch-start"])
    revoking = asyncio.create_task(asyncio.to_thread(fakes[-1].rb.revoked, [TP0]))
    await asyncio.sleep(0.2)
    assert not revoking.done()
    release.set()
    await revoking
    order.append("revoked")
    assert order == ["batch-start", "batch-end", "revoked"]
    assert store.token_of(TP0).frontier == 10  # type: ignore[union-attr]
    assert [r.event for r in store.journal_rows][-1] == "release"
    worker.request_stop()
    assert await run is ExitCode.OK


async def test_full_partition_is_paused_then_resumed() -> None:
    gate = asyncio.Event()

    async def gated(conn: Any, recs: Sequence[SourceRecord]) -> list[Verdict]:
        await gate.wait()
        return [ACCEPT] * len(recs)

    worker, _store, fakes = make(gated, batch_max_records=10, queue_max_batches=2)
    run = asyncio.create_task(worker.run())
    await until_async(lambda: bool(fakes))
    await asyncio.to_thread(fakes[-1].rb.assigned, [TP0])
    await asyncio.to_thread(fakes[0].deliver, records(TP0, 0, 40))
    await until_async(lambda: ("pause", TP0, -1) in fakes[0].commands)
    gate.set()
    await until_async(lambda: ("resume", TP0, -1) in fakes[0].commands)
    await until_async(lambda: fakes[0].committed(TP0) == 40)
    worker.request_stop()
    assert await run is ExitCode.OK


async def test_shutdown_past_bound_reports_in_flight_and_exits_6(caplog: Any) -> None:
    async def stuck(conn: Any, recs: Sequence[SourceRecord]) -> list[Verdict]:
        await asyncio.Event().wait()
        return []

    worker, store, fakes = make(stuck, shutdown_timeout_s=0.3)
    run = asyncio.create_task(worker.run())
    await until_async(lambda: bool(fakes))
    await asyncio.to_thread(fakes[-1].rb.assigned, [TP1])
    await asyncio.to_thread(fakes[0].deliver, records(TP1, 0, 7))
    await until_async(lambda: bool(worker.in_flight))
    worker.request_stop()
    assert await run is ExitCode.SHUTDOWN_TIMEOUT
    assert "t[1] offsets 0..6 (7 records)" in caplog.text
    assert store.token_of(TP1).frontier == 0  # type: ignore[union-attr]


async def test_refused_source_ends_with_exit_4() -> None:
    worker, _store, fakes = make()
    run = asyncio.create_task(worker.run())
    await until_async(lambda: bool(fakes))
    assert await asyncio.to_thread(fakes[-1].rb.assigned, [TP0]) == {TP0: 0}
    await asyncio.to_thread(fakes[0].deliver, records(TP0, 0, 5))
    await until_async(lambda: fakes[0].committed(TP0) == 5)
    await asyncio.to_thread(fakes[-1].rb.revoked, [TP0])

    source = worker.source
    assert isinstance(source, Facts)
    source.topic_id = "other-id"  # the topic was recreated
    assert await asyncio.to_thread(fakes[-1].rb.assigned, [TP0]) is None  # held paused, not claimed
    assert await run is ExitCode.SOURCE_REFUSED


async def test_fenced_batch_retires_and_restart_lifetimes_starts_a_fresh_one() -> None:
    from fencing.types import ClaimRequest

    worker, store, fakes = make(restart_lifetimes=1)
    run = asyncio.create_task(worker.run())
    await until_async(lambda: bool(fakes))
    await asyncio.to_thread(fakes[-1].rb.assigned, [TP0])
    # another member claims the partition behind this lifetime's back (a zombie's view)
    await store.claim([ClaimRequest(TP0, 0, "tid")], lifetime="intruder")
    await asyncio.to_thread(fakes[0].deliver, records(TP0, 0, 5))
    await until_async(lambda: len(fakes) == 2)  # lifetime 1 retired: a fresh consumer and lifetime
    assert fakes[0].closed.done() and len(worker.lifetimes) == 2
    assert store.token_of(TP0).frontier == 0  # type: ignore[union-attr]  # nothing applied
    assert await asyncio.to_thread(fakes[-1].rb.assigned, [TP0]) == {TP0: 0}
    await asyncio.to_thread(fakes[1].deliver, records(TP0, 0, 5))
    await until_async(lambda: fakes[1].committed(TP0) == 5)
    worker.request_stop()
    assert await run is ExitCode.OK


async def test_fenced_batch_without_restarts_exits_3() -> None:
    from fencing.types import ClaimRequest

    worker, store, fakes = make()
    run = asyncio.create_task(worker.run())
    await until_async(lambda: bool(fakes))
    await asyncio.to_thread(fakes[-1].rb.assigned, [TP0])
    await store.claim([ClaimRequest(TP0, 0, "tid")], lifetime="intruder")
    await asyncio.to_thread(fakes[0].deliver, records(TP0, 0, 5))
    assert await run is ExitCode.RETIRED
    assert store.token_of(TP0).frontier == 0  # type: ignore[union-attr]
    # its frontier is stale (fenced): it stops mirroring into Kafka before it leaves
    assert [c for c, _t, _f in fakes[0].commands if c == "freeze"] == ["freeze"]


async def test_callbacks_of_an_earlier_lifetime_are_ignored(caplog: Any) -> None:
    """Liveness item 7: after a restart, the old consumer's callbacks reach its own
    lifetime's callbacks object, which ignores them: no claim, no partition, no tokens."""
    from fencing.types import ClaimRequest

    worker, store, fakes = make(restart_lifetimes=1)
    run = asyncio.create_task(worker.run())
    await until_async(lambda: bool(fakes))
    assert await asyncio.to_thread(fakes[0].rb.assigned, [TP0]) == {TP0: 0}
    await store.claim([ClaimRequest(TP0, 0, "tid")], lifetime="intruder")
    await asyncio.to_thread(fakes[0].deliver, records(TP0, 0, 5))
    await until_async(lambda: len(fakes) == 2)  # lifetime 1 retired (fenced), lifetime 2 runs
    epoch = store.token_of(TP1)
    assert await asyncio.to_thread(fakes[0].rb.assigned, [TP1]) is None  # stale: ignored
    await asyncio.to_thread(fakes[0].rb.revoked, [TP0])
    await asyncio.to_thread(fakes[0].rb.lost, [TP0])
    assert store.token_of(TP1) == epoch  # nothing claimed for the old consumer
    assert worker.progress() == {}
    assert "ignored assign callback of earlier lifetime" in caplog.text
    assert await asyncio.to_thread(fakes[1].rb.assigned, [TP1]) == {TP1: 0}  # current: works
    worker.request_stop()
    assert await run is ExitCode.OK


@pytest.mark.parametrize(("failure", "code"), [
    (ConfigError("librdkafka refused the consumer configuration: no.such.property"),
     ExitCode.CONFIG),
    (KafkaClientFailed("incremental_assign failed"), ExitCode.UNAVAILABLE),
    (RuntimeError("bug in the Kafka thread"), ExitCode.INTERNAL),
])
async def test_kafka_thread_failure_ends_the_lifetime(failure: BaseException, code: ExitCode,
                                                      caplog: Any) -> None:
    """Liveness item 3: never a hang; an unexpected error is logged with its traceback."""
    worker, _store, fakes = make(restart_lifetimes=0)
    run = asyncio.create_task(worker.run())
    await until_async(lambda: bool(fakes))
    try:
        raise failure  # as the Kafka thread reports it: raised, with a traceback
    except BaseException as exc:
        await asyncio.to_thread(fakes[0].rb.failed, exc)
    assert await asyncio.wait_for(run, 10) is code
    assert ("Traceback" in caplog.text) is (code is ExitCode.INTERNAL)


async def test_a_delivery_that_cannot_be_translated_ends_the_lifetime(caplog: Any) -> None:
    """Records are translated on the loop (``kafka.adapter.translated``); a translation that
    raises ends the run with exit 1 and its traceback instead of vanishing into the loop's
    exception handler, and the Kafka thread's delivery slot is still released."""
    worker, _store, fakes = make(restart_lifetimes=0)
    run = asyncio.create_task(worker.run())
    await until_async(lambda: bool(fakes))
    await asyncio.to_thread(fakes[-1].rb.assigned, [TP0])

    def broken() -> list[SourceRecord]:
        raise ValueError("untranslatable message")
    released = threading.Event()
    await asyncio.to_thread(fakes[0].rb.deliver, broken, released.set)
    assert await asyncio.wait_for(run, 10) is ExitCode.INTERNAL
    assert released.is_set()
    assert "untranslatable message" in caplog.text and "Traceback" in caplog.text


async def test_shutdown_bound_is_final_after_an_earlier_failure(caplog: Any) -> None:
    """Liveness item 9: a batch that ignores cancellation outlives the bound after another
    partition's failure: exit 6 (not 3), and no fresh lifetime starts beside it."""
    from fencing.types import ClaimRequest

    entered, done = asyncio.Event(), asyncio.Event()

    async def stubborn(conn: Any, recs: Sequence[SourceRecord]) -> list[Verdict]:
        if recs[0].partition == 1:
            entered.set()
            for _ in range(200):  # until the test ends (at most ~10 s), ignoring cancellation
                if done.is_set():
                    break
                try:
                    await asyncio.sleep(0.05)
                except asyncio.CancelledError:
                    continue
        return [ACCEPT] * len(recs)

    worker, store, fakes = make(stubborn, restart_lifetimes=3, shutdown_timeout_s=0.5)
    run = asyncio.create_task(worker.run())
    await until_async(lambda: bool(fakes))
    await asyncio.to_thread(fakes[0].rb.assigned, [TP0, TP1])
    await asyncio.to_thread(fakes[0].deliver, records(TP1, 0, 3))
    await asyncio.wait_for(entered.wait(), 5)
    await store.claim([ClaimRequest(TP0, 0, "tid")], lifetime="intruder")  # TP0 fenced
    await asyncio.to_thread(fakes[0].deliver, records(TP0, 0, 3))
    assert await asyncio.wait_for(run, 15) is ExitCode.SHUTDOWN_TIMEOUT
    assert worker.abandoned and len(fakes) == 1 and len(worker.lifetimes) == 1
    assert "exit 6 instead of 3" in caplog.text and "t[1] offsets 0..2" in caplog.text
    assert "exit 5" not in caplog.text  # a budget used up is a retirement (3), not 5
    done.set()


async def _lingering(linger_s: float) -> tuple[Worker, asyncio.Task[Any], FakeKafka, list[int]]:
    """A running worker with ``batch_linger_s=linger_s``, assigned ``TP0``, whose handler
    records each batch's size (the list)."""
    calls: list[int] = []

    async def counting(conn: Any, recs: Sequence[SourceRecord]) -> list[Verdict]:
        calls.append(len(recs))
        return [ACCEPT] * len(recs)

    worker, _store, fakes = make(counting, batch_linger_s=linger_s)
    run = asyncio.create_task(worker.run())
    await until_async(lambda: bool(fakes))
    await asyncio.to_thread(fakes[0].rb.assigned, [TP0])
    return worker, run, fakes[0], calls


async def test_a_batch_that_is_not_full_waits_the_linger_and_no_longer() -> None:
    worker, run, kafka, calls = await _lingering(1.5)
    began = time.monotonic()
    await asyncio.to_thread(kafka.deliver, records(TP0, 0, 1))
    await asyncio.to_thread(kafka.deliver, records(TP0, 1, 5))  # within the linger: joins
    await until_async(lambda: kafka.committed(TP0) == 6, timeout_s=20)
    assert time.monotonic() - began >= 1.5  # the first record waited for more
    assert calls == [6]
    worker.request_stop()
    assert await run == ExitCode.OK


async def test_a_lingering_batch_goes_once_a_later_delivery_fills_it() -> None:
    """While its batch lingers the runner is not woken by each delivery, but the delivery
    that fills the batch (50 records) wakes it: the batch goes at once, not after 60 s."""
    worker, run, kafka, calls = await _lingering(60.0)
    await asyncio.to_thread(kafka.deliver, records(TP0, 0, 10))   # lingers
    await asyncio.sleep(0.2)
    await asyncio.to_thread(kafka.deliver, records(TP0, 10, 30))  # 40: still lingers
    await asyncio.sleep(0.2)
    assert kafka.committed(TP0) == -1 and calls == []
    await asyncio.to_thread(kafka.deliver, records(TP0, 40, 15))  # 55: full at 50
    await until_async(lambda: kafka.committed(TP0) == 50, timeout_s=20)
    assert calls == [50]
    worker.request_stop()  # the 5 left linger: the stop wakes their runner
    assert await run == ExitCode.OK


async def test_a_full_batch_never_lingers() -> None:
    worker, _store, fakes = make(batch_linger_s=60.0)
    run = asyncio.create_task(worker.run())
    await until_async(lambda: bool(fakes))
    kafka = fakes[0]
    await asyncio.to_thread(kafka.rb.assigned, [TP0])
    await asyncio.to_thread(kafka.deliver, records(TP0, 0, 70))  # 50 full, 20 not
    await until_async(lambda: kafka.committed(TP0) == 50, timeout_s=20)  # not 60 s later
    await asyncio.sleep(0.5)
    assert kafka.committed(TP0) == 50  # the other 20 wait for more, up to the linger
    worker.request_stop()
    assert await run == ExitCode.OK
