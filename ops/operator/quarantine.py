"""Operator SQL for ``fencectl quarantine``: list, show, replay, purge quarantined records.

Rules
- A quarantine row is ``quarantined`` until a replay applies it; then ``replayed`` with who
  (``replayed_by``), when (``replayed_at``) and the result (migration 0004). Rows are never
  changed by a replay that does not apply them, except their ``replays`` count and the
  last replay's ``replay_result``, ``replayed_by`` and ``replayed_at``: a record that fails
  again stays quarantined with its original ``reason`` (why the worker quarantined it) and
  the new one in ``replay_result``.
- ``replay_one`` is one transaction per record: it locks the row ``FOR UPDATE SKIP LOCKED``
  *and* requires ``state = 'quarantined'``, runs the handler through the same connection
  inside a SAVEPOINT, marks the row and appends one ``replay`` journal row, then COMMITs.
  So the handler's effect and the "replayed" mark commit together or not at all: a second
  run of the same replay, or a re-run after the first was killed (its open transaction rolls
  back when its session ends), applies each record at most once; a row another replay holds
  right now is skipped, never waited for.
- A ``Reject`` or an exception of the handler rolls back to the SAVEPOINT (nothing of the
  record applies) and keeps the row quarantined with the new reason. A lost connection or a
  failed COMMIT is not a verdict: it is raised classified by phase
  (``ops.operator.db.one_transaction``: ``NotCommitted`` before COMMIT, ``OutcomeUnknown``
  once COMMIT was sent, also past ``timeout_s``), and re-running the replay is safe: it
  applies the record if it was not applied and skips it if it was.
- ``purge`` deletes only ``replayed`` rows whose ``replayed_at`` is before the given time and
  journals one ``purge`` row per partition with the count, in one transaction (classified as
  a replay's). Quarantined rows are never purged; a re-run after an unknown outcome deletes
  what is left, so each row is purged and journaled once.
- All SQL is parameterized; the schema is a checked identifier (``quote_schema``).
- ``grant_operator_sql`` is what the commands need (the worker role cannot delete quarantine
  rows); ``replay`` additionally needs the handler's own grants on its tables.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fencing.crashpoints import crash_point
from fencing.handler import check_verdicts
from fencing.postgres.schema import quote_ident, quote_schema
from fencing.store import HandlerFn
from fencing.types import Reject, SourceRecord, TopicPartition, Verdict
from ops.operator.db import DEFAULT_TIMEOUT_S, one_transaction

__all__ = [
    "QuarantineKey",
    "ReplayResult",
    "Selection",
    "State",
    "grant_operator_sql",
    "headers_of",
    "judge",
    "purge",
    "record_of",
    "replay_one",
    "select_rows",
]

_COLUMNS = ('group_id, topic, partition, "offset", key, value, headers, reason, epoch, at,'
            ' state, replays, replayed_by, replayed_at, replay_result')


class State(enum.Enum):
    """A quarantine row's state (column ``state``)."""

    QUARANTINED = "quarantined"
    REPLAYED = "replayed"


@dataclass(frozen=True, slots=True, order=True)
class QuarantineKey:
    group_id: str
    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.group_id} {self.topic}[{self.partition}]@{self.offset}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Selection:
    """Which rows a command is about; None means any."""

    group_id: str | None = None
    topic: str | None = None
    partition: int | None = None
    offsets: tuple[int, ...] = ()
    state: State | None = State.QUARANTINED
    limit: int | None = None


class Outcome(enum.Enum):
    APPLIED = "applied"  # the handler accepted it: effect committed, row marked replayed
    FAILED = "failed"  # rejected again or raised: nothing applied, row stays quarantined
    SKIPPED = "skipped"  # already replayed, or held by a concurrent replay: not touched


