"""``fencectl status``: who owns which partition at which epoch, how far behind, who is alive.

``fencectl status [--json] [--group G] [--schema S]`` reads the fence rows and the member
heartbeats from PostgreSQL (``FENCE_DSN``) and the watermarks, topic ids and each group's
committed offsets from Kafka (``KAFKA_BOOTSTRAP_SERVERS``). ``fencectl status --history
--topic T --partition P`` prints the ownership journal of one partition. Read-only. Exit
codes: ``EXITS`` (0 shown, Kafka facts may be missing, see ``kafka.answered``; 1 the
database failed; 2 bad usage or configuration: ``FENCE_DSN`` unset or refused, schema not
migrated, a ``--group`` with neither fence rows nor members: the known groups are listed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from consumer.exits import Exit
from consumer.kafka.adapter import checked_client_properties
from fencing.errors import ConfigError, FenceError, SchemaMismatch, SourceRefused
from fencing.failures import quarantine_cause
from fencing.postgres.schema import DEFAULT_SCHEMA, quote_schema
from fencing.types import SourceFacts, TopicPartition
from ops.hints import schema_advice
from ops.librdkafka_logs import add_log_level_argument, client_log_settings
from ops.operator.db import connection, dsn_from_env, require_known_group
from ops.operator.member_view import DEFAULT_BOUND_S, FINAL_STATES, MemberRow, classify_member
from ops.operator.status_text import render_history, render_text
from ops.operator.status_view import (
    DEFAULT_MIRROR_WARN_S,
    KafkaCommitted,
    PartitionRow,
    view_partition,
)

__all__ = ["EXITS", "build_status", "kafka_committed", "read_history", "read_rows",
           "register"]

SHOWN = Exit(0, "shown (Kafka facts may be missing: a note says so; `kafka.answered` in "
             "`--json`)", "nothing")
DB_FAILED = Exit(1, "the database failed mid-read", "run it again; if it persists, check "
                 "PostgreSQL (its log, its connections)")
CONFIG = Exit(2, "`FENCE_DSN` unset, malformed, refused or unreachable; schema not migrated; "
              "an unknown `--group` (the known groups are listed); `--history` without "
              "`--topic` and `--partition`", "fix what the line on stderr names")
EXITS = (SHOWN, DB_FAILED, CONFIG)

Facts = Mapping[TopicPartition, SourceFacts]
Committed = Mapping[tuple[str, TopicPartition], int | None]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg,unused-ignore]
    p = sub.add_parser("status", help="partitions (owner, epoch, frontier, lag) and members")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--group", default=None, help="only this consumer group (default: all)")
    p.add_argument("--schema", default=os.environ.get("FENCE_SCHEMA", DEFAULT_SCHEMA),
                   help="fence schema (default: $FENCE_SCHEMA or fence)")
    p.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"),
                   help="Kafka for watermarks and topic ids (default: $KAFKA_BOOTSTRAP_SERVERS)")
    p.add_argument("--kafka-timeout-s", type=float, default=5.0,
                   help="bound for each Kafka request, seconds (default 5)")
    p.add_argument("--members-since-s", type=float, default=3600.0,
                   help="show members seen within this many seconds, and every partition "
                        "owner (default 3600)")
    p.add_argument("--default-bound-s", type=float, default=DEFAULT_BOUND_S,
                   help="unavailability bound for rows that store none, seconds (default 15)")
    p.add_argument("--offset-mirror-warn-s", type=float, default=DEFAULT_MIRROR_WARN_S,
                   help="flag a Kafka committed offset that differs from a frontier which "
                        "last moved longer ago than this, seconds (default 30)")
    p.add_argument("--history", action="store_true",
                   help="print the ownership journal of --topic/--partition")
    p.add_argument("--topic", default=None, help="the topic of --history")
    p.add_argument("--partition", type=int, default=None, help="the partition of --history")
    p.add_argument("--limit", type=int, default=100, help="history rows, newest last")
    add_log_level_argument(p)
    p.set_defaults(func=_main, exits=EXITS)


async def read_rows(
    conn: Any, *, schema: str, group: str | None, members_since_s: float
) -> tuple[datetime, list[PartitionRow], list[MemberRow]]:
    """The database clock, the partition rows and the recent member rows (one snapshot)."""
    q = quote_schema(schema)
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        now = await conn.fetchval("SELECT now()")
        prow = await conn.fetch(
            f"SELECT p.group_id, p.topic, p.partition, p.epoch, p.frontier, p.owner,"
            f" p.topic_id, p.updated_at, a.attempts, a.max_attempts, a.next_retry_at,"
            f" a.last_error, a.alone, (SELECT coalesce(jsonb_object_agg(t, n), '{{}}')::text"
            f" FROM (SELECT coalesce(x.error_type, '') AS t, count(*) AS n"
            f" FROM {q}.quarantine x WHERE x.group_id = p.group_id AND x.topic = p.topic"
            f" AND x.partition = p.partition AND x.state = 'quarantined'"  # replayed: handled
            f" GROUP BY 1) c) AS quarantined,"
            f" (SELECT coalesce(array_agg(f ORDER BY f), '{{}}') FROM {q}.completions k,"
            f" unnest(k.first) f WHERE k.group_id = p.group_id AND k.topic = p.topic"
            f" AND k.partition = p.partition) AS lane_first,"
            f" (SELECT coalesce(array_agg(l ORDER BY l), '{{}}') FROM {q}.completions k,"
            f" unnest(k.last) l WHERE k.group_id = p.group_id AND k.topic = p.topic"
            f" AND k.partition = p.partition) AS lane_last"
            f" FROM {q}.partitions p LEFT JOIN {q}.attempts a ON a.group_id = p.group_id"
            f" AND a.topic = p.topic AND a.partition = p.partition AND a.\"offset\" = p.frontier"
            f" WHERE $1::text IS NULL OR p.group_id = $1"
            f" ORDER BY p.group_id, p.topic, p.partition", group)
        mrow = await conn.fetch(
            f"SELECT lifetime_id, group_id, member_id, host, pid, state, started_at,"
            f" last_seen, detail::text AS detail FROM {q}.members"
            f" WHERE ($1::text IS NULL OR group_id = $1)"
            f" AND (last_seen >= now() - make_interval(secs => $2) OR lifetime_id IN"
            f" (SELECT owner FROM {q}.partitions WHERE $1::text IS NULL OR group_id = $1))"
            f" ORDER BY group_id, started_at, lifetime_id", group, members_since_s)
    parts = []
    for r in prow:
        causes: dict[str, int] = {}
        for error_type, n in json.loads(r["quarantined"]).items():
            cause = quarantine_cause(error_type or None)
            causes[cause] = causes.get(cause, 0) + int(n)
        parts.append(PartitionRow(
            r["group_id"], r["topic"], r["partition"], r["epoch"], r["frontier"], r["owner"],
            r["topic_id"], r["updated_at"], sum(causes.values()), r["attempts"],
            r["max_attempts"], r["next_retry_at"], r["last_error"], alone=r["alone"],
            quarantine_causes=causes,
            # spans are disjoint: their firsts and lasts sorted apart still pair up
            lane_spans=tuple(zip(r["lane_first"], r["lane_last"], strict=True))))
    members = [MemberRow(r["lifetime_id"], r["group_id"], r["member_id"], r["host"], r["pid"],
                         r["state"], r["started_at"], r["last_seen"], json.loads(r["detail"]))
               for r in mrow]
    return now, parts, members


async def read_history(
    conn: Any, *, schema: str, group: str | None, tp: TopicPartition, limit: int
) -> list[dict[str, Any]]:
    """The newest ``limit`` journal rows of ``tp`` (every group unless ``group``), oldest first."""
    q = quote_schema(schema)
    rows = await conn.fetch(
        f"SELECT * FROM (SELECT id, group_id, event, epoch, lifetime, detail, at"
        f" FROM {q}.journal WHERE topic = $1 AND partition = $2"
        f" AND ($3::text IS NULL OR group_id = $3) ORDER BY id DESC LIMIT $4) j ORDER BY id",
        tp.topic, tp.partition, group, limit)
    return [{"id": r["id"], "group": r["group_id"], "event": r["event"], "epoch": r["epoch"],
             "lifetime": r["lifetime"], "detail": r["detail"], "at": r["at"].isoformat()}
            for r in rows]


def kafka_facts(
    bootstrap: str | None, tps: Sequence[TopicPartition], *, timeout_s: float,
    log_level: str | None = None,
) -> tuple[dict[TopicPartition, SourceFacts], dict[str, str]]:
    """Watermarks and topic ids per partition, plus a note per topic Kafka could not answer."""
    facts: dict[TopicPartition, SourceFacts] = {}
    notes: dict[str, str] = {}
    topics = sorted({tp.topic for tp in tps})
    if bootstrap is None:
        return facts, {t: "no Kafka configured (KAFKA_BOOTSTRAP_SERVERS)" for t in topics}
    from consumer.kafka.source import KafkaSource

    source = KafkaSource({"bootstrap.servers": bootstrap, **checked_client_properties(os.environ),
                          **client_log_settings(log_level)},
                         request_timeout_s=timeout_s)
    for topic in topics:
        wanted = [tp for tp in tps if tp.topic == topic]
        try:
            facts.update(source.facts(wanted))
        except SourceRefused as exc:
            notes[topic] = f"source refused: {exc}"
        except FenceError as exc:
            notes[topic] = f"Kafka did not answer: {exc}"
    return facts, notes


def kafka_committed(
    bootstrap: str | None, parts: Sequence[PartitionRow], *, timeout_s: float,
    log_level: str | None = None,
) -> tuple[dict[tuple[str, TopicPartition], int | None], dict[str, str]]:
    """Each group's committed offsets in Kafka, plus a note per group Kafka did not answer."""
    out: dict[tuple[str, TopicPartition], int | None] = {}
    notes: dict[str, str] = {}
    groups: dict[str, list[TopicPartition]] = {}
    for r in parts:
        groups.setdefault(r.group_id, []).append(TopicPartition(r.topic, r.partition))
    if bootstrap is None or not groups:
        return out, notes
    from consumer.kafka.source import KafkaSource

    source = KafkaSource({"bootstrap.servers": bootstrap, **checked_client_properties(os.environ),
                          **client_log_settings(log_level)},
                         request_timeout_s=timeout_s)
    for group, tps in sorted(groups.items()):
        try:
            got = source.committed_offsets(group, tps)
        except FenceError as exc:
            notes[f"group {group}"] = f"committed offsets unknown: {exc}"
            continue
        out.update({(group, tp): got.get(tp) for tp in tps})
    return out, notes


