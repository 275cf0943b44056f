"""consumer.kafka.adapter: librdkafka's fatal errors, static membership's in particular (no
broker: the errors are built as consume() reports them, code _FATAL with the cause's text)."""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import KafkaError

from consumer.kafka.adapter import KafkaThread
from fencing.errors import InstanceFenced, KafkaClientFailed
from fencing.types import SourceRecord, TopicPartition


class Recorder:
    def __init__(self) -> None:
        self.failures: list[BaseException] = []

    def assigned(self, tps: list[TopicPartition]) -> dict[TopicPartition, int] | None:
        return {}

    def revoked(self, tps: list[TopicPartition]) -> None: ...

    def lost(self, tps: list[TopicPartition]) -> None: ...

    def deliver(self, take: Callable[[], list[SourceRecord]],
                release: Callable[[], None]) -> None: ...

    def failed(self, exc: BaseException) -> None:
        self.failures.append(exc)

    def kafka_outcome(self, answered: bool, what: str) -> None: ...


def _fatal(code: int) -> KafkaError:
    text = KafkaError(code).str()
    return KafkaError(KafkaError._FATAL, f"Fatal error: {text}: Fatal consumer error: {text}")


def _thread(clock: Callable[[], float], bound_s: float = 10.0) -> tuple[KafkaThread, Recorder]:
    rb = Recorder()
    t = KafkaThread(settings={"group.instance.id": "member-a"}, topic="t", cooperative=True,
                    rebalancer=rb, clock=clock, outage_bound_s=bound_s)
    return t, rb


def test_a_fatal_message_error_is_fatal_although_its_fatal_flag_is_false() -> None:
    t, rb = _thread(lambda: 0.0)
    err = KafkaError(KafkaError._FATAL, "Fatal error: something else")
    assert not err.fatal()  # as consume() hands it over
    t._consumer_error(err, None)
    assert len(rb.failures) == 1 and isinstance(rb.failures[0], KafkaClientFailed)


def test_fenced_instance_id_is_instance_fenced() -> None:
    t, rb = _thread(lambda: 0.0)
    t._consumer_error(_fatal(KafkaError.FENCED_INSTANCE_ID), None)
    assert len(rb.failures) == 1 and isinstance(rb.failures[0], InstanceFenced)
    assert "--instance-id member-a" in str(rb.failures[0])


def test_unreleased_instance_id_joins_again_within_the_bound_then_fails() -> None:
    now = [0.0]
    t, rb = _thread(lambda: now[0], bound_s=10.0)
    waits = []
    for _ in range(20):
        t._consumer_error(_fatal(KafkaError.UNRELEASED_INSTANCE_ID), None)
        if rb.failures:
            break
        assert t._rejoin_due
        waits.append(t._rejoin_wait_s)
        t._rejoin_due = False
        now[0] += t._rejoin_wait_s
    assert waits[:3] == [0.5, 1.0, 2.0] and sum(waits) == 10.0
    assert len(rb.failures) == 1 and isinstance(rb.failures[0], KafkaClientFailed)
    assert "still held by another member of the group after 10 s" in str(rb.failures[0])


def test_unreleased_after_an_assignment_means_another_process_took_the_id() -> None:
    t, rb = _thread(lambda: 0.0)
    t._ever_assigned = True
    t._consumer_error(_fatal(KafkaError.UNRELEASED_INSTANCE_ID), None)
    assert len(rb.failures) == 1 and isinstance(rb.failures[0], InstanceFenced)
