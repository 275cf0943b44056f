"""The fence store interface. Two implementations share it and one contract test suite:
``fencing.postgres.store.PgFenceStore`` (asyncpg, production) and
``fencing.memory.store.MemoryFenceStore`` (unit tests and the simulator, with fault hooks).

Rules
- Every call is about one consumer group: the store is constructed for ``group_id``.
- ``validate`` and ``observe`` are read-only; they raise ``ReadFailed`` when the store
  cannot answer. ``observe(..., settled=True)`` first waits (bounded) until no transaction
  holds the rows, so it sees the outcome of a COMMIT still being processed; it resolves
  lost COMMIT replies.
- ``claim`` is one statement for the whole assignment: for every partition, create the
  row if missing (frontier := ``initial_frontier``), ``epoch := epoch + 1``,
  ``owner := lifetime``, journal the claim. Raises ``NotCommitted`` or ``OutcomeUnknown``.
- ``process`` is one transaction for one ``BatchCall``: lock the row, require ``token``
  (epoch and frontier) to match, run the call's handler over its records in order,
  quarantine rejected records, set ``frontier := last offset + 1``, COMMIT. Returns the new
  token. Raises ``Fenced`` (nothing applied), ``NotCommitted`` or ``OutcomeUnknown``.
- ``LaneStore`` (both stores; ``fencing.lanes``): ``process_lane`` is one lane's
  transaction: the partition's epoch required under a share lock (lanes of a partition
  run side by side; a claim waits for every one in flight, then fences them), the
  handler over the lane's records (offset order, at or above the frontier, not
  contiguous), their rejects quarantined and their spans written, COMMIT; the frontier
  does not move. Raises ``Fenced`` (nothing applied), ``HandlerFailed``, ``NotCommitted``
  or ``OutcomeUnknown``. ``completions`` reads each partition's frontier, epoch and spans
  (``settled``: as ``observe``). ``fold`` moves the frontier under the token to
  ``to_frontier`` and deletes the spans wholly below it.
- ``skip`` is ``process`` without records: under the token, move the frontier forward to
  ``to_offset`` and journal ``reason`` (retention gap accepted by the operator's option).
- A handler exception is raised as ``HandlerFailed`` (transient or poison; nothing
  applied), except where it means the lifetime must stop (handler misuse, a deployment
  error such as an undefined table). A call with ``clear_attempts`` also deletes the
  partition's durable attempt counts below the batch end, in the same transaction.
- ``AttemptStore`` (both stores): ``record_attempt`` counts one attempt of an offset under
  the token in its own committed write (``alone``: an attempt of the record with nothing
  else of its process in flight); ``record_intent`` writes the intent of an
  ``outcome-uncertain`` batch (from the token's frontier to its last offset) under the token
  in its own committed write, replacing the partition's previous one; ``attempts`` reads the
  failure marks at claim (``fencing.failures.Attempts``).
- ``ResetStore`` (both stores): ``operator_reset`` reads whether every epoch of a
  partition above a given one was installed by an operator's ``fencectl reset`` (the row's
  owner is an operator and no member journaled a claim above that epoch), so a live owner
  fenced by the operator claims it again instead of retiring; ``heartbeat`` upserts the
  member row and returns the group's partitions whose owner is an operator now (one
  statement: an idle worker learns of a reset without another query).
- ``journal`` appends an ownership-journal row (fence, retirement, release); it never
  decides anything and is best-effort for the caller.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from fencing.failures import Attempts
from fencing.lanes import Completion, Span
from fencing.types import (
    ClaimRequest,
    SourceCheck,
    SourceRecord,
    Token,
    TopicPartition,
    Validation,
    Verdict,
)

__all__ = ["JOURNAL_EVENTS", "AttemptStore", "BatchCall", "FenceStore", "HandlerFn",
           "LaneStore", "ResetStore"]

# An effect handler: given the transaction's connection (asyncpg Connection for the
# PostgreSQL store, a MemoryTx for the in-memory store) and the batch, returns one
# verdict per record, in order.
HandlerFn = Callable[[Any, Sequence[SourceRecord]], Awaitable[Sequence[Verdict]]]

JOURNAL_EVENTS = ("claim", "fence", "retire", "release", "gap-skip", "reset", "adopt")


@dataclass(frozen=True, slots=True)
class BatchCall:
    """One batch call, as the failure handling submits it to ``Lifecycle.process`` and as
    ``guarded_process`` hands it to ``FenceStore.process``: one partition's records (in
    offset order), the handler that applies them, and how the call runs. A layer that
    narrows the records or wraps the handler passes on a ``dataclasses.replace`` of it."""

    tp: TopicPartition
    records: Sequence[SourceRecord]
    handler: HandlerFn
    links: Sequence[object] = ()  # producer spans the batch's ``fence.process`` span links
    clear_attempts: bool = False  # the transaction deletes the attempt counts it moves past
    uncertain: bool = False  # an outcome-uncertain handler: intent first, run at most once


@runtime_checkable
class FenceStore(Protocol):
    group_id: str

    async def validate(
        self, checks: Sequence[SourceCheck]
    ) -> Mapping[TopicPartition, Validation]: ...

    async def claim(
        self, claims: Sequence[ClaimRequest], *, lifetime: str
    ) -> Mapping[TopicPartition, Token]: ...

    async def observe(
        self, tps: Sequence[TopicPartition], *, settled: bool = False
    ) -> Mapping[TopicPartition, Token | None]: ...

    async def process(self, call: BatchCall, token: Token) -> Token: ...

    async def skip(
        self, tp: TopicPartition, token: Token, *, to_offset: int, reason: str
    ) -> Token: ...

    async def journal(
        self,
        tps: Sequence[TopicPartition],
        *,
        lifetime: str,
        event: str,
        epoch: int | None = None,
        detail: str = "",
    ) -> None: ...


@runtime_checkable
class LaneStore(Protocol):
    """Key-ordered lanes inside a partition (``fencing.lanes``; see the module Rules)."""

    async def process_lane(self, call: BatchCall, token: Token,
                           spans: Sequence[Span]) -> None: ...

    async def completions(self, tps: Sequence[TopicPartition], *,
                          settled: bool = False) -> Mapping[TopicPartition, Completion | None]: ...

    async def fold(self, tp: TopicPartition, token: Token, *, to_frontier: int) -> Token: ...


@runtime_checkable
class AttemptStore(Protocol):
    """Durable attempt counts of failing offsets and intents of outcome-uncertain batches
    (``fencing.failures``)."""

    async def record_attempt(self, tp: TopicPartition, token: Token, *, offset: int,
                             max_attempts: int, error: str | None,
                             next_retry_in_s: float | None,
                             at_least: int = 1, alone: bool = False) -> Attempts: ...

    async def record_intent(self, tp: TopicPartition, token: Token, *,
                            last_offset: int) -> None: ...

    async def attempts(self, tokens: Mapping[TopicPartition, Token]
                       ) -> Mapping[TopicPartition, Attempts]: ...


@runtime_checkable
class ResetStore(Protocol):
    """Operator resets seen by the owner they fenced (see the module Rules)."""

    async def operator_reset(self, tp: TopicPartition, *, epoch: int) -> bool: ...

    async def heartbeat(self, *, lifetime: str, member_id: str | None, host: str, pid: int,
                        state: str, detail: Mapping[str, Any] | None = None
                        ) -> frozenset[TopicPartition]: ...
