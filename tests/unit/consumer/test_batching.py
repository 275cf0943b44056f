"""Per-partition buffer: stale drops, count/byte bounds, pause/resume hysteresis."""

from __future__ import annotations

import pytest

from consumer.batching import Flow, PartitionBuffer, in_flight_of, record_size
from fencing.types import SourceRecord


def rec(offset: int, size: int = 10, partition: int = 0) -> SourceRecord:
    return SourceRecord("t", partition, offset, b"k", b"v" * (size - 1))


def buf(**kw: int) -> PartitionBuffer:
    args = dict(next_offset=0, max_records=3, max_bytes=1000, queue_max_records=6,
                queue_max_bytes=10_000)
    args.update(kw)
    return PartitionBuffer(**args)


def test_record_size_counts_key_value_headers() -> None:
    r = SourceRecord("t", 0, 0, b"ab", b"cde", (("tp", b"xyz"),))
    assert record_size(r) == 2 + 3 + 2 + 3


def test_batches_bounded_by_count() -> None:
    b = buf()
    b.add(rec(i) for i in range(7))
    assert [len(b.take_batch()) for _ in range(4)] == [3, 3, 1, 0]


def test_batches_bounded_by_bytes_but_never_empty() -> None:
    b = buf(max_records=100, max_bytes=25)
    b.add([rec(0, 10), rec(1, 10), rec(2, 10), rec(3, 100)])
    assert [r.offset for r in b.take_batch()] == [0, 1]
    assert [r.offset for r in b.take_batch()] == [2]
    assert [r.offset for r in b.take_batch()] == [3]  # larger than the bound: a batch of one
    assert b.buffered_bytes == 0


def test_stale_and_duplicate_records_are_dropped() -> None:
    b = buf(next_offset=5)
    assert b.add([rec(3), rec(4), rec(5), rec(5), rec(8)]) == 3
    assert [r.offset for r in b.take_batch()] == [5, 8]
    assert b.next_offset == 9


def test_pause_at_bound_resume_at_half() -> None:
    b = buf()
    b.add(rec(i) for i in range(5))
    assert b.flow() is Flow.KEEP
    b.add([rec(5)])
    assert b.flow() is Flow.PAUSE
    assert b.flow() is Flow.KEEP  # remembered
    b.take_batch()  # 3 left: exactly half
    assert b.flow() is Flow.RESUME
    assert b.flow() is Flow.KEEP


def test_pause_on_bytes() -> None:
    b = buf(queue_max_bytes=50, queue_max_records=1000)
    b.add([rec(0, 30), rec(1, 30)])
    assert b.flow() is Flow.PAUSE
    b.take_batch()
    assert b.flow() is Flow.RESUME


def test_memory_stays_bounded_under_any_backlog() -> None:
    """Feeding only while not paused keeps the buffer within bound + one delivery."""
    b = buf(max_records=10, queue_max_records=40)
    offset, peak, paused = 0, 0, False
    for step in range(10_000):
        if not paused:
            b.add(rec(offset + i) for i in range(7))  # one consume() call
            offset += 7
        if step % 3 == 0:
            b.take_batch()
        flow = b.flow()
        paused = flow is Flow.PAUSE or (paused and flow is not Flow.RESUME)
        peak = max(peak, len(b))
    assert peak <= 40 + 7


def test_in_flight_describes_batch() -> None:
    i = in_flight_of([rec(4), rec(9)])
    assert (i.first_offset, i.last_offset, i.records) == (4, 9, 2)
    assert "t[0] offsets 4..9" in i.describe()


def test_clear() -> None:
    b = buf()
    b.add(rec(i) for i in range(4))
    b.clear()
    assert len(b) == 0 and b.buffered_bytes == 0


def test_linger_counts_from_the_oldest_buffered_record() -> None:
    b = buf(max_records=10)
    assert b.linger_left_s(5.0, 0.005) == 0.0  # empty: nothing waits
    b.add([rec(0)], now_s=1.000)
    b.add([rec(1)], now_s=1.003)  # a later arrival does not restart the linger
    assert b.linger_left_s(1.003, 0.005) == pytest.approx(0.002)
    assert b.linger_left_s(1.006, 0.005) == 0.0  # past the linger: go
    assert b.linger_left_s(1.003, 0.0) == 0.0  # no linger
    b.take_batch()
    b.add([rec(2)], now_s=2.0)  # emptied, then a new oldest record
    assert b.linger_left_s(2.001, 0.005) == pytest.approx(0.004)


def test_a_full_batch_never_lingers() -> None:
    by_count = buf(max_records=3)
    by_count.add([rec(0), rec(1), rec(2)], now_s=1.0)
    assert by_count.linger_left_s(1.0, 0.5) == 0.0
    by_bytes = buf(max_records=100, max_bytes=20)
    assert not by_bytes.full
    by_bytes.add([rec(0), rec(1)], now_s=1.0)  # 2 x 10 bytes
    assert by_bytes.linger_left_s(1.0, 0.5) == 0.0
    assert by_count.full and by_bytes.full
    by_count.take_batch()
    assert not by_count.full


def test_records_left_after_a_batch_keep_their_arrival() -> None:
    b = buf(max_records=2)
    b.add([rec(0), rec(1), rec(2)], now_s=1.0)
    assert len(b.take_batch()) == 2
    assert b.linger_left_s(1.001, 0.005) == pytest.approx(0.004)  # since 1.0, not now
    b.clear()
    assert b.linger_left_s(1.001, 0.005) == 0.0