def build_status(
    *, now: datetime, partitions: Sequence[PartitionRow], members: Sequence[MemberRow],
    facts: Facts, topic_notes: Mapping[str, str], default_bound_s: float = DEFAULT_BOUND_S,
    committed: Committed | None = None, group_notes: Mapping[str, str] | None = None,
    mirror_warn_s: float = DEFAULT_MIRROR_WARN_S,
) -> dict[str, Any]:
    """Pure: the status document (``--json`` prints exactly this). ``committed`` holds the
    Kafka committed offsets that Kafka answered for, by (group, partition)."""
    views = {m.lifetime_id: classify_member(m, now=now, default_bound_s=default_bound_s)
             for m in members}
    committed = committed or {}
    parts = []
    for r in partitions:
        tp = TopicPartition(r.topic, r.partition)
        key = (r.group_id, tp)
        parts.append(view_partition(
            r, facts=facts.get(tp), members=views, source_note=topic_notes.get(r.topic),
            committed=KafkaCommitted(committed[key]) if key in committed else None,
            now=now, mirror_warn_s=mirror_warn_s))
    notes = {**topic_notes, **(group_notes or {})}
    rendered = [p.as_dict() for p in parts]
    return {
        "at": now.isoformat(),
        "kafka": {"answered": not notes, "notes": notes},
        "topics": topic_totals(rendered),
        "partitions": rendered,
        "members": [v.as_dict() for v in views.values()],
    }


