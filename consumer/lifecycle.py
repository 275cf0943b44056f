"""One worker lifetime: the assignment mutex, retained tokens, cancellation, the budget.

Long because each public operation keeps its rule next to its guarded body (the state,
budget, error frame and retirement live in the ``consumer.lifetime_gate.LifetimeGate`` a
lifecycle owns).

Rules (docs/ARCHITECTURE.md, "Lifecycle"; the decisions live in ``consumer.decisions``)
- ``assign``/``seek``/``revoke`` run under the assignment mutex. ``process`` takes the
  mutex only to read the token and take the partition's guard; its I/O runs under the
  guard alone, so partitions proceed concurrently. ``revoke``, ``seek`` and ``assign`` wait
  (holding the mutex) for the guards of their partitions, so a lifetime never fences or
  misreads its own in-flight batch.
- Every guarded call runs in its own task with a budget (``budget_s``) that starts before
  the mutex wait, measured by the injected clock (and bounded in real time by
  ``asyncio.timeout``). The three-call policy uses the injected ``wait``.
- ``stop`` takes no lock and does no I/O: the lifetime becomes STOPPED, its tokens are
  dropped and its in-flight tasks are cancelled; interrupted callers get ``Retired``.
- A failure retires the lifetime while the mutex (or, for ``process``, the partition's
  guard) is still held: the gate closes first (every later call raises ``Retired`` without
  I/O), then one best-effort ``retire`` journal row is written, then the state becomes
  RETIRED. Budget exhaustion retires without journaling.
- Retirement is a write barrier: a batch of another partition whose handler returns after
  the gate closed rolls back instead of committing (the gate is checked between the handler
  and COMMIT); one whose COMMIT was already sent completes under its still-valid epoch. The
  retire journal row waits (bounded by the budget) until those in-flight batches ended, so
  it is the lifetime's last write; it never touches epochs, frontiers or effects.
- Cancelling the caller of a guarded call (not ``stop``) retires the lifetime, without
  journaling: the interrupted I/O left an unknown outcome.
- Lanes (``fencing.lanes``): ``assign`` reads the retained partitions' completion sets
  (``completion``); ``process_lane`` commits one lane's batch under the epoch without the
  partition's guard (lanes of a partition run side by side; revoke, assign and retirement
  wait for them too); ``fold`` moves the frontier to the lanes' contiguous prefix under
  the guard.
- ``process`` raises ``HandlerFailed`` (the handler raised; rolled back) without retiring;
  ``record_attempt`` counts one attempt of an offset in its own committed, fenced write.
  ``assign`` reads the durable failure marks of the partitions it retains
  (``take_failure_marks``); the worker decides what to do with them (``consumer.failure_run``).
- An operator's reset (``fencectl reset``) fences the owner without another member:
  ``process`` and ``record_attempt`` that find their token fenced ask the store whether only
  operators installed the newer epochs (``ResetStore.operator_reset``); if so they raise
  ``ResetByOperator`` without retiring, and ``reclaim`` claims the partition again
  (validate, claim, as ``assign``) and returns the new token at the operator's frontier. A
  fence by another member retires as before.
- Callers only see errors of ``fencing.errors``: ``Retired``, ``Fenced``, ``SourceRefused``
  (and ``ValueError`` for a malformed batch, before any I/O).
  ``seek``/``process`` of a partition without a token raise ``Fenced`` without I/O and
  without retiring (a late call after ``revoke``/``lost``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any, TypeVar

from consumer import decisions as d
from consumer.decisions import LifetimeState
from consumer.lifetime_gate import LaneCount, LifetimeGate
from consumer.observability.instruments import Instruments
from fencing.crashpoints import crash_point
from fencing.errors import Fenced, FenceError, ResetByOperator, TokenDropped, TooSlow
from fencing.failures import SUSPECT_OPEN, Attempts
from fencing.guarded import (
    CallHooks,
    guarded_claim,
    guarded_fold,
    guarded_lane,
    guarded_observe,
    guarded_process,
    guarded_skip,
)
from fencing.lanes import Completion, Span, check_lane
from fencing.policy import with_policy
from fencing.slow import handler_limit_s
from fencing.store import AttemptStore, BatchCall, FenceStore, LaneStore, ResetStore
from fencing.tracing import NO_TRACING, SpanHandle, Tracing
from fencing.types import (
    ClaimRequest,
    SourceCheck,
    SourceRecord,
    Token,
    TopicPartition,
    Verdict,
)

__all__ = ["Lifecycle", "LifetimeState"]

T = TypeVar("T")

class Lifecycle:
    """One worker lifetime over ``store``; see the module Rules."""

    def __init__(
        self,
        *,
        store: FenceStore,
        lifetime_id: str,
        clock: Callable[[], float],
        wait: Callable[[float], Awaitable[None]],
        budget_s: float = 20.0,
        auto_offset_reset: str = "earliest",
        allow_retention_gap: bool = False,
        instruments: Instruments | None = None,
        tracing: Tracing = NO_TRACING,
        idle_in_transaction_s: float | None = None,
    ) -> None:
        """``idle_in_transaction_s``: the store sessions' idle-in-transaction timeout (None:
        none), which bounds a handler call with the budget (``handler_limit_s``)."""
        d.check_auto_offset_reset(auto_offset_reset)
        self.lifetime_id = lifetime_id
        self.group_id = store.group_id
        self._store = store
        self._clock = clock
        self._wait = wait
        self._budget_s = budget_s
        self._idle_s = idle_in_transaction_s
        self._reset = auto_offset_reset
        self._allow_gap = allow_retention_gap
        self._metrics = instruments  # optional: metrics of retries, resolutions, batches
        self._tracing = tracing  # spans (OpenTelemetry in production) -- wired at the edge
        self._mutex = asyncio.Lock()
        self._guards: dict[TopicPartition, asyncio.Lock] = {}
        self._tokens: dict[TopicPartition, Token] = {}
        self._marks: dict[TopicPartition, Attempts] = {}
        self._suspect_open: set[TopicPartition] = set()
        self._lanes: dict[TopicPartition, LaneCount] = {}
        self._completions: dict[TopicPartition, Completion] = {}
        self._span_of: dict[TopicPartition, Mapping[int, Span]] = {}
        self._gate = LifetimeGate(lifetime_id=lifetime_id, store=store, clock=clock,
                                  budget_s=budget_s, tokens=self._tokens, guards=self._guards,
                                  suspect_open=self._suspect_open, lanes=self._lanes)

    # -- local state -------------------------------------------------------------------
    @property
    def state(self) -> LifetimeState:
        """LIVE until the lifetime retires or stops (``consumer.decisions``)."""
        return self._gate.state

    @property
    def retired_reason(self) -> str | None:
        """Why the lifetime left LIVE (None while it is live)."""
        return self._gate.retired_reason

    def token(self, tp: TopicPartition) -> Token | None:
        """The retained token of ``tp`` (None when not held)."""
        return self._tokens.get(tp)

    def run_lanes(self, tp: TopicPartition, span_of: Mapping[int, Span] | None) -> None:
        """From now on ``process`` of ``tp`` commits lane transactions, each record with its
        span from ``span_of`` (the worker's ``fencing.lanes.Dispatch``); None: no longer."""
        if span_of is None:
            self._span_of.pop(tp, None)
        else:
            self._span_of[tp] = span_of

    def completion(self, tp: TopicPartition) -> Completion | None:
        """The completion set ``assign`` read for ``tp`` (None: not read, or no store with
        lanes): where its lanes, or a successor of lanes, resume (``fencing.lanes``)."""
        return self._completions.get(tp)

    def take_failure_marks(self, tp: TopicPartition) -> Attempts | None:
        """The durable failure marks ``assign`` read for ``tp``, once (None: none, not read,
        or already taken)."""
        return self._marks.pop(tp, None) if self._marks else None

    def suspect_window(self, tp: TopicPartition, open_: bool) -> None:
        """Whether ``tp``'s suspect window is open (from ``assign`` on, for a partition with
        suspect marks, until the failure handling closes it): while it is, the release or
        retire row of ``tp`` says so, and its next owner stays suspicious
        (``fencing.failures``)."""
        if open_:
            self._suspect_open.add(tp)
        else:
            self._suspect_open.discard(tp)

    def _hooks(self, operation: str) -> CallHooks:
        """Retry and resolution callbacks (metrics) and spans of the guarded calls."""
        if self._metrics is None:
            return CallHooks(tracing=self._tracing)
        return CallHooks(on_retry=self._metrics.on_retry(operation),
                         on_resolve=self._metrics.unknown_outcome, tracing=self._tracing)

    def _span(self, name: str, tp: TopicPartition | None,
              attrs: Mapping[str, Any] | None = None, *,
              links: Sequence[object] = ()) -> AbstractContextManager[SpanHandle]:
        """A span with the messaging attributes of this lifetime (and of ``tp``)."""
        base: dict[str, Any] = {"messaging.system": "kafka",
                                "messaging.consumer.group.name": self.group_id,
                                "fence.lifetime": self.lifetime_id}
        if tp is not None:
            base["messaging.destination.name"] = tp.topic
            base["messaging.destination.partition.id"] = str(tp.partition)
        base.update(attrs or {})
        return self._tracing.span(name, base, links=links)

    def stop(self) -> None:
        """Cancel without the mutex and without I/O; the lifetime never resumes."""
        self._gate.stop()

    def lost(self, tps: Sequence[TopicPartition]) -> None:
        """Drop the tokens of ``tps`` locally (ownership already gone); no I/O."""
        self._gate.check_live()
        for tp in tps:
            self._tokens.pop(tp, None)

    # -- assign --------------------------------------------------------------------------
    async def assign(self, checks: Sequence[SourceCheck]) -> Mapping[TopicPartition, Token]:
        """Validate, claim (one call for all partitions), retain compatible tokens."""
        return await self._gate.guarded(lambda deadline_s: self._assign(checks, deadline_s))

    async def _assign(self, checks: Sequence[SourceCheck],
                      deadline_s: float) -> Mapping[TopicPartition, Token]:
        async with self._mutex:
            live = self._gate.live_until(deadline_s)

            async def body() -> Mapping[TopicPartition, Token]:
                live()
                return await self._assign_locked(checks, live)

            return await self._gate.framed(body)

    async def _assign_locked(self, checks: Sequence[SourceCheck],
                             live: Callable[[], None]) -> Mapping[TopicPartition, Token]:
        checks = [replace(c, allow_retention_gap=c.allow_retention_gap or self._allow_gap)
                  for c in checks]
        tps = [c.tp for c in checks]
        if not tps:
            return {}
        with self._span("fence.assign", tps[0] if len(tps) == 1 else None,
                  {"fence.partitions": len(tps)}) as outer:
            with self._span("fence.validate", None, {"fence.partitions": len(tps)}):
                validations = await with_policy(lambda: self._store.validate(checks),
                                                wait=self._wait, check_live=live,
                                                on_retry=self._hooks("validate").on_retry)
            for c in checks:
                refusal = validations[c.tp].refusal
                if refusal is not None:
                    raise refusal
            crash_point("after-validate", lifetime=self.lifetime_id, partitions=_names(tps))
            await self._gate.settle(tps)  # never fence our own in-flight batch with a new epoch
            claims = [ClaimRequest(c.tp, d.initial_frontier(c.facts, self._reset),
                                   c.facts.topic_id) for c in checks]
            with self._span("fence.claim", None, {"fence.partitions": len(tps)}):
                claimed = await guarded_claim(self._store, claims, lifetime=self.lifetime_id,
                                              wait=self._wait, check_live=live,
                                              hooks=self._hooks("claim"))
            retained: dict[TopicPartition, Token] = {}
            for c in checks:
                before = d.newest(self._tokens.get(c.tp), validations[c.tp].durable)
                token = claimed.get(c.tp)
                if token is None or not d.retain_claim(token, before):
                    self._tokens.pop(c.tp, None)
                    continue
                gap_to = validations[c.tp].gap_skipped_to
                if gap_to is not None and gap_to > token.frontier:
                    token = await guarded_skip(self._store, c.tp, token, to_offset=gap_to,
                                               reason="retention-gap", wait=self._wait,
                                               check_live=live)
                retained[c.tp] = token
            self._tokens.update(retained)
            await self._read_marks(retained, live)
            await self._read_completions(retained, live)
            crash_point("after-claim", lifetime=self.lifetime_id, partitions=_names(retained),
                        epochs={str(tp): t.epoch for tp, t in retained.items()},
                        frontiers={str(tp): t.frontier for tp, t in retained.items()})
            if len(retained) == 1:
                (only,) = retained.values()
                outer.set_attribute("fence.epoch", only.epoch)
                outer.set_attribute("fence.frontier", only.frontier)
            return retained

    async def _read_marks(self, retained: Mapping[TopicPartition, Token],
                          live: Callable[[], None]) -> None:
        """One read per assignment: the durable failure marks at the retained frontiers."""
        store = self._store
        if not retained or not isinstance(store, AttemptStore):
            return
        marks = await with_policy(lambda: store.attempts(retained), wait=self._wait,
                                  check_live=live)
        for tp in retained:
            mark = marks.get(tp)
            if mark is not None and mark.marked:
                self._marks[tp] = mark
                if mark.suspect:  # open until the failure handling closes it: a revoke
                    self._suspect_open.add(tp)  # before the first batch keeps it suspect
            else:
                self._marks.pop(tp, None)

    async def _read_completions(self, retained: Mapping[TopicPartition, Token],
                                live: Callable[[], None]) -> None:
        """One read per assignment: each retained partition's completion set, so lanes (and a
        successor of lanes without them) skip what lanes of an earlier owner applied."""
        store = self._store
        for tp in retained:
            self._completions.pop(tp, None)
        if not retained or not isinstance(store, LaneStore):
            return
        read = await with_policy(lambda: store.completions(sorted(retained)),
                                 wait=self._wait, check_live=live)
        for tp, token in retained.items():
            got = read.get(tp)
            if got is not None and got.epoch == token.epoch and got.base == token.frontier:
                self._completions[tp] = got

    # -- lanes ---------------------------------------------------------------------------
    async def process_lane(self, call: BatchCall, spans: Sequence[Span]) -> None:
        """Commit one lane's batch of ``call.tp`` under the retained token's epoch
        (``LaneStore.process_lane``): lanes of a partition run side by side (no guard; a
        revoke, assign or retirement waits for them), the frontier does not move (``fold``
        moves it). Fails like ``process``; records of another partition, out of order or
        below the frontier raise ``ValueError`` before any I/O."""
        self._gate.check_live()
        tp = call.tp
        token = self._tokens.get(tp)
        if token is None:
            raise Fenced(f"lane {tp}: lifetime {self.lifetime_id} holds no token for it")
        check_lane(tp, token, call.records, spans)
        return await self._gate.guarded(lambda deadline_s: self._process_lane(
            call, spans, deadline_s))

    async def _process_lane(self, call: BatchCall, spans: Sequence[Span],
                            deadline_s: float) -> None:
        tp = call.tp
        live = self._gate.live_until(deadline_s)

        async def check() -> None:
            live()

        async with self._mutex:
            await self._gate.framed(check)
            token = self._tokens.get(tp)
            lanes = self._lanes.setdefault(tp, LaneCount())
            lanes.enter()

        async def body() -> None:
            live()
            if token is None:
                raise TokenDropped(f"lane {tp}: token dropped while waiting for the mutex")
            try:
                await self._lane_guarded(call, spans, token, live)
            except Fenced as exc:
                await self._raise_if_reset(tp, token, live, exc)
                raise

        def late() -> bool:
            now = self._tokens.get(tp)
            return token is None or now is None or now.epoch != token.epoch

        try:
            await self._gate.framed(body, late=late, holding=tp)
        finally:
            lanes.leave()

    async def _lane_guarded(self, call: BatchCall, spans: Sequence[Span], token: Token,
                            live: Callable[[], None]) -> None:
        store = self._store
        if not isinstance(store, LaneStore):
            raise TypeError(f"{type(store).__name__} keeps no completion sets: lanes need them")
        tp, records = call.tp, call.records
        m, started_s = self._metrics, self._clock()
        inner = call.handler if m is None else m.counting_handler(call.handler)
        rejected = [0]

        async def barrier(conn: Any, recs: Sequence[SourceRecord]) -> Sequence[Verdict]:
            limit_s = handler_limit_s(budget_s=self._budget_s, idle_in_transaction_s=self._idle_s,
                                      elapsed_s=self._clock() - started_s)
            try:
                async with asyncio.timeout(max(0.0, limit_s)) as timer:
                    verdicts = await inner(conn, recs)
            except TimeoutError as exc:
                if not timer.expired():
                    raise
                raise TooSlow(f"lane {tp} offsets {recs[0].offset}..{recs[-1].offset}: the "
                              f"handler was stopped after {limit_s:.1f} s", limit_s=limit_s
                              ) from exc
            self._gate.check_live()  # retired meanwhile: roll back instead of committing
            rejected[0] = d.rejects(verdicts)
            return verdicts

        attrs = {"messaging.kafka.offset": records[0].offset,
                 "fence.first_offset": records[0].offset, "fence.last_offset": records[-1].offset,
                 "fence.epoch": token.epoch, "fence.lane": True,
                 "messaging.batch.message_count": len(records),
                 "messaging.operation.type": "process", "messaging.operation.name": "process"}
        with self._span("fence.process", tp, attrs, links=call.links) as sp:
            try:
                await guarded_lane(store, replace(call, handler=barrier), token, spans,
                                   wait=self._wait, check_live=live,
                                   hooks=self._hooks("process"))
            except BaseException as exc:
                if m is not None:
                    m.batch_failed(tp, outcome=type(exc).__name__,
                                   duration_s=self._clock() - started_s)
                    if isinstance(exc, Fenced):
                        m.fenced(tp)
                raise
            if m is not None:
                m.batch_committed(tp, records=len(records), duration_s=self._clock() - started_s)
            if rejected[0]:
                sp.set_attribute("fence.rejected", rejected[0])

    async def fold(self, tp: TopicPartition, *, to_frontier: int) -> Token:
        """Move ``tp``'s durable frontier to ``to_frontier`` (the lanes' contiguous prefix)
        under the retained token, deleting the spans below it (``LaneStore.fold``); return the
        new token. Holds the partition's guard (folds of a partition never overlap); the
        store's row lock waits for the lanes in flight. Fails like ``process``."""
        self._gate.check_live()
        if tp not in self._tokens:
            raise Fenced(f"fold {tp}: lifetime {self.lifetime_id} holds no token for it")
        store = self._store
        if not isinstance(store, LaneStore):
            raise TypeError(f"{type(store).__name__} keeps no completion sets: lanes need them")

        async def call(token: Token, live: Callable[[], None]) -> Token:
            new = await guarded_fold(store, tp, token, to_frontier=to_frontier,
                                     wait=self._wait, check_live=live,
                                     hooks=self._hooks("process"))
            if self._tokens.get(tp) is token:
                self._tokens[tp] = new
            return new

        return await self._under_guard(tp, "fold", call, dropped=TokenDropped)

    # -- seek ----------------------------------------------------------------------------
    async def seek(self, tp: TopicPartition) -> int:
        """Re-observe under the retained token; return the durable frontier. No new epoch."""
        return (await self.seek_all([tp]))[tp]

    async def seek_all(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        """``seek`` of every partition of an assignment with one read (O(1) round trips);
        one ``fence.seek`` span per partition, as for single seeks."""
        self._gate.check_live()
        for tp in tps:
            if tp not in self._tokens:
                raise Fenced(f"seek {tp}: lifetime {self.lifetime_id} holds no token for it")
        return await self._gate.guarded(lambda deadline_s: self._seek(list(tps), deadline_s))

    async def _seek(self, tps: list[TopicPartition],
                    deadline_s: float) -> dict[TopicPartition, int]:
        async with self._mutex:
            live = self._gate.live_until(deadline_s)
            held = {tp: self._tokens.get(tp) for tp in tps}

            async def body() -> dict[TopicPartition, int]:
                nonlocal held
                live()
                for tp in tps:
                    if held[tp] is None:
                        raise Fenced(f"seek {tp}: token dropped while waiting for the mutex")
                await self._gate.settle(tps)
                held = {tp: self._tokens.get(tp) for tp in tps}  # our in-flight batches
                with self._span("fence.observe", tps[0] if len(tps) == 1 else None,
                                {"fence.partitions": len(tps)}):
                    observed = await guarded_observe(
                        self._store, tps, wait=self._wait, check_live=live,
                        hooks=self._hooks("observe"))
                out: dict[TopicPartition, int] = {}
                for tp in tps:
                    token = held[tp]
                    if token is None:
                        raise Fenced(f"seek {tp}: token dropped while waiting for in-flight work")
                    with self._span("fence.seek", tp, {"fence.epoch": token.epoch}) as sp:
                        if not d.seek_matches(token, observed[tp]):
                            raise Fenced(f"seek {tp}: retained {token}, durable {observed[tp]}")
                        sp.set_attribute("fence.frontier", token.frontier)
                    out[tp] = token.frontier
                return out

            return await self._gate.framed(body, late=lambda: any(
                d.late_call(held[tp], self._tokens.get(tp)) for tp in tps))

    # -- process -------------------------------------------------------------------------
    async def process(self, call: BatchCall) -> Token:
        """Commit ``call`` under the retained token of ``call.tp``; return the advanced token.
        ``clear_attempts``: the same transaction deletes the attempt counts it moves past;
        ``uncertain`` (an ``outcome-uncertain`` handler): its intent is written first, in its
        own committed write, and the handler runs at most once (``EffectUncertain``);
        ``links``: the producer spans the ``fence.process`` span links to.
        A handler that outlives its limit (``fencing.slow.handler_limit_s``) is stopped:
        ``TooSlow``, nothing applied, the lifetime stays live.

        Records below the retained frontier are already durable and are dropped (no I/O
        when none is left); records of another partition or out of order raise
        ``ValueError`` before any I/O, without retiring."""
        self._gate.check_live()
        d.check_batch(call.tp, call.records)
        if call.tp not in self._tokens:
            raise Fenced(f"process {call.tp}: lifetime {self.lifetime_id} holds no token for it")
        span_of = self._span_of.get(call.tp)
        if span_of is not None:  # a partition of lanes: the records' own spans
            if call.uncertain:
                raise ValueError(f"process {call.tp}: an outcome-uncertain handler runs no lanes")
            await self.process_lane(call, [span_of[r.offset] for r in call.records])
            token = self._tokens.get(call.tp)
            if token is None:
                raise TokenDropped(f"process {call.tp}: token dropped after its lane committed")
            return token
        return await self._gate.guarded(lambda deadline_s: self._process(call, deadline_s))

    async def _process(self, call: BatchCall, deadline_s: float) -> Token:
        tp = call.tp
        live = self._gate.live_until(deadline_s)

        async def check() -> None:
            live()

        async with self._mutex:
            await self._gate.framed(check)
            guard = self._guards.setdefault(tp, asyncio.Lock())
            await guard.acquire()
            token = self._tokens.get(tp)

        async def body() -> Token:
            if token is None:
                raise TokenDropped(f"process {tp}: token dropped while waiting for the guard")
            try:
                return await self._process_guarded(call, token, live)
            except Fenced as exc:
                await self._raise_if_reset(tp, token, live, exc)
                raise

        try:
            return await self._gate.framed(
                body, late=lambda: d.late_call(token, self._tokens.get(tp)), holding=tp)
        finally:
            guard.release()

    async def _process_guarded(self, call: BatchCall, token: Token,
                               live: Callable[[], None]) -> Token:
        """The guarded body of ``process`` (the partition's guard held): the records past the
        frontier, the intent of an uncertain call, the handler inside its time limit and the
        write barrier, then ``guarded_process`` under the ``fence.process`` span."""
        live()
        tp = call.tp
        batch = d.submittable(token, call.records)
        if not batch:
            return token
        if call.uncertain:
            await self._record_intent(tp, token, batch[-1].offset, live)
        attrs = {"messaging.kafka.offset": batch[0].offset,
                 "fence.first_offset": batch[0].offset, "fence.last_offset": batch[-1].offset,
                 "fence.epoch": token.epoch, "fence.frontier": token.frontier,
                 "messaging.batch.message_count": len(batch),
                 "messaging.operation.type": "process", "messaging.operation.name": "process"}
        m, started_s = self._metrics, self._clock()
        inner = call.handler if m is None else m.counting_handler(call.handler)

        rejected = [0]  # of the handler's last call: the committed transaction's

        async def barrier(conn: Any, recs: Sequence[SourceRecord]) -> Sequence[Verdict]:
            limit_s = handler_limit_s(budget_s=self._budget_s, idle_in_transaction_s=self._idle_s,
                                      elapsed_s=self._clock() - started_s)
            try:
                async with asyncio.timeout(max(0.0, limit_s)) as timer:
                    verdicts = await inner(conn, recs)
            except TimeoutError as exc:
                if not timer.expired():
                    raise  # the handler's own
                raise TooSlow(f"process {tp} offsets {recs[0].offset}..{recs[-1].offset}: the "
                              f"handler was stopped after {limit_s:.1f} s", limit_s=limit_s
                              ) from exc
            self._gate.check_live()  # retired meanwhile: roll back instead of committing
            rejected[0] = d.rejects(verdicts)
            return verdicts

        with self._span("fence.process", tp, attrs, links=call.links) as sp:
            try:
                new = await guarded_process(
                    self._store, replace(call, records=batch, handler=barrier), token,
                    wait=self._wait, check_live=live, hooks=self._hooks("process"))
            except BaseException as exc:
                if m is not None:
                    m.batch_failed(tp, outcome=type(exc).__name__,
                                   duration_s=self._clock() - started_s)
                    if isinstance(exc, Fenced):
                        m.fenced(tp)
                raise
            if m is not None:
                m.batch_committed(tp, records=len(batch), duration_s=self._clock() - started_s)
            sp.set_attribute("fence.frontier", new.frontier)
            if rejected[0]:  # records of the batch quarantined (fencectl trace marks them)
                sp.set_attribute("fence.rejected", rejected[0])
        if self._tokens.get(tp) is token:
            self._tokens[tp] = new
        return new

    async def _record_intent(self, tp: TopicPartition, token: Token, last_offset: int,
                             live: Callable[[], None]) -> None:
        store = self._store
        if not isinstance(store, AttemptStore):
            raise TypeError(f"{type(store).__name__} keeps no intents: an outcome-uncertain "
                            "handler needs them")
        await with_policy(lambda: store.record_intent(tp, token, last_offset=last_offset),
                          wait=self._wait, check_live=live)

    async def record_attempt(self, tp: TopicPartition, *, offset: int, max_attempts: int,
                             error: str | None, next_retry_in_s: float | None,
                             at_least: int = 1, alone: bool = False) -> Attempts:
        """Count one more attempt of ``offset`` under the retained token (committed before
        the attempt runs; at least ``at_least``; ``alone``: an attempt of the record with
        nothing else of the process in flight); return the durable counts. Fails like
        ``process``."""
        self._gate.check_live()
        store = self._store
        if tp not in self._tokens or not isinstance(store, AttemptStore):
            raise Fenced(f"record attempt {tp}: lifetime {self.lifetime_id} holds no token")

        async def call(token: Token, live: Callable[[], None]) -> Attempts:
            return await with_policy(lambda: store.record_attempt(
                tp, token, offset=offset, max_attempts=max_attempts, error=error,
                next_retry_in_s=next_retry_in_s, at_least=at_least, alone=alone),
                wait=self._wait, check_live=live)

        return await self._under_guard(tp, "record attempt", call, dropped=Fenced,
                                       reset=True)

    async def _under_guard(self, tp: TopicPartition, what: str,
                           call: Callable[[Token, Callable[[], None]], Awaitable[T]], *,
                           dropped: type[Fenced], reset: bool = False) -> T:
        """``call(token, live)`` under ``tp``'s guard with its retained token, in a guarded
        call's budget and error frame (``record_attempt``, ``fold``); a token dropped while
        waiting raises ``dropped``; ``reset``: a fence by an operator's reset raises
        ``ResetByOperator``."""
        async def run(deadline_s: float) -> T:
            live = self._gate.live_until(deadline_s)
            async with self._mutex:
                guard = self._guards.setdefault(tp, asyncio.Lock())
                await guard.acquire()
                token = self._tokens.get(tp)

            async def body() -> T:
                live()
                if token is None:
                    raise dropped(f"{what} {tp}: token dropped while waiting")
                try:
                    return await call(token, live)
                except Fenced as exc:
                    if reset:
                        await self._raise_if_reset(tp, token, live, exc)
                    raise

            try:
                return await self._gate.framed(
                    body, late=lambda: d.late_call(token, self._tokens.get(tp)), holding=tp)
            finally:
                guard.release()

        return await self._gate.guarded(run)

    # -- operator resets --------------------------------------------------------------
    async def _raise_if_reset(self, tp: TopicPartition, token: Token,
                              live: Callable[[], None], fenced: Fenced) -> None:
        """Raise ``ResetByOperator`` (from ``fenced``) when only operators installed the
        epochs above ``token``'s; return otherwise, also when that cannot be read (the
        caller raises ``fenced``: a fence not proven the operator's retires)."""
        store = self._store
        if isinstance(fenced, TokenDropped) or not isinstance(store, ResetStore):
            return
        try:
            by_operator = await with_policy(lambda: store.operator_reset(tp, epoch=token.epoch),
                                            wait=self._wait, check_live=live)
        except FenceError:  # not known to be the operator's: the fence stands as it is
            return
        if by_operator:
            raise ResetByOperator(f"{tp}: an operator's reset fenced epoch {token.epoch} "
                                  f"of lifetime {self.lifetime_id}") from fenced

    async def reclaim(self, check: SourceCheck) -> Token | None:
        """After an operator's reset of ``check.tp``: claim it again (validate and claim as
        ``assign``) and return the new token, at the operator's frontier. None when the
        retained token is still the durable one (nothing was reset). ``TokenDropped`` when
        the token was dropped meanwhile (revoked, lost: nothing to claim); ``Fenced``
        (retiring) when another member claimed it since."""
        tp = check.tp
        self._gate.check_live()
        if tp not in self._tokens:
            raise TokenDropped(f"reclaim {tp}: lifetime {self.lifetime_id} holds no token")
        return await self._gate.guarded(lambda deadline_s: self._reclaim(check, deadline_s))

    async def _reclaim(self, check: SourceCheck, deadline_s: float) -> Token | None:
        tp = check.tp
        async with self._mutex:
            live = self._gate.live_until(deadline_s)

            async def body() -> Token | None:
                live()
                await self._gate.settle([tp])  # the partition's in-flight batch ends first
                held = self._tokens.get(tp)
                if held is None:
                    raise TokenDropped(f"reclaim {tp}: token dropped while waiting")
                observed = await guarded_observe(self._store, [tp], wait=self._wait,
                                                 check_live=live, hooks=self._hooks("observe"))
                if d.seek_matches(held, observed[tp]):
                    return None
                store = self._store
                if not isinstance(store, ResetStore) or not await with_policy(
                        lambda: store.operator_reset(tp, epoch=held.epoch), wait=self._wait,
                        check_live=live):
                    raise Fenced(f"reclaim {tp}: retained {held}, durable {observed[tp]}, "
                                 "installed by another member")
                token = (await self._assign_locked([check], live)).get(tp)
                if token is None:
                    raise Fenced(f"reclaim {tp}: the claim after the reset was not retained")
                return token

            return await self._gate.framed(body, late=lambda: tp not in self._tokens)

    # -- revoke --------------------------------------------------------------------------
    async def revoke(self, tps: Sequence[TopicPartition]) -> None:
        """Wait for guarded work on ``tps``, clear their tokens, journal the release."""
        await self._gate.guarded(lambda deadline_s: self._revoke(tps, deadline_s))

    async def _revoke(self, tps: Sequence[TopicPartition], deadline_s: float) -> None:
        async with self._mutex:
            live = self._gate.live_until(deadline_s)

            async def body() -> None:
                live()
                await self._revoke_locked(tps)

            await self._gate.framed(body)

    async def _revoke_locked(self, tps: Sequence[TopicPartition]) -> None:
        with self._span("fence.revoke", tps[0] if len(tps) == 1 else None,
                  {"fence.partitions": len(tps)}):
            released: dict[TopicPartition, Token] = {}
            if tps:
                crash_point("in-revoke", lifetime=self.lifetime_id, partitions=_names(tps),
                            epochs={str(tp): t.epoch for tp, t in self._tokens.items()
                                    if tp in tps})
            await self._gate.settle(tps)  # in-flight batches of these partitions end first
            for tp in sorted(set(tps)):
                token = self._tokens.pop(tp, None)
                if token is not None:
                    released[tp] = token
            for tp, token in released.items():
                detail = SUSPECT_OPEN if tp in self._suspect_open else ""
                self._suspect_open.discard(tp)
                try:
                    await self._store.journal([tp], lifetime=self.lifetime_id,
                                              event="release", epoch=token.epoch, detail=detail)
                except FenceError:
                    pass  # best effort


def _names(tps: Iterable[TopicPartition]) -> list[str]:
    """Partitions as ``topic[p]`` for a crash marker."""
    return [str(tp) for tp in sorted(tps)]