@dataclass(frozen=True, slots=True)
class ReplayResult:
    key: QuarantineKey
    outcome: Outcome
    detail: str  # the new reason (failed), "accepted" (applied), why not (skipped)

    def as_dict(self) -> dict[str, Any]:
        return {"group": self.key.group_id, "topic": self.key.topic,
                "partition": self.key.partition, "offset": self.key.offset,
                "outcome": self.outcome.value, "detail": self.detail}


def judge(verdicts: Sequence[Verdict] | None, error: BaseException | None) -> tuple[Outcome, str]:
    """Pure: the outcome of one record's replay from the handler's verdicts or its error."""
    if error is not None:
        return Outcome.FAILED, f"replay: handler raised {type(error).__name__}: {error}"
    assert verdicts is not None
    verdict = verdicts[0]
    if isinstance(verdict, Reject):
        return Outcome.FAILED, verdict.reason
    return Outcome.APPLIED, "accepted"


def headers_of(raw: Any) -> tuple[tuple[str, bytes | None], ...]:
    items = json.loads(raw) if isinstance(raw, str) else (raw or [])
    out: list[tuple[str, bytes | None]] = []
    for key, value in items:
        try:
            out.append((str(key), None if value is None else base64.b64decode(value)))
        except (binascii.Error, TypeError):
            out.append((str(key), str(value).encode()))
    return tuple(out)


def record_of(row: Any) -> SourceRecord:
    """The ``SourceRecord`` a quarantine row holds, as the handler saw it (no timestamp)."""
    return SourceRecord(row["topic"], row["partition"], row["offset"], row["key"],
                        row["value"], headers_of(row["headers"]), None)


def _where(sel: Selection, first: int = 1) -> tuple[str, list[Any]]:
    conds: list[str] = []
    args: list[Any] = []
    for column, value in (("group_id", sel.group_id), ("topic", sel.topic),
                          ("partition", sel.partition)):
        if value is not None:
            args.append(value)
            conds.append(f"{column} = ${first + len(args) - 1}")
    if sel.offsets:
        args.append(list(sel.offsets))
        conds.append(f'"offset" = ANY(${first + len(args) - 1}::bigint[])')
    if sel.state is not None:
        args.append(sel.state.value)
        conds.append(f"state = ${first + len(args) - 1}")
    return (" WHERE " + " AND ".join(conds)) if conds else "", args


async def select_rows(conn: Any, schema: str, sel: Selection) -> list[Any]:
    """Quarantine rows matching ``sel`` in (group, topic, partition, offset) order."""
    where, args = _where(sel)
    limit = f" LIMIT {int(sel.limit)}" if sel.limit is not None else ""
    return list(await conn.fetch(
        f"SELECT {_COLUMNS} FROM {quote_schema(schema)}.quarantine{where}"
        f' ORDER BY group_id, topic, partition, "offset"{limit}', *args))


