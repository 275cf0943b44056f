"""How the kit drives one batch through the real store: the handler wrapped to record its
verdicts and to watch for writes outside its transaction, the injected abort, and one
partition's planned steps (rules in ``fencing.testing.kit``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fencing.errors import Fenced, HandlerFailed
from fencing.guarded import guarded_claim, guarded_process
from fencing.store import BatchCall, FenceStore, HandlerFn
from fencing.testing.pgproxy import Action, PgProxy
from fencing.testing.plan import Fault, Step, diff
from fencing.types import ClaimRequest, Reject, SourceRecord, Token, TopicPartition, Verdict

__all__ = ["Watch", "run_partition", "watched"]

Key = tuple[str, int, int]


@dataclass(slots=True)
class Watch:
    """What every handler call saw: verdicts per record, writes outside the transaction."""

    verdicts: dict[Key, list[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    calls: int = 0


class _Abort(Exception):
    """Raised by the kit after the handler returned, so the store rolls the batch back."""


def _verdict_text(v: Verdict) -> str:
    return f"reject: {v.reason}" if isinstance(v, Reject) else "accept"


def watched(fn: HandlerFn, watch: Watch, outside: Callable[[], Awaitable[Any]] | None,
            *, abort: bool = False) -> HandlerFn:
    """``fn`` recording its verdicts into ``watch``; with ``outside`` (a snapshot read from
    another connection) it notes tables that changed while ``fn`` ran; with ``abort`` it
    raises after ``fn`` returned, so the store rolls the batch back."""
    async def run(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        watch.calls += 1
        before = None if outside is None else await outside()
        verdicts = await fn(conn, records)
        for r, v in zip(records, verdicts, strict=False):
            watch.verdicts.setdefault((r.topic, r.partition, r.offset), []).append(
                _verdict_text(v))
        if outside is not None and (after := await outside()) != before:
            watch.problems.append(
                f"batch {records[0].tp} offsets {records[0].offset}..{records[-1].offset}: "
                "declared transactional, but tables changed (committed) outside its "
                "transaction while it ran -- it writes through another connection: "
                + "; ".join(diff(before or {}, after, labels=("before the call",
                                                              "while it ran"))))
        if abort:
            raise _Abort()
        return verdicts
    return run


async def _no_wait(_seconds: float) -> None:
    return None


def _live() -> None:
    return None


async def _process(store: FenceStore, tp: TopicPartition, token: Token,
                   records: Sequence[SourceRecord], fn: HandlerFn) -> Token:
    return await guarded_process(store, BatchCall(tp, records, fn), token, wait=_no_wait,
                                 check_live=_live)


async def _aborted(store: FenceStore, tp: TopicPartition, token: Token,
                   records: Sequence[SourceRecord], fn: HandlerFn) -> None:
    try:
        await store.process(BatchCall(tp, records, fn), token)
    except HandlerFailed as exc:  # the store types a handler's raise (rolled back, no retire)
        if isinstance(exc.__cause__, _Abort):
            return
        raise
    raise AssertionError("the kit's abort did not abort")  # pragma: no cover


async def run_partition(store: FenceStore, proxy: PgProxy, tp: TopicPartition,
                        steps: list[Step], fn: HandlerFn, aborting: HandlerFn,
                        counts: dict[str, int], problems: list[str]) -> Token:
    """Claim ``tp`` and apply ``steps`` with their faults; return the final token. Counts
    each fault in ``counts``; a fault that did not take effect is added to ``problems``."""
    lifetime = 1
    token = (await guarded_claim(store, [ClaimRequest(tp, 0)], lifetime=f"kit-{lifetime}",
                                 wait=_no_wait, check_live=_live))[tp]
    for step in steps:
        counts[step.fault.value] = counts.get(step.fault.value, 0) + 1
        batch = step.records
        where = f"{tp} offsets {batch[0].offset}..{batch[-1].offset}"
        if step.fault in (Fault.LOST_REPLY_COMMITTED, Fault.LOST_REPLY_NOT_COMMITTED):
            action = (Action.CUT_AFTER if step.fault is Fault.LOST_REPLY_COMMITTED
                      else Action.CUT_BEFORE)
            rule = proxy.add_rule("COMMIT", action, exact=True)
            token = await _process(store, tp, token, batch, fn)
            if not rule.fired.is_set():
                proxy.rules.remove(rule)
                problems.append(f"kit: fault {step.fault.value} did not fire at {where}")
            continue
        if step.fault is Fault.ABORT:
            await _aborted(store, tp, token, batch, aborting)
        elif step.fault is Fault.REPLAY_NEW_EPOCH:
            await _aborted(store, tp, token, batch, aborting)
            lifetime += 1
            new = (await guarded_claim(store, [ClaimRequest(tp, 0)], lifetime=f"kit-{lifetime}",
                                       wait=_no_wait, check_live=_live))[tp]
            try:
                await store.process(BatchCall(tp, batch, fn), token)
                problems.append(f"kit: the old token {token} committed after a new claim "
                                f"at {where}")
            except Fenced:
                pass
            token, half = new, max(1, len(batch) // 2)
            token = await _process(store, tp, token, batch[:half], fn)
            batch = batch[half:]
            if not batch:
                continue
        token = await _process(store, tp, token, batch, fn)
    return token
