"""Handler failures of one partition: transient retries, bisection, quarantine, suspects.
(Long because it sequences every failure path of a partition in one place; the decisions
are pure, in ``fencing.failures``.)

Rules (the decisions live in ``fencing.failures``; this module only sequences I/O)
- Every step of these paths first checks the caller's ``stopped()`` (through ``wait(0)``):
  once the partition closed (revoked, lost) or the run ends, ``RetryInterrupted`` ends the
  handling without another write, and so does a ``Fenced`` raised once it closed (its
  token was dropped meanwhile); the batch is not applied and the next owner (or this
  lifetime after reassignment) takes it from the durable frontier.
- ``submit`` is ``Lifecycle.process`` plus a dict lookup for a healthy partition: the
  paths below run only after ``HandlerFailed`` (nothing applied) or inside the window of a
  *suspect* partition, so a healthy partition's batches cost what they cost before.
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
- ``outcome-uncertain`` handlers are never retried or bisected: a failed batch is
  quarantined whole, and so is a suspect record with an earlier attempt.
- Suspect (``Attempts.suspect``, read when the partition is claimed): the next
  ``suspect_window`` records (``--batch-max-records``: the most the dead process can have
  had in flight) are tried one per transaction, each after its durable count was
  incremented in its own committed write; a record whose earlier, unfinished attempts
  reached ``--max-attempts`` is quarantined instead of tried (it killed the process that
  often). A process that dies during such an attempt leaves the count behind; the count is
  deleted by the transaction that moves the frontier past the record.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception

from consumer.decisions import LifetimeState
from consumer.observability.instruments import Instruments
from consumer.ports import LifecyclePort
from fencing.errors import Fenced, HandlerFailed
from fencing.failures import Bisection, RetryPolicy, death_reason
from fencing.handler import Declaration, Effects, OnFailure, check_verdicts
from fencing.store import HandlerFn
from fencing.tracing import NO_TRACING, SpanHandle, Tracing
from fencing.types import Reject, SourceRecord, Token, TopicPartition, Verdict

__all__ = ["Backoff", "FailureRun", "RetryInterrupted"]

log = logging.getLogger("fenceworker.failures")

Wait = Callable[[float], Awaitable[None]]


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
                  traceback_digest=failure.traceback_digest)


def with_rejects(inner: HandlerFn, rejects: Mapping[int, Reject]) -> HandlerFn:
    """``inner`` over the records whose offset is not in ``rejects``; those get their Reject."""
    if not rejects:
        return inner

    async def handler(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        apply = [r for r in records if r.offset not in rejects]
        got = iter(check_verdicts(await inner(conn, apply), len(apply)) if apply else ())
        return [rejects[r.offset] if r.offset in rejects else next(got) for r in records]

    return handler


class FailureRun:
    """The failure handling of a worker's partitions (see the module Rules)."""

    def __init__(self, *, lifecycle: LifecyclePort, handler: HandlerFn, declaration: Declaration,
                 policy: RetryPolicy, rng: random.Random, clock: Callable[[], float],
                 wait: Wait, suspect_window: int = 500,
                 instruments: Instruments | None = None, tracing: Tracing = NO_TRACING) -> None:
        """``clock``/``wait``/``rng``: injected time and randomness of the backoffs;
        ``suspect_window``: records tried alone after a suspect claim (``--batch-max-records``:
        the largest batch the dead process may have had in flight)."""
        self._lc = lifecycle
        self._handler = handler
        self._decl = declaration
        self._policy = policy
        self._rng = rng
        self._clock = clock
        self._wait = wait
        self._m = instruments
        self._window = suspect_window
        self._tracing = tracing
        self._spans: dict[TopicPartition, SpanHandle] = {}  # open fence.handler_failure spans
        self._suspect_left: dict[TopicPartition, int] = {}
        self.retrying: dict[TopicPartition, tuple[int, float]] = {}  # attempt, backoff s

    def _count(self, tp: TopicPartition, kind: str, n: int = 1,
               attrs: Mapping[str, Any] | None = None) -> None:
        """Metrics and a span event (``fence.<kind>``) of one failure-handling step."""
        if self._m is not None and n:
            self._m.handler_failure(tp, kind=kind, count=n)
        span = self._spans.get(tp)
        if span is not None and n:
            span.add_event(f"fence.{kind}", {"fence.count": n, **(attrs or {})})


    async def submit(self, tp: TopicPartition, batch: Sequence[SourceRecord], *,
                     links: Sequence[object], stopped: Callable[[], bool]) -> Token:
        """``lifecycle.process`` of one batch; suspect records and handler failures take the
        paths of the module Rules; their backoff waits raise ``RetryInterrupted`` once
        ``stopped()``."""
        if self._lc.take_failure_marks(tp) is not None:  # a dict lookup on the hot path
            self._suspect_left[tp] = self._window
        if tp in self._suspect_left:
            return await self._closing_ends(self._suspects(
                tp, batch, Backoff(self._clock, self._wait, stopped)), stopped)
        try:
            return await self._lc.process(tp, batch, self._handler, links=links)
        except HandlerFailed as failure:
            return await self._closing_ends(self.failed(
                tp, batch, failure, wait=Backoff(self._clock, self._wait, stopped)),
                stopped)

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

    async def _suspects(self, tp: TopicPartition, batch: Sequence[SourceRecord],
                        wait: Wait) -> Token:
        """Records of the suspect window, one per transaction, each counted first."""
        token: Token | None = None
        for i, record in enumerate(batch):
            left = self._suspect_left.get(tp, 0)
            if left <= 0:
                self._suspect_left.pop(tp, None)
                return await self._rest(tp, batch[i:], wait)
            token = await self.suspect(tp, record, wait=wait)
            self._suspect_left[tp] = left - 1
        if self._suspect_left.get(tp, 0) <= 0:
            self._suspect_left.pop(tp, None)
        assert token is not None
        return token

    async def _rest(self, tp: TopicPartition, batch: Sequence[SourceRecord],
                    wait: Wait) -> Token:
        try:
            return await self._lc.process(tp, batch, self._handler)
        except HandlerFailed as failure:
            return await self.failed(tp, batch, failure, wait=wait)

    async def suspect(self, tp: TopicPartition, record: SourceRecord, *, wait: Wait) -> Token:
        """Count an attempt of ``record`` durably, then try it alone; quarantine it instead
        when earlier attempts that never completed reached ``--max-attempts``."""
        limit = self._policy.max_attempts
        await wait(0.0)  # raises RetryInterrupted once the partition closed (lost, revoked)
        got = await self._lc.record_attempt(tp, offset=record.offset, max_attempts=limit,
                                            error=None, next_retry_in_s=None)
        self._count(tp, "attempt")
        earlier = got.count - 1
        if earlier >= limit or (self._decl.effects is Effects.OUTCOME_UNCERTAIN and earlier > 0):
            log.warning("%s offset %d: quarantined after %d unfinished attempts", tp,
                        record.offset, earlier)
            self._count(tp, "quarantine")
            reject = Reject(death_reason(earlier, got.last_error),
                            error_type=None if got.last_error else "ProcessDeath")
            return await self._lc.process(tp, [record], with_rejects(
                self._handler, {record.offset: reject}), clear_attempts=True)
        try:
            return await self._lc.process(tp, [record], self._handler, clear_attempts=True)
        except HandlerFailed as failure:
            return await self.failed(tp, [record], failure, attempts=got.count, wait=wait)

    async def failed(self, tp: TopicPartition, batch: Sequence[SourceRecord],
                     failure: HandlerFailed, *, wait: Wait, attempts: int = 1) -> Token:
        """Handle ``failure`` of ``batch`` (nothing of it applied); return the new token.
        One ``fence.handler_failure`` span holds the retries, probes and quarantines."""
        if tp in self._spans:
            return await self._failed(tp, batch, failure, wait=wait, attempts=attempts)
        with self._tracing.span("fence.handler_failure", {
                "messaging.destination.name": tp.topic,
                "messaging.destination.partition.id": str(tp.partition),
                "fence.first_offset": batch[0].offset, "fence.last_offset": batch[-1].offset,
                "fence.transient": failure.transient,
                "exception.type": failure.error_type}) as span:
            self._spans[tp] = span
            try:
                return await self._failed(tp, batch, failure, wait=wait, attempts=attempts)
            finally:
                self._spans.pop(tp, None)

    async def _failed(self, tp: TopicPartition, batch: Sequence[SourceRecord],
                      failure: HandlerFailed, *, wait: Wait, attempts: int) -> Token:
        log.warning("%s offsets %d..%d: %s", tp, batch[0].offset, batch[-1].offset, failure)
        if self._decl.effects is Effects.OUTCOME_UNCERTAIN:
            self._count(tp, "quarantine", len(batch))
            why = "outcome-uncertain effect failed mid-batch; not replayed"
            return await self._lc.process(tp, batch, with_rejects(
                self._handler, {r.offset: poison_reject(failure, why=why) for r in batch}),
                clear_attempts=True)
        try:
            return await self._retry(tp, batch, self._handler, failure, attempts, wait)
        except HandlerFailed as last:
            failure = last
        if self._decl.on_failure is OnFailure.STOP:
            raise failure
        return await self._bisect(tp, batch, failure, wait)

    async def _retry(self, tp: TopicPartition, batch: Sequence[SourceRecord],
                     handler: HandlerFn, failure: HandlerFailed, attempts: int,
                     wait: Wait) -> Token:
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
            return await self._lc.process(tp, batch, handler, clear_attempts=True)

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
                      failure: HandlerFailed, wait: Wait) -> Token:
        plan = Bisection(len(batch))
        rejects: dict[int, Reject] = {}
        token: Token | None = None
        while True:
            found = len(plan.poison)
            probe = plan.next()
            for i in plan.poison[found:]:
                rejects[batch[i].offset] = poison_reject(failure)
                self._count(tp, "quarantine", attrs={"messaging.kafka.offset": batch[i].offset,
                                                     "exception.type": failure.error_type})
                log.warning("%s offset %d: poison record quarantined (%s)", tp,
                            batch[i].offset, failure.error_type)
            if probe is None:
                break
            await wait(0.0)
            self._count(tp, "bisection", int(probe.bisecting))
            records = batch[probe.start:probe.end]
            handler = with_rejects(self._handler, {i: rejects[i] for i in
                                                   (batch[j].offset for j in probe.reject)})
            try:
                token = await self._lc.process(tp, records, handler, clear_attempts=True)
            except HandlerFailed as again:
                failure = again
                try:  # a transient failure is not proof of poison: retry it first
                    token = await self._retry(tp, records, handler, again, 1, wait)
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
