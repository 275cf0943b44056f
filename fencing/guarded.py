"""Guarded store operations: the three-call policy plus resolution of unknown outcomes.

Rules
- ``guarded_process``: at most three process calls. ``NotCommitted`` is retried.
  ``OutcomeUnknown`` is resolved by ``observe`` (itself under the three-call policy):
  COMMITTED returns the advanced token without another call; NOT_COMMITTED retries
  the same batch as the next call; FENCED raises ``Fenced``. An observe that cannot be
  answered raises ``Unresolved`` and the caller's lifetime must retire.
- ``guarded_claim``: ``OutcomeUnknown`` is followed by an observe (three-call policy)
  and then, only while ``check_live`` passes, a fresh claim as the next call. The
  observed epoch is never adopted: only a claim reply installs a token.
- ``check_live`` runs before every call and after every wait.
- ``guarded_skip`` logs one warning once the frontier moved (the journal has its
  ``gap-skip`` row): records were skipped unprocessed and an operator should know.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from opentelemetry import trace

from fencing.errors import Fenced, NotCommitted, OutcomeUnknown, ReadFailed
from fencing.policy import Wait, with_policy
from fencing.resolution import Resolution, resolve_process
from fencing.store import FenceStore, HandlerFn
from fencing.types import ClaimRequest, SourceRecord, Token, TopicPartition

__all__ = ["Unresolved", "guarded_claim", "guarded_observe", "guarded_process", "guarded_skip"]

_tracer = trace.get_tracer("fenceworker.fencing")
log = logging.getLogger("fenceworker.fencing")


class Unresolved(OutcomeUnknown):
    """An unknown outcome could not be resolved within the observe's three calls; the lifetime
    retires."""


OnRetry = Callable[[BaseException, float], None] | None
OnResolve = Callable[[str, str], None] | None


async def guarded_observe(
    store: FenceStore,
    tps: Sequence[TopicPartition],
    *,
    wait: Wait,
    check_live: Callable[[], None],
    on_retry: OnRetry = None,
) -> Mapping[TopicPartition, Token | None]:
    """Observe under the three-call policy; raises ``ReadFailed`` after three failed calls."""
    return await with_policy(
        lambda: store.observe(tps), wait=wait, check_live=check_live, on_retry=on_retry
    )


async def _resolve_observe(
    store: FenceStore, tp_list: Sequence[TopicPartition], *, wait: Wait,
    check_live: Callable[[], None], on_retry: OnRetry, what: str,
) -> Mapping[TopicPartition, Token | None]:
    try:
        return await guarded_observe(store, tp_list, wait=wait, check_live=check_live,
                                     on_retry=on_retry)
    except ReadFailed as exc:
        raise Unresolved(f"{what}: outcome unknown and the re-read failed three times") from exc


def _settle(resolution: Resolution, token: Token, end: int, observed: Token | None, *,
            what: str) -> Token:
    """The advanced token for COMMITTED; ``NotCommitted`` (retry) or ``Fenced`` otherwise."""
    if resolution is Resolution.COMMITTED:
        return Token(token.epoch, end)
    if resolution is Resolution.NOT_COMMITTED:
        raise NotCommitted(f"{what}: unknown outcome resolved as not committed")
    raise Fenced(f"{what}: unknown outcome resolved to another owner ({observed})")


async def guarded_process(
    store: FenceStore,
    tp: TopicPartition,
    token: Token,
    records: Sequence[SourceRecord],
    handler: HandlerFn,
    *,
    wait: Wait,
    check_live: Callable[[], None],
    on_retry: OnRetry = None,
    on_resolve: OnResolve = None,
) -> Token:
    """Commit one batch under ``token``; return the advanced token.

    Raises ``Fenced`` (nothing of this call applied), ``NotCommitted`` after three calls,
    ``Unresolved`` when an unknown outcome cannot be re-read, or whatever ``check_live`` raises.
    """
    if not records:
        raise ValueError("guarded_process needs at least one record")
    batch_end = records[-1].offset + 1

    async def one_call() -> Token:
        try:
            return await store.process(tp, token, records, handler)
        except OutcomeUnknown:
            pass
        with _tracer.start_as_current_span("fence.resolve") as span:
            span.set_attribute("fence.operation", "process")
            span.set_attribute("messaging.destination.name", tp.topic)
            span.set_attribute("messaging.destination.partition.id", str(tp.partition))
            span.set_attribute("fence.epoch", token.epoch)
            span.set_attribute("fence.frontier", token.frontier)
            observed = (await _resolve_observe(
                store, [tp], wait=wait, check_live=check_live, on_retry=on_retry,
                what=f"process {tp}"))[tp]
            resolution = resolve_process(sent=token, batch_end=batch_end, observed=observed)
            span.set_attribute("fence.outcome", resolution.value)
        if on_resolve is not None:
            on_resolve("process", resolution.value)
        return _settle(resolution, token, batch_end, observed, what=f"process {tp}")

    return await with_policy(one_call, wait=wait, check_live=check_live, on_retry=on_retry)


async def guarded_claim(
    store: FenceStore,
    claims: Sequence[ClaimRequest],
    *,
    lifetime: str,
    wait: Wait,
    check_live: Callable[[], None],
    on_retry: OnRetry = None,
    on_resolve: OnResolve = None,
) -> Mapping[TopicPartition, Token]:
    """Claim every partition of ``claims`` in one call per attempt; return the installed tokens.

    Raises ``NotCommitted`` after three calls, ``Unresolved`` when an unknown claim cannot be
    re-read or its third call was unknown, or whatever ``check_live`` raises.
    """
    tp_list = [c.tp for c in claims]
    calls = 0

    async def one_call() -> Mapping[TopicPartition, Token]:
        nonlocal calls
        calls += 1
        try:
            return await store.claim(claims, lifetime=lifetime)
        except OutcomeUnknown:
            pass
        with _tracer.start_as_current_span("fence.resolve") as span:
            span.set_attribute("fence.operation", "claim")
            span.set_attribute("fence.lifetime", lifetime)
            await _resolve_observe(store, tp_list, wait=wait, check_live=check_live,
                                   on_retry=on_retry, what=f"claim {lifetime}")
            check_live()
            span.set_attribute("fence.outcome", "reclaim")
        if on_resolve is not None:
            on_resolve("claim", "reclaim")
        if calls >= 3:
            raise Unresolved(f"claim {lifetime}: third claim call had an unknown outcome")
        raise NotCommitted(f"claim {lifetime}: unknown outcome; claiming afresh")

    return await with_policy(one_call, wait=wait, check_live=check_live, on_retry=on_retry)


async def guarded_skip(
    store: FenceStore,
    tp: TopicPartition,
    token: Token,
    *,
    to_offset: int,
    reason: str,
    wait: Wait,
    check_live: Callable[[], None],
    on_retry: OnRetry = None,
) -> Token:
    """Move the frontier to ``to_offset`` under ``token`` (``store.skip``), three-call policy.

    An unknown outcome is resolved like a process commit whose batch ends at ``to_offset``.
    Raises ``Fenced``, ``NotCommitted`` after three calls, ``Unresolved``, or whatever
    ``check_live`` raises.
    """
    if to_offset <= token.frontier:
        return token

    async def one_call() -> Token:
        try:
            return await store.skip(tp, token, to_offset=to_offset, reason=reason)
        except OutcomeUnknown:
            pass
        observed = (await _resolve_observe(store, [tp], wait=wait, check_live=check_live,
                                           on_retry=on_retry, what=f"skip {tp}"))[tp]
        resolution = resolve_process(sent=token, batch_end=to_offset, observed=observed)
        return _settle(resolution, token, to_offset, observed, what=f"skip {tp}")

    moved = await with_policy(one_call, wait=wait, check_live=check_live, on_retry=on_retry)
    log.warning("%s: skipped offsets %d..%d unprocessed (%s, %d records; journaled gap-skip at "
                "epoch %d)", tp, token.frontier, to_offset - 1, reason, to_offset - token.frontier,
                moved.epoch)
    return moved
