"""``fencectl reset``: the operator's recovery actions, each confirmed, fencing and journaled.

  fencectl reset frontier    --group G --topic T --partition P --to-offset N --yes-i-understand
  fencectl reset accept-gap  --group G --topic T [--partition P] --yes-i-understand
  fencectl reset adopt-topic --group G --topic T [--frontier earliest|latest|keep]
      --yes-i-understand
  (each also takes [--expect-epoch E] [--operation-id ID] [--timeout-s S] [--reason TEXT])

Without ``--yes-i-understand`` the plan is printed and nothing changes (exit 2). With it,
one transaction locks the rows, refuses an operation the journal already holds, re-plans
against the locked values (``ops.operator.reset_plan``), bumps each epoch and makes the
operator the owner (a running owner claims the partition again at the new frontier:
docs/reset-and-replay.md), writes the new frontier / topic id and one journal row per
partition (its detail starts with the operation id), and commits. The operation id is
printed; by default it is a digest of the request, so running the same command again is
recognised as the same operation and refused once it was applied.

Exit codes (``EXITS``): 0 applied; 1 refused (already applied, the partition moved, nothing
to do) or not applied (the database failed before COMMIT: nothing changed); 2 bad usage or
configuration (``FENCE_DSN`` unset or refused, schema not migrated, unknown ``--group``,
a bad ``FENCE_CRASH_AT``) or confirmation missing; 3 outcome unknown (COMMIT was sent and
its reply lost, timed out or interrupted: run the same command again, which applies it if
it was not applied and refuses it if it was).

Long because each of the three actions declares its flags, its plan's printing and its
exit codes here, beside the one transaction they share.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from consumer.exits import Exit
from consumer.kafka.adapter import checked_client_properties
from fencing import crashpoints
from fencing.crashpoints import crash_point
from fencing.errors import ConfigError, NotCommitted, OutcomeUnknown, SchemaMismatch
from fencing.postgres.classify import Phase
from fencing.postgres.schema import DEFAULT_SCHEMA, quote_schema
from fencing.types import OPERATOR_OWNER_PREFIX, SourceFacts, TopicPartition
from ops.hints import fencectl, schema_advice
from ops.operator.db import (
    DEFAULT_TIMEOUT_S,
    Progress,
    connection,
    dsn_from_env,
    one_transaction,
    require_known_group,
)
from ops.operator.reset_plan import (
    JOURNAL_EVENT,
    Action,
    Current,
    Plan,
    ResetApplied,
    ResetRefused,
    check_operation_id,
    journal_detail,
    journal_prefix,
    operation_id,
    plan_reset,
)

__all__ = ["EXITS", "apply_reset", "operator_identity", "register"]

CONFIRM = "--yes-i-understand"

APPLIED = Exit(0, "applied and journaled", "nothing: a running owner claims the partition "
               "again and continues from the new frontier")
REFUSED = Exit(1, "refused (already applied, the partition moved: `--expect-epoch`, nothing "
               "to do), not applied (the database failed before COMMIT: nothing changed), "
               "or Kafka or the database failed",
               "read the reason on stderr; `fencectl status --history` shows the partition "
               "now; a reset not applied can be run again")
CONFIG = Exit(2, "the plan printed without `--yes-i-understand` (nothing changed); "
              "`FENCE_DSN` unset, refused or unreachable; schema not migrated; an unknown "
              "`--group`; a bad `--operation-id`, `--timeout-s` or `FENCE_CRASH_AT`",
              "read the plan and run the command again with `--yes-i-understand`, or fix "
              "what the line on stderr names")
OUTCOME_UNKNOWN = Exit(3, "outcome unknown: COMMIT was sent and its reply lost, timed out or "
                       "interrupted",
                       "run the same command again: it applies the reset if it was not "
                       "applied and refuses it as already applied (exit 1) if it was")
EXITS = (APPLIED, REFUSED, CONFIG, OUTCOME_UNKNOWN)


def operator_identity() -> str:
    """Who acted, for the owner column and the journal (never a secret)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{OPERATOR_OWNER_PREFIX}{user}@{socket.gethostname()}"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg,unused-ignore]
    p = sub.add_parser("reset", help="operator recovery: move a frontier, accept a retention "
                                     "gap, adopt a recreated topic (fences the owner)")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    helps = {Action.FRONTIER: "move one partition's durable frontier to --to-offset",
             Action.ACCEPT_GAP: "move frontiers below Kafka's low watermark up to it",
             Action.ADOPT_TOPIC: "record the recreated topic's id and restart its frontiers"}
    for action in Action:
        a = actions.add_parser(action.value, help=helps[action])
        a.add_argument("--group", required=True, help="consumer group")
        a.add_argument("--topic", required=True, help="the topic")
        if action is Action.FRONTIER:
            a.add_argument("--partition", type=int, required=True, help="the partition")
        else:
            a.add_argument("--partition", type=int, default=None,
                           help="one partition (default: every partition of the topic with "
                                "fence rows)")
        if action is Action.FRONTIER:
            a.add_argument("--to-offset", type=int, required=True,
                           help="new frontier (next offset to process)")
        if action is Action.ADOPT_TOPIC:
            a.add_argument("--frontier", default="earliest", choices=("earliest", "latest", "keep"),
                           help="where the adopted topic restarts (default earliest)")
        a.add_argument("--expect-epoch", type=int, default=None,
                       help="refuse unless the partition is still at this epoch")
        a.add_argument("--reason", default="", help="free text for the journal")
        a.add_argument("--operation-id", default=None,
                       help="the operation's id, journaled (default: a digest of the request, "
                            "so the same command again is the same operation and is refused "
                            "once applied; give a new id to apply the same reset again)")
        a.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S,
                       help="bound on the reset's transaction in seconds (default 30); past "
                            "it before COMMIT nothing changed, after it the outcome is unknown")
        a.add_argument(CONFIRM, dest="confirmed", action="store_true",
                       help="apply (without it the plan is only printed)")
        a.add_argument("--json", action="store_true", help="machine-readable output")
        a.add_argument("--schema", default=os.environ.get("FENCE_SCHEMA", DEFAULT_SCHEMA),
                       help="fence schema (default: $FENCE_SCHEMA or fence)")
        a.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"),
                       help="Kafka, for the watermarks and topic id the plan checks "
                            "(default: $KAFKA_BOOTSTRAP_SERVERS)")
        a.add_argument("--kafka-timeout-s", type=float, default=5.0,
                       help="bound of each Kafka request, seconds (default 5)")
        a.set_defaults(func=_main, reset_action=action, exits=EXITS)


