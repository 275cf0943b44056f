"""What the adapter relies on from librdkafka, checked against the real broker per group setup.

- ``assign``/``incremental_assign`` with offsets positions the consumer there, whatever the
  group's committed offset says (the worker's positions come from PostgreSQL).
- Callback order on a member joining: the old member's revoke callback returns before the
  new member's assign callback for those partitions runs, and no record of a revoked
  partition is delivered after its revoke callback returned (buffered ones are dropped).
- ``pause`` then ``resume`` continues at the record after the last one delivered: nothing
  is lost or repeated although pause purges librdkafka's prefetched records, which
  ``resume`` fetches again (counted with librdkafka's ``rxmsgs`` statistic).
- A full prefetch queue postpones the next fetch by ``fetch.queue.backoff.ms`` (1 s by
  default), however soon the application drains it; the worker sets 10 ms.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, cast

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka import TopicPartition as KTP
from confluent_kafka.admin import AdminClient

from consumer.config import PREFETCH, GroupProtocol, WorkerConfig, kafka_settings
from consumer.kafka.adapter import KafkaThread
from fencing.errors import KafkaClientFailed
from fencing.types import SourceRecord, TopicPartition
from tests.integration.workers import (
    GROUP_SETUPS,
    GroupSetup,
    create_topic,
    generated,
    produce,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration


class Recorder:
    """A Rebalancer that records events in order and positions partitions at ``start``."""

    def __init__(self, name: str, log: list[tuple[str, str, object]], start: int) -> None:
        self.name, self.log, self.start = name, log, start
        self.records: list[SourceRecord] = []
        self.owned: set[TopicPartition] = set()
        self.failures: list[BaseException] = []
        self.lock = threading.Lock()

    def assigned(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        with self.lock:
            self.log.append((self.name, "assign", sorted(tps)))
            self.owned.update(tps)
        return {tp: self.start for tp in tps}

    def revoked(self, tps: list[TopicPartition]) -> None:
        time.sleep(0.3)  # a slow revoke: the other member must wait for it
        with self.lock:
            self.owned.difference_update(tps)
            self.log.append((self.name, "revoke-done", sorted(tps)))

    def lost(self, tps: list[TopicPartition]) -> None:
        with self.lock:
            self.owned.difference_update(tps)
            self.log.append((self.name, "lost", sorted(tps)))

    def deliver(self, take: Callable[[], list[SourceRecord]],
                release: Callable[[], None]) -> None:
        records = take()
        with self.lock:
            for r in records:
                if r.tp not in self.owned:
                    self.log.append((self.name, "stray", (r.tp, r.offset)))
            self.records.extend(records)
        release()

    def failed(self, exc: BaseException) -> None:
        with self.lock:
            self.failures.append(exc)
            self.log.append((self.name, "failed", repr(exc)))

    def kafka_outcome(self, answered: bool, what: str) -> None:
        pass


def settings_for(setup: GroupSetup, bootstrap: str, group: str) -> tuple[dict[str, str], bool]:
    args = dict(zip(setup.args[::2], setup.args[1::2], strict=False))
    x = {}
    for i, a in enumerate(setup.args):
        if a == "-X":
            k, _, v = setup.args[i + 1].partition("=")
            x[k] = v
    cfg = WorkerConfig(topics=("t",), group_id=group, bootstrap_servers=bootstrap, dsn="x",
                       handler="m:h",
                       group_protocol=GroupProtocol(args["--group-protocol"]),
                       assignment_strategy=args.get("--assignment-strategy",
                                                    "cooperative-sticky"),
                       x_options=x)
    return kafka_settings(cfg), cfg.cooperative


@pytest.mark.parametrize("setup", GROUP_SETUPS, ids=lambda s: s.name)
def test_positions_callback_order_and_revoked_records(services, setup: GroupSetup) -> None:
    bootstrap = services.kafka_bootstrap
    topic, group = unique("facts"), unique("gfacts")
    create_topic(bootstrap, topic, 4)
    recs, _ = generated(topic, count=800, partitions=4)
    produce(bootstrap, recs)
    settings, coop = settings_for(setup, bootstrap, group)
    # A committed offset the worker must ignore.
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futs = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(
        group, [KTP(topic, p, 150) for p in range(4)])])
    for f in futs.values():
        f.result(timeout=30)

    log: list[tuple[str, str, object]] = []
    a = Recorder("a", log, start=20)
    ta = KafkaThread(settings=settings, topic=topic, cooperative=coop, rebalancer=a)
    ta.start()
    try:
        wait_until(lambda: len({r.tp for r in a.records}) == 4, timeout_s=40,
                   what="member a consuming 4 partitions")
        firsts: dict[object, int] = {}
        for r in a.records:
            firsts.setdefault(r.tp, r.offset)
        assert set(firsts.values()) == {20}, firsts  # positioned by us, not by Kafka's 150

        b = Recorder("b", log, start=0)
        tb = KafkaThread(settings=settings, topic=topic, cooperative=coop, rebalancer=b)
        tb.start()
        try:
            wait_until(lambda: b.owned and not (a.owned & b.owned), timeout_s=40,
                       what="member b owning partitions")
            moved = set(b.owned)
            events = [(who, what, set(cast(Iterable[Any], tps)))
                      for who, what, tps in log if what != "stray"]
            b_assign = next(i for i, e in enumerate(events)
                            if e[0] == "b" and e[1] == "assign" and e[2] & moved)
            a_revoke = [i for i, e in enumerate(events)
                        if e[0] == "a" and e[1] == "revoke-done" and e[2] & moved]
            assert a_revoke and a_revoke[0] < b_assign, events
            assert not [e for e in log if e[1] == "stray"], "record of an unowned partition"
        finally:
            tb.close().result(timeout=30)
    finally:
        ta.close().result(timeout=30)
    # close() served a final revoke on the calling thread of the consumer.
    assert log[-1][1] == "revoke-done"


class Gated(Recorder):
    """Holds the Kafka thread in its first delivery until ``gate`` opens."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.entered, self.gate = threading.Event(), threading.Event()

    def deliver(self, take: Callable[[], list[SourceRecord]],
                release: Callable[[], None]) -> None:
        if not self.entered.is_set():
            self.entered.set()
            self.gate.wait(30)
        super().deliver(take, release)


