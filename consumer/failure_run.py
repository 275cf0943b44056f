"""Handler failures of one partition: transient retries, bisection, splits, quarantine,
suspects and outcome-uncertain intents.

Long because each failure path keeps its rule next to its sequence of calls (the decisions
live in ``fencing.failures``; the process-wide gate in ``consumer.alone_gate``).

Rules
- Every step of these paths first checks the caller's ``stopped()`` (through ``wait(0)``):
  once the partition closed (revoked, lost) or the run ends, ``RetryInterrupted`` ends the
  handling without another write, and so does a ``Fenced`` raised once it closed (its
  token was dropped meanwhile); the batch is not applied and the next owner (or this
  lifetime after reassignment) takes it from the durable frontier.
- ``submit`` is ``Lifecycle.process`` of one ``BatchCall`` plus two dict lookups and the
  gate's counter for a healthy partition: the paths below run only after ``HandlerFailed``
  (nothing applied), or for a partition with durable marks (read at its claim), or one
  whose batches were split; each of their transactions is a ``BatchCall`` of its own (its
  records, its handler wrapped with the verdicts it settles, ``clear_attempts``).
- Every transaction enters the process-wide ``AloneGate`` shared; a suspect record's
  attempts (the first, counted, and its retries) enter it alone (see below). A batch
  whose partition closed while it waited for the gate is never attempted
  (``RetryInterrupted``: dropped like buffered records, not a ``Fenced`` that would end
  the lifetime). A transaction
  that only quarantines never runs the handler's code and enters no gate.
- Transient: before each retry the attempt is counted durably (``record_attempt``, which
  also re-checks the epoch) with the time of the retry; the backoff is waited through the
  ``wait`` the caller gives (it ends early when the partition is revoked or the worker
  stops); meanwhile the partition takes nothing new from its buffer, which fills and
  pauses it, while the other partitions keep flowing (the retrying one keeps one of the
  ``--db-concurrency`` slots). Every retry is a new fenced transaction that also deletes
  the count (``clear_attempts``).
- An *unavailable* failure (``fencing.errors.Unavailable``) is retried so for as long as
  it lasts: no attempt limit, no bisection, no durable count (an outage is not the records').
- After ``--retry-max-attempts`` (or at once for poison) the batch is bisected
  (``fencing.failures.Bisection``); each poison record is quarantined with the exception's
  type, message and traceback digest in the transaction that moves the frontier past it;
  the other records are applied exactly once. A handler declared ``on_failure="stop"``
  fail-stops the lifetime instead (the ``HandlerFailed`` is raised).
- Too slow (``TooSlow``: the handler outlived ``fencing.slow.handler_limit_s``): the
  batch is split (``fencing.slow.Split``), halved until a chunk fits; the size that fits
  is kept for the partition's next batches (one WARNING per partition and lifetime names
  the settings). A single record that is still too slow is reported once (a WARNING, the
  ``too-slow`` metric, its quarantine row) and quarantined as too slow, or fail-stops the
  lifetime when declared ``on_failure="stop"``. Never a lifetime failure by itself.
- ``outcome-uncertain`` handlers are never retried, bisected or split: each batch is
  preceded by its durable intent (an ``uncertain`` ``BatchCall``) and its
  handler runs at most once. A failed batch is quarantined whole (``on_failure="stop"``:
  raised); an intent left by an earlier owner (``Attempts.uncertain_to``) is quarantined as
  outcome unknown before anything else of the partition runs. Suspect windows do not apply:
  the intent says exactly which records were in flight.
- Suspect (``Attempts.suspect``, read when the partition is claimed): the next
  ``suspect_window`` records (``--batch-max-records``: the most the dead process can have
  had in flight) are tried one per transaction, each alone in the process (the gate), after
  its durable ``alone`` count was incremented in its own committed write; a record whose
  earlier attempts alone reached ``--max-attempts`` is quarantined instead of tried (it
  killed the process that often). A process that dies during such an attempt leaves the
  count behind; the count is deleted by the transaction that moves the frontier past the
  record. A partition revoked or retired while its window is open stays suspect for its
  next owner (``Lifecycle.suspect_window``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception

from consumer.alone_gate import AloneGate
from consumer.decisions import LifetimeState
from consumer.observability.instruments import Instruments
from consumer.ports import LifecyclePort
from fencing.crashpoints import crash_point, is_armed_for
from fencing.errors import EffectUncertain, Fenced, HandlerFailed, TooSlow
from fencing.failures import (
    Bisection,
    RetryPolicy,
    death_reason,
    quarantine_cause,
    too_slow_reason,
    unknown_reason,
)
from fencing.handler import Declaration, Effects, OnFailure, check_verdicts
from fencing.slow import Split, handler_limit_s
from fencing.store import BatchCall, HandlerFn
from fencing.tracing import NO_TRACING, SpanHandle, Tracing
from fencing.types import Reject, SourceRecord, Token, TopicPartition, Verdict

__all__ = ["Backoff", "FailureRun", "RetryInterrupted"]

log = logging.getLogger("fenceworker.failures")

Wait = Callable[[float], Awaitable[None]]
SLOW_SETTINGS = ("--db-idle-in-transaction-timeout-s (a handler call may last 90 % of it) "
                 "and --call-budget-s (75 % of it)")


def _unavailable(exc: BaseException | None) -> bool:
    return isinstance(exc, HandlerFailed) and exc.unavailable


class RetryInterrupted(Exception):
    """A retry backoff ended early: the partition closed or the run is ending."""


class Backoff:
    """A backoff wait that raises ``RetryInterrupted`` once ``stopped()`` (checked at least
    every 100 ms on the injected clock and wait); ``await backoff(0)`` only checks."""

    def __init__(self, clock: Callable[[], float], wait: Wait,
                 stopped: Callable[[], bool]) -> None:
        self._clock = clock
        self._wait = wait
        self.stopped = stopped

    async def __call__(self, seconds: float) -> None:
        deadline = self._clock() + seconds
        while not self.stopped():
            left = deadline - self._clock()
            if left <= 0:
                return
            await self._wait(min(left, 0.1))
        raise RetryInterrupted("retry abandoned: the partition closed or the run is ending")


def poison_reject(failure: HandlerFailed, *, why: str = "poison") -> Reject:
    """The quarantine verdict of a record whose handler raised ``failure``."""
    return Reject(f"{why}: {failure.error_type}: {failure.error_message}"[:2000],
                  error_type=failure.error_type, error_message=failure.error_message,
                  traceback_digest=failure.traceback_digest or None)


def with_rejects(inner: HandlerFn, rejects: Mapping[int, Reject]) -> HandlerFn:
    """``inner`` over the records whose offset is not in ``rejects``; those get their Reject."""
    if not rejects:
        return inner

    async def handler(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        apply = [r for r in records if r.offset not in rejects]
        got = iter(check_verdicts(await inner(conn, apply), len(apply)) if apply else ())
        return [rejects[r.offset] if r.offset in rejects else next(got) for r in records]

    return handler


def _probe_point(inner: HandlerFn, tp: TopicPartition, bisecting: bool) -> HandlerFn:
    """``inner`` followed by the ``in-bisection-probe`` crash point (a probe's effects
    written in its transaction, not committed); wrapped only when that point is armed."""
    async def handler(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        verdicts = await inner(conn, records)
        crash_point("in-bisection-probe", partition=str(tp), first=records[0].offset,
                    last=records[-1].offset, bisecting=bisecting)
        return verdicts
    return handler


def _interrupted() -> RetryInterrupted:
    return RetryInterrupted("waiting for the process's records tried alone ended: the "
                            "partition closed or the run is ending")


class FailureRun:
    """The failure handling of a worker's partitions (see the module Rules)."""

    def __init__(self, *, lifecycle: LifecyclePort, handler: HandlerFn, declaration: Declaration,
                 policy: RetryPolicy, rng: random.Random, clock: Callable[[], float],
                 wait: Wait, suspect_window: int = 500,
                 instruments: Instruments | None = None, tracing: Tracing = NO_TRACING,
                 gate: AloneGate | None = None, limit_s: float | None = None) -> None:
        """``clock``/``wait``/``rng``: injected time and randomness of the backoffs;
        ``suspect_window``: records tried alone after a suspect claim (``--batch-max-records``:
        the largest batch the dead process may have had in flight); ``gate``: the process's
        (one of its own when None); ``limit_s``: the longest a handler call may last
        (``handler_limit_s``; the default budget's when None)."""
        self._lc = lifecycle
        self._handler = handler
        self._decl = declaration
        self._uncertain = declaration.effects is Effects.OUTCOME_UNCERTAIN
        self._policy = policy
        self._rng = rng
        self._clock = clock
        self._wait = wait
        self._m = instruments
        self._window = suspect_window
        self._tracing = tracing
        self._gate = gate if gate is not None else AloneGate()
        self._limit_s = limit_s if limit_s is not None else handler_limit_s(
            budget_s=20.0, idle_in_transaction_s=None)
        self._spans: dict[TopicPartition, SpanHandle] = {}  # open fence.handler_failure spans
        self._suspect_left: dict[TopicPartition, int] = {}
        self._unknown_to: dict[TopicPartition, int] = {}  # an earlier owner's open intent
        self._fits: dict[TopicPartition, int] = {}  # chunk size that fits, after a split
        self._split_reported: set[TopicPartition] = set()
        self.retrying: dict[TopicPartition, tuple[int, float]] = {}  # attempt, backoff s

    def _count(self, tp: TopicPartition, kind: str, n: int = 1,
               attrs: Mapping[str, Any] | None = None, *, cause: str | None = None) -> None:
        """Metrics and a span event (``fence.<kind>``) of one failure-handling step."""
        if self._m is not None and n:
            self._m.handler_failure(tp, kind=kind, count=n, cause=cause)
        span = self._spans.get(tp)
        if span is not None and n:
            extra = {"fence.cause": cause} if cause is not None else {}
            span.add_event(f"fence.{kind}", {"fence.count": n, **extra, **(attrs or {})})

    async def _once(self, call: BatchCall, stopped: Callable[[], bool], *,
                    settles: bool = False) -> Token:
        """``lifecycle.process(call)``: one transaction beside the process's other batches
        (the gate's shared side); a single record of a suspect partition (a retry of a
        suspect record) runs alone. ``settles``: it only quarantines, the handler's code never
        runs, so it needs neither the gate (it cannot kill the process; it never waits behind
        the suspect windows) nor, for an outcome-uncertain handler, an intent."""
        if settles:
            return await self._lc.process(call)
        gate = self._gate
        alone = len(call.records) == 1 and call.tp in self._suspect_left
        if alone:
            if not await gate.alone(stopped):
                raise _interrupted()
        elif not gate.try_shared() and not await gate.shared(stopped):
            raise _interrupted()
        try:
            if stopped():  # closed while it waited for the gate: never attempted, dropped
                raise _interrupted()
            return await self._lc.process(replace(call, uncertain=True) if self._uncertain
                                          else call)
        finally:
            if alone:
                gate.release_alone()
            else:
                gate.release_shared()

    async def submit(self, tp: TopicPartition, batch: Sequence[SourceRecord], *,
                     links: Sequence[object], stopped: Callable[[], bool]) -> Token:
        """``lifecycle.process`` of one batch; marked partitions and handler failures take
        the paths of the module Rules; their waits raise ``RetryInterrupted`` once
        ``stopped()``."""
        marks = self._lc.take_failure_marks(tp)  # a dict lookup on the hot path
        if marks is not None:
            if self._uncertain:  # the intent says what was in flight: no suspect window
                self._lc.suspect_window(tp, False)
                if marks.uncertain_to is not None:
                    self._unknown_to[tp] = marks.uncertain_to
            elif marks.suspect:
                self._suspect_left[tp] = self._window
        if tp in self._unknown_to or tp in self._suspect_left or tp in self._fits:
            return await self._closing_ends(self._marked(
                tp, batch, links, Backoff(self._clock, self._wait, stopped)), stopped)
        try:
            return await self._once(BatchCall(tp, batch, self._handler, links=links), stopped)
        except HandlerFailed as failure:
            return await self._closing_ends(self.failed(
                tp, batch, failure, wait=Backoff(self._clock, self._wait, stopped)),
                stopped)

    async def _marked(self, tp: TopicPartition, batch: Sequence[SourceRecord],
                      links: Sequence[object], wait: Backoff) -> Token:
        if tp in self._unknown_to:
            last = self._unknown_to.pop(tp)
            head = [r for r in batch if r.offset <= last]
            rest = [r for r in batch if r.offset > last]
            token = await self._settle_unknown(
                tp, head, f"an earlier owner ran the handler on offsets up to {last} and "
                "ended before its COMMIT", wait) if head else None
            if rest:
                return await self.submit(tp, rest, links=links, stopped=wait.stopped)
            assert token is not None
            return token
        if tp in self._suspect_left:
            return await self._suspects(tp, batch, wait)
        return await self._split(tp, batch, self._handler, wait, size=self._fits[tp])

    async def _closing_ends(self, handling: Awaitable[Token],
                            stopped: Callable[[], bool]) -> Token:
        """``handling``; a late ``Fenced`` (the lifetime still live: the token was dropped
        by a revoke or loss while the failure was handled) is ``RetryInterrupted``. A fence
        that retired the lifetime (a newer owner) is raised: the run ends (exit 3)."""
        try:
            return await handling
        except Fenced as exc:
            if not stopped() or self._lc.state is not LifetimeState.LIVE:
                raise
            log.warning("handling of a failed batch ended: the partition closed (%s)", exc)
            raise RetryInterrupted(str(exc)) from exc

    # -- outcome unknown -------------------------------------------------------------------
    async def _settle_unknown(self, tp: TopicPartition, records: Sequence[SourceRecord],
                              why: str, wait: Backoff) -> Token:
        """Quarantine ``records`` as outcome unknown (never run again), or fail-stop."""
        if self._decl.on_failure is OnFailure.STOP:
            raise EffectUncertain(f"{tp} offsets {records[0].offset}..{records[-1].offset}: "
                                  f"outcome unknown: {why} (on_failure=stop)")
        log.warning("%s offsets %d..%d: quarantined as outcome unknown: %s", tp,
                    records[0].offset, records[-1].offset, why)
        reject = Reject(unknown_reason(why), error_type="OutcomeUnknown", error_message=why)
        self._count(tp, "quarantine", len(records), cause="outcome-unknown")
        await wait(0.0)
        return await self._once(BatchCall(tp, records, with_rejects(
            self._handler, {r.offset: reject for r in records}), clear_attempts=True),
            wait.stopped, settles=True)

    # -- suspects --------------------------------------------------------------------------
    async def _suspects(self, tp: TopicPartition, batch: Sequence[SourceRecord],
                        wait: Backoff) -> Token:
        """Records of the suspect window, one per transaction, each alone and counted first."""
        token: Token | None = None
        for i, record in enumerate(batch):
            if self._suspect_left.get(tp, 0) <= 0:
                self._end_window(tp)
                return await self._rest(tp, batch[i:], wait)
            token = await self.suspect(tp, record, wait=wait)
            if tp in self._suspect_left:  # another lane of the partition may have ended it
                self._suspect_left[tp] -= 1
        if self._suspect_left.get(tp, 0) <= 0:
            self._end_window(tp)
        assert token is not None
        return token

    def _end_window(self, tp: TopicPartition) -> None:
        self._suspect_left.pop(tp, None)
        self._lc.suspect_window(tp, False)

    async def _rest(self, tp: TopicPartition, batch: Sequence[SourceRecord],
                    wait: Backoff) -> Token:
        try:
            return await self._once(BatchCall(tp, batch, self._handler), wait.stopped)
        except HandlerFailed as failure:
            return await self.failed(tp, batch, failure, wait=wait)

    async def suspect(self, tp: TopicPartition, record: SourceRecord, *, wait: Backoff) -> Token:
        """Count an attempt of ``record`` alone durably, then try it alone; quarantine it
        instead when earlier attempts alone that never completed reached ``--max-attempts``."""
        limit = self._policy.max_attempts
        await wait(0.0)  # raises RetryInterrupted once the partition closed (lost, revoked)
        gate = self._gate
        if not await gate.alone(wait.stopped):
            raise _interrupted()
        failure: HandlerFailed | None = None
        try:
            got = await self._lc.record_attempt(tp, offset=record.offset, max_attempts=limit,
                                                error=None, next_retry_in_s=None, alone=True)
            self._count(tp, "attempt")
            earlier = got.alone - 1
            if earlier < limit:
                try:
                    return await self._lc.process(BatchCall(tp, [record], self._handler,
                                                            clear_attempts=True))
                except HandlerFailed as exc:
                    failure = exc
        finally:
            gate.release_alone()
        if failure is not None:  # handled beside the other batches: it is no death
            return await self.failed(tp, [record], failure, attempts=got.count, wait=wait)
        # more than the limit only when a count was made for a quarantine that did not commit
        deaths = min(earlier, limit)
        log.warning("%s offset %d: quarantined after %d attempts alone that did not complete "
                    "(it killed the process)", tp, record.offset, deaths)
        self._count(tp, "quarantine", cause="killed-the-process")
        reject = Reject(death_reason(deaths, got.last_error), error_type="ProcessDeath")
        return await self._once(BatchCall(tp, [record], with_rejects(
            self._handler, {record.offset: reject}), clear_attempts=True), wait.stopped,
            settles=True)

    # -- failures --------------------------------------------------------------------------
    async def failed(self, tp: TopicPartition, batch: Sequence[SourceRecord],
                     failure: HandlerFailed, *, wait: Backoff, attempts: int = 1) -> Token:
        """Handle ``failure`` of ``batch`` (nothing of it applied); return the new token.
        One ``fence.handler_failure`` span holds the retries, probes and quarantines."""
        if tp in self._spans:
            return await self._failed(tp, batch, failure, wait=wait, attempts=attempts,
                                      handler=self._handler)
        with self._tracing.span("fence.handler_failure", {
                "messaging.destination.name": tp.topic,
                "messaging.destination.partition.id": str(tp.partition),
                "fence.first_offset": batch[0].offset, "fence.last_offset": batch[-1].offset,
                "fence.transient": failure.transient,
                "exception.type": failure.error_type}) as span:
            self._spans[tp] = span
            try:
                return await self._failed(tp, batch, failure, wait=wait, attempts=attempts,
                                          handler=self._handler)
            finally:
                self._spans.pop(tp, None)

    async def _failed(self, tp: TopicPartition, batch: Sequence[SourceRecord],
                      failure: HandlerFailed, *, wait: Backoff, attempts: int,
                      handler: HandlerFn) -> Token:
        log.warning("%s offsets %d..%d: %s", tp, batch[0].offset, batch[-1].offset, failure)
        if self._uncertain:
            return await self._uncertain_failed(tp, batch, failure, wait)
        if isinstance(failure, TooSlow):
            return await self._split(tp, batch, handler, wait, slow=failure)
        try:
            return await self._retry(tp, batch, handler, failure, attempts, wait)
        except TooSlow as slow:
            return await self._split(tp, batch, handler, wait, slow=slow)
        except HandlerFailed as last:
            failure = last
        if self._decl.on_failure is OnFailure.STOP:
            raise failure
        return await self._bisect(tp, batch, failure, wait, handler)

    async def _uncertain_failed(self, tp: TopicPartition, batch: Sequence[SourceRecord],
                                failure: HandlerFailed, wait: Backoff) -> Token:
        """An outcome-uncertain batch failed: quarantined whole, never run again (or stop)."""
        if isinstance(failure, TooSlow):
            self._report_slow(tp, batch, failure.limit_s)
            return await self._settle_unknown(
                tp, batch, f"the handler was stopped after {failure.limit_s:.1f} s (too slow)",
                wait)
        if isinstance(failure, EffectUncertain):
            return await self._settle_unknown(tp, batch, str(failure), wait)
        if self._decl.on_failure is OnFailure.STOP:
            raise failure
        why = "outcome-uncertain effect failed mid-batch; not replayed"
        self._count(tp, "quarantine", len(batch), cause=quarantine_cause(failure.error_type))
        await wait(0.0)
        return await self._once(BatchCall(tp, batch, with_rejects(
            self._handler, {r.offset: poison_reject(failure, why=why) for r in batch}),
            clear_attempts=True), wait.stopped, settles=True)

    async def _retry(self, tp: TopicPartition, batch: Sequence[SourceRecord],
                     handler: HandlerFn, failure: HandlerFailed, attempts: int,
                     wait: Backoff) -> Token:
        """Retry a transient ``failure`` (attempt number ``attempts``) with backoff under
        tenacity; raise the last ``HandlerFailed``. Before each wait the attempt about to
        start is counted durably (which re-checks the epoch) with its retry time."""
        policy = self._policy
        if not failure.transient or (attempts >= policy.retry_max_attempts
                                     and not failure.unavailable):
            raise failure
        state = {"attempt": attempts}
        pending: list[HandlerFailed] = [failure]  # the failure that got us here comes first

        async def attempt() -> Token:
            if pending:
                raise pending.pop()
            return await self._once(BatchCall(tp, batch, handler, clear_attempts=True),
                                    wait.stopped)

        async def count_next(rs: RetryCallState) -> None:
            failed = rs.outcome.exception() if rs.outcome is not None else None
            backoff_s = rs.upcoming_sleep
            await wait(0.0)  # a closed partition (lost, revoked) has no token to count
            if _unavailable(failed):  # not the records' doing: counted here only
                state["attempt"] += 1
            else:
                state["attempt"] = (await self._lc.record_attempt(
                    tp, offset=batch[0].offset, max_attempts=policy.retry_max_attempts,
                    error=None if not isinstance(failed, HandlerFailed)
                    else f"{failed.error_type}: {failed.error_message}",
                    next_retry_in_s=backoff_s, at_least=state["attempt"] + 1)).count
            self._count(tp, "retry", attrs={"fence.attempt": state["attempt"],
                                            "fence.backoff_s": backoff_s})
            self.retrying[tp] = (state["attempt"], backoff_s)
            log.warning("%s: attempt %d of %s in %.2f s after %s", tp, state["attempt"], "any" if
                        _unavailable(failed) else policy.retry_max_attempts, backoff_s, failed)

        retrying = AsyncRetrying(
            retry=retry_if_exception(lambda e: isinstance(e, HandlerFailed) and e.transient),
            stop=lambda rs: state["attempt"] >= policy.retry_max_attempts and not _unavailable(
                rs.outcome.exception() if rs.outcome is not None else None),
            wait=lambda _rs: policy.backoff_s(state["attempt"], self._rng),
            sleep=wait, before_sleep=count_next, reraise=True)
        try:
            return await retrying(attempt)
        finally:
            self.retrying.pop(tp, None)

    async def _bisect(self, tp: TopicPartition, batch: Sequence[SourceRecord],
                      failure: HandlerFailed, wait: Backoff, inner: HandlerFn) -> Token:
        plan = Bisection(len(batch))
        rejects: dict[int, Reject] = {}
        token: Token | None = None
        while True:
            found = len(plan.poison)
            probe = plan.next()
            for i in plan.poison[found:]:
                rejects[batch[i].offset] = poison_reject(failure)
                self._count(tp, "quarantine", attrs={"messaging.kafka.offset": batch[i].offset,
                                                     "exception.type": failure.error_type},
                            cause=quarantine_cause(failure.error_type))
                log.warning("%s offset %d: poison record quarantined (%s)", tp,
                            batch[i].offset, failure.error_type)
            if probe is None:
                break
            await wait(0.0)
            self._count(tp, "bisection", int(probe.bisecting))
            records = batch[probe.start:probe.end]
            handler = with_rejects(inner, {i: rejects[i] for i in
                                           (batch[j].offset for j in probe.reject)})
            if is_armed_for("in-bisection-probe"):
                handler = _probe_point(handler, tp, probe.bisecting)
            try:
                token = await self._once(BatchCall(tp, records, handler, clear_attempts=True),
                                         wait.stopped)
            except TooSlow as slow:  # the split settles every record of the probe
                token = await self._split(tp, records, handler, wait, slow=slow)
                plan.committed()
            except HandlerFailed as again:
                failure = again
                try:  # a transient failure is not proof of poison: retry it first
                    token = await self._retry(tp, records, handler, again, 1, wait)
                except TooSlow as slow:
                    token = await self._split(tp, records, handler, wait, slow=slow)
                    plan.committed()
                except HandlerFailed as still:
                    failure = still
                    plan.failed()
                else:
                    plan.committed()
            else:
                plan.committed()
        log.info("%s: bisected %d records in %d probes, %d poison", tp, len(batch),
                 plan.probes, len(plan.poison))
        assert token is not None, "a bisection commits at least one transaction"
        return token

    # -- too slow --------------------------------------------------------------------------
    async def _split(self, tp: TopicPartition, batch: Sequence[SourceRecord],
                     handler: HandlerFn, wait: Backoff, *, slow: TooSlow | None = None,
                     size: int | None = None) -> Token:
        """Commit ``batch`` in chunks that fit (see the module Rules), after ``slow`` (the
        whole batch was too slow) or in chunks of ``size``; each record is applied,
        quarantined by the failure paths, or quarantined as too slow."""
        if slow is not None and len(batch) == 1:
            return await self._too_slow(tp, batch[0], handler, slow.limit_s, wait)
        plan = Split(len(batch), size) if size is not None else Split.after_too_slow(len(batch))
        if size is None:
            self._report_split(tp, len(batch))
        token: Token | None = None
        while (chunk := plan.next()) is not None:
            records = batch[chunk[0]:chunk[1]]
            await wait(0.0)
            started_s = self._clock()
            try:
                token = await self._once(BatchCall(tp, records, handler, clear_attempts=True),
                                         wait.stopped)
            except TooSlow as slow:
                if not plan.too_slow():
                    continue
                token = await self._too_slow(tp, records[0], handler, slow.limit_s, wait)
                plan.skip()
                continue
            except HandlerFailed as other:
                token = await self._failed(tp, records, other, wait=wait, attempts=1,
                                           handler=handler)
            plan.committed(duration_s=self._clock() - started_s, limit_s=self._limit_s)
        if plan.size >= self._window:
            self._fits.pop(tp, None)
        else:
            self._fits[tp] = plan.size
        assert token is not None
        return token

    def _report_split(self, tp: TopicPartition, n: int) -> None:
        self._count(tp, "split")
        if tp in self._split_reported:
            return
        self._split_reported.add(tp)
        log.warning("%s: a batch of %d records outlived %.1f s in the handler: it is split "
                    "into halves until each fits, and the partition's next batches keep the "
                    "size that fits; to avoid it shrink --batch-max-records, or give the "
                    "handler more time: %s", tp, n, self._limit_s, SLOW_SETTINGS)

    def _report_slow(self, tp: TopicPartition, records: Sequence[SourceRecord],
                     limit_s: float) -> None:
        what = "stops the worker" if self._decl.on_failure is OnFailure.STOP \
            else "is quarantined as too slow"
        log.warning("%s offsets %d..%d: the handler took longer than %.1f s (too slow); the "
                    "record %s; change %s, or make the handler faster", tp, records[0].offset,
                    records[-1].offset, limit_s, what, SLOW_SETTINGS)
        self._count(tp, "too-slow", len(records))

    async def _too_slow(self, tp: TopicPartition, record: SourceRecord, handler: HandlerFn,
                        limit_s: float, wait: Backoff) -> Token:
        """``record`` alone outlived the limit: reported once, then stop or quarantine."""
        self._report_slow(tp, [record], limit_s)
        if self._decl.on_failure is OnFailure.STOP:
            raise TooSlow(f"{tp} offset {record.offset}: the handler took longer than "
                          f"{limit_s:.1f} s for this record alone (on_failure=stop; change "
                          f"{SLOW_SETTINGS})", limit_s=limit_s)
        self._count(tp, "quarantine", cause="too-slow")
        reject = Reject(too_slow_reason(limit_s, SLOW_SETTINGS), error_type="TooSlow",
                        error_message=f"handler call longer than {limit_s:.1f} s")
        await wait(0.0)
        return await self._once(BatchCall(tp, [record], with_rejects(
            handler, {record.offset: reject}), clear_attempts=True), wait.stopped, settles=True)
