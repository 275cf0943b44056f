"""consumer.mirror (pure) and consumer.kafka.committer: Kafka's committed offset follows
the frontier."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from consumer import mirror
from consumer.kafka.committer import Committer
from consumer.mirror import CommitFailure, MirrorState
from consumer.observability.observer import WorkerObserver
from consumer.observability.readiness import LoopHeartbeat, ReadinessHolder
from fencing.types import TopicPartition
from tests.unit.consumer.test_instruments import _make as make_instruments
from tests.unit.consumer.test_instruments import _points, _value

A, B = TopicPartition("orders", 0), TopicPartition("orders", 1)


# ---- pure transitions -----------------------------------------------------------------------

def test_a_partition_assigned_in_sync_is_not_behind() -> None:
    assert mirror.assigned(durable=10, kafka=10, now_s=5.0) == MirrorState(10, 10, None)
    s = mirror.assigned(durable=10, kafka=3, now_s=5.0)
    assert s.behind_since_s == 5.0 and mirror.needs_commit(s)
    assert mirror.needs_commit(mirror.assigned(durable=0, kafka=None, now_s=0.0))


def test_behind_since_starts_at_the_first_unmirrored_move_and_survives_later_moves() -> None:
    s = mirror.assigned(durable=10, kafka=10, now_s=0.0)
    s = mirror.durable_moved(s, 20, 1.0)
    s = mirror.durable_moved(s, 30, 2.0)
    assert (s.durable, s.kafka, s.behind_since_s) == (30, 10, 1.0)


def test_a_successful_commit_restarts_the_clock_and_reaching_the_frontier_ends_it() -> None:
    s = MirrorState(30, 10, 1.0)
    s = mirror.confirmed(s, 20, 4.0)  # Kafka advanced, the frontier moved on meanwhile
    assert (s.kafka, s.behind_since_s) == (20, 4.0)
    s = mirror.confirmed(s, 30, 5.0)
    assert s.in_sync and s.behind_since_s is None
    # an operator reset backwards: the lower frontier is committed and confirmed as it is
    low = mirror.confirmed(mirror.assigned(durable=5, kafka=30, now_s=0.0), 5, 1.0)
    assert low.in_sync


def test_lagging_needs_the_bound_without_a_successful_commit() -> None:
    states = {A: MirrorState(30, 10, 100.0), B: MirrorState(7, 7, None)}
    assert mirror.lagging(states, now_s=129.9, bound_s=30) == frozenset()
    assert mirror.lagging(states, now_s=130.0, bound_s=30) == {A}


@pytest.mark.parametrize(("name", "reason"), [
    ("ILLEGAL_GENERATION", CommitFailure.REJECTED),
    ("STALE_MEMBER_EPOCH", CommitFailure.REJECTED),
    ("UNKNOWN_MEMBER_ID", CommitFailure.REJECTED),
    ("REBALANCE_IN_PROGRESS", CommitFailure.REJECTED),
    ("_WAIT_COORD", CommitFailure.UNAVAILABLE),
    ("_TIMED_OUT", CommitFailure.UNAVAILABLE),
    ("COORDINATOR_NOT_AVAILABLE", CommitFailure.UNAVAILABLE),
    ("GROUP_AUTHORIZATION_FAILED", CommitFailure.ERROR),
])
def test_commit_errors_are_classified_into_bounded_reasons(name: str,
                                                           reason: CommitFailure) -> None:
    assert mirror.classify_commit_error(name) is reason


# ---- the Kafka-thread shell, against a recording consumer -----------------------------------

class Consumer:
    """Records commits; ``committed`` answers from ``kafka``; ``fail_sync`` raises."""

    def __init__(self, kafka: dict[TopicPartition, int]) -> None:
        self.kafka = kafka
        self.sent: list[tuple[bool, dict[TopicPartition, int]]] = []
        self.fail_sync: int | None = None

    def committed(self, ktps: list[KafkaTP], timeout: float) -> list[KafkaTP]:
        return [KafkaTP(p.topic, p.partition, self.kafka.get(TopicPartition(p.topic, p.partition),
                                                             -1001)) for p in ktps]

    def commit(self, *, offsets: list[KafkaTP], asynchronous: bool) -> Any:
        sent = {TopicPartition(p.topic, p.partition): p.offset for p in offsets}
        self.sent.append((asynchronous, sent))
        if not asynchronous:
            if self.fail_sync is not None:
                raise KafkaException(KafkaError(self.fail_sync))
            self.kafka.update(sent)
            return [KafkaTP(p.topic, p.partition, p.offset) for p in offsets]
        return None


def _committer() -> tuple[Committer, list[float], list[tuple[CommitFailure, int]]]:
    now, failures = [0.0], []
    c = Committer(clock=lambda: now[0], on_failure=lambda r, n: failures.append((r, n)),
                  retry_s=1.0)
    return c, now, failures


def test_positioning_commits_only_where_kafka_differs() -> None:
    c, _now, _f = _committer()
    consumer = Consumer({A: 40, B: 12})
    c.positioned(consumer, {A: 40, B: 50})
    assert consumer.sent == [(True, {B: 50})]  # one commit for the assignment
    assert c.snapshot()[A].in_sync and not c.snapshot()[B].in_sync


def test_batches_coalesce_and_results_update_the_mirror() -> None:
    c, now, _f = _committer()
    consumer = Consumer({A: 0})
    c.positioned(consumer, {A: 0})
    c.queue(A, 10)
    c.queue(A, 20)
    c.flush(consumer, {A})
    assert consumer.sent == [(True, {A: 20})]
    now[0] = 1.0
    c.results(None, [KafkaTP("orders", 0, 20)])
    assert c.snapshot()[A] == MirrorState(20, 20, None)


def test_a_failed_commit_is_counted_and_retried_after_the_backoff() -> None:
    c, now, failures = _committer()
    consumer = Consumer({A: 0})
    c.positioned(consumer, {A: 0})
    c.queue(A, 10)
    c.flush(consumer, {A})
    c.results(KafkaError(KafkaError.ILLEGAL_GENERATION), [KafkaTP("orders", 0, 10)])
    assert failures == [(CommitFailure.REJECTED, 1)]
    c.flush(consumer, {A})
    assert len(consumer.sent) == 1  # not before the backoff
    now[0] = 1.0
    c.flush(consumer, {A})
    assert consumer.sent[-1] == (True, {A: 10})


def test_revoke_commits_synchronously_what_kafka_lacks_then_forgets() -> None:
    c, _now, failures = _committer()
    consumer = Consumer({A: 5, B: 9})
    c.positioned(consumer, {A: 5, B: 9})
    c.queue(A, 15)  # queued, not flushed yet
    c.commit_sync(consumer, [A, B])
    assert consumer.sent == [(False, {A: 15})] and consumer.kafka[A] == 15
    c.forget([A, B])
    assert c.snapshot() == {} and failures == []
    c.commit_sync(consumer, [A, B])  # nothing known any more: nothing sent
    assert len(consumer.sent) == 1


def test_a_failed_sync_commit_is_counted() -> None:
    c, _now, failures = _committer()
    consumer = Consumer({})
    c.positioned(consumer, {A: 3})
    consumer.fail_sync = KafkaError._WAIT_COORD
    c.commit_sync(consumer, [A])
    assert failures == [(CommitFailure.UNAVAILABLE, 1)]


def test_lost_and_unassigned_commits_are_dropped_and_counted() -> None:
    c, _now, failures = _committer()
    consumer = Consumer({A: 0, B: 0})
    c.positioned(consumer, {A: 0, B: 0})
    c.queue(A, 10)
    c.lost([A])
    assert failures == [(CommitFailure.LOST, 1)] and A not in c.snapshot()
    c.queue(A, 11)  # a late batch report of the lost partition
    c.flush(consumer, {B})
    assert failures[-1] == (CommitFailure.NOT_ASSIGNED, 1)
    assert all(A not in sent for _sync, sent in consumer.sent)


def test_a_late_report_of_an_earlier_assignment_does_not_move_the_mirror_back() -> None:
    c, _now, _f = _committer()
    consumer = Consumer({A: 50})
    c.positioned(consumer, {A: 50})
    c.queue(A, 30)
    c.flush(consumer, {A})
    assert consumer.sent == [] and c.snapshot()[A].durable == 50


# ---- metric and warning -----------------------------------------------------------------------

def test_the_failure_metric_is_exported_from_start_with_zero_per_reason() -> None:
    inst, reader = make_instruments()
    points = _points(reader)["fence.kafka.commits.failed"]
    assert {p.attributes["reason"]: p.value for p in points} == {
        r.value: 0 for r in CommitFailure}
    inst.kafka_commit_failed(CommitFailure.LOST, 3)
    assert _value(_points(reader)["fence.kafka.commits.failed"], reason="lost").value == 3


def test_the_observer_warns_once_when_the_mirror_lags_past_the_bound(
        caplog: pytest.LogCaptureFixture) -> None:
    inst, reader = make_instruments()
    now = [0.0]
    obs = WorkerObserver(instruments=inst, readiness=ReadinessHolder(),
                         loop_heartbeat=LoopHeartbeat(clock=lambda: now[0], bound_s=5),
                         clock=lambda: now[0], mirror_warn_s=30)
    states = {A: MirrorState(300, 250, 10.0)}
    obs.mirror = lambda: states
    with caplog.at_level(logging.INFO, logger="fenceworker.observer"):
        now[0] = 39.0
        obs._check_mirror()
        assert not caplog.records
        assert _value(_points(reader)["fence.partitions.mirror_lagging"]).value == 0
        now[0] = 40.0
        obs._check_mirror()
        obs._check_mirror()
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1
        assert _value(_points(reader)["fence.partitions.mirror_lagging"]).value == 1
        assert "orders[0]" in warnings[0].getMessage() and "Kafka has 250" in \
            warnings[0].getMessage()
        states[A] = MirrorState(300, 300, None)
        obs._check_mirror()
        assert "caught up" in caplog.records[-1].getMessage()
        assert _value(_points(reader)["fence.partitions.mirror_lagging"]).value == 0


def test_a_frozen_committer_sends_nothing_more() -> None:
    c, _now, _f = _committer()
    consumer = Consumer({A: 0})
    c.positioned(consumer, {A: 0})
    c.queue(A, 10)
    c.freeze()
    c.flush(consumer, {A})
    c.commit_sync(consumer, [A])
    assert consumer.sent == []


def test_module_exports() -> None:
    from consumer.kafka import committer
    from ops.stack import kafka_tools

    for module in (mirror, committer, kafka_tools):
        assert all(hasattr(module, name) for name in module.__all__), module


def test_a_commit_with_no_answer_is_sent_again_after_the_bound() -> None:
    # librdkafka can drop an asynchronous commit's result during a coordinator move: with no
    # later batch, the partition's Kafka offset would stay behind for good
    c, now, failures = _committer()
    consumer = Consumer({A: 0})
    c.positioned(consumer, {A: 0})
    c.queue(A, 10)
    c.flush(consumer, {A})
    now[0] = 9.0
    c.flush(consumer, {A})
    assert consumer.sent == [(True, {A: 10})]  # within the bound: waiting for the answer
    now[0] = 10.0
    c.flush(consumer, {A})
    assert consumer.sent[-1] == (True, {A: 10}) and len(consumer.sent) == 2
    c.results(None, [KafkaTP("orders", 0, 10)])
    now[0] = 30.0
    c.flush(consumer, {A})
    assert len(consumer.sent) == 2 and c.snapshot()[A].in_sync and failures == []


def test_one_commit_request_awaits_its_answer_at_a_time() -> None:
    # committing every batch at a low rate queued OffsetCommit requests faster than the
    # coordinator answered, until a heartbeat behind them timed the session out
    c, now, _f = _committer()
    consumer = Consumer({A: 0, B: 0})
    c.positioned(consumer, {A: 0, B: 0})
    c.queue(A, 10)
    c.flush(consumer, {A, B})
    for frontier in (11, 12, 13):  # batches committed while the first request is out
        c.queue(A, frontier)
        c.queue(B, frontier)
        now[0] += 0.001
        c.flush(consumer, {A, B})
    assert consumer.sent == [(True, {A: 10})]
    c.results(None, [KafkaTP("orders", 0, 10)])
    c.flush(consumer, {A, B})
    assert consumer.sent[-1] == (True, {A: 13, B: 13}) and len(consumer.sent) == 2
    c.results(None, [KafkaTP("orders", 0, 13), KafkaTP("orders", 1, 13)])
    assert c.snapshot()[A].in_sync and c.snapshot()[B].in_sync


def test_an_answer_to_an_older_commit_keeps_the_newer_one_watched() -> None:
    c, now, _f = _committer()
    consumer = Consumer({A: 0})
    c.positioned(consumer, {A: 0})
    c.queue(A, 10)
    c.flush(consumer, {A})
    c.queue(A, 20)
    now[0] = 10.0  # the first one unanswered past the bound: the next request goes out
    c.flush(consumer, {A})
    assert consumer.sent[-1] == (True, {A: 20}) and len(consumer.sent) == 2
    c.results(None, [KafkaTP("orders", 0, 10)])  # the first one answered, the second never
    now[0] = 20.0
    c.flush(consumer, {A})
    assert consumer.sent[-1] == (True, {A: 20}) and len(consumer.sent) == 3
    c.flush(consumer, {B})  # no longer assigned: nothing more
    now[0] = 30.0
    c.flush(consumer, {B})
    assert len(consumer.sent) == 3


def test_a_late_success_of_an_older_commit_is_corrected() -> None:
    # after a coordinator move librdkafka sends the commits it held back as a burst and an
    # older offset can land after a newer one (seen with debug=cgrp after a SIGKILL of the
    # coordinator's node): every commit succeeded, yet Kafka holds the older offset
    c, now, failures = _committer()
    consumer = Consumer({A: 0})
    c.positioned(consumer, {A: 0})
    for frontier in (10, 20):  # the second after the first went unanswered past the bound
        c.queue(A, frontier)
        c.flush(consumer, {A})
        now[0] += 10.0
    c.results(None, [KafkaTP("orders", 0, 20)])
    c.results(None, [KafkaTP("orders", 0, 10)])  # applied last: Kafka holds 10
    assert c.snapshot()[A] == MirrorState(20, 10, 20.0)  # behind since that answer
    c.flush(consumer, {A})
    assert consumer.sent[-1] == (True, {A: 20}) and len(consumer.sent) == 3  # at once
    c.flush(consumer, {A})
    assert len(consumer.sent) == 3  # awaiting that answer: not sent twice
    c.results(None, [KafkaTP("orders", 0, 20)])
    now[0] = 80.0
    c.flush(consumer, {A})
    assert len(consumer.sent) == 3 and c.snapshot()[A].in_sync and failures == []


def test_kafka_behind_is_not_recommitted_for_a_partition_no_longer_assigned() -> None:
    c, now, _f = _committer()
    consumer = Consumer({A: 0})
    c.positioned(consumer, {A: 0})
    c.queue(A, 10)
    c.flush(consumer, {A})
    c.queue(A, 20)
    now[0] = 10.0
    c.flush(consumer, {A})
    c.results(None, [KafkaTP("orders", 0, 20)])
    c.results(None, [KafkaTP("orders", 0, 10)])
    c.flush(consumer, {B})
    assert len(consumer.sent) == 2


class _Member:
    """What the observer writes to a member row: the detail of each ``set_state``."""

    def __init__(self) -> None:
        self.detail: dict[str, Any] = {}
        self.writes = 0

    def set_state(self, state: Any, **detail: Any) -> None:
        self.detail.update(detail)
        self.writes += 1


def test_the_observer_samples_the_lanes_into_gauges_and_the_member_row() -> None:
    inst, reader = make_instruments()
    obs = WorkerObserver(instruments=inst, readiness=ReadinessHolder(),
                         loop_heartbeat=LoopHeartbeat(clock=lambda: 0.0, bound_s=5),
                         clock=lambda: 0.0)
    member = _Member()
    obs._member = member  # type: ignore[assignment]
    load = {A: (3, 120)}
    obs.lanes = lambda: load
    obs._sample_lanes()
    points = _points(reader)
    assert _value(points["fence.lanes.busy"], partition=0).value == 3
    assert _value(points["fence.lanes.window_used"], partition=0).value == 120
    assert member.detail["lanes_busy"] == {"orders[0]": 3}
    writes = member.writes
    obs._sample_lanes()  # unchanged: no new member detail
    assert member.writes == writes
    load.clear()  # the partition no longer runs lanes: gone from the next scrape
    obs._sample_lanes()
    assert "fence.lanes.busy" not in _points(reader) or not _points(reader)["fence.lanes.busy"]
    assert member.detail["lanes_busy"] == {}