def test_pause_resume_loses_and_repeats_nothing(services) -> None:
    bootstrap = services.kafka_bootstrap
    topic, group = unique("pause"), unique("gpause")
    create_topic(bootstrap, topic, 1)
    recs, _ = generated(topic, count=3000, partitions=1)
    produce(bootstrap, recs)
    settings, coop = settings_for(GROUP_SETUPS[1], bootstrap, group)
    log: list[tuple[str, str, object]] = []
    a = Gated("a", log, start=0)
    t = KafkaThread(settings=settings, topic=topic, cooperative=coop, rebalancer=a,
                    consume_max_records=100)
    tp = TopicPartition(topic, 0)
    t.start()
    try:
        # the pause is asked for while the thread delivers its first 100 records (with a
        # 10 ms fetch backoff all 3000 arrive within milliseconds otherwise: nothing to pause)
        assert a.entered.wait(30), "no first delivery"
        t.pause(tp)
        a.gate.set()
        # pause() queues a command the Kafka thread runs between two consume() calls; one
        # queued after it has run once the pause has (commands run in order): wait for that,
        # not a fixed time (a starved thread may deliver a batch more before it gets there)
        paused = threading.Event()
        t._commands.put(lambda _consumer: paused.set())
        assert paused.wait(30), "the pause command never ran"
        n_paused = len(a.records)
        assert n_paused < 3000, "everything was delivered before the pause: nothing tested"
        time.sleep(1.0)
        assert len(a.records) == n_paused, "records delivered while paused"
        t.resume(tp)
        wait_until(lambda: len(a.records) >= 3000, timeout_s=30, what="all records")
    finally:
        t.close().result(timeout=30)
    offsets = [r.offset for r in a.records]
    assert offsets == list(range(3000))


class Stalling(Recorder):
    """Blocks the consumer thread in its first delivery for longer than max.poll.interval.ms."""

    def __init__(self, *args: object, stall_s: float) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.stall_s = stall_s

    def deliver(self, take: Callable[[], list[SourceRecord]],
                release: Callable[[], None]) -> None:
        if self.stall_s:
            stall, self.stall_s = self.stall_s, 0.0
            time.sleep(stall)
        super().deliver(take, release)


