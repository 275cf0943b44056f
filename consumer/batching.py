"""Per-partition buffering, batch cutting and pause/resume decisions (pure, no I/O).

Rules
- A partition's buffer holds records in offset order, strictly increasing; a record at or
  below the last accepted offset, or below the expected position after a (re)assignment,
  is dropped (it belongs to an older position: librdkafka may still deliver it).
- ``take_batch`` cuts at most ``max_records`` records and at most ``max_bytes`` bytes of
  key+value, but always at least one record (a single record larger than the byte bound
  forms a batch of one).
- Linger: a batch may wait for more records only while it is not full (count or bytes),
  and never past ``linger_s`` after its oldest buffered record arrived (``linger_left_s``):
  a partition with records buffered and nothing else coming starts its batch within the
  linger (Kafka's producer lingers the same way, ``linger.ms``).
- Backpressure has hysteresis: ``PAUSE`` once the buffer reaches the queue bound (records
  or bytes), ``RESUME`` only once it has drained to half of both; a partition therefore
  never flaps and its memory is bounded by the queue bound plus one consume() call.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fencing.types import SourceRecord

__all__ = ["Flow", "InFlight", "PartitionBuffer", "in_flight_of", "record_size"]


class Flow(enum.Enum):
    """What the consumer should do with a partition's fetching."""

    KEEP = "keep"
    PAUSE = "pause"
    RESUME = "resume"


def record_size(rec: SourceRecord) -> int:
    """Bytes a record counts for in batch and queue bounds: key + value + header values."""
    key, value, headers = rec.key, rec.value, rec.headers
    size = (len(key) if key is not None else 0) + (len(value) if value is not None else 0)
    if headers:
        for name, hv in headers:
            size += len(name) + (len(hv) if hv is not None else 0)
    return size


@dataclass(frozen=True, slots=True)
class InFlight:
    """A batch handed to the store and not yet answered: what shutdown reports if it overruns."""

    topic: str
    partition: int
    first_offset: int
    last_offset: int
    records: int

    def describe(self) -> str:
        return (f"{self.topic}[{self.partition}] offsets {self.first_offset}..{self.last_offset}"
                f" ({self.records} records)")


class PartitionBuffer:
    """Records fetched for one partition and not yet taken into a batch."""

    __slots__ = ("_bytes", "_records", "_since_s", "max_bytes", "max_records", "next_offset",
                 "paused", "queue_max_bytes", "queue_max_records")

    def __init__(self, *, next_offset: int, max_records: int, max_bytes: int,
                 queue_max_records: int, queue_max_bytes: int) -> None:
        self._records: deque[tuple[SourceRecord, int]] = deque()
        self._bytes = 0
        self._since_s: float | None = None  # when the oldest buffered record arrived
        self.next_offset = next_offset
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.queue_max_records = queue_max_records
        self.queue_max_bytes = queue_max_bytes
        self.paused = False

    def __len__(self) -> int:
        return len(self._records)

    @property
    def buffered_bytes(self) -> int:
        return self._bytes

    def add(self, records: Iterable[SourceRecord], now_s: float = 0.0) -> int:
        """Append records in order, arrived at ``now_s``; return how many were dropped as
        stale."""
        dropped = added = 0
        append, next_offset = self._records.append, self.next_offset  # per record: locals
        for rec in records:
            offset = rec.offset
            if offset < next_offset:
                dropped += 1
                continue
            size = record_size(rec)
            append((rec, size))
            added += size
            next_offset = offset + 1
        if added and self._since_s is None:
            self._since_s = now_s
        self._bytes += added
        self.next_offset = next_offset
        return dropped

    def take_batch(self) -> list[SourceRecord]:
        """Remove and return the next batch (possibly empty), bounded by count and bytes."""
        batch: list[SourceRecord] = []
        size_total = 0
        queue, max_bytes = self._records, self.max_bytes  # per record: locals
        for _ in range(min(len(queue), self.max_records)):
            rec, size = queue[0]
            if batch and size_total + size > max_bytes:
                break
            queue.popleft()
            batch.append(rec)
            size_total += size
        self._bytes -= size_total
        if not queue:
            self._since_s = None  # what stays arrived before: its linger already runs
        return batch

    @property
    def full(self) -> bool:
        """The next batch is full (by count or bytes): it waits for no more records."""
        return len(self._records) >= self.max_records or self._bytes >= self.max_bytes

    def linger_left_s(self, now_s: float, linger_s: float) -> float:
        """Seconds the next batch may still wait for more records: 0 when it is full (by
        count or bytes) or its oldest record arrived ``linger_s`` ago (see the Rules)."""
        if self._since_s is None or linger_s <= 0 or self.full:
            return 0.0
        return max(self._since_s + linger_s - now_s, 0.0)

    def flow(self) -> Flow:
        """Decide pause/resume from the buffer's fill, remembering the decision."""
        full = (len(self._records) >= self.queue_max_records
                or self._bytes >= self.queue_max_bytes)
        drained = (len(self._records) <= self.queue_max_records // 2
                   and self._bytes <= self.queue_max_bytes // 2)
        if not self.paused and full:
            self.paused = True
            return Flow.PAUSE
        if self.paused and drained:
            self.paused = False
            return Flow.RESUME
        return Flow.KEEP

    def clear(self) -> None:
        self._records.clear()
        self._bytes = 0
        self._since_s = None


def in_flight_of(records: Sequence[SourceRecord]) -> InFlight:
    """The ``InFlight`` description of a non-empty batch."""
    first, last = records[0], records[-1]
    return InFlight(first.topic, first.partition, first.offset, last.offset, len(records))
