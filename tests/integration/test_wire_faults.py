"""Wire faults at every statement the stores and the operator tools send (a lane's
transaction and a fold included), and at the table sink's write of a small set (real
PostgreSQL, through ``fencing.testing.pgproxy``).

One parametrized test: every statement kind x {the connection cut before the statement
reaches the server, cut after the server finished it and before its reply, the reply held
until the call's budget cancels it}. Each case drives the production path that sends the
statement (the lifecycle, the member heartbeat, the operator functions) and asserts:

- the typed error of the store-level call matches what the server did, read back on another
  connection right when the error came: ``ReadFailed`` (a read: nothing done),
  ``NotCommitted`` (nothing of the transaction applied), ``OutcomeUnknown`` (either; it
  is the only answer allowed where the client cannot tell), a cancellation noted "outcome
  unknown" exactly where COMMIT or a one-statement write was in flight;
- the call ends with its effect durable exactly once (retried, or resolved by the re-read),
  or its lifetime retired; an operator command re-run afterwards applies it exactly once;
- a held reply ends the call within its budget (the lifecycle's, the pool's command
  timeout for a heartbeat, ``timeout_s`` for the operator tools).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest

from consumer.decisions import LifetimeState
from consumer.lifecycle import Lifecycle
from consumer.observability.heartbeat import MemberHeartbeat, MemberIdentity, MemberState
from fencing.errors import (
    Fenced,
    FenceError,
    NotCommitted,
    OutcomeUnknown,
    ReadFailed,
    Retired,
    TooSlow,
)
from fencing.postgres.sink import SinkSpec, make_table_sink
from fencing.postgres.store import PgFenceStore
from fencing.store import BatchCall
from fencing.testing.pgproxy import Action, PgProxy
from fencing.types import (
    ClaimRequest,
    Reject,
    SourceCheck,
    SourceFacts,
    SourceRecord,
    Token,
    TopicPartition,
    Verdict,
)
from ops.commands.reset import apply_reset
from ops.operator.quarantine import Outcome, QuarantineKey, purge, replay_one
from ops.operator.reset_plan import Action as ResetAction
from ops.operator.reset_plan import Current, ResetApplied, plan_reset
from tests.integration.pg_helpers import effect_handler, make_records

pytestmark = pytest.mark.integration

TP = TopicPartition("wire", 0)
BUDGET_S = 2.0  # the lifecycle's and the operator tools' budget in these tests
COMMAND_TIMEOUT_S = 2.0  # the proxied pool's (a heartbeat's only bound)
SLACK_S = 3.0  # a call returns within its budget plus this (loop, rollback, close)
LIFETIME = "lt-wire"
FACTS = SourceFacts("tid", 0, 100)

READ, WRITE, BODY, COMMIT = "read", "write", "body", "commit"
FAULTS = {"cut-before": Action.CUT_BEFORE, "cut-after": Action.CUT_AFTER,
          "held-then-cancelled": Action.HOLD_REPLY}


class Recording:
    """The proxied store, recording the first error of a call of ``method`` and what the
    server had done at that moment (``snapshot``)."""

    def __init__(self, store: PgFenceStore, snapshot: Callable[[], Awaitable[int]]) -> None:
        self.store = store
        self.group_id = store.group_id
        self._snapshot = snapshot
        self.method = ""
        self.first: tuple[str, BaseException, int] | None = None

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.store, name)
        if not callable(target):
            return target

        async def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return await target(*args, **kwargs)
            except BaseException as exc:
                if self.first is None and name == self.method:
                    seen = await asyncio.shield(self._snapshot())
                    self.first = (name, exc, seen)
                raise
        return call


@dataclass
class Env:
    dsn: str
    schema: str
    group: str
    proxy: PgProxy
    direct: PgFenceStore
    proxied: PgFenceStore
    probe: Callable[[], Awaitable[int]] = field(default=lambda: _zero())
    recording: Recording | None = None

    def lifecycle(self, *, allow_gap: bool = False) -> Lifecycle:
        self.recording = Recording(self.proxied, lambda: self.probe())
        return Lifecycle(store=self.recording, lifetime_id=LIFETIME, clock=time.monotonic,
                         wait=asyncio.sleep, budget_s=BUDGET_S, allow_retention_gap=allow_gap)

    async def sql(self, query: str, *args: Any) -> list[Any]:
        conn = await asyncpg.connect(self.dsn)
        try:
            return list(await conn.fetch(query.replace("{s}", f'"{self.schema}"'), *args))
        finally:
            await conn.close()

    async def count(self, query: str, *args: Any) -> int:
        return int((await self.sql(query, *args))[0][0])

    async def proxied_conn(self) -> asyncpg.Connection:
        return await asyncpg.connect(self.proxy.dsn(self.dsn))


async def _zero() -> int:
    return 0


@dataclass(frozen=True, slots=True)
class Case:
    """One statement kind: its class, the SQL it is found by, the store method that sends
    it, and its scenario."""

    klass: str
    needle: Callable[[str], str]
    method: str
    scenario: Callable[[Env, str], Awaitable[None]]
    exact: bool = False
    in_handler: bool = False  # a statement of the handler's body (its time limit applies)


@dataclass(slots=True)
class Ran:
    value: Any
    error: BaseException | None
    took_s: float


async def _faulted(env: Env, case: Case, fault: str, act: Callable[[], Awaitable[Any]]) -> Ran:
    """Arm the fault on the case's statement, run ``act``, release held replies."""
    if env.recording is not None:
        env.recording.method, env.recording.first = case.method, None
    rule = env.proxy.add_rule(case.needle(env.schema), FAULTS[fault], exact=case.exact)
    started = time.monotonic()
    try:
        value, error = await act(), None
    except (FenceError, asyncio.CancelledError, TimeoutError) as exc:
        value, error = None, exc
    took_s = time.monotonic() - started
    assert rule.fired.is_set(), f"the {fault} fault never fired on {case.needle(env.schema)!r}"
    env.proxy.release()
    return Ran(value, error, took_s)