async def replay_one(conn: Any, schema: str, key: QuarantineKey, handler: HandlerFn, *,
                     operator: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> ReplayResult:
    """Replay one record in one transaction bounded by ``timeout_s`` (see the module Rules).
    The handler's own errors are a ``FAILED`` result; raises ``NotCommitted`` or
    ``OutcomeUnknown`` when the connection or COMMIT fails (``one_transaction``)."""
    q = quote_schema(schema)

    async def body() -> ReplayResult:
        row = await conn.fetchrow(
            f"SELECT {_COLUMNS} FROM {q}.quarantine WHERE group_id = $1 AND topic = $2"
            ' AND partition = $3 AND "offset" = $4 AND state = $5 FOR UPDATE SKIP LOCKED',
            key.group_id, key.topic, key.partition, key.offset, State.QUARANTINED.value)
        if row is None:
            return ReplayResult(key, Outcome.SKIPPED,
                                "not quarantined (already replayed or purged) or held by "
                                "another replay right now")
        verdicts: Sequence[Verdict] | None = None
        error: BaseException | None = None
        try:
            async with conn.transaction():  # SAVEPOINT: a failed record applies nothing
                verdicts = check_verdicts(await handler(conn, [record_of(row)]), 1)
                if isinstance(verdicts[0], Reject):
                    raise _Rejected
        except _Rejected:
            pass
        except Exception as exc:
            if conn.is_closed():
                raise
            error = exc
        outcome, detail = judge(verdicts, error)
        applied = outcome is Outcome.APPLIED
        await conn.execute(
            f"UPDATE {q}.quarantine SET replays = replays + 1, replay_result = $5,"
            " replayed_by = $6, replayed_at = now(),"
            " state = CASE WHEN $7 THEN 'replayed' ELSE state END"
            ' WHERE group_id = $1 AND topic = $2 AND partition = $3 AND "offset" = $4',
            key.group_id, key.topic, key.partition, key.offset, detail, operator, applied)
        await conn.execute(
            f"INSERT INTO {q}.journal (group_id, topic, partition, event, epoch, lifetime,"
            " detail) VALUES ($1, $2, $3, 'replay', NULL, $4, $5)",
            key.group_id, key.topic, key.partition, operator,
            f"offset={key.offset} {outcome.value}: {detail}")
        crash_point("in-replay", partition=f"{key.topic}[{key.partition}]", offset=key.offset,
                    outcome=outcome.value)
        return ReplayResult(key, outcome, detail)

    return await one_transaction(conn, body, what=f"replay {key}", timeout_s=timeout_s)


class _Rejected(Exception):
    """Internal: leaves the SAVEPOINT so a rejected record's statements roll back."""


async def purge(conn: Any, schema: str, *, group_id: str, before: datetime,
                topic: str | None, operator: str,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[TopicPartition, int]:
    """Delete replayed rows handled before ``before``; journal and return counts per
    partition. One transaction bounded by ``timeout_s``; raises ``NotCommitted`` or
    ``OutcomeUnknown`` when the connection or COMMIT fails (``one_transaction``)."""
    q = quote_schema(schema)

    async def body() -> dict[TopicPartition, int]:
        rows = await conn.fetch(
            f"WITH gone AS (DELETE FROM {q}.quarantine WHERE group_id = $1 AND state = $2"
            " AND replayed_at < $3 AND ($4::text IS NULL OR topic = $4)"
            " RETURNING topic, partition)"
            " SELECT topic, partition, count(*) AS n FROM gone GROUP BY 1, 2 ORDER BY 1, 2",
            group_id, State.REPLAYED.value, before, topic)
        counts = {TopicPartition(r["topic"], r["partition"]): int(r["n"]) for r in rows}
        for tp, n in counts.items():
            await conn.execute(
                f"INSERT INTO {q}.journal (group_id, topic, partition, event, epoch, lifetime,"
                " detail) VALUES ($1, $2, $3, 'purge', NULL, $4, $5)",
                group_id, tp.topic, tp.partition, operator,
                f"purged {n} replayed quarantine row(s) handled before {before.isoformat()}")
        return counts

    return await one_transaction(conn, body, what=f"purge {group_id}", timeout_s=timeout_s)


def grant_operator_sql(schema: str, role: str) -> list[str]:
    """Statements granting ``role`` what ``fencectl quarantine`` needs on ``schema`` and no
    more: read the rows, mark them replayed, delete handled ones (purge), append to the
    journal, and read which groups exist (partition and member rows, read only). Run as
    the schema owner; add the handler's grants on its tables for replay."""
    q = quote_schema(schema)
    r = quote_ident(role)
    return [
        f"GRANT USAGE ON SCHEMA {q} TO {r}",
        f"GRANT SELECT ON {q}.schema_version, {q}.partitions, {q}.members TO {r}",
        f"GRANT SELECT, UPDATE, DELETE ON {q}.quarantine TO {r}",
        f"GRANT SELECT, INSERT ON {q}.journal TO {r}",
    ]