@pytest.mark.parametrize("setup", GROUP_SETUPS, ids=lambda s: s.name)
def test_missed_poll_interval_calls_on_lost_then_rejoins(services, setup: GroupSetup) -> None:
    """Exceeding max.poll.interval.ms: librdkafka reports the assignment lost (``on_lost``,
    not ``on_revoke``) from the next consume(), then rejoins and assigns again."""
    bootstrap = services.kafka_bootstrap
    topic, group = unique("lostcb"), unique("glostcb")
    create_topic(bootstrap, topic, 2)
    recs, _ = generated(topic, count=200, partitions=2)
    produce(bootstrap, recs)
    settings, coop = settings_for(setup, bootstrap, group)
    settings["max.poll.interval.ms"] = "2500"
    log: list[tuple[str, str, object]] = []
    a = Stalling("a", log, 0, stall_s=5.0)
    t = KafkaThread(settings=settings, topic=topic, cooperative=coop, rebalancer=a)
    t.start()
    try:
        wait_until(lambda: [e for e in log if e[1] == "lost"], timeout_s=30, what="on_lost")
        wait_until(lambda: [e for e in log[[e[1] for e in log].index("lost"):]
                            if e[1] == "assign" and e[2]], timeout_s=30, what="re-assign")
    finally:
        t.close().result(timeout=30)
    kinds = [e[1] for e in log if e[1] in ("assign", "lost", "revoke-done")]
    assert kinds.index("lost") > kinds.index("assign")
    assert "revoke-done" not in kinds[:kinds.index("lost")], kinds


class Crashing(Recorder):
    """A Rebalancer whose delivery raises: an unexpected failure inside the Kafka thread."""

    def deliver(self, take: Callable[[], list[SourceRecord]],
                release: Callable[[], None]) -> None:
        raise RuntimeError("boom in delivery")


def test_kafka_thread_failure_is_reported_never_silent(services) -> None:
    """Liveness item 3: an unexpected error ends the thread *and* reaches the rebalancer."""
    bootstrap = services.kafka_bootstrap
    topic, group = unique("crashcb"), unique("gcrashcb")
    create_topic(bootstrap, topic, 1)
    recs, _ = generated(topic, count=50, partitions=1)
    produce(bootstrap, recs)
    settings, coop = settings_for(GROUP_SETUPS[1], bootstrap, group)
    a = Crashing("a", [], 0)
    t = KafkaThread(settings=settings, topic=topic, cooperative=coop, rebalancer=a)
    t.start()
    wait_until(lambda: a.failures, timeout_s=30, what="the failure reported")
    assert isinstance(a.failures[0], RuntimeError) and "boom" in str(a.failures[0])
    t.close().result(timeout=30)


class FailingAssign(KafkaThread):
    """``assign``/``incremental_assign`` inside the callback fails in librdkafka itself: a
    list naming each partition twice is refused (``_INVALID_ARG``/``_CONFLICT``)."""

    def _assign(self, consumer: Any, ktps: list[KTP]) -> None:
        super()._assign(consumer, [*ktps, *ktps])


@pytest.mark.parametrize("setup", GROUP_SETUPS, ids=lambda s: s.name)
def test_failed_assign_fail_stops_and_positions_nothing(services, setup: GroupSetup) -> None:
    """Liveness item 8: the lifetime fail-stops (``KafkaClientFailed``) and librdkafka never
    positions the partitions from Kafka's committed offset by itself."""
    bootstrap = services.kafka_bootstrap
    topic, group = unique("failassign"), unique("gfailassign")
    create_topic(bootstrap, topic, 2)
    recs, _ = generated(topic, count=400, partitions=2)
    produce(bootstrap, recs)
    settings, coop = settings_for(setup, bootstrap, group)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(
            group, [KTP(topic, p, 150) for p in range(2)])]).values():
        f.result(timeout=30)
    a = Recorder("a", [], start=20)
    t = FailingAssign(settings=settings, topic=topic, cooperative=coop, rebalancer=a)
    t.start()
    try:
        wait_until(lambda: a.failures, timeout_s=30, what="the failed assign reported")
        assert isinstance(a.failures[0], KafkaClientFailed), a.failures
        assert "assign of" in str(a.failures[0]), a.failures
        time.sleep(3.0)  # would be plenty to fetch from offset 150 (or 20)
        assert a.records == []
    finally:
        t.close().result(timeout=30)



