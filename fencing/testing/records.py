"""Records for the handler test kit, without Kafka."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable
from typing import Any

from fencing.types import SourceRecord

__all__ = ["json_records"]


def json_records(topic: str, items: Iterable[tuple[str | None, Any]], *,
                 partitions: int = 1) -> list[SourceRecord]:
    """``(key, value)`` pairs -> records as a producer would write them: the value as JSON
    (``None``: a tombstone), the partition from the key (crc32, like a keyed producer; no key:
    round robin), offsets counting from 0 per partition."""
    if partitions < 1:
        raise ValueError("partitions must be at least 1")
    next_offset = [0] * partitions
    out = []
    for n, (key, value) in enumerate(items):
        p = n % partitions if key is None else zlib.crc32(key.encode()) % partitions
        out.append(SourceRecord(
            topic, p, next_offset[p], None if key is None else key.encode(),
            None if value is None else json.dumps(value).encode(),
            timestamp_ms=1_700_000_000_000 + n))
        next_offset[p] += 1
    return out
