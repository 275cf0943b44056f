"""Key-ordered lanes inside a partition: the pure decisions (``--lanes N``).

A partition's records at or above its frontier are dispatched to N lanes by key; each lane
applies its records in offset order, in fenced transactions of its own, so records of
different keys run concurrently and records of one key never overtake each other. What the
lanes applied above the frontier is the partition's *completion set*, kept in PostgreSQL in
the same transaction as each lane's effects (``fencing.store``); this module decides
everything about it without I/O.

Rules
- ``lane_of``: a record's lane is a stable hash of its key (CRC-32, the same in every
  process and release) modulo N; a record without a key goes to lane 0, or with
  ``null_any`` to lane ``offset mod N`` (null keys have no order to keep).
- ``Dispatch``: the records of one partition, in offset order and from its frontier on, are
  cut into *spans*: a record's span runs from the offset after the previous dispatched
  record (or the frontier) to its own offset, so the offsets Kafka never delivered (gaps of
  compaction and transaction markers) belong to the next record's span. Applying a record
  means its whole span is done; the union of the applied spans and the frontier's prefix
  leaves no hole where everything was applied.
- ``Completion`` is the durable frontier plus the spans applied above it (disjoint, sorted,
  adjacent ones merged). ``frontier`` (the *effective* frontier) is the end of the
  contiguous prefix: every offset below it is applied or quarantined; Kafka's committed
  offset is it. ``done(offset)`` says whether a successor must skip a record: it seeks to
  the effective frontier and skips every record inside the set.
- The window: no record is dispatched whose span would start at or above ``frontier +
  window`` (a gap of Kafka's wider than the window still lets its next record through);
  the partition waits (its buffer fills and pauses the consumer), it never drops or
  replays.
- ``fold``: the set rewritten with its contiguous prefix moved into the durable frontier
  (what a fold transaction writes); it never loses a span.
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fencing.types import SourceRecord, Token, TopicPartition

__all__ = ["Completion", "Dispatch", "Span", "check_lane", "lane_of", "merge_spans"]

#: (first, last) offsets, both included
Span = tuple[int, int]


def lane_of(key: bytes | None, lanes: int, *, offset: int = 0, null_any: bool = False) -> int:
    """The lane of a record (see the module Rules)."""
    if lanes < 1:
        raise ValueError(f"lanes must be >= 1 (got {lanes})")
    if lanes == 1:
        return 0
    if key is None:
        return offset % lanes if null_any else 0
    return zlib.crc32(key) % lanes


def merge_spans(spans: Iterable[Span]) -> tuple[Span, ...]:
    """Sorted, disjoint spans with adjacent or overlapping ones merged."""
    out: list[list[int]] = []
    for first, last in sorted(spans):
        if first > last:
            raise ValueError(f"span ({first}, {last}) ends before it starts")
        if out and first <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], last)
        else:
            out.append([first, last])
    return tuple((a, b) for a, b in out)


def check_lane(tp: TopicPartition, token: Token, records: Sequence[SourceRecord],
               spans: Sequence[Span]) -> None:
    """Raise ``ValueError`` (the caller's bug) unless ``records`` (one lane's, of ``tp``) are
    in offset order at or above the token's frontier and ``spans`` are theirs: one per
    record, in order, each ending at its record's offset and starting above the previous."""
    if not records or len(spans) != len(records):
        raise ValueError(f"lane {tp}: {len(records)} records and {len(spans)} spans")
    prev = token.frontier - 1
    for rec, (first, last) in zip(records, spans, strict=True):
        if rec.topic != tp.topic or rec.partition != tp.partition:
            raise ValueError(f"lane {tp}: record of {rec.tp} in the batch")
        if last != rec.offset or not prev < first <= last:
            raise ValueError(f"lane {tp}: span ({first}, {last}) of offset {rec.offset} after "
                             f"{prev}")
        prev = last


@dataclass(frozen=True, slots=True)
class Completion:
    """A partition's durable frontier and the spans applied above it (module Rules);
    ``epoch``: the partition row's, when read from a store."""

    base: int  # the durable frontier of the partition row
    spans: tuple[Span, ...] = ()
    epoch: int = 0

    @classmethod
    def of(cls, base: int, spans: Iterable[Span], *, epoch: int = 0) -> Completion:
        """The set from a frontier and spans read back (below ``base`` dropped, merged)."""
        kept = [(max(a, base), b) for a, b in spans if b >= base]
        return cls(base, merge_spans(kept), epoch)

    @property
    def frontier(self) -> int:
        """The effective frontier: the end of the contiguous prefix from ``base``."""
        if self.spans and self.spans[0][0] <= self.base:
            return self.spans[0][1] + 1
        return self.base

    def done(self, offset: int) -> bool:
        """True when ``offset`` is below the effective frontier or inside a span."""
        if offset < self.base:
            return True
        i = bisect.bisect_right(self.spans, (offset, float("inf"))) - 1
        return i >= 0 and self.spans[i][0] <= offset <= self.spans[i][1]

    def with_spans(self, spans: Iterable[Span]) -> Completion:
        """The set after ``spans`` were applied (committed)."""
        return Completion(self.base, merge_spans((*self.spans, *spans)), self.epoch)

    def fold(self) -> Completion:
        """The contiguous prefix moved into the base (what a fold writes)."""
        frontier = self.frontier
        return Completion(frontier, tuple(s for s in self.spans if s[0] > frontier), self.epoch)

    @property
    def above(self) -> int:
        """How far the highest applied offset is above the effective frontier (0: none):
        what the window bounds."""
        return self.spans[-1][1] + 1 - self.frontier if self.spans and \
            self.spans[-1][1] >= self.frontier else 0


class Dispatch:
    """Cuts one partition's records into lanes and spans (module Rules); one per partition
    and lifetime, from the effective frontier the claim returned."""

    def __init__(self, completion: Completion, lanes: int, *, window: int,
                 null_any: bool = False) -> None:
        if window < 1:
            raise ValueError(f"lanes window must be >= 1 (got {window})")
        self.lanes = lanes
        self.window = window
        self.null_any = null_any
        self.completion = completion
        self.next_offset = completion.frontier  # the first offset no span covers yet

    def room(self) -> int:
        """The first offset that must wait for the effective frontier to move (the window)."""
        return self.completion.frontier + self.window

    def take(self, records: Sequence[SourceRecord]
             ) -> tuple[list[tuple[int, SourceRecord, Span]], int]:
        """Dispatch ``records`` (in offset order, of this partition) up to the window:
        ``(lane, record, span)`` for each record to apply, and how many of ``records`` were
        consumed (the rest wait for room). Records below the next offset are dropped (already
        dispatched or durable); records the completion set holds are consumed without a lane
        (a predecessor applied them)."""
        out: list[tuple[int, SourceRecord, Span]] = []
        room = self.room()
        used = 0
        for rec in records:
            if rec.offset < self.next_offset:
                used += 1
                continue
            if self.next_offset >= room:  # its span would start past the window
                break
            span = (self.next_offset, rec.offset)
            self.next_offset = rec.offset + 1
            used += 1
            if self.completion.done(rec.offset):
                continue
            out.append((lane_of(rec.key, self.lanes, offset=rec.offset,
                                null_any=self.null_any), rec, span))
        return out, used

    def applied(self, spans: Iterable[Span]) -> int:
        """Record committed spans; return the effective frontier after them."""
        self.completion = self.completion.with_spans(spans)
        return self.completion.frontier
