"""Rows, logs and the handler transaction of the in-memory store (see ``fencing.memory.store``)."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from fencing.types import TopicPartition

__all__ = [
    "JournalRow", "MemberRow", "MemoryTx", "QuarantineRow", "Row", "StoreEvent", "WriteRecord",
]


@dataclass(frozen=True, slots=True)
class Row:
    """A partition row: epoch, frontier (next offset), owner (last claimer) and topic identity."""

    epoch: int
    frontier: int
    owner: str | None
    topic_id: str | None
    updated_s: float


@dataclass(frozen=True, slots=True)
class JournalRow:
    tp: TopicPartition
    lifetime: str
    event: str
    epoch: int | None
    detail: str
    at_s: float


@dataclass(frozen=True, slots=True)
class QuarantineRow:
    tp: TopicPartition
    offset: int
    reason: str
    epoch: int
    key: bytes | None
    value: bytes | None
    error_type: str | None = None
    traceback_digest: str | None = None


@dataclass(frozen=True, slots=True)
class WriteRecord:
    """One durable write: ``kind`` is claim | process | skip | journal | lane | fold;
    ``lifetime`` the writer."""

    kind: str
    tp: TopicPartition
    lifetime: str | None
    epoch: int | None
    attempt: str
    event: str = ""  # the journal event (claim rows are journaled by the claim itself)
    skipped: tuple[int, int] | None = None  # a skip: the offsets [from, to) given up
    spans: tuple[tuple[int, int], ...] = ()  # a lane: the spans it applied, in its order


@dataclass(frozen=True, slots=True)
class StoreEvent:
    """One store call as seen by the model: requested fault, applied effect, observation."""

    attempt: str
    operation: str
    call: int
    requested: str | None
    delay_ms: int
    interleave: str | None
    applied: bool
    observed: str
    at_s: float
    installed: tuple[tuple[str, int, int], ...]
    started_s: float = 0.0  # when the call began (before its injected delay)
    partition: int | None = None  # process: the batch's partition


class MemoryTx:
    """The handler's ``conn``: copy-on-write tables, committed only by the store."""

    __slots__ = ("_base", "_changed", "group_id")

    def __init__(self, group_id: str, base: Mapping[str, dict[Any, Any]]) -> None:
        self.group_id = group_id
        self._base = base
        self._changed: dict[str, dict[Any, Any]] = {}

    def table(self, name: str) -> MutableMapping[Any, Any]:
        """The transaction's mutable copy of table ``name`` (created empty if missing)."""
        if name not in self._changed:
            self._changed[name] = dict(self._base.get(name, {}))
        return self._changed[name]


@dataclass(frozen=True, slots=True)
class MemberRow:
    """One worker lifetime as ``heartbeat`` last saw it (``last_seen_s`` by the store clock)."""

    lifetime: str
    member_id: str | None
    host: str
    pid: int
    state: str
    detail: Mapping[str, Any]
    last_seen_s: float