def _check_typed(case: Case, fault: str, name: str, exc: BaseException, applied: int) -> None:
    """The store-level error agrees with what the server did (``applied`` effects)."""
    if fault == "held-then-cancelled":
        unknown_note = any("outcome unknown" in n for n in getattr(exc, "__notes__", []))
        if isinstance(exc, asyncio.CancelledError):
            assert unknown_note is (case.klass in (WRITE, COMMIT)), (name, exc.__notes__)
        elif case.in_handler:
            # the handler's own time limit (fencing.slow: 75 % of the budget) stops a held
            # statement of its body before the budget does: rolled back, nothing applied
            assert isinstance(exc, TooSlow), (name, exc)
            assert not applied, (name, exc, applied)
        else:  # the pool's command timeout (a heartbeat): asyncpg's TimeoutError, classified
            assert isinstance(exc, OutcomeUnknown if case.klass in (WRITE, COMMIT) else
                              ReadFailed if case.klass == READ else NotCommitted), (name, exc)
        return
    if case.klass == READ:
        assert isinstance(exc, ReadFailed) and not applied, (name, exc, applied)
    elif case.klass == BODY:
        assert isinstance(exc, NotCommitted) and not applied, (name, exc, applied)
    else:  # the client cannot tell a cut before from a cut after: only "unknown" is true
        assert isinstance(exc, OutcomeUnknown), (name, exc)
        assert applied == (1 if fault == "cut-after" else 0), (name, applied)


def _typed(env: Env, case: Case, fault: str) -> None:
    assert env.recording is not None and env.recording.first is not None, \
        "the faulted store call raised nothing"
    _check_typed(case, fault, *env.recording.first)


def _within_budget(ran: Ran, budget_s: float = BUDGET_S) -> None:
    assert ran.took_s < budget_s + SLACK_S, f"the call took {ran.took_s:.1f} s"


def _retired_within_budget(ran: Ran, lc: Lifecycle) -> None:
    assert isinstance(ran.error, Retired), ran.error
    assert lc.state is not LifetimeState.LIVE and lc.token(TP) is None
    _within_budget(ran)


# -- reads and claims of an assignment ---------------------------------------------------
async def _claims(env: Env) -> int:
    return await env.count("SELECT count(*) FROM {s}.journal WHERE group_id = $1 AND"
                           " event = 'claim' AND lifetime = $2", env.group, LIFETIME)


