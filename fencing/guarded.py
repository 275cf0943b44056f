"""Guarded store operations: the three-call policy plus resolution of unknown outcomes.

Long because each write (process, lane, fold, claim, skip) keeps its resolution next to
its call.

Rules
- ``guarded_process``: at most three process calls. ``NotCommitted`` is retried.
  ``OutcomeUnknown`` is resolved by a settled ``observe`` (it waits, bounded, for a
  COMMIT the server may still be processing; itself under the three-call policy):
  COMMITTED returns the advanced token without another call; NOT_COMMITTED retries
  the same batch as the next call; FENCED raises ``Fenced``. An observe that cannot be
  answered raises ``Unresolved`` and the caller's lifetime must retire.
- ``guarded_lane``: a lane's transaction (``LaneStore.process_lane``) under the same
  policy; an unknown outcome is resolved by a settled re-read of the completion set
  (``resolve_lane``): COMMITTED returns, NOT_COMMITTED retries the same lane batch, FENCED
  raises ``Fenced``, a contradiction ``Unresolved``.
- ``guarded_claim``: ``OutcomeUnknown`` is followed by an observe (three-call policy)
  and then, only while ``check_live`` passes, a fresh claim as the next call. The
  observed epoch is never adopted: only a claim reply installs a token.
- ``guarded_process`` of an ``uncertain`` call (an ``outcome-uncertain`` handler) runs the
  handler at most once: a call that fails before the handler ran is retried as above, but
  once it ran, ``NotCommitted`` and an unknown outcome resolved as not committed raise
  ``EffectUncertain`` instead of calling it again.
- ``check_live`` runs before every call and after every wait.
- ``guarded_skip`` logs one warning once the frontier moved (the journal has its
  ``gap-skip`` row): records were skipped unprocessed and an operator should know.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from fencing.crashpoints import crash_point
from fencing.errors import (
    EffectUncertain,
    Fenced,
    NotCommitted,
    OutcomeUnknown,
    ReadFailed,
    Unresolved,
)
from fencing.lanes import Span
from fencing.policy import Wait, with_policy
from fencing.resolution import Resolution, resolve_lane, resolve_process
from fencing.store import BatchCall, FenceStore, LaneStore
from fencing.tracing import NO_TRACING, Tracing
from fencing.types import ClaimRequest, SourceRecord, Token, TopicPartition, Verdict

__all__ = [
    "NO_HOOKS",
    "CallHooks",
    "guarded_claim",
    "guarded_fold",
    "guarded_lane",
    "guarded_observe",
    "guarded_process",
    "guarded_skip",
]

log = logging.getLogger("fenceworker.fencing")


OnRetry = Callable[[BaseException, float], None] | None
OnResolve = Callable[[str, str], None] | None


@dataclass(frozen=True, slots=True)
class CallHooks:
    """What a guarded call reports while it runs (metrics live with the caller)."""

    on_retry: OnRetry = None  # (error, seconds until the next call) before each retry wait
    on_resolve: OnResolve = None  # (operation, resolution) once an unknown outcome resolved
    tracing: Tracing = NO_TRACING  # the ``fence.resolve`` span of a resolution


NO_HOOKS = CallHooks()


async def guarded_observe(
    store: FenceStore,
    tps: Sequence[TopicPartition],
    *,
    wait: Wait,
    check_live: Callable[[], None],
    hooks: CallHooks = NO_HOOKS,
    settled: bool = False,
) -> Mapping[TopicPartition, Token | None]:
    """Observe under the three-call policy; raises ``ReadFailed`` after three failed calls.
    ``settled``: wait for in-progress commits on the rows first (``FenceStore.observe``)."""
    return await with_policy(
        lambda: store.observe(tps, settled=settled), wait=wait, check_live=check_live,
        on_retry=hooks.on_retry)


async def _resolve_observe(
    store: FenceStore, tp_list: Sequence[TopicPartition], *, wait: Wait,
    check_live: Callable[[], None], hooks: CallHooks, what: str,
) -> Mapping[TopicPartition, Token | None]:
    try:
        return await guarded_observe(store, tp_list, wait=wait, check_live=check_live,
                                     hooks=hooks, settled=True)
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
    call: BatchCall,
    token: Token,
    *,
    wait: Wait,
    check_live: Callable[[], None],
    hooks: CallHooks = NO_HOOKS,
) -> Token:
    """Commit ``call`` under ``token`` (``FenceStore.process``); return the advanced token.
    An ``uncertain`` call runs its handler at most once (see the module Rules).

    Raises ``Fenced`` (nothing of this call applied), ``NotCommitted`` after three calls,
    ``Unresolved`` when an unknown outcome cannot be re-read, ``EffectUncertain`` (only for
    an ``uncertain`` call), or whatever ``check_live`` raises.
    """
    tp, records = call.tp, call.records
    if not records:
        raise ValueError("guarded_process needs at least one record")
    batch_end = records[-1].offset + 1
    ran = [False]
    if call.uncertain:
        inner = call.handler

        async def once(conn: object, recs: Sequence[SourceRecord]) -> Sequence[Verdict]:
            if ran[0]:
                raise AssertionError(f"process {tp}: an outcome-uncertain handler ran twice")
            ran[0] = True
            return await inner(conn, recs)

        call = replace(call, handler=once)

    async def one_call() -> Token:
        try:
            return await store.process(call, token)
        except OutcomeUnknown:
            pass
        except NotCommitted as exc:
            if ran[0]:
                raise EffectUncertain(f"process {tp}: not committed after the handler ran "
                                      f"({exc})") from exc
            raise
        with hooks.tracing.span("fence.resolve", {
                "fence.operation": "process", "messaging.destination.name": tp.topic,
                "messaging.destination.partition.id": str(tp.partition),
                "fence.epoch": token.epoch, "fence.frontier": token.frontier}) as span:
            observed = (await _resolve_observe(
                store, [tp], wait=wait, check_live=check_live, hooks=hooks,
                what=f"process {tp}"))[tp]
            resolution = resolve_process(sent=token, batch_end=batch_end, observed=observed)
            span.set_attribute("fence.outcome", resolution.value)
        if hooks.on_resolve is not None:
            hooks.on_resolve("process", resolution.value)
        if ran[0] and call.uncertain and resolution is Resolution.NOT_COMMITTED:
            raise EffectUncertain(f"process {tp}: lost COMMIT reply resolved as not committed "
                                  "after the handler ran")
        return _settle(resolution, token, batch_end, observed, what=f"process {tp}")

    return await with_policy(one_call, wait=wait, check_live=check_live,
                             on_retry=hooks.on_retry)


async def guarded_lane(
    store: LaneStore,
    call: BatchCall,
    token: Token,
    spans: Sequence[Span],
    *,
    wait: Wait,
    check_live: Callable[[], None],
    hooks: CallHooks = NO_HOOKS,
) -> None:
    """Commit one lane's batch under ``token``'s epoch (``LaneStore.process_lane``).

    Raises ``Fenced`` (nothing applied, or an unknown outcome re-read with another owner),
    ``HandlerFailed``, ``NotCommitted`` after three calls, ``Unresolved``, or whatever
    ``check_live`` raises."""
    tp = call.tp
    offsets = [r.offset for r in call.records]

    async def one_call() -> None:
        try:
            await store.process_lane(call, token, spans)
            return
        except OutcomeUnknown:
            pass
        with hooks.tracing.span("fence.resolve", {
                "fence.operation": "lane", "messaging.destination.name": tp.topic,
                "messaging.destination.partition.id": str(tp.partition),
                "fence.epoch": token.epoch}) as span:
            try:
                observed = (await with_policy(
                    lambda: store.completions([tp], settled=True), wait=wait,
                    check_live=check_live, on_retry=hooks.on_retry))[tp]
            except ReadFailed as exc:
                raise Unresolved(f"lane {tp}: outcome unknown and the re-read failed three "
                                 "times") from exc
            resolution = resolve_lane(sent=token, offsets=offsets, observed=observed)
            span.set_attribute("fence.outcome", "unresolved" if resolution is None
                               else resolution.value)
        if resolution is None:
            raise Unresolved(f"lane {tp}: after an unknown outcome only some of offsets "
                             f"{offsets[0]}..{offsets[-1]} are done")
        if hooks.on_resolve is not None:
            hooks.on_resolve("process", resolution.value)
        if resolution is Resolution.NOT_COMMITTED:
            raise NotCommitted(f"lane {tp}: unknown outcome resolved as not committed")
        if resolution is Resolution.FENCED:
            raise Fenced(f"lane {tp}: unknown outcome resolved to another owner ({observed})")

    await with_policy(one_call, wait=wait, check_live=check_live, on_retry=hooks.on_retry)


async def guarded_fold(
    store: LaneStore,
    tp: TopicPartition,
    token: Token,
    *,
    to_frontier: int,
    wait: Wait,
    check_live: Callable[[], None],
    hooks: CallHooks = NO_HOOKS,
) -> Token:
    """Move ``tp``'s frontier to ``to_frontier`` under ``token`` (``LaneStore.fold``), the
    three-call policy; an unknown outcome is resolved like a process commit ending at
    ``to_frontier``. Raises ``Fenced``, ``NotCommitted`` after three calls, ``Unresolved``."""
    if to_frontier <= token.frontier:
        return token

    async def one_call() -> Token:
        try:
            return await store.fold(tp, token, to_frontier=to_frontier)
        except OutcomeUnknown:
            pass
        assert isinstance(store, FenceStore)
        observed = (await _resolve_observe(store, [tp], wait=wait, check_live=check_live,
                                           hooks=hooks, what=f"fold {tp}"))[tp]
        resolution = resolve_process(sent=token, batch_end=to_frontier, observed=observed)
        return _settle(resolution, token, to_frontier, observed, what=f"fold {tp}")

    return await with_policy(one_call, wait=wait, check_live=check_live,
                             on_retry=hooks.on_retry)


async def guarded_claim(
    store: FenceStore,
    claims: Sequence[ClaimRequest],
    *,
    lifetime: str,
    wait: Wait,
    check_live: Callable[[], None],
    hooks: CallHooks = NO_HOOKS,
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
        with hooks.tracing.span("fence.resolve", {"fence.operation": "claim",
                                                   "fence.lifetime": lifetime}) as span:
            await _resolve_observe(store, tp_list, wait=wait, check_live=check_live,
                                   hooks=hooks, what=f"claim {lifetime}")
            check_live()
            span.set_attribute("fence.outcome", "reclaim")
        if hooks.on_resolve is not None:
            hooks.on_resolve("claim", "reclaim")
        if calls >= 3:
            raise Unresolved(f"claim {lifetime}: third claim call had an unknown outcome")
        raise NotCommitted(f"claim {lifetime}: unknown outcome; claiming afresh")

    return await with_policy(one_call, wait=wait, check_live=check_live,
                             on_retry=hooks.on_retry)


async def guarded_skip(
    store: FenceStore,
    tp: TopicPartition,
    token: Token,
    *,
    to_offset: int,
    reason: str,
    wait: Wait,
    check_live: Callable[[], None],
    hooks: CallHooks = NO_HOOKS,
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
                                           hooks=hooks, what=f"skip {tp}"))[tp]
        resolution = resolve_process(sent=token, batch_end=to_offset, observed=observed)
        return _settle(resolution, token, to_offset, observed, what=f"skip {tp}")

    moved = await with_policy(one_call, wait=wait, check_live=check_live,
                              on_retry=hooks.on_retry)
    crash_point("in-gap-skip", partition=str(tp), epoch=moved.epoch, first_offset=token.frontier,
                frontier=moved.frontier)
    log.warning("%s: skipped offsets %d..%d unprocessed (%s, %d records; journaled gap-skip at "
                "epoch %d)", tp, token.frontier, to_offset - 1, reason, to_offset - token.frontier,
                moved.epoch)
    return moved