def _facts(bootstrap: str | None, topic: str, partitions: Sequence[int], *,
           timeout_s: float) -> dict[TopicPartition, SourceFacts]:
    """Kafka's facts for the partitions that still exist; {} without Kafka."""
    if bootstrap is None or not partitions:
        return {}
    from consumer.kafka.source import KafkaSource

    source = KafkaSource({"bootstrap.servers": bootstrap, **checked_client_properties(os.environ)},
                         request_timeout_s=timeout_s)
    _tid, count = source.topic_id(topic)
    existing = [TopicPartition(topic, p) for p in partitions if p < count]
    return source.facts(existing) if existing else {}


_ROWS = ("SELECT topic, partition, epoch, frontier, owner, topic_id FROM {q}.partitions"
         " WHERE group_id = $1 AND topic = $2 AND ($3::int IS NULL OR partition = $3)"
         " ORDER BY partition")


async def _rows(conn: Any, q: str, group: str, topic: str, partition: int | None,
                *, lock: bool) -> list[Current]:
    rows = await conn.fetch(_ROWS.format(q=q) + (" FOR UPDATE" if lock else ""),
                            group, topic, partition)
    return [Current(TopicPartition(r["topic"], r["partition"]), r["epoch"], r["frontier"],
                    r["owner"], r["topic_id"]) for r in rows]


def _plans(rows: Sequence[Current], facts: Mapping[TopicPartition, SourceFacts],
           args: argparse.Namespace) -> list[Plan]:
    return [plan_reset(row, args.reset_action, facts=facts.get(row.tp),
                       to_offset=getattr(args, "to_offset", None),
                       adopt_frontier=getattr(args, "frontier", "earliest"),
                       expect_epoch=args.expect_epoch, reason=args.reason) for row in rows]