async def _assigned(env: Env, fault: str, case: Case, *, probe_claims: bool) -> None:
    env.probe = (lambda: _claims(env)) if probe_claims else _zero
    lc = env.lifecycle()
    ran = await _faulted(env, case, fault, lambda: lc.assign([SourceCheck(TP, FACTS)]))
    _typed(env, case, fault)
    durable = (await env.direct.observe([TP]))[TP]
    if fault == "held-then-cancelled":
        _retired_within_budget(ran, lc)
        return
    assert ran.error is None, ran.error
    # exactly one installed token: the lifetime's, equal to the durable row
    assert lc.token(TP) == durable and durable is not None
    assert durable.epoch == await _claims(env)


async def validate(env: Env, fault: str) -> None:
    await _assigned(env, fault, CASES["validate"], probe_claims=False)


async def claim(env: Env, fault: str) -> None:
    await _assigned(env, fault, CASES["claim"], probe_claims=True)
    if fault == "held-then-cancelled":  # the held claim had committed: one epoch installed
        assert await _claims(env) == 1


async def attempts_read(env: Env, fault: str) -> None:
    await _assigned(env, fault, CASES["attempt count read"], probe_claims=False)


async def _held(env: Env) -> Lifecycle:
    """A lifetime holding ``TP`` (assigned and sought through the proxy, no fault yet)."""
    lc = env.lifecycle()
    await lc.assign([SourceCheck(TP, FACTS)])
    await lc.seek_all([TP])
    return lc


async def observe(env: Env, fault: str) -> None:
    lc = await _held(env)
    ran = await _faulted(env, CASES["observe"], fault, lambda: lc.seek_all([TP]))
    _typed(env, CASES["observe"], fault)
    if fault == "held-then-cancelled":
        _retired_within_budget(ran, lc)
        return
    assert ran.value == {TP: 0} and lc.token(TP) == (await env.direct.observe([TP]))[TP]


# -- one batch: the fence statement, the handler's body, COMMIT ---------------------------
async def _effects(env: Env) -> int:
    return await env.count("SELECT count(*) FROM {s}.effects")


def _batches(env: Env, table: str) -> Callable[[], Awaitable[int]]:
    async def batches() -> int:  # of four records each
        return await env.count(f"SELECT count(*) FROM {{s}}.{table}") // 4
    return batches


async def _batch(env: Env, fault: str, case: Case, *, handler: Any = None,
                 records: Sequence[SourceRecord] | None = None, table: str = "effects",
                 lanes: bool = False) -> None:
    """Four records in one batch (``effect_handler``'s into ``effects``, or ``handler``'s
    ``records`` into ``table``, one row per record with its ``offset``); with ``lanes``,
    as one lane's batch (each record its own span): the partition row's frontier stays
    where it is (no fold) and the completion set says what was applied."""
    lc = await _held(env)
    env.probe = _batches(env, table)
    records = make_records(TP, range(4)) if records is None else records
    handler = effect_handler(env.schema) if handler is None else handler
    if lanes:
        lc.run_lanes(TP, {r.offset: (r.offset, r.offset) for r in records})
    ran = await _faulted(env, case, fault, lambda: lc.process(BatchCall(TP, records, handler)))
    _typed(env, case, fault)
    durable = (await env.direct.observe([TP]))[TP]
    assert durable is not None and durable.epoch == 1
    offsets = sorted(r[0] for r in await env.sql(f'SELECT "offset" FROM {{s}}.{table}'))
    applied = await _applied_set(env) if lanes else durable.frontier
    if lanes:
        assert durable == Token(1, 0)  # a lane never moves the row's frontier (a fold does)
    if fault == "held-then-cancelled" and case.in_handler:
        # the handler's time limit (fencing.slow: 75 % of the budget) stops its held
        # statement before the budget: the batch rolled back and is the failure run's to
        # split; the lifetime goes on (a slow handler is not a failure of the lifetime)
        assert isinstance(ran.error, TooSlow), ran.error
        assert lc.state is LifetimeState.LIVE and lc.token(TP) == Token(1, 0)
        assert offsets == [] and applied == 0
        _within_budget(ran)
        return
    if fault == "held-then-cancelled":
        _retired_within_budget(ran, lc)
        committed = case.klass == COMMIT  # a held COMMIT reply: the server had committed
        assert offsets == ([0, 1, 2, 3] if committed else [])
        assert applied == (4 if committed else 0)
        return
    assert ran.error is None, ran.error
    assert offsets == [0, 1, 2, 3] and applied == 4  # each record's effect exactly once
    assert lc.token(TP) == durable


