"""Seeded generator of reference-domain source records.

Rules
- ``generate(seed, count=, partitions=, klass=, topic=)`` is a pure function of its
  arguments: it draws only from ``random.Random(seed)`` (never the global random).
- A record's partition is ``partition_for(key, partitions)``: CRC-32 of the key bytes
  modulo the partition count, so one document stays in one partition.
- ``valid``: every record is accepted when folded in order (puts at rev 1, then
  corrections and withdrawals at current + 1; nothing after a withdrawal).
- ``conflict``: about 60% valid changes mixed with stale and skipped revisions, changes
  of missing documents, changes after withdrawal, exact duplicates of earlier records,
  puts of existing documents, and malformed records (bad UTF-8, not JSON, wrong
  shapes, unknown kinds, bad keys). Which ones are rejected is for the oracle to say.
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from fencing.types import SourceRecord

__all__ = ["CLASSES", "GeneratedRecord", "generate", "partition_for", "to_source_records"]

Klass = Literal["valid", "conflict"]
CLASSES: tuple[str, ...] = ("valid", "conflict")


@dataclass(frozen=True, slots=True)
class GeneratedRecord:
    """One source record before it is produced: Kafka assigns the offset."""

    topic: str
    partition: int
    key: bytes
    value: bytes


def partition_for(key: bytes, partitions: int) -> int:
    """The generator's partition of a key: CRC-32 of the key bytes modulo ``partitions``."""
    return zlib.crc32(key) % partitions


def to_source_records(records: Sequence[GeneratedRecord]) -> list[SourceRecord]:
    """The records as a fresh topic would hold them: offsets 0, 1, 2, ... per partition."""
    next_offset: dict[int, int] = {}
    out: list[SourceRecord] = []
    for r in records:
        off = next_offset.get(r.partition, 0)
        next_offset[r.partition] = off + 1
        out.append(SourceRecord(r.topic, r.partition, off, r.key, r.value))
    return out


def _value(kind: str, rev: int, body: str | None = None) -> bytes:
    """Compact JSON, byte-identical to ``json.dumps(obj, separators=(",", ":"))``."""
    if body is None:
        return f'{{"kind":"{kind}","rev":{rev}}}'.encode()
    return f'{{"kind":"{kind}","rev":{rev},"body":{json.dumps(body)}}}'.encode()


class _Ledger:
    """The generator's own view of the documents (the changes it meant to be valid)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.revision: dict[str, int] = {}
        self.live: list[str] = []  # not withdrawn
        self.withdrawn: list[str] = []
        self.created = 0

    def body(self, doc: str, rev: int) -> str:
        return f"{doc} r{rev} {self.rng.randrange(1 << 30):08x}"

    def valid(self) -> tuple[str, bytes]:
        rng = self.rng
        if not self.live or len(self.live) < 8 or rng.random() < 0.25:
            self.created += 1
            doc = f"doc-{self.created:07d}"
            self.revision[doc] = 1
            self.live.append(doc)
            return doc, _value("put", 1, self.body(doc, 1))
        i = rng.randrange(len(self.live))
        doc = self.live[i]
        rev = self.revision[doc] + 1
        self.revision[doc] = rev
        if rng.random() < 0.08:
            self.live[i] = self.live[-1]
            self.live.pop()
            self.withdrawn.append(doc)
            return doc, _value("withdraw", rev)
        return doc, _value("correct", rev, self.body(doc, rev))

    def conflict(self, history: list[tuple[str, bytes]]) -> tuple[str, bytes]:
        rng = self.rng
        pick = rng.randrange(8)
        if pick == 0 and self.live:
            doc = rng.choice(self.live)
            rev = rng.randint(1, self.revision[doc])
            return doc, _value(rng.choice(("correct", "withdraw")), rev, self.body(doc, rev))
        if pick == 1 and self.live:
            doc = rng.choice(self.live)
            rev = self.revision[doc] + rng.randint(2, 5)
            return doc, _value("correct", rev, self.body(doc, rev))
        if pick == 2:
            doc = f"ghost-{rng.randrange(10**6):06d}"
            kind = rng.choice(("correct", "withdraw", "put"))
            return doc, _value(kind, rng.randint(2 if kind == "put" else 1, 4), "x")
        if pick == 3 and self.withdrawn:
            doc = rng.choice(self.withdrawn)
            rev = self.revision[doc] + 1
            return doc, _value(rng.choice(("correct", "withdraw", "put")), rev, "after")
        if pick == 4 and history:
            return rng.choice(history)
        if pick == 5 and self.live:
            doc = rng.choice(self.live)
            return doc, _value("put", rng.choice((1, 2)), "again")
        return self.malformed()

    def malformed(self) -> tuple[str, bytes]:
        rng = self.rng
        doc = rng.choice(self.live) if self.live else "doc-0000000"
        options: list[bytes] = [
            b"\xff\xfe not utf-8",
            b"{not json",
            b"",
            b"[1, 2, 3]",
            b'{"kind": "publish", "rev": 1, "body": "x"}',
            b'{"kind": "correct", "body": "no rev"}',
            b'{"kind": "correct", "rev": "2", "body": "x"}',
            b'{"kind": "correct", "rev": 0, "body": "x"}',
            b'{"kind": "put", "rev": 1}',
            b'{"kind": "put", "rev": 1, "body": 7}',
            b'{"kind": "put", "rev": 1, "body": "nul \\u0000 inside"}',
            b'{"kind": "put", "rev": 1, "body": "lone \\ud800"}',
            b'{"kind": "put", "rev": true, "body": "x"}',
        ]
        i = rng.randrange(len(options) + 2)
        if i == len(options):
            return "\udcff", _value("put", 1, "bad key")  # key bytes are not UTF-8
        if i == len(options) + 1:
            return "", _value("put", 1, "empty key")
        return doc, options[i]


def _key_bytes(doc: str) -> bytes:
    return doc.encode("utf-8", "surrogateescape")


def generate(
    seed: int, *, count: int, partitions: int, klass: Klass, topic: str
) -> list[GeneratedRecord]:
    """``count`` records of class ``klass`` for ``topic``, deterministic in all arguments."""
    if klass not in CLASSES:
        raise ValueError(f"klass {klass!r}: expected one of {CLASSES}")
    if count < 0 or partitions < 1:
        raise ValueError("count must be >= 0 and partitions >= 1")
    rng = random.Random(seed)
    ledger = _Ledger(rng)
    history: list[tuple[str, bytes]] = []
    out: list[GeneratedRecord] = []
    for _ in range(count):
        if klass == "conflict" and rng.random() < 0.4:
            doc, value = ledger.conflict(history)
        else:
            doc, value = ledger.valid()
            if len(history) < 4096:
                history.append((doc, value))
            else:
                history[rng.randrange(4096)] = (doc, value)
        key = _key_bytes(doc)
        out.append(GeneratedRecord(topic, partition_for(key, partitions), key, value))
    return out