async def apply_reset(conn: Any, *, schema: str, group: str, plans: Sequence[Plan],
                      facts: Mapping[TopicPartition, SourceFacts], args: argparse.Namespace,
                      operator: str, operation: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                      progress: Progress | None = None) -> list[Plan]:
    """In one transaction, bounded by ``timeout_s``: lock, refuse an operation the journal
    holds, re-plan, bump epochs, write, journal, COMMIT. Raises ``ResetRefused`` (also
    ``ResetApplied``), ``NotCommitted`` (failed before COMMIT: nothing changed) or
    ``OutcomeUnknown`` (COMMIT sent, reply lost or timed out); a cancellation propagates
    (``progress.phase`` says whether COMMIT was in flight): ``ops.operator.db.one_transaction``."""
    q = quote_schema(schema)
    tp0 = plans[0].tp

    async def body() -> list[Plan]:
        locked = await _rows(conn, q, group, tp0.topic, args.partition, lock=True)
        await _refuse_if_applied(conn, q, group, tp0.topic, operation)
        fresh = _plans(locked, facts, args)
        if [p.tp for p in fresh] != [p.tp for p in plans]:
            raise ResetRefused("the partition rows changed while planning; run again")
        for plan in fresh:
            await conn.execute(
                f"UPDATE {q}.partitions SET epoch = $5, frontier = $6, topic_id = $7,"
                f" owner = $8, updated_at = now()"
                f" WHERE group_id = $1 AND topic = $2 AND partition = $3 AND epoch = $4",
                group, plan.tp.topic, plan.tp.partition, plan.old_epoch, plan.new_epoch,
                plan.new_frontier, plan.new_topic_id, operator)
            # lanes' completion sets (fencing.lanes): a gap accepted keeps what was applied
            # above the new frontier; any other reset means "from here on, again"
            await conn.execute(
                f"DELETE FROM {q}.completions c WHERE c.group_id = $1 AND c.topic = $2"
                f" AND c.partition = $3 AND ($5::boolean OR"
                f" (SELECT max(l) FROM unnest(c.last) AS l) < $4)",
                group, plan.tp.topic, plan.tp.partition, plan.new_frontier,
                plan.action is not Action.ACCEPT_GAP)
            await conn.execute(
                f"INSERT INTO {q}.journal (group_id, topic, partition, event, epoch, lifetime,"
                f" detail) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                group, plan.tp.topic, plan.tp.partition, plan.journal_event, plan.new_epoch,
                operator, journal_detail(operation, plan.detail))
        crash_point("in-reset", operation=operation, partitions=[str(p.tp) for p in fresh],
                    epochs={str(p.tp): p.new_epoch for p in fresh},
                    frontiers={str(p.tp): [p.old_frontier, p.new_frontier] for p in fresh})
        return fresh

    return await one_transaction(conn, body, what=f"reset {operation}", timeout_s=timeout_s,
                                 progress=progress)


async def _refuse_if_applied(conn: Any, q: str, group: str, topic: str, operation: str) -> None:
    """``ResetApplied`` when the journal holds ``operation`` for ``group`` and ``topic``.
    Called with the rows locked: a concurrent run of the same operation waited for the lock
    and sees the other's committed journal rows (READ COMMITTED: a fresh snapshot per
    statement)."""
    rows = await conn.fetch(
        f"SELECT partition, epoch, lifetime, at FROM {q}.journal WHERE group_id = $1"
        " AND topic = $2 AND event = ANY($3::text[]) AND starts_with(detail, $4)"
        " ORDER BY id", group, topic, sorted(set(JOURNAL_EVENT.values())),
        journal_prefix(operation))
    if rows:
        first = rows[0]
        where = ", ".join(f"{topic}[{r['partition']}] epoch {r['epoch']}" for r in rows)
        raise ResetApplied(
            f"operation {operation} was already applied by {first['lifetime']} at "
            f"{first['at'].isoformat(timespec='seconds')} ({where}); nothing changed. To "
            "apply the same reset once more, give it a new --operation-id")


def _operation(args: argparse.Namespace) -> str:
    if args.operation_id is not None:
        return check_operation_id(args.operation_id)
    return operation_id(args.reset_action, group=args.group, topic=args.topic,
                        partition=args.partition, to_offset=getattr(args, "to_offset", None),
                        adopt_frontier=getattr(args, "frontier", None))