def topic_totals(partitions: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Pure: per (group, topic) of the partition views: partitions, how many have a live
    owner (observed now and neither stopped nor retired), total lag (None when Kafka did not
    answer for one), partitions stalled."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for p in partitions:
        t = out.setdefault((p["group"], p["topic"]), {
            "group": p["group"], "topic": p["topic"], "partitions": 0, "owned_live": 0,
            "lag": 0, "stalled": 0})
        t["partitions"] += 1
        t["owned_live"] += p["owner_availability"] == "observed" and str(
            p["owner_state"]).split("/")[0] not in FINAL_STATES
        t["lag"] = None if t["lag"] is None or p["lag"] is None else t["lag"] + p["lag"]
        t["stalled"] += bool(p["stalled"])
    return list(out.values())


async def _collect(dsn: str, args: argparse.Namespace) -> dict[str, Any] | list[dict[str, Any]]:
    async with connection(dsn, schema=args.schema) as conn:
        if args.group is not None:
            await require_known_group(conn, schema=args.schema, group=args.group)
        if args.history:
            tp = TopicPartition(args.topic, args.partition)
            return await read_history(conn, schema=args.schema, group=args.group, tp=tp,
                                      limit=args.limit)
        now, parts, members = await read_rows(conn, schema=args.schema, group=args.group,
                                              members_since_s=args.members_since_s)
    tps = [TopicPartition(p.topic, p.partition) for p in parts]
    facts, notes = await asyncio.to_thread(kafka_facts, args.bootstrap_servers, tps,
                                           timeout_s=args.kafka_timeout_s,
                                           log_level=args.log_level)
    committed, group_notes = await asyncio.to_thread(
        kafka_committed, args.bootstrap_servers, parts, timeout_s=args.kafka_timeout_s,
        log_level=args.log_level)
    return build_status(now=now, partitions=parts, members=members, facts=facts,
                        topic_notes=notes, default_bound_s=args.default_bound_s,
                        committed=committed, group_notes=group_notes,
                        mirror_warn_s=args.offset_mirror_warn_s)


def _main(args: argparse.Namespace) -> int:
    dsn = dsn_from_env("fencectl status")
    if dsn is None:
        return CONFIG.code
    if args.history and (args.topic is None or args.partition is None):
        print("fencectl status --history needs --topic and --partition", file=sys.stderr)
        return CONFIG.code
    try:
        quote_schema(args.schema)
        result = asyncio.run(_collect(dsn, args))
    except ConfigError as exc:
        print(f"fencectl status: {exc}", file=sys.stderr)
        return CONFIG.code
    except SchemaMismatch as exc:
        print(f"fencectl status: {schema_advice(exc, args.schema)}", file=sys.stderr)
        return CONFIG.code
    except Exception as exc:  # the database failed: report without the DSN
        print(f"fencectl status: {type(exc).__name__}: {exc}", file=sys.stderr)
        return DB_FAILED.code
    if args.json:
        print(json.dumps(result, indent=2))
    elif isinstance(result, list):
        print(render_history(result))
    else:
        print(render_text(result))
    return SHOWN.code