def _one_partition(bootstrap: str, prefix: str, total: int, value: bytes) -> str:
    """A fresh one-partition topic holding ``total`` records of ``value`` (keys "0", "1", ...)."""
    from confluent_kafka import Producer

    topic = unique(prefix)
    create_topic(bootstrap, topic, 1)
    # batches of at most 64 KiB: a fetch of at most 128 KiB (``_longest_wait_draining``)
    # then holds one or two of them, never the whole topic
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 65536})
    for i in range(total):
        p.produce(topic, value, str(i).encode(), partition=0)
    assert p.flush(30) == 0
    return topic


def _longest_wait_draining(bootstrap: str, topic: str, total: int, extra: dict[str, str]
                           ) -> tuple[float, float]:
    """Consume ``topic`` to its end, draining what librdkafka holds every 0.2 s: (the
    longest time between two non-empty consume() results, the whole span).

    Not a consume() that waits: librdkafka hands a waiting consume() each message as it
    lands, so its queue may be empty again when the fetcher decides on the next fetch, and
    nothing is postponed (a cold make test saw the whole topic arrive within one 50 ms
    consume(500, 0.05) with the default backoff). Drained between waits, as the worker's
    loop drains it, the queue is full at that decision."""
    from confluent_kafka import Consumer

    # a fetch returns at most 128 KiB (one batch at least), so the 64 KiB queue bound is
    # reached by each fetch and the topic takes several: with librdkafka's default of 1 MiB
    # a fetch could bring the whole topic at once, and nothing was ever postponed (the
    # first consume() returned 500 records, the rest followed within 10 ms)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("fqb"),
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "enable.partition.eof": False, "queued.max.messages.kbytes": "64",
                  "max.partition.fetch.bytes": "131072", **extra})
    c.subscribe([topic])
    try:
        seen, first, last, longest = 0, None, None, 0.0
        deadline = time.monotonic() + 60
        while seen < total and time.monotonic() < deadline:
            msgs = [m for m in c.consume(500, 0) if m.error() is None]
            if msgs:
                now = time.monotonic()
                if last is not None:
                    longest = max(longest, now - last)
                first, last = first or now, now
                seen += len(msgs)
            time.sleep(0.2)
        assert seen == total and first is not None and last is not None
        return longest, last - first
    finally:
        c.close()


def test_a_full_prefetch_queue_postpones_the_next_fetch_by_fetch_queue_backoff_ms(
        services) -> None:
    """librdkafka (>= 2.3, CONFIGURATION.md): once a partition's local queue reached
    ``queued.max.messages.kbytes``, the next fetch waits ``fetch.queue.backoff.ms``, 1 s by
    default, even when the application drained the queue long before. With the worker's
    prefetch bound that starved it of records for ~0.5 s at a time (docs/benchmarks.md);
    the worker sets 10 ms (``consumer.config.PREFETCH``)."""
    total = 400  # 400 KB: the 64 KiB queue fills and drains at least three times
    topic = _one_partition(services.kafka_bootstrap, "fqb", total, b"x" * 1000)
    slow_gap, slow_span = _longest_wait_draining(services.kafka_bootstrap, topic, total, {})
    fast_gap, fast_span = _longest_wait_draining(services.kafka_bootstrap, topic, total,
                                                 {"fetch.queue.backoff.ms":
                                                  PREFETCH["fetch.queue.backoff.ms"]})
    print(f"longest wait / span: default {slow_gap:.2f} / {slow_span:.2f} s, "
          f"10 ms {fast_gap:.2f} / {fast_span:.2f} s")
    assert slow_gap >= 0.5  # a postponed fetch: the 1 s backoff, less the drain time
    assert fast_gap < slow_gap and fast_span < slow_span