async def _run(dsn: str, args: argparse.Namespace, operation: str,
               progress: Progress) -> tuple[bool, list[Plan]]:
    q = quote_schema(args.schema)
    async with connection(dsn, schema=args.schema) as conn:
        await require_known_group(conn, schema=args.schema, group=args.group)
        rows = await _rows(conn, q, args.group, args.topic, args.partition, lock=False)
        if not rows:
            raise ResetRefused(f"no fence rows for group {args.group!r} topic {args.topic!r}"
                               + ("" if args.partition is None else f" partition {args.partition}"))
        facts = await asyncio.to_thread(_facts, args.bootstrap_servers, args.topic,
                                        [r.tp.partition for r in rows],
                                        timeout_s=args.kafka_timeout_s)
        plans = _plans(rows, facts, args)
        if not args.confirmed:
            return False, plans
        applied = await apply_reset(conn, schema=args.schema, group=args.group, plans=plans,
                                    facts=facts, args=args, operator=operator_identity(),
                                    operation=operation, timeout_s=args.timeout_s,
                                    progress=progress)
        return True, applied


def _print(applied: bool, plans: Sequence[Plan], as_json: bool, operation: str) -> None:
    if as_json:
        print(json.dumps({"applied": applied, "operation_id": operation,
                          "plans": [p.as_dict() for p in plans]}, indent=2))
        return
    for p in plans:
        owner = (f"fences owner {p.fenced_owner}" if p.fenced_owner else "no owner to fence")
        print(f"{p.tp}: {p.detail}; epoch {p.old_epoch} -> {p.new_epoch}, {owner}")
    if applied:
        print(f"operation {operation}: applied and journaled ({len(plans)} partition(s)). A "
              "running member that owns the partition claims it again at its next commit or "
              "heartbeat and continues from the new frontier; with none running, the next "
              "member assigned it starts there")
    else:
        print(f"nothing changed: re-run with {CONFIRM} to apply (operation {operation})")


def _unknown(args: argparse.Namespace, operation: str, why: str) -> int:
    where = (f"--group {args.group} --topic {args.topic}"
             + ("" if args.partition is None else f" --partition {args.partition}"))
    print(f"fencectl reset: outcome unknown: {why}: operation {operation} may or may not "
          "have been applied. To find out, run the same command again: it applies the reset "
          f"if it was not applied and refuses it as already applied if it was (the journal "
          f"holds operation {operation} then; see `{fencectl()} status --history {where}`)",
          file=sys.stderr)
    return OUTCOME_UNKNOWN.code


def _main(args: argparse.Namespace) -> int:
    dsn = dsn_from_env("fencectl reset")
    if dsn is None:
        return CONFIG.code
    progress = Progress()
    try:
        crashpoints.armed()  # FENCE_CRASH_AT (the crash-point matrix)
        quote_schema(args.schema)
        operation = _operation(args)
        if args.timeout_s <= 0:
            raise ConfigError(f"--timeout-s {args.timeout_s}: must be > 0")
    except (ConfigError, ValueError) as exc:
        print(f"fencectl reset: {exc}", file=sys.stderr)
        return CONFIG.code
    try:
        applied, plans = asyncio.run(_run(dsn, args, operation, progress))
    except ConfigError as exc:
        print(f"fencectl reset: {exc}", file=sys.stderr)
        return CONFIG.code
    except SchemaMismatch as exc:
        print(f"fencectl reset: {schema_advice(exc, args.schema)}", file=sys.stderr)
        return CONFIG.code
    except ResetRefused as exc:
        print(f"fencectl reset: refused: {exc}", file=sys.stderr)
        return REFUSED.code
    except OutcomeUnknown as exc:
        return _unknown(args, operation, f"COMMIT was sent and its reply lost ({exc})")
    except NotCommitted as exc:
        print(f"fencectl reset: not applied: {exc}; nothing changed (COMMIT was never "
              f"sent); run the command again (operation {operation})", file=sys.stderr)
        return REFUSED.code
    except KeyboardInterrupt:
        if progress.phase is Phase.IN_FLIGHT:
            return _unknown(args, operation, "interrupted while COMMIT was in flight")
        raise
    except Exception as exc:  # Kafka or the database failed: report without the DSN
        print(f"fencectl reset: {type(exc).__name__}: {exc}", file=sys.stderr)
        return REFUSED.code
    _print(applied, plans, args.json, operation)
    return (APPLIED if applied else CONFIG).code