async def fence(env: Env, fault: str) -> None:
    await _batch(env, fault, CASES["fence statement"])


async def handler_body(env: Env, fault: str) -> None:
    await _batch(env, fault, CASES["handler body"])


async def commit(env: Env, fault: str) -> None:
    await _batch(env, fault, CASES["COMMIT"])


async def sink_write(env: Env, fault: str) -> None:
    """The table sink's write of a small set (``Writer.unnest_insert``), in insert mode:
    a record applied twice would be two rows."""
    await env.sql('CREATE TABLE {s}.sink_rows ("offset" int8 NOT NULL)')
    records = [SourceRecord(TP.topic, TP.partition, o, None, json.dumps({"offset": o}).encode())
               for o in range(4)]
    await _batch(env, fault, CASES["sink write"], records=records, table="sink_rows",
                 handler=make_table_sink(SinkSpec(f"{env.schema}.sink_rows")))


# -- one lane's transaction (``--lanes``): the epoch check, the body, the spans, COMMIT; a fold --
async def _applied_set(env: Env) -> int:
    """What a successor skips: the effective frontier of the completion set (0 or 4)."""
    done = (await env.direct.completions([TP]))[TP]
    return 0 if done is None else done.frontier


async def lane_fence(env: Env, fault: str) -> None:
    await _batch(env, fault, CASES["lane epoch check"], lanes=True)


async def lane_body(env: Env, fault: str) -> None:
    await _batch(env, fault, CASES["lane handler body"], lanes=True)


async def lane_spans(env: Env, fault: str) -> None:
    await _batch(env, fault, CASES["lane spans"], lanes=True)


async def lane_commit(env: Env, fault: str) -> None:
    await _batch(env, fault, CASES["lane COMMIT"], lanes=True)


async def _row_frontier(env: Env) -> int:
    return await env.count("SELECT frontier FROM {s}.partitions WHERE group_id = $1",
                           env.group) // 4


async def fold(env: Env, fault: str) -> None:
    """A lane's four records applied, then the fold of the row's frontier to 4: once, or
    the lifetime retired with the fold applied or not, never twice or past the set."""
    lc = await _held(env)
    records = make_records(TP, range(4))
    lc.run_lanes(TP, {r.offset: (r.offset, r.offset) for r in records})
    await lc.process(BatchCall(TP, records, effect_handler(env.schema)))
    env.probe = lambda: _row_frontier(env)
    case = CASES["fold"]
    ran = await _faulted(env, case, fault, lambda: lc.fold(TP, to_frontier=4))
    _typed(env, case, fault)
    durable = (await env.direct.observe([TP]))[TP]
    assert await _applied_set(env) == 4  # the set's effective frontier, folded or not
    if fault == "held-then-cancelled":
        _retired_within_budget(ran, lc)
        assert durable == Token(1, 4)  # the held one-statement fold had committed
        return
    assert ran.error is None, ran.error
    assert durable == Token(1, 4) == lc.token(TP) == ran.value
    assert await env.count("SELECT count(*) FROM {s}.completions WHERE group_id = $1",
                           env.group) == 0  # the spans below the frontier deleted with it


async def completions_read(env: Env, fault: str) -> None:
    await _assigned(env, fault, CASES["completions read"], probe_claims=False)


# -- gap-skip ---------------------------------------------------------------------------
async def _gap_skips(env: Env) -> int:
    return await env.count("SELECT count(*) FROM {s}.journal WHERE group_id = $1 AND"
                           " event = 'gap-skip'", env.group)


async def gap_skip(env: Env, fault: str) -> None:
    await env.direct.claim([ClaimRequest(TP, 0, "tid")], lifetime="lt-before")
    env.probe = lambda: _gap_skips(env)
    lc = env.lifecycle(allow_gap=True)
    case = CASES["gap skip"]
    ran = await _faulted(env, case, fault, lambda: lc.assign(
        [SourceCheck(TP, SourceFacts("tid", 5, 100))]))
    _typed(env, case, fault)
    durable = (await env.direct.observe([TP]))[TP]
    assert await _gap_skips(env) == 1  # the held one had committed too
    assert durable is not None and durable.frontier == 5
    if fault == "held-then-cancelled":
        _retired_within_budget(ran, lc)
        return
    assert ran.error is None, ran.error
    assert lc.token(TP) == durable