def _fetched_and_delivered(bootstrap: str, topic: str, total: int, *, pause_every: int
                           ) -> tuple[int, int]:
    """Consume ``topic`` to its end with the worker's prefetch settings; with
    ``pause_every``, pause the partition each time that many more records were delivered
    (after librdkafka had 50 ms to prefetch) and resume it at once, as the worker's flow
    control does at its queue bound. (records librdkafka fetched from the broker — its
    ``rxmsgs`` statistic —, records delivered)."""
    import json

    from confluent_kafka import Consumer

    stats: dict[str, int] = {}

    def on_stats(raw: str) -> None:
        stats["rxmsgs"] = json.loads(raw)["rxmsgs"]

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("refetch"),
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "enable.partition.eof": False, **PREFETCH,
                  "statistics.interval.ms": 100, "stats_cb": on_stats})
    c.subscribe([topic])
    try:
        seen, next_pause, offsets = 0, pause_every, []
        deadline = time.monotonic() + 60
        while seen < total and time.monotonic() < deadline:
            msgs = [m for m in c.consume(1000, 0.05) if m.error() is None]
            offsets += [m.offset() for m in msgs]
            seen += len(msgs)
            if pause_every and seen >= next_pause and seen < total:
                next_pause += pause_every
                time.sleep(0.05)  # librdkafka prefetches meanwhile
                tp = [KTP(topic, 0)]
                c.pause(tp)
                c.resume(tp)
        assert offsets == list(range(total))  # nothing lost or repeated for the application
        stats.clear()
        deadline = time.monotonic() + 10
        while "rxmsgs" not in stats and time.monotonic() < deadline:
            assert not c.consume(1, 0.1)  # serves the next statistics callback
        return stats["rxmsgs"], seen
    finally:
        c.close()


def test_pause_discards_prefetched_records_and_resume_fetches_them_again(services) -> None:
    """librdkafka purges a partition's prefetched records on ``pause`` and fetches again
    from the application's position on ``resume`` (librdkafka#5343, open; a maintainer in
    confluent-kafka-dotnet#1621: use pause/resume only against extreme imbalance). The
    worker pauses a partition at its queue bound (``consumer.batching``), so at full
    speed it fetches many records more than once (docs/librdkafka.md says what that
    costs and why the worker keeps pausing). The control: without pauses, every record is
    fetched exactly once."""
    total = 20_000  # 2 MB of 100-byte values: more than one fetch
    topic = _one_partition(services.kafka_bootstrap, "refetch", total, b"v" * 100)
    fetched, delivered = _fetched_and_delivered(services.kafka_bootstrap, topic, total,
                                                pause_every=0)
    assert (fetched, delivered) == (total, total)
    fetched, delivered = _fetched_and_delivered(services.kafka_bootstrap, topic, total,
                                                pause_every=2_000)
    print(f"with a pause every 2,000 records: fetched {fetched} for {delivered} delivered")
    assert delivered == total
    assert fetched > 1.5 * total  # the prefetched records discarded at each pause, again


def test_consume_holds_a_ready_record_until_its_count_or_timeout(services) -> None:
    """librdkafka's ``consume(n, timeout)`` returns only once it has ``n`` records or the
    timeout passed (``rd_kafka_q_serve_rkmessages`` waits on the queue until then): a record
    already fetched waits the whole timeout. The adapter's ``consume_ready`` (through
    ``KafkaThread._consume``) hands it over at once."""
    from confluent_kafka import Consumer, Producer

    bootstrap = services.kafka_bootstrap
    topic = _one_partition(bootstrap, "hold", 1, b"v")
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("hold"),
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "enable.partition.eof": False})
    c.subscribe([topic])
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    thread = KafkaThread(settings={}, topic=topic, cooperative=False, poll_timeout_s=3.0,
                         rebalancer=Recorder("hold", [], 0))
    try:
        deadline = time.monotonic() + 60
        while not c.consume(10, 0.2) and time.monotonic() < deadline:  # joined, positioned
            pass

        def ready_then(consume: Callable[[], list[Any]]) -> tuple[int, float]:
            p.produce(topic, b"late", partition=0)
            assert p.flush(10) == 0
            time.sleep(1.0)  # fetched into librdkafka's queue by now
            began = time.monotonic()
            got = [m for m in consume() if m.error() is None]
            return len(got), time.monotonic() - began

        held, held_s = ready_then(lambda: c.consume(1000, 3.0))
        assert held == 1 and held_s >= 2.9, held_s
        handed, handed_s = ready_then(lambda: thread._consume(c))
        assert handed == 1 and handed_s < 1.0, handed_s
    finally:
        c.close()
