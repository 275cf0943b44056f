"""The in-memory fence store: the ``FenceStore`` semantics without a database, plus fault hooks.

Long because every modeled persistence boundary carries its fault and interleave hooks,
which the simulator selects per call.

Rules
- Same contract as ``fencing.store`` (epochs start at 0, one claim call for the whole
  assignment, ``process`` is one transaction); rows, journal, quarantine, members and
  handler tables live in this object. Values stored in handler tables must be immutable.
- A handler gets a ``MemoryTx`` as ``conn``: ``conn.table(name)`` is a copy-on-write
  mapping; its changes become visible only when the transaction commits.
- ``process`` holds the partition's row lock while the handler runs (like ``SELECT ... FOR
  UPDATE``); ``claim`` takes the row locks of all its partitions in sorted order.
- Faults are selected per attempt (``begin_attempt`` / ``attempt``): an operation
  (validate, claim, observe, process, skip, journal, heartbeat), the call number of that
  operation within the attempt, an outcome, an optional logical delay and an optional
  interleave point.
  The effect point checks the storage fence first: a fence or a cancellation is never
  overridden by a fault; every call logs the requested outcome, whether the effect was
  applied and what the caller observed, separately (``events``).
- ``interleave_hook`` (if set) is awaited before and after the atomic effect of every
  claim and process and before every read (``skip``, ``journal`` and ``heartbeat`` have
  faults and events but no interleave hook);
  cancellation is honoured at each of these points.
- Handler exceptions become ``HandlerFailed`` (transient only for a ``Transient``);
  attempt counts live in ``attempt_rows`` and intents in ``intent_rows`` (``AttemptStore``),
  read and written without faults or events (the simulator models no handler failures).
- ``writes`` lists every durable write (claim, process, skip, journal) in order.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from fencing.errors import (
    Fenced,
    NotCommitted,
    OutcomeUnknown,
    ReadFailed,
)
from fencing.failures import SUSPECT_OPEN, Attempts, handler_failure
from fencing.handler import check_verdicts
from fencing.lanes import Completion, Span, check_lane
from fencing.memory.faults import Fault, FaultOutcome, InterleavePoint, Operation
from fencing.memory.rows import (
    JournalRow,
    MemberRow,
    MemoryTx,
    QuarantineRow,
    Row,
    StoreEvent,
    WriteRecord,
)
from fencing.resolution import batch_end, decide_validation
from fencing.store import JOURNAL_EVENTS, BatchCall
from fencing.types import (
    ClaimRequest,
    Reject,
    SourceCheck,
    SourceRecord,
    Token,
    TopicPartition,
    Validation,
    operator_owned,
)

__all__ = [
    "JournalRow",
    "MemberRow",
    "MemoryFenceStore",
    "MemoryTx",
    "QuarantineRow",
    "Row",
    "StoreEvent",
    "WriteRecord",
]


@dataclass(slots=True)
class _Frame:
    label: str
    faults: tuple[Fault, ...]
    store: object
    calls: dict[str, int] = field(default_factory=dict)


# the nested attempt of the current task (asyncio copies it into the tasks it starts), so a
# batch already in flight is never counted in a replacement's attempt
_FRAME: contextvars.ContextVar[_Frame | None] = contextvars.ContextVar(
    "memory_store_frame", default=None)


_Effect = Callable[[Fault | None, str, dict[str, bool], int], Awaitable[Any]]


async def _no_wait(_seconds: float) -> None:
    await asyncio.sleep(0)


class MemoryFenceStore:
    """In-memory ``FenceStore`` for one consumer group; see the module Rules."""

    def __init__(
        self,
        group_id: str,
        *,
        clock: Callable[[], float] | None = None,
        wait: Callable[[float], Awaitable[None]] | None = None,
        on_event: Callable[[StoreEvent], None] | None = None,
    ) -> None:
        self.group_id = group_id
        self._clock = clock or (lambda: 0.0)
        self._wait = wait or _no_wait
        self.on_event = on_event
        self.interleave_hook: Callable[[InterleavePoint], Awaitable[None]] | None = None
        self.rows: dict[TopicPartition, Row] = {}
        self._names: dict[TopicPartition, str] = {}  # the rows' partitions, sorted, named
        self.journal_rows: list[JournalRow] = []
        self.quarantine: list[QuarantineRow] = []
        self.members: dict[str, MemberRow] = {}
        self.writes: list[WriteRecord] = []
        self.events: list[StoreEvent] = []
        self.attempt_rows: dict[tuple[TopicPartition, int], Attempts] = {}
        self.retry_scheduled: dict[tuple[TopicPartition, int], bool] = {}  # next_retry_at set
        self.alone_epochs: dict[tuple[TopicPartition, int], int] = {}  # of the last one
        self.intent_rows: dict[TopicPartition, tuple[int, int, int]] = {}  # first, last, epoch
        self._tables: dict[str, dict[Any, Any]] = {}
        self._locks: dict[TopicPartition, asyncio.Lock] = {}
        self._sharers: dict[TopicPartition, int] = {}  # lane transactions in flight
        self._lanes_ended = asyncio.Condition()
        self.completion_rows: dict[TopicPartition, list[tuple[int, tuple[Span, ...]]]] = {}
        self._base = _Frame("-", (), self)

    # -- attempts and faults -------------------------------------------------------------
    def begin_attempt(self, label: str, faults: Sequence[Fault] = ()) -> None:
        """Start a new attempt at the bottom level: call numbers restart, ``faults`` apply
        (to the calling task and the tasks it starts from now on)."""
        self._base = _Frame(label, tuple(faults), self)
        _FRAME.set(None)

    @contextmanager
    def attempt(self, label: str, faults: Sequence[Fault] = ()) -> Iterator[None]:
        """A nested attempt (e.g. a replacement inside an interleave) for the calling task
        and the tasks it starts inside the block; restores the outer one. Tasks already
        running (another batch of the same step in flight) stay in the outer attempt."""
        token = _FRAME.set(_Frame(label, tuple(faults), self))
        try:
            yield
        finally:
            _FRAME.reset(token)

    def _select(self, op: Operation) -> tuple[int, Fault | None, str]:
        frame = _FRAME.get()
        if frame is None or frame.store is not self:
            frame = self._base
        call = frame.calls.get(op.value, 0) + 1
        frame.calls[op.value] = call
        for fault in frame.faults:
            if fault.operation is op and fault.call == call:
                return call, fault, frame.label
        return call, None, frame.label

    # -- read helpers for tests and the simulator ----------------------------------------
    def tables(self) -> dict[str, dict[Any, Any]]:
        """Copies of the committed handler tables."""
        return {name: dict(rows) for name, rows in self._tables.items()}

    def token_of(self, tp: TopicPartition) -> Token | None:
        row = self.rows.get(tp)
        return None if row is None else Token(row.epoch, row.frontier)

    # -- internals -----------------------------------------------------------------------
    def _installed(self) -> tuple[tuple[str, int, int], ...]:
        names = self._names
        if names.keys() != self.rows.keys():  # (topic, partition) order, as they sort
            self._names = names = {tp: str(tp) for tp in sorted(self.rows)}
        return tuple((name, self.rows[tp].epoch, self.rows[tp].frontier)
                     for tp, name in names.items())

    def _log(
        self,
        label: str,
        op: Operation,
        call: int,
        fault: Fault | None,
        *,
        applied: bool,
        observed: str,
        started_s: float = 0.0,
        partition: int | None = None,
    ) -> None:
        event = StoreEvent(
            attempt=label,
            operation=op.value,
            call=call,
            requested=None if fault is None else fault.outcome.value,
            delay_ms=0 if fault is None else fault.delay_ms,
            interleave=None if fault is None or fault.interleave is None else fault.interleave.at,
            applied=applied,
            observed=observed,
            at_s=self._clock(),
            installed=self._installed(),
            started_s=started_s,
            partition=partition,
        )
        self.events.append(event)
        if self.on_event is not None:
            self.on_event(event)

    async def _point(
        self, op: Operation, call: int, at: str, fault: Fault | None, label: str,
        partition: int | None = None,
    ) -> None:
        if self.interleave_hook is not None:
            await self.interleave_hook(InterleavePoint(op, call, at, fault, label, partition))
        await asyncio.sleep(0)  # cancellation point

    def _lock(self, tp: TopicPartition) -> asyncio.Lock:
        return self._locks.setdefault(tp, asyncio.Lock())

    async def _no_lanes(self, tps: Iterable[TopicPartition]) -> None:
        """Wait (holding the rows' locks) until no lane transaction holds a share lock."""
        tps = list(tps)
        async with self._lanes_ended:
            await self._lanes_ended.wait_for(
                lambda: not any(self._sharers.get(tp, 0) for tp in tps))

    def _write(
        self, kind: str, tp: TopicPartition, lifetime: str | None, epoch: int | None, label: str,
        event: str = "", skipped: tuple[int, int] | None = None,
        spans: tuple[Span, ...] = (),
    ) -> None:
        self.writes.append(WriteRecord(kind, tp, lifetime, epoch, label, event, skipped, spans))

    async def _run(self, op: Operation, effect: _Effect, partition: int | None = None) -> Any:
        """Common frame of every faultable call: delay, interleave, effect, log, cancellation."""
        call, fault, label = self._select(op)
        state = {"applied": False}
        t0 = self._clock()
        try:
            if fault is not None and fault.delay_ms:
                await self._wait(fault.delay_ms / 1000.0)
            await asyncio.sleep(0)
            result = await effect(fault, label, state, call)
        except asyncio.CancelledError:
            self._log(label, op, call, fault, applied=state["applied"], observed="cancelled",
                      started_s=t0, partition=partition)
            raise
        except (Fenced, NotCommitted, OutcomeUnknown, ReadFailed) as exc:
            self._log(label, op, call, fault, applied=state["applied"], observed=_name(exc),
                      started_s=t0, partition=partition)
            raise
        self._log(label, op, call, fault, applied=state["applied"], observed="ok", started_s=t0,
                  partition=partition)
        return result

    # -- FenceStore ----------------------------------------------------------------------
    async def validate(self, checks: Sequence[SourceCheck]) -> Mapping[TopicPartition, Validation]:
        async def effect(
            fault: Fault | None, label: str, state: dict[str, bool], call: int
        ) -> Mapping[TopicPartition, Validation]:
            if fault is not None and fault.outcome is FaultOutcome.ABORT:
                raise ReadFailed(f"validate: injected read failure (call {call})")
            await self._point(Operation.VALIDATE, call, "before", fault, label)
            return {c.tp: self._validate_one(c) for c in checks}

        return await self._run(Operation.VALIDATE, effect)

    def _validate_one(self, check: SourceCheck) -> Validation:
        row = self.rows.get(check.tp)
        return decide_validation(
            check, None if row is None else (row.epoch, row.frontier, row.topic_id))

    async def claim(
        self, claims: Sequence[ClaimRequest], *, lifetime: str
    ) -> Mapping[TopicPartition, Token]:
        async def effect(
            fault: Fault | None, label: str, state: dict[str, bool], call: int
        ) -> Mapping[TopicPartition, Token]:
            if fault is not None and fault.outcome is FaultOutcome.ABORT:
                raise NotCommitted(f"claim: injected rollback (call {call})")
            await self._point(Operation.CLAIM, call, "before", fault, label)
            tps = sorted({c.tp for c in claims})
            locks = [self._lock(tp) for tp in tps]
            for lock in locks:
                await lock.acquire()
            try:
                await self._no_lanes(tps)  # the row locks wait for every lane's share lock
                if fault is not None and fault.outcome is FaultOutcome.UNKNOWN_ABORTED:
                    raise OutcomeUnknown(f"claim: injected lost reply, not applied (call {call})")
                tokens = self._apply_claim(claims, lifetime, label)
                state["applied"] = True
            finally:
                for lock in locks:
                    lock.release()
            await self._point(Operation.CLAIM, call, "after", fault, label)
            if fault is not None and fault.outcome is FaultOutcome.UNKNOWN_COMMITTED:
                raise OutcomeUnknown(f"claim: injected lost reply after commit (call {call})")
            return tokens

        return await self._run(Operation.CLAIM, effect)

    def _apply_claim(
        self, claims: Sequence[ClaimRequest], lifetime: str, label: str
    ) -> dict[TopicPartition, Token]:
        now = self._clock()
        tokens: dict[TopicPartition, Token] = {}
        for c in claims:
            row = self.rows.get(c.tp) or Row(0, c.initial_frontier, None, c.topic_id, now)
            row = replace(
                row,
                epoch=row.epoch + 1,
                owner=lifetime,
                updated_s=now,
                topic_id=row.topic_id if row.topic_id is not None else c.topic_id,
            )
            self.rows[c.tp] = row
            self.journal_rows.append(JournalRow(c.tp, lifetime, "claim", row.epoch, "", now))
            self._write("claim", c.tp, lifetime, row.epoch, label)
            tokens[c.tp] = Token(row.epoch, row.frontier)
        return tokens

    async def observe(self, tps: Sequence[TopicPartition], *,
                      settled: bool = False) -> Mapping[TopicPartition, Token | None]:
        """Read-only; ``settled`` changes nothing here: every modeled commit is atomic."""
        async def effect(
            fault: Fault | None, label: str, state: dict[str, bool], call: int
        ) -> Mapping[TopicPartition, Token | None]:
            if fault is not None and fault.outcome is FaultOutcome.ABORT:
                raise ReadFailed(f"observe: injected read failure (call {call})")
            await self._point(Operation.OBSERVE, call, "before", fault, label)
            return {tp: self.token_of(tp) for tp in tps}

        return await self._run(Operation.OBSERVE, effect)

    async def process(self, call: BatchCall, token: Token) -> Token:
        tp, records, handler, clear = call.tp, call.records, call.handler, call.clear_attempts
        end = batch_end(tp, token, records)

        async def effect(
            fault: Fault | None, label: str, state: dict[str, bool], call: int
        ) -> Token:
            await self._point(Operation.PROCESS, call, "before", fault, label,
                              tp.partition)
            async with self._lock(tp):
                self._require(tp, token)
                if fault is not None and fault.outcome is FaultOutcome.ABORT:
                    raise NotCommitted(f"process {tp}: injected rollback (call {call})")
                tx = MemoryTx(self.group_id, self._tables)
                try:
                    returned = await handler(tx, records)
                except Exception as exc:
                    err = handler_failure(exc, what=f"process {tp}")
                    if err is exc:
                        raise
                    raise err from exc
                verdicts = check_verdicts(returned, len(records))
                self._require(tp, token)  # the row lock makes this a no-op; kept as an assertion
                if fault is not None and fault.outcome is FaultOutcome.UNKNOWN_ABORTED:
                    raise OutcomeUnknown(
                        f"process {tp}: injected lost COMMIT, not applied (call {call})"
                    )
                new = self._commit_process(tp, token, end, records, verdicts, tx, label)
                if clear:
                    for key in [k for k in self.attempt_rows if k[0] == tp and k[1] < end]:
                        del self.attempt_rows[key]
                        self.retry_scheduled.pop(key, None)
                        self.alone_epochs.pop(key, None)
                state["applied"] = True
            await self._point(Operation.PROCESS, call, "after", fault, label,
                              tp.partition)
            if fault is not None and fault.outcome is FaultOutcome.UNKNOWN_COMMITTED:
                raise OutcomeUnknown(
                    f"process {tp}: injected lost COMMIT reply, committed (call {call})"
                )
            return new

        return await self._run(Operation.PROCESS, effect, tp.partition)

    async def process_lane(self, call: BatchCall, token: Token,
                           spans: Sequence[Span]) -> None:
        """``LaneStore.process_lane``: the epoch required under a share lock (a claim waits
        for it), the handler, the quarantine and the spans committed together."""
        tp, records, handler = call.tp, call.records, call.handler
        check_lane(tp, token, records, spans)

        async def effect(fault: Fault | None, label: str, state: dict[str, bool],
                         call_no: int) -> None:
            await self._point(Operation.LANE, call_no, "before", fault, label, tp.partition)
            async with self._lock(tp):  # a claim holding the row waits first
                row = self.rows.get(tp)
                if row is None or row.epoch != token.epoch:
                    raise Fenced(f"lane {tp}: epoch {token.epoch} does not match the durable "
                                 f"{None if row is None else row.epoch}")
                self._sharers[tp] = self._sharers.get(tp, 0) + 1
            try:
                if fault is not None and fault.outcome is FaultOutcome.ABORT:
                    raise NotCommitted(f"lane {tp}: injected rollback (call {call_no})")
                tx = MemoryTx(self.group_id, self._tables)
                try:
                    returned = await handler(tx, records)
                except Exception as exc:
                    err = handler_failure(exc, what=f"lane {tp}")
                    if err is exc:
                        raise
                    raise err from exc
                verdicts = check_verdicts(returned, len(records))
                if fault is not None and fault.outcome is FaultOutcome.UNKNOWN_ABORTED:
                    raise OutcomeUnknown(f"lane {tp}: injected lost COMMIT, not applied "
                                         f"(call {call_no})")
                for rec, verdict in zip(records, verdicts, strict=True):
                    if isinstance(verdict, Reject):
                        self.quarantine.append(QuarantineRow(
                            tp, rec.offset, verdict.reason, token.epoch, rec.key, rec.value,
                            verdict.error_type, verdict.traceback_digest))
                self._tables.update(tx._changed)
                self.completion_rows.setdefault(tp, []).append((token.epoch, tuple(spans)))
                self._write("lane", tp, row.owner, token.epoch, label, spans=tuple(spans))
                state["applied"] = True
            finally:
                self._sharers[tp] -= 1
                async with self._lanes_ended:
                    self._lanes_ended.notify_all()
            await self._point(Operation.LANE, call_no, "after", fault, label, tp.partition)
            if fault is not None and fault.outcome is FaultOutcome.UNKNOWN_COMMITTED:
                raise OutcomeUnknown(f"lane {tp}: injected lost COMMIT reply, committed "
                                     f"(call {call_no})")

        await self._run(Operation.LANE, effect, tp.partition)

    async def completions(self, tps: Sequence[TopicPartition], *,
                          settled: bool = False) -> Mapping[TopicPartition, Completion | None]:
        """``LaneStore.completions`` (a read; ``settled`` changes nothing here: a commit is
        atomic). Read without faults or events, like the attempt counts, until the
        simulator's traces model lanes."""
        await asyncio.sleep(0)
        out: dict[TopicPartition, Completion | None] = {}
        for tp in tps:
            row = self.rows.get(tp)
            out[tp] = None if row is None else Completion.of(
                row.frontier, (sp for _, spans in self.completion_rows.get(tp, ())
                               for sp in spans), epoch=row.epoch)
        return out

    async def fold(self, tp: TopicPartition, token: Token, *, to_frontier: int) -> Token:
        """``LaneStore.fold``: the frontier moved under the token, the spans wholly below it
        deleted, in one atomic step (it waits for the lanes in flight, as the row lock does)."""
        if to_frontier < token.frontier:
            raise ValueError(f"fold {tp}: {to_frontier} is below the frontier {token.frontier}")

        async def effect(fault: Fault | None, label: str, state: dict[str, bool],
                         call_no: int) -> Token:
            async with self._lock(tp):
                await self._no_lanes([tp])
                row = self._require(tp, token)
                if fault is not None and fault.outcome is FaultOutcome.ABORT:
                    raise NotCommitted(f"fold {tp}: injected rollback (call {call_no})")
                if fault is not None and fault.outcome is FaultOutcome.UNKNOWN_ABORTED:
                    raise OutcomeUnknown(f"fold {tp}: injected lost COMMIT, not applied "
                                         f"(call {call_no})")
                self.rows[tp] = replace(row, frontier=to_frontier, updated_s=self._clock())
                self.completion_rows[tp] = [
                    (e, spans) for e, spans in self.completion_rows.get(tp, ())
                    if max(b for _, b in spans) >= to_frontier]
                for key in [k for k in self.attempt_rows if k[0] == tp and k[1] < to_frontier]:
                    del self.attempt_rows[key]
                    self.retry_scheduled.pop(key, None)
                    self.alone_epochs.pop(key, None)
                self._write("fold", tp, row.owner, token.epoch, label)
                state["applied"] = True
            if fault is not None and fault.outcome is FaultOutcome.UNKNOWN_COMMITTED:
                raise OutcomeUnknown(f"fold {tp}: injected lost COMMIT reply, committed "
                                     f"(call {call_no})")
            return Token(token.epoch, to_frontier)

        return await self._run(Operation.FOLD, effect, tp.partition)

    def _require(self, tp: TopicPartition, token: Token) -> Row:
        row = self.rows.get(tp)
        if row is None or row.epoch != token.epoch or row.frontier != token.frontier:
            held = None if row is None else Token(row.epoch, row.frontier)
            raise Fenced(f"{tp}: token {token} does not match the durable {held}")
        return row

    def _commit_process(
        self,
        tp: TopicPartition,
        token: Token,
        end: int,
        records: Sequence[SourceRecord],
        verdicts: Sequence[Any],
        tx: MemoryTx,
        label: str,
    ) -> Token:
        row = self.rows[tp]
        for rec, verdict in zip(records, verdicts, strict=True):
            if isinstance(verdict, Reject):
                self.quarantine.append(
                    QuarantineRow(tp, rec.offset, verdict.reason, token.epoch, rec.key, rec.value,
                                  verdict.error_type, verdict.traceback_digest)
                )
        self._tables.update(tx._changed)
        self.rows[tp] = replace(row, frontier=end, updated_s=self._clock())
        self._write("process", tp, row.owner, token.epoch, label)
        return Token(token.epoch, end)

    async def skip(self, tp: TopicPartition, token: Token, *, to_offset: int, reason: str) -> Token:
        async def effect(fault: Fault | None, label: str, state: dict[str, bool],
                         call: int) -> Token:
            if fault is not None and fault.outcome is FaultOutcome.ABORT:
                raise NotCommitted(f"skip {tp}: injected rollback (call {call})")
            async with self._lock(tp):
                row = self._require(tp, token)
                if to_offset < row.frontier:
                    raise ValueError(f"skip {tp}: {to_offset} is below the frontier "
                                     f"{row.frontier}")
                if fault is not None and fault.outcome is FaultOutcome.UNKNOWN_ABORTED:
                    raise OutcomeUnknown(f"skip {tp}: injected lost reply, not applied")
                now = self._clock()
                self.rows[tp] = replace(row, frontier=to_offset, updated_s=now)
                self.journal_rows.append(JournalRow(
                    tp, row.owner or "", "gap-skip", token.epoch,
                    f"{reason}: {row.frontier}..{to_offset}", now))
                self._write("skip", tp, row.owner, token.epoch, label,
                            skipped=(row.frontier, to_offset))
                state["applied"] = True
            if fault is not None and fault.outcome is FaultOutcome.UNKNOWN_COMMITTED:
                raise OutcomeUnknown(f"skip {tp}: injected lost reply after commit")
            return Token(token.epoch, to_offset)

        return await self._run(Operation.SKIP, effect)

    async def journal(
        self,
        tps: Sequence[TopicPartition],
        *,
        lifetime: str,
        event: str,
        epoch: int | None = None,
        detail: str = "",
    ) -> None:
        if event not in JOURNAL_EVENTS:
            raise ValueError(f"journal event {event!r} is not one of {JOURNAL_EVENTS}")

        async def effect(fault: Fault | None, label: str, state: dict[str, bool],
                         call: int) -> None:
            if fault is not None and fault.outcome is FaultOutcome.ABORT:
                raise NotCommitted(f"journal {event}: injected rollback (call {call})")
            now = self._clock()
            for tp in tps:
                self.journal_rows.append(JournalRow(tp, lifetime, event, epoch, detail, now))
                self._write("journal", tp, lifetime, epoch, label, event)
            state["applied"] = True

        await self._run(Operation.JOURNAL, effect)

    async def record_attempt(self, tp: TopicPartition, token: Token, *, offset: int,
                             max_attempts: int, error: str | None,
                             next_retry_in_s: float | None, at_least: int = 1,
                             alone: bool = False) -> Attempts:
        """``AttemptStore.record_attempt``: one more attempt of ``offset`` under ``token``
        (faultable: ``attempt``)."""
        async def effect(fault: Fault | None, label: str, state: dict[str, bool],
                         call: int) -> Attempts:
            if fault is not None and fault.outcome is FaultOutcome.ABORT:
                raise NotCommitted(f"attempt {tp}@{offset}: injected rollback (call {call})")
            if fault is not None and fault.outcome is FaultOutcome.UNKNOWN_ABORTED:
                async with self._lock(tp):
                    self._require(tp, token)
                raise OutcomeUnknown(f"attempt {tp}@{offset}: injected lost reply, not applied")
            now = await self._record_attempt(tp, token, offset=offset, error=error,
                                             next_retry_in_s=next_retry_in_s,
                                             at_least=at_least, alone=alone)
            state["applied"] = True
            if fault is not None and fault.outcome is FaultOutcome.UNKNOWN_COMMITTED:
                raise OutcomeUnknown(f"attempt {tp}@{offset}: injected lost reply after commit")
            return now

        return await self._run(Operation.ATTEMPT, effect, tp.partition)

    async def _record_attempt(self, tp: TopicPartition, token: Token, *, offset: int,
                              error: str | None, next_retry_in_s: float | None,
                              at_least: int, alone: bool) -> Attempts:
        async with self._lock(tp):
            self._require(tp, token)
            key = (tp, offset)
            was, scheduled = self.attempt_rows.get(key, Attempts()), None
            if key in self.attempt_rows:
                scheduled = self.retry_scheduled.get(key)
            last = self.alone_epochs.get(key)
            # the last attempt alone was no death (its lifetime ended cleanly): replaced
            replaced = alone and last is not None and self._ended_cleanly(tp, last)
            count = was.count if alone and (scheduled or replaced) else max(was.count + 1,
                                                                            at_least)
            self.retry_scheduled[key] = next_retry_in_s is not None
            deaths = was.alone
            if alone:
                deaths += 0 if replaced else 1
                self.alone_epochs[key] = token.epoch
            now = Attempts(count=count,
                           last_error=error if error is not None else was.last_error,
                           alone=deaths)
            self.attempt_rows[key] = now
            return now

    async def record_intent(self, tp: TopicPartition, token: Token, *, last_offset: int) -> None:
        """``AttemptStore.record_intent``: the partition's intent, from the token's frontier
        to ``last_offset``, under ``token``."""
        if last_offset < token.frontier:
            raise ValueError(f"intent {tp}: {last_offset} is below the frontier {token.frontier}")
        async with self._lock(tp):
            self._require(tp, token)
            self.intent_rows[tp] = (token.frontier, last_offset, token.epoch)

    async def attempts(self, tokens: Mapping[TopicPartition, Token]
                       ) -> Mapping[TopicPartition, Attempts]:
        """``AttemptStore.attempts``: unclean = the previous epoch's claimer journaled no
        release/retire after its claim (or one saying its suspect window was open)
        (faultable: ``attempts``, a read)."""
        async def effect(fault: Fault | None, label: str, state: dict[str, bool],
                         call: int) -> Mapping[TopicPartition, Attempts]:
            if fault is not None and fault.outcome is FaultOutcome.ABORT:
                raise ReadFailed(f"attempts: injected read failure (call {call})")
            return self._attempts(tokens)

        return await self._run(Operation.ATTEMPTS, effect)

    def _attempts(self, tokens: Mapping[TopicPartition, Token]
                  ) -> Mapping[TopicPartition, Attempts]:
        out: dict[TopicPartition, Attempts] = {}
        for tp, token in tokens.items():
            got = self.attempt_rows.get((tp, token.frontier), Attempts())
            intent = self.intent_rows.get(tp)
            out[tp] = Attempts(unclean=self._unclean(tp, token.epoch - 1), count=got.count,
                               last_error=got.last_error, alone=got.alone,
                               uncertain_to=intent[1] if intent is not None
                               and intent[0] == token.frontier else None)
        return out

    def _ended_cleanly(self, tp: TopicPartition, epoch: int) -> bool:
        """The lifetime that claimed ``epoch`` journaled a release or retire after it."""
        rows = [r for r in self.journal_rows if r.tp == tp]
        for i, r in enumerate(rows):
            if r.event == "claim" and r.epoch == epoch:
                return any(x.lifetime == r.lifetime and x.event in ("release", "retire")
                           for x in rows[i + 1:])
        return False

    def _unclean(self, tp: TopicPartition, epoch: int) -> bool:
        rows = [r for r in self.journal_rows if r.tp == tp]
        for i, r in enumerate(rows):
            if r.event == "claim" and r.epoch == epoch:
                return not any(x.lifetime == r.lifetime and x.event in ("release", "retire")
                               and not x.detail.startswith(SUSPECT_OPEN) for x in rows[i + 1:])
        return False

    async def operator_reset(self, tp: TopicPartition, *, epoch: int) -> bool:
        """``ResetStore.operator_reset``: only operators installed the epochs above
        ``epoch`` (no claim journaled above it); read without faults or events."""
        row = self.rows.get(tp)
        return (row is not None and operator_owned(row.owner) and row.epoch > epoch
                and not any(j.tp == tp and j.event == "claim" and (j.epoch or 0) > epoch
                            for j in self.journal_rows))

    def reset_by_operator(self, tp: TopicPartition, *, frontier: int,
                          operator: str = "operator:test@host") -> Token:
        """What ``fencectl reset frontier`` does to the row (tests): epoch + 1, the new
        frontier, the operator as owner, one ``reset`` journal row."""
        row = self.rows[tp]
        now = self._clock()
        self.rows[tp] = replace(row, epoch=row.epoch + 1, frontier=frontier, owner=operator,
                                updated_s=now)
        self.completion_rows.pop(tp, None)  # lanes: from the new frontier on, again
        self.journal_rows.append(JournalRow(tp, operator, "reset", row.epoch + 1,
                                            f"frontier {row.frontier} -> {frontier}", now))
        return Token(row.epoch + 1, frontier)

    def operator_owned_partitions(self) -> frozenset[TopicPartition]:
        """The partitions whose owner is an operator now."""
        return frozenset(tp for tp, row in self.rows.items() if operator_owned(row.owner))

    async def heartbeat(self, *, lifetime: str, member_id: str | None, host: str, pid: int,
                        state: str, detail: Mapping[str, Any] | None = None
                        ) -> frozenset[TopicPartition]:
        """Upsert this lifetime's member row with ``last_seen_s`` := now (status only);
        return the partitions whose owner is an operator (``ResetStore``)."""
        async def effect(fault: Fault | None, label: str, applied: dict[str, bool],
                         call: int) -> None:
            if fault is not None and fault.outcome is FaultOutcome.ABORT:
                raise NotCommitted(f"heartbeat {lifetime}: injected rollback (call {call})")
            if fault is not None and fault.outcome is FaultOutcome.UNKNOWN_ABORTED:
                raise OutcomeUnknown(f"heartbeat {lifetime}: injected lost reply, not applied")
            self.members[lifetime] = MemberRow(lifetime, member_id, host, pid, state,
                                               dict(detail or {}), self._clock())
            applied["applied"] = True
            if fault is not None and fault.outcome is FaultOutcome.UNKNOWN_COMMITTED:
                raise OutcomeUnknown(f"heartbeat {lifetime}: injected lost reply after commit")

        await self._run(Operation.HEARTBEAT, effect)
        return self.operator_owned_partitions()

def _name(exc: BaseException) -> str:
    names: dict[type[BaseException], str] = {
        Fenced: "fenced",
        NotCommitted: "not-committed",
        ReadFailed: "read-failed",
    }
    return names.get(
        type(exc), "outcome-unknown" if isinstance(exc, OutcomeUnknown) else type(exc).__name__
    )