# -- attempt count write ------------------------------------------------------------------
async def _attempts(env: Env) -> int:
    rows = await env.sql("SELECT attempts FROM {s}.attempts WHERE group_id = $1", env.group)
    return int(rows[0][0]) if rows else 0


async def attempts_write(env: Env, fault: str) -> None:
    lc = await _held(env)
    env.probe = lambda: _attempts(env)
    case = CASES["attempt count write"]
    ran = await _faulted(env, case, fault, lambda: lc.record_attempt(
        TP, offset=0, max_attempts=5, error="boom", next_retry_in_s=1.0))
    _typed(env, case, fault)
    count = await _attempts(env)
    if fault == "held-then-cancelled":
        _retired_within_budget(ran, lc)
        assert count == 1
        return
    # an unknown count is not retried blindly: the lifetime retires, the count is the server's
    assert isinstance(ran.error, Retired) and isinstance(ran.error.__cause__, OutcomeUnknown)
    assert lc.state is LifetimeState.RETIRED
    assert count == (1 if fault == "cut-after" else 0)


# -- the member heartbeat -----------------------------------------------------------------
async def _member(env: Env) -> int:
    return await env.count("SELECT count(*) FROM {s}.members WHERE lifetime_id = $1", LIFETIME)


async def heartbeat(env: Env, fault: str) -> None:
    env.probe = lambda: _member(env)
    env.recording = Recording(env.proxied, lambda: env.probe())
    beat = MemberHeartbeat(store=env.recording, identity=MemberIdentity(LIFETIME, "h", 1),
                           clock=time.monotonic, interval_s=60.0)
    beat.set_state(MemberState.RUNNING)
    ran = await _faulted(env, CASES["heartbeat"], fault, beat.tick)
    _typed(env, CASES["heartbeat"], fault)
    assert ran.error is None and ran.value is False  # a failed write raises nothing
    _within_budget(ran, COMMAND_TIMEOUT_S)
    # and is not retried before the next interval (which counts from the write's start)
    assert beat.delay_s() > 60 - ran.took_s - 1
    rows = await env.sql("SELECT state FROM {s}.members WHERE lifetime_id = $1", LIFETIME)
    assert [r[0] for r in rows] == ([] if fault == "cut-before" else ["running"])


# -- journal rows: release and retire -----------------------------------------------------
async def _journal(env: Env, event: str) -> int:
    return await env.count("SELECT count(*) FROM {s}.journal WHERE group_id = $1 AND"
                           " event = $2 AND lifetime = $3", env.group, event, LIFETIME)


async def release(env: Env, fault: str) -> None:
    lc = await _held(env)
    env.probe = lambda: _journal(env, "release")
    ran = await _faulted(env, CASES["release"], fault, lambda: lc.revoke([TP]))
    _typed(env, CASES["release"], fault)
    assert lc.token(TP) is None
    rows = await _journal(env, "release")
    if fault == "held-then-cancelled":
        _retired_within_budget(ran, lc)
        assert rows == 1
        return
    assert ran.error is None and lc.state is LifetimeState.LIVE  # best effort: no retry
    assert rows == (1 if fault == "cut-after" else 0)


async def retire(env: Env, fault: str) -> None:
    lc = await _held(env)
    env.probe = lambda: _journal(env, "retire")
    await env.direct.claim([ClaimRequest(TP, 0)], lifetime="lt-newer")  # fences the lifetime
    ran = await _faulted(env, CASES["retire"], fault, lambda: lc.process(
        BatchCall(TP, make_records(TP, range(2)), effect_handler(env.schema))))
    _typed(env, CASES["retire"], fault)
    assert lc.state is LifetimeState.RETIRED and lc.token(TP) is None
    assert await _effects(env) == 0
    rows = await _journal(env, "retire")
    if fault == "held-then-cancelled":
        _retired_within_budget(ran, lc)
        assert rows == 1
        return
    assert isinstance(ran.error, Fenced), ran.error  # the retire row is best effort
    assert rows == (1 if fault == "cut-after" else 0)


