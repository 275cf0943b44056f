"""The asyncpg fence store (production implementation of ``fencing.store.FenceStore``).

Long because each store operation sits with its phase-aware outcome classification and
the checks of COMMIT; the SQL lives in ``fencing.postgres.sql``.

Rules
- ``PgFenceStore.connect`` refuses a schema whose version is not ``SCHEMA_VERSION``
  (``SchemaMismatch`` names both) before any fence call is possible.
- ``validate``/``observe`` are one read each for all partitions; ``claim`` is one
  autocommit statement for the whole assignment (rows, epochs and journal together).
- ``process`` is one transaction on one pooled connection: BEGIN together with the fence
  statement (lock the row, require the token, move the frontier to the batch end) in one
  round trip; the handler's statements; one quarantine insert for all rejects; COMMIT.
  Without rejects it costs the same round trips as an unfenced BEGIN/handler/COMMIT.
  (The row id is learned from claim/observe, else read once per partition.)
- ``process_lane`` is one lane's transaction: BEGIN together with the epoch check under a
  share lock (``sql.lane_fence``), the handler's statements and quarantine, the insert of
  its spans, COMMIT; ``completions`` and ``fold`` are one statement each.
- COMMIT is checked: a handler that ended the transaction itself, or one whose statement
  failed and was caught without a SAVEPOINT (PostgreSQL then answers COMMIT with ROLLBACK),
  raises ``HandlerMisuse``; the batch is not reported applied.
- A claim kept waiting for ``unblock_after_s`` by a row lock of another fenceworker
  session ends that session (``pg_terminate_backend``): its owner lost the partition, and a
  member frozen mid-exchange is ``active``, never idle in transaction. The fence makes this
  safe: the ended transaction rolls back.
- ``observe(tps, settled=True)`` (used to resolve a lost COMMIT reply) locks the rows
  ``FOR SHARE`` under a ``lock_timeout``: it waits for a COMMIT of ours that the server is
  still processing, so a slow commit is read as committed, not as "not committed".
- Errors are translated by ``fencing.postgres.classify``; no asyncpg or OS error leaves this module.
  ``Fenced`` means nothing of the call was applied. ``CancelledError`` propagates
  unchanged (with a note when COMMIT was in flight) and the connection is discarded.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg

from fencing.crashpoints import crash_point, is_armed_for
from fencing.errors import Fenced, HandlerFailed, HandlerMisuse
from fencing.failures import SUSPECT_OPEN, Attempts
from fencing.handler import accepted_all
from fencing.lanes import Completion, Span, check_lane
from fencing.postgres.classify import Phase, connection_suspect, translate, wrap_handler_error
from fencing.postgres.schema import DEFAULT_SCHEMA, check_version
from fencing.postgres.sql import Statements
from fencing.resolution import batch_end, decide_validation
from fencing.store import JOURNAL_EVENTS, BatchCall, HandlerFn
from fencing.types import (
    ACCEPT,
    OPERATOR_OWNER_PREFIX,
    ClaimRequest,
    Reject,
    SourceCheck,
    SourceRecord,
    Token,
    TopicPartition,
    Validation,
)

__all__ = ["APPLICATION_NAME", "PgFenceStore", "decide_validation", "light_reset"]

log = logging.getLogger("fenceworker.store")

APPLICATION_NAME = "fenceworker"  # the worker's sessions; a claim may end an older one's

_IN_FAILED_TRANSACTION = "25P02"  # a statement after an error the handler caught
_UNKNOWN_NOTE = "fence: COMMIT was in flight when cancelled: outcome unknown (re-read to resolve)"


async def light_reset(conn: Any) -> None:
    """Pool reset: roll back a leftover transaction; the store keeps no other session state."""
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


def _headers_json(headers: Sequence[tuple[str, bytes | None]]) -> str:
    return json.dumps([[k, None if v is None else base64.b64encode(v).decode()]
                       for k, v in headers])


class PgFenceStore:
    """Fence store over an asyncpg pool for one consumer group in one schema."""

    def __init__(self, pool: Any, *, group_id: str, schema: str = DEFAULT_SCHEMA,
                 fence_prepared: bool = False, settle_timeout_s: float = 5.0,
                 unblock_after_s: float | None = None) -> None:
        """``fence_prepared``: every pool connection ran ``Statements.prepare_fence``;
        ``settle_timeout_s``: how long a settled observe waits for a row lock;
        ``unblock_after_s``: after how long a waiting claim ends the fenceworker sessions
        that block it (None: never)."""
        self.group_id = group_id
        self._settle_timeout_s = settle_timeout_s
        self._unblock_after_s = unblock_after_s
        self.schema = schema
        self._pool = pool
        self._sql = Statements.for_schema(schema)
        self._begin_fence = (self._sql.begin_fence_prepared if fence_prepared
                             else self._sql.begin_fence)
        self._ids: dict[TopicPartition, int] = {}  # partition row ids (never reused)

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        group_id: str,
        schema: str = DEFAULT_SCHEMA,
        pool_min: int = 1,
        pool_max: int = 8,
        command_timeout_s: float = 10.0,
        unblock_after_s: float | None = None,
        **connect_kwargs: Any,
    ) -> PgFenceStore:
        """Check the schema version, then open a pool; raises ``SchemaMismatch``/``ReadFailed``."""
        try:
            conn = await asyncpg.connect(dsn, command_timeout=command_timeout_s, **connect_kwargs)
            try:
                await check_version(conn, schema)
            finally:
                await conn.close()
        except BaseException as exc:
            err = translate(exc, Phase.READ, "schema check")
            if err is exc:
                raise
            raise err from exc
        prepare = Statements.for_schema(schema).prepare_fence

        async def init(conn: Any) -> None:
            await conn.execute(prepare)

        try:
            pool = await asyncpg.create_pool(
                dsn, min_size=pool_min, max_size=pool_max, command_timeout=command_timeout_s,
                reset=light_reset, init=init, **connect_kwargs)
        except BaseException as exc:
            err = translate(exc, Phase.READ, "connect")
            if err is exc:
                raise
            raise err from exc
        return cls(pool, group_id=group_id, schema=schema, fence_prepared=True,
                   unblock_after_s=unblock_after_s)

    async def close(self, *, timeout_s: float | None = None) -> None:
        """Close the pool once every connection is released; past ``timeout_s`` terminate
        the connections still in use (their open transactions roll back)."""
        try:
            await asyncio.wait_for(self._pool.close(), timeout=timeout_s)
        except TimeoutError:
            self._pool.terminate()

    async def _fetch(self, phase: Phase, what: str, sql: str, *args: Any,
                     unblock: bool = False, lock_timeout_ms: int | None = None) -> list[Any]:
        """One statement (autocommit, or in its own transaction under ``lock_timeout_ms``);
        ``phase`` applies once a connection is acquired. ``unblock``: end older owners'
        sessions that keep the statement waiting (``_unblock``)."""
        step = Phase.READ if phase is Phase.READ else Phase.BEFORE_COMMIT
        try:
            async with self._pool.acquire() as conn:
                step = phase
                watchdog = (asyncio.ensure_future(self._unblock(conn.get_server_pid()))
                            if unblock and self._unblock_after_s is not None else None)
                try:
                    if lock_timeout_ms is None:
                        return list(await conn.fetch(sql, *args))
                    async with conn.transaction():
                        await conn.execute(f"SET LOCAL lock_timeout = {int(lock_timeout_ms)}")
                        return list(await conn.fetch(sql, *args))
                except BaseException as exc:
                    if connection_suspect(exc):
                        _discard(conn)  # never wait for a cancelled or lost statement's reply
                    raise
                finally:
                    if watchdog is not None:
                        watchdog.cancel()
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError) and step is Phase.IN_FLIGHT:
                exc.add_note(_UNKNOWN_NOTE.replace("COMMIT", what))
            err = translate(exc, step, what)
            if err is exc:
                raise
            raise err from exc

    async def _unblock(self, pid: int) -> None:
        """While backend ``pid`` (a claim) waits: every second after ``unblock_after_s``, end
        the fenceworker sessions that block it. Their owner lost the partition (Kafka gave
        it to us); a member frozen in the middle of a protocol exchange shows ``active``, so
        ``idle_in_transaction_session_timeout`` never ends its transaction. Ending the
        session rolls that transaction back: nothing of it applies (the fence holds)."""
        assert self._unblock_after_s is not None
        await asyncio.sleep(self._unblock_after_s)
        while True:
            try:
                async with self._pool.acquire(timeout=2.0) as conn:
                    rows = await conn.fetch(self._sql.end_blockers, pid, APPLICATION_NAME)
                for r in rows:
                    log.warning("ended session pid %s (state %s, waiting on %s since %s) of an "
                                "older owner: it blocked this member's claim past %.1f s",
                                r["pid"], r["state"], r["wait_event"], r["xact_start"],
                                self._unblock_after_s)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError,
                    TimeoutError) as exc:
                log.warning("could not end the sessions blocking the claim: %s", exc)
            await asyncio.sleep(1.0)

    async def _rows(self, tps: Sequence[TopicPartition], what: str, *,
                    settled: bool = False) -> dict[TopicPartition, Any]:
        """The rows of ``tps``; ``settled``: once no transaction holds their lock (bounded by
        ``settle_timeout_s``) -- a plain read would not see a COMMIT still in progress."""
        if settled:
            rows = await self._fetch(
                Phase.READ, f"{what} (settled)", self._sql.observe_settled, self.group_id,
                [tp.topic for tp in tps], [tp.partition for tp in tps],
                lock_timeout_ms=max(1, int(self._settle_timeout_s * 1000)))
        else:
            rows = await self._fetch(Phase.READ, what, self._sql.observe, self.group_id,
                                     [tp.topic for tp in tps], [tp.partition for tp in tps])
        return {TopicPartition(r["topic"], r["partition"]): r for r in rows}

    async def validate(self, checks: Sequence[SourceCheck]) -> Mapping[TopicPartition, Validation]:
        found = await self._rows([c.tp for c in checks], "validate")
        out: dict[TopicPartition, Validation] = {}
        for c in checks:
            r = found.get(c.tp)
            out[c.tp] = decide_validation(
                c, None if r is None else (r["epoch"], r["frontier"], r["topic_id"]))
        return out

    async def observe(self, tps: Sequence[TopicPartition], *,
                      settled: bool = False) -> Mapping[TopicPartition, Token | None]:
        found = await self._rows(tps, "observe", settled=settled)
        self._ids.update((tp, r["id"]) for tp, r in found.items())
        return {tp: (None if tp not in found else Token(found[tp]["epoch"], found[tp]["frontier"]))
                for tp in tps}

    async def claim(
        self, claims: Sequence[ClaimRequest], *, lifetime: str
    ) -> Mapping[TopicPartition, Token]:
        tps = [c.tp for c in claims]
        if len(set(tps)) != len(tps):
            raise ValueError(f"claim: duplicate partitions in {tps}")
        if not claims:
            return {}
        rows = await self._fetch(
            Phase.IN_FLIGHT, f"claim {lifetime}", self._sql.claim, self.group_id,
            [c.tp.topic for c in claims], [c.tp.partition for c in claims],
            [c.initial_frontier for c in claims], [c.topic_id for c in claims], lifetime,
            unblock=True)
        out: dict[TopicPartition, Token] = {}
        for r in rows:
            tp = TopicPartition(r["topic"], r["partition"])
            self._ids[tp] = r["id"]
            out[tp] = Token(r["epoch"], r["frontier"])
        return out

    async def process(self, call: BatchCall, token: Token) -> Token:
        tp, records = call.tp, call.records
        end = batch_end(tp, token, records)

        async def apply(conn: Any) -> None:
            row_id = await self._row_id(conn, tp, token)
            await self._apply(conn, tp, token, end, row_id, records, call.handler)
            if call.clear_attempts:  # only after a failure was seen: never on the hot path
                await conn.execute(self._sql.clear_attempts, self.group_id, tp.topic,
                                   tp.partition, end)

        marker = {"partition": str(tp), "epoch": token.epoch, "first_offset": records[0].offset,
                  "last_offset": records[-1].offset, "frontier": token.frontier,
                  "batch_end": end}
        await self._transaction(f"process {tp}", apply, marker,
                                f"process {tp} epoch={token.epoch} frontier={token.frontier}")
        return Token(token.epoch, end)

    async def _transaction(self, what: str, apply: Any, marker: Mapping[str, Any],
                           describe: str) -> None:
        """One fenced transaction on a pooled connection: ``apply(conn)`` (BEGIN, the fence
        and the handler's statements), the checks of a handler's misuse, the crash points,
        COMMIT (module Rules); errors translated with ``describe``."""
        phase = Phase.BEFORE_COMMIT
        try:
            async with self._pool.acquire() as conn:
                try:
                    await apply(conn)
                except BaseException as exc:
                    failed = exc.__cause__ if isinstance(exc, HandlerFailed) else None
                    await _abandon(conn, failed if failed is not None else exc)
                    if getattr(exc, "sqlstate", None) == _IN_FAILED_TRANSACTION:
                        raise HandlerMisuse(
                            f"{what}: a statement ran in an aborted transaction "
                            f"({exc}): a statement of the handler failed and the handler "
                            "caught the error without a SAVEPOINT; nothing of the batch was "
                            "applied; let the error propagate, or wrap the statement in "
                            "SAVEPOINT / ROLLBACK TO SAVEPOINT") from exc
                    raise
                if not conn.is_in_transaction():
                    raise HandlerMisuse(
                        f"{what}: the handler ended the store's transaction itself "
                        "(COMMIT or ROLLBACK on the given connection): the batch is not "
                        "reported applied; never end or restart the transaction in a "
                        "handler (use SAVEPOINT for partial rollback)")
                crash_point("in-handler", **marker)
                phase = Phase.IN_FLIGHT
                try:
                    status = await _commit(conn, marker)
                except BaseException as exc:
                    if isinstance(exc, asyncio.CancelledError):
                        exc.add_note(_UNKNOWN_NOTE)
                    _discard(conn)
                    raise
                if status != "COMMIT":  # PostgreSQL answers ROLLBACK for a failed transaction
                    raise HandlerMisuse(
                        f"{what}: PostgreSQL answered COMMIT with {status}: a statement "
                        "of the handler failed and the handler caught the error without a "
                        "SAVEPOINT, so the whole transaction was rolled back and nothing of "
                        "the batch was applied; let the error propagate, or wrap the "
                        "statement in SAVEPOINT / ROLLBACK TO SAVEPOINT")
        except BaseException as exc:
            err = translate(exc, phase, describe)
            if err is exc:
                raise
            raise err from exc

    async def process_lane(self, call: BatchCall, token: Token,
                           spans: Sequence[Span]) -> None:
        """``LaneStore.process_lane``: one lane's transaction under the partition's epoch."""
        tp, records = call.tp, call.records
        check_lane(tp, token, records, spans)

        async def apply(conn: Any) -> None:
            row_id = await self._row_id(conn, tp, token)
            status = await conn.execute(self._sql.begin_lane_fence.format(
                row_id=int(row_id), epoch=int(token.epoch)))
            if status != "SELECT 1":
                self._ids.pop(tp, None)
                now = await conn.fetchrow(self._sql.read_one, self.group_id, tp.topic,
                                          tp.partition)
                held = "no row" if now is None else f"epoch={now['epoch']}"
                raise Fenced(f"lane {tp}: epoch {token.epoch} does not match the durable "
                             f"{held}")
            await self._handle(conn, tp, token, records, call.handler)
            await conn.execute(self._sql.lane_done, self.group_id, tp.topic, tp.partition,
                               token.epoch, [a for a, _ in spans], [b for _, b in spans])

        marker = {"partition": str(tp), "epoch": token.epoch, "first_offset": records[0].offset,
                  "last_offset": records[-1].offset, "frontier": token.frontier,
                  "batch_end": records[-1].offset + 1, "lane": True}
        await self._transaction(f"lane {tp}", apply, marker,
                                f"lane {tp} epoch={token.epoch} offsets {records[0].offset}.."
                                f"{records[-1].offset}")

    async def completions(self, tps: Sequence[TopicPartition], *,
                          settled: bool = False) -> Mapping[TopicPartition, Completion | None]:
        """``LaneStore.completions``: each partition's frontier and spans (None: no row), with
        the epoch in ``Completion.epoch``; ``settled`` waits for a COMMIT in progress."""
        if not tps:
            return {}
        args = (self.group_id, [tp.topic for tp in tps], [tp.partition for tp in tps])
        if settled:
            rows = await self._fetch(Phase.READ, "completions", self._sql.completions_settled,
                                     *args, lock_timeout_ms=max(1, int(
                                         self._settle_timeout_s * 1000)))
        else:
            rows = await self._fetch(Phase.READ, "completions", self._sql.completions, *args)
        found: dict[TopicPartition, tuple[int, int, list[Span]]] = {}
        for r in rows:
            tp = TopicPartition(r["topic"], r["partition"])
            spans = found.setdefault(tp, (r["epoch"], r["frontier"], []))[2]
            if r["first"] is not None:
                spans.extend(zip(r["first"], r["last"], strict=True))
        return {tp: (None if tp not in found else Completion.of(
            found[tp][1], found[tp][2], epoch=found[tp][0])) for tp in tps}

    async def fold(self, tp: TopicPartition, token: Token, *, to_frontier: int) -> Token:
        """``LaneStore.fold``: under ``token``, move the frontier to ``to_frontier`` and delete
        the spans wholly below it. Raises ``Fenced`` when the token no longer matches."""
        if to_frontier < token.frontier:
            raise ValueError(f"fold {tp}: {to_frontier} is below the frontier {token.frontier}")
        rows = await self._fetch(Phase.IN_FLIGHT, f"fold {tp}", self._sql.fold, self.group_id,
                                 tp.topic, tp.partition, token.epoch, token.frontier,
                                 to_frontier)
        if not rows:
            raise Fenced(f"fold {tp}: token epoch={token.epoch} frontier={token.frontier} "
                         "no longer matches")
        return Token(rows[0]["epoch"], rows[0]["frontier"])

    async def _row_id(self, conn: Any, tp: TopicPartition, token: Token) -> int:
        row_id = self._ids.get(tp)
        if row_id is None:
            row = await conn.fetchrow(self._sql.read_one, self.group_id, tp.topic, tp.partition)
            if row is None:
                raise Fenced(f"process {tp}: token epoch={token.epoch} frontier={token.frontier}"
                             " but the partition has no fence row")
            row_id = self._ids[tp] = row["id"]
        return int(row_id)

    async def _apply(self, conn: Any, tp: TopicPartition, token: Token, end: int, row_id: int,
                     records: Sequence[SourceRecord], handler: HandlerFn) -> None:
        status = await conn.execute(self._begin_fence.format(
            end=int(end), row_id=int(row_id), epoch=int(token.epoch),
            frontier=int(token.frontier)))
        if status != "UPDATE 1":
            self._ids.pop(tp, None)  # a reset may have recreated the row: look it up again
            key = (self.group_id, tp.topic, tp.partition)
            now = await conn.fetchrow(self._sql.read_one, *key)
            held = "no row" if now is None else f"epoch={now['epoch']} frontier={now['frontier']}"
            raise Fenced(f"process {tp}: token epoch={token.epoch} frontier={token.frontier} "
                         f"does not match the durable {held}")
        await self._handle(conn, tp, token, records, handler)

    async def _handle(self, conn: Any, tp: TopicPartition, token: Token,
                      records: Sequence[SourceRecord], handler: HandlerFn) -> None:
        """The handler's statements on the fenced transaction, then its rejects' quarantine."""
        try:
            returned = await handler(conn, records)
        except Exception as exc:
            err = wrap_handler_error(exc, f"process {tp} offsets {records[0].offset}.."
                                          f"{records[-1].offset}")
            if err is exc:
                raise
            raise err from exc
        if accepted_all(returned, len(records)):
            return  # the common case: nothing to quarantine
        rejected = [(r, v) for r, v in zip(records, returned, strict=True)
                    if v is not ACCEPT and isinstance(v, Reject)]
        if rejected:
            await conn.execute(
                self._sql.quarantine, self.group_id, tp.topic, tp.partition, token.epoch,
                [r.offset for r, _ in rejected], [r.key for r, _ in rejected],
                [r.value for r, _ in rejected], [_headers_json(r.headers) for r, _ in rejected],
                [v.reason for _, v in rejected], [v.error_type for _, v in rejected],
                [v.error_message for _, v in rejected],
                [v.traceback_digest for _, v in rejected],
                [r.timestamp_ms for r, _ in rejected])

    async def skip(self, tp: TopicPartition, token: Token, *, to_offset: int, reason: str) -> Token:
        if to_offset < token.frontier:
            raise ValueError(f"skip {tp}: {to_offset} is below the frontier {token.frontier}")
        rows = await self._fetch(
            Phase.IN_FLIGHT, f"skip {tp}", self._sql.skip, self.group_id, tp.topic, tp.partition,
            token.epoch, token.frontier, to_offset, f"{reason} (from {token.frontier})")
        if not rows:
            raise Fenced(f"skip {tp}: token epoch={token.epoch} frontier={token.frontier} "
                         "no longer matches")
        return Token(rows[0]["epoch"], rows[0]["frontier"])

    async def record_attempt(self, tp: TopicPartition, token: Token, *, offset: int,
                             max_attempts: int, error: str | None,
                             next_retry_in_s: float | None, at_least: int = 1,
                             alone: bool = False) -> Attempts:
        """Under ``token``, count one more attempt of ``offset`` (committed before the attempt
        runs; the count becomes at least ``at_least``; ``alone``: also one more attempt of the
        record alone); returns the counts and last error. Raises ``Fenced`` when the token
        no longer matches."""
        rows = await self._fetch(
            Phase.IN_FLIGHT, f"record attempt {tp}@{offset}", self._sql.record_attempt,
            self.group_id, tp.topic, tp.partition, token.epoch, token.frontier, offset,
            max_attempts, None if error is None else error[:2000],
            None if next_retry_in_s is None else float(next_retry_in_s), max(1, int(at_least)),
            1 if alone else 0)
        if not rows:
            raise Fenced(f"record attempt {tp}: token epoch={token.epoch} "
                         f"frontier={token.frontier} no longer matches")
        crash_point("after-attempt-count", partition=str(tp), epoch=token.epoch,
                    frontier=token.frontier, offset=offset, attempts=int(rows[0]["attempts"]))
        return Attempts(count=int(rows[0]["attempts"]), last_error=rows[0]["last_error"],
                        alone=int(rows[0]["alone"]))

    async def record_intent(self, tp: TopicPartition, token: Token, *, last_offset: int) -> None:
        """Under ``token``, record that a batch from its frontier to ``last_offset`` is about
        to run an ``outcome-uncertain`` handler (one autocommit statement, replacing the
        partition's previous intent). Raises ``Fenced`` when the token no longer matches."""
        if last_offset < token.frontier:
            raise ValueError(f"intent {tp}: {last_offset} is below the frontier {token.frontier}")
        rows = await self._fetch(
            Phase.IN_FLIGHT, f"record intent {tp}", self._sql.record_intent, self.group_id,
            tp.topic, tp.partition, token.epoch, token.frontier, last_offset)
        if not rows:
            raise Fenced(f"record intent {tp}: token epoch={token.epoch} "
                         f"frontier={token.frontier} no longer matches")

    async def attempts(self, tokens: Mapping[TopicPartition, Token]
                       ) -> Mapping[TopicPartition, Attempts]:
        """Read-only: the durable failure marks of each partition at its token's frontier."""
        tps = sorted(tokens)
        if not tps:
            return {}
        rows = await self._fetch(
            Phase.READ, "attempts", self._sql.attempts, self.group_id, [tp.topic for tp in tps],
            [tp.partition for tp in tps], [tokens[tp].epoch for tp in tps],
            [tokens[tp].frontier for tp in tps], SUSPECT_OPEN)
        return {TopicPartition(r["topic"], r["partition"]): Attempts(
            unclean=bool(r["unclean"]), count=int(r["attempts"]), last_error=r["last_error"],
            alone=int(r["alone"]), uncertain_to=r["uncertain_to"])
            for r in rows}

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
            raise ValueError(f"journal: unknown event {event!r}; expected one of {JOURNAL_EVENTS}")
        if tps:
            await self._fetch(Phase.IN_FLIGHT, f"journal {event}", self._sql.journal,
                              self.group_id, [tp.topic for tp in tps],
                              [tp.partition for tp in tps], event, epoch, lifetime, detail)

    async def heartbeat(
        self,
        *,
        lifetime: str,
        member_id: str | None,
        host: str,
        pid: int,
        state: str,
        detail: Mapping[str, Any] | None = None,
    ) -> frozenset[TopicPartition]:
        """Upsert this lifetime's member row and set ``last_seen := now()``; return the
        group's partitions whose owner is an operator (``fencing.store.ResetStore``)."""
        rows = await self._fetch(Phase.IN_FLIGHT, f"heartbeat {lifetime}", self._sql.heartbeat,
                                 lifetime, self.group_id, member_id, host, pid, state,
                                 json.dumps(dict(detail or {})), OPERATOR_OWNER_PREFIX)
        return frozenset(TopicPartition(r["topic"], r["partition"]) for r in rows)

    async def operator_reset(self, tp: TopicPartition, *, epoch: int) -> bool:
        """Read-only: True when only operator resets installed ``tp``'s epochs above
        ``epoch`` (``fencing.store.ResetStore``)."""
        rows = await self._fetch(Phase.READ, f"operator reset {tp}", self._sql.operator_reset,
                                 self.group_id, tp.topic, tp.partition, epoch,
                                 OPERATOR_OWNER_PREFIX)
        return bool(rows and rows[0]["reset"])


async def _commit(conn: Any, marker: Mapping[str, Any]) -> str:
    """COMMIT; with ``commit-in-flight`` armed the point fires once the COMMIT message is
    written to the socket (the task's first step) and before its reply is read."""
    if not is_armed_for("commit-in-flight"):
        return str(await conn.execute("COMMIT"))
    sending = asyncio.ensure_future(conn.execute("COMMIT"))
    await asyncio.sleep(0)  # the task runs first: asyncpg writes the Query, awaits the reply
    crash_point("commit-in-flight", **marker)
    return str(await sending)


async def _abandon(conn: Any, exc: BaseException) -> None:
    """End a transaction that failed before COMMIT: roll back, or drop the connection."""
    if connection_suspect(exc):
        _discard(conn)  # the server rolls back when the session ends
        return
    try:
        if conn.is_in_transaction():
            await asyncio.wait_for(conn.execute("ROLLBACK"), timeout=5.0)
    except Exception:
        _discard(conn)


def _discard(conn: Any) -> None:
    """Close a connection whose state is unknown; a lost one is already detached."""
    with contextlib.suppress(asyncpg.InterfaceError):
        conn.terminate()