# -- operator tools: quarantine replay, reset, purge ----------------------------------
async def _operator(env: Env, case: Case, fault: str,
                    act: Callable[[asyncpg.Connection], Awaitable[Any]],
                    probe: Callable[[], Awaitable[int]]) -> Ran:
    conn = await env.proxied_conn()
    try:
        ran = await _faulted(env, case, fault, lambda: act(conn))
    finally:
        conn.terminate()
    assert isinstance(ran.error, OutcomeUnknown), ran.error
    applied = await probe()
    if fault != "held-then-cancelled":
        _check_typed(case, fault, "operator", ran.error, applied)
    else:
        assert applied == 1  # the held COMMIT had been answered by the server
        _within_budget(ran)
    return ran


async def quarantine_replay(env: Env, fault: str) -> None:
    token = (await env.direct.claim([ClaimRequest(TP, 0)], lifetime="lt-w"))[TP]

    async def rejecting(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        return [Reject("bad") for _ in records]

    await env.direct.process(BatchCall(TP, make_records(TP, [0]), rejecting), token)
    key = QuarantineKey(env.group, TP.topic, TP.partition, 0)
    handler = effect_handler(env.schema)
    replays = lambda: env.count("SELECT count(*) FROM {s}.journal WHERE event = 'replay'")  # noqa: E731

    await _operator(env, CASES["quarantine replay"], fault, lambda conn: replay_one(
        conn, env.schema, key, handler, operator="operator:t@h", timeout_s=BUDGET_S), replays)
    conn = await asyncpg.connect(env.dsn)
    try:
        again = await replay_one(conn, env.schema, key, handler, operator="operator:t@h")
    finally:
        await conn.close()
    assert again.outcome is (Outcome.SKIPPED if fault != "cut-before" else Outcome.APPLIED)
    assert await _effects(env) == 1 and await replays() == 1
    state = await env.sql("SELECT state, replays FROM {s}.quarantine")
    assert [tuple(r) for r in state] == [("replayed", 1)]


async def reset(env: Env, fault: str) -> None:
    await env.direct.claim([ClaimRequest(TP, 10)], lifetime="lt-w")
    resets = lambda: env.count("SELECT count(*) FROM {s}.journal WHERE event = 'reset'")  # noqa: E731

    class Args:
        partition = 0
        to_offset = 3
        frontier = "earliest"
        expect_epoch = None
        reason = ""
        reset_action = ResetAction.FRONTIER

    async def once(conn: asyncpg.Connection, timeout_s: float = BUDGET_S) -> Any:
        plan = plan_reset(Current(TP, 1, 10, "lt-w", None), ResetAction.FRONTIER, facts=None,
                          to_offset=3)
        return await apply_reset(conn, schema=env.schema, group=env.group, plans=[plan],
                                 facts={}, args=Args(), operator="operator:t@h",  # type: ignore[arg-type]
                                 operation="reset-wire", timeout_s=timeout_s)

    await _operator(env, CASES["reset"], fault, once, resets)
    conn = await asyncpg.connect(env.dsn)
    try:
        if fault == "cut-before":
            await once(conn)
        else:
            with pytest.raises(ResetApplied):
                await once(conn)
    finally:
        await conn.close()
    assert await resets() == 1 and (await env.direct.observe([TP]))[TP] == Token(2, 3)


async def purge_replayed(env: Env, fault: str) -> None:
    token = (await env.direct.claim([ClaimRequest(TP, 0)], lifetime="lt-w"))[TP]

    async def rejecting(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        return [Reject("bad") for _ in records]

    await env.direct.process(BatchCall(TP, make_records(TP, [0, 1]), rejecting), token)
    await env.sql("UPDATE {s}.quarantine SET state = 'replayed', replayed_at = now()")
    purges = lambda: env.count("SELECT count(*) FROM {s}.journal WHERE event = 'purge'")  # noqa: E731
    before = datetime.now(UTC) + timedelta(hours=1)

    async def once(conn: asyncpg.Connection) -> Any:
        return await purge(conn, env.schema, group_id=env.group, before=before, topic=None,
                           operator="operator:t@h", timeout_s=BUDGET_S)

    await _operator(env, CASES["purge"], fault, once, purges)
    conn = await asyncpg.connect(env.dsn)
    try:
        again = await once(conn)
    finally:
        await conn.close()
    assert again == ({TP: 2} if fault == "cut-before" else {})
    assert await purges() == 1
    assert await env.count("SELECT count(*) FROM {s}.quarantine") == 0


def _q(schema: str) -> str:
    return f'"{schema}"'


_ROWS = "JOIN {}.partitions p ON p.group_id = $1"  # validate's and observe's read
_JOURNAL = "SELECT $1, topic, partition, $4, $5, $6, $7"  # the journal's insert

CASES: dict[str, Case] = {
    "validate": Case(READ, lambda s: _ROWS.format(_q(s)), "validate", validate),
    "claim": Case(WRITE, lambda s: f"INSERT INTO {_q(s)}.partitions AS p", "claim", claim),
    "attempt count read": Case(READ, lambda s: "AS unclean", "attempts", attempts_read),
    "observe": Case(READ, lambda s: _ROWS.format(_q(s)), "observe", observe),
    "fence statement": Case(BODY, lambda s: "EXECUTE fence_advance(", "process", fence),
    "handler body": Case(BODY, lambda s: f'INSERT INTO "{s}".effects', "process",
                         handler_body, in_handler=True),
    "sink write": Case(BODY, lambda s: f'INSERT INTO "{s}"."sink_rows" ("offset") SELECT '
                       '"offset" FROM unnest(', "process", sink_write, in_handler=True),
    "COMMIT": Case(COMMIT, lambda s: "COMMIT", "process", commit, exact=True),
    "lane epoch check": Case(BODY, lambda s: f"BEGIN; SELECT 1 FROM {_q(s)}.partitions WHERE",
                             "process_lane", lane_fence),
    "lane handler body": Case(BODY, lambda s: f'INSERT INTO "{s}".effects', "process_lane",
                              lane_body, in_handler=True),
    "lane spans": Case(BODY, lambda s: f"INSERT INTO {_q(s)}.completions", "process_lane",
                       lane_spans),
    "lane COMMIT": Case(COMMIT, lambda s: "COMMIT", "process_lane", lane_commit, exact=True),
    "fold": Case(WRITE, lambda s: f"UPDATE {_q(s)}.partitions SET frontier = $6", "fold",
                 fold),
    "completions read": Case(READ, lambda s: f"LEFT JOIN {_q(s)}.completions c", "completions",
                             completions_read),
    "gap skip": Case(WRITE, lambda s: "'gap-skip', epoch, owner", "skip", gap_skip),
    "attempt count write": Case(WRITE, lambda s: f"INSERT INTO {_q(s)}.attempts AS a",
                                "record_attempt", attempts_write),
    "heartbeat": Case(WRITE, lambda s: f"INSERT INTO {_q(s)}.members AS m", "heartbeat",
                      heartbeat),
    "release": Case(WRITE, lambda s: _JOURNAL, "journal", release),
    "retire": Case(WRITE, lambda s: _JOURNAL, "journal", retire),
    "quarantine replay": Case(COMMIT, lambda s: "COMMIT", "-", quarantine_replay),
    "reset": Case(COMMIT, lambda s: "COMMIT", "-", reset),
    "purge": Case(COMMIT, lambda s: "COMMIT", "-", purge_replayed),
}


@pytest.fixture
async def env(pg_dsn: str, fence_schema: str) -> AsyncIterator[Env]:
    parts = urlsplit(pg_dsn)
    group = f"g-{uuid.uuid4().hex[:8]}"
    async with PgProxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        direct = await PgFenceStore.connect(pg_dsn, group_id=group, schema=fence_schema,
                                            pool_max=2)
        proxied = await PgFenceStore.connect(proxy.dsn(pg_dsn), group_id=group,
                                             schema=fence_schema, pool_max=2,
                                             command_timeout_s=COMMAND_TIMEOUT_S)
        try:
            yield Env(pg_dsn, fence_schema, group, proxy, direct, proxied)
        finally:
            proxy.release()
            await proxied.close(timeout_s=5)
            await direct.close()


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("kind", list(CASES))
async def test_a_wire_fault_at_every_statement(env: Env, kind: str, fault: str) -> None:
    await CASES[kind].scenario(env, fault)
