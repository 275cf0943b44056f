"""The quarantine relayed to a dead-letter topic (``fencectl quarantine relay``): which rows,
the record each becomes, and marking them relayed (SQL + pure; the producer is the command's).

Rules
- A row is relayed while it is ``quarantined`` and not relayed yet (``relayed_at`` NULL,
  migration 0006): a row a replay applied before the relay saw it is no longer dead and is
  not published. Rows go oldest quarantine first.
- The record published for a row has the original key, value and headers, the original
  timestamp (when the row has it), and the dead-letter headers of both Kafka Connect's
  (``__connect.errors.*``: UTF-8 text, as Connect's ``DeadLetterQueueReporter`` writes
  with ``errors.deadletterqueue.context.headers.enable=true``) and Spring Kafka's
  (``kafka_dlt-*``: its ``DeadLetterPublishingRecoverer``'s; partition a 4-byte and offset
  and timestamp 8-byte big-endian integers, as it writes them), and fenceworker's own
  ``fenceworker.dlq.*``: the reason, the error type, the attempt count, the group, and
  ``fenceworker.dlq.id``, the dedupe id ``GROUP/TOPIC/PARTITION/OFFSET@EPOCH`` (the epoch
  of the batch that quarantined it: a row quarantined again after a reset has a new id).
- ``mark`` sets ``relayed_*`` only for rows still quarantined at the epoch they were read
  with and not relayed yet, one statement for a whole flush: it runs only after the
  broker acknowledged each of them. A relay that dies between the acknowledgement and the
  mark publishes those rows again on its next run, with the same dedupe id: a reader that
  keeps the ids it has seen reads each row exactly once.
- ``relay_lock`` is a session advisory lock per group: two relays of one group never run
  at once (the second is refused, it does not wait).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fencing.postgres.schema import quote_ident, quote_schema
from ops.operator.quarantine import headers_of

__all__ = ["DEDUPE_HEADER", "DeadLetter", "Delivered", "dead_letter", "grant_relay_sql",
           "mark", "pending", "relay_lock"]

DEDUPE_HEADER = "fenceworker.dlq.id"
_CONNECT = "__connect.errors."
_SPRING = "kafka_dlt-"
_OURS = "fenceworker.dlq."
_COLUMNS = ('group_id, topic, partition, "offset", key, value, headers, reason, epoch,'
            " error_type, error_message, record_timestamp_ms, attempts")


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """What the relay publishes for one quarantine row, and the row it marks after."""

    dedupe_id: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int | None
    row: tuple[str, str, int, int, int]  # group, topic, partition, offset, epoch


@dataclass(frozen=True, slots=True)
class Delivered:
    """A dead letter the broker acknowledged, where it landed."""

    letter: DeadLetter
    topic: str
    partition: int
    offset: int


def _text(value: Any) -> bytes:
    return str(value).encode()


def dead_letter(row: Any) -> DeadLetter:
    """Pure: the record to publish for a quarantine row (see the module Rules)."""
    group, topic, partition, offset, epoch = (row["group_id"], row["topic"], row["partition"],
                                              row["offset"], row["epoch"])
    dedupe = f"{group}/{topic}/{partition}/{offset}@{epoch}"
    error_type = row["error_type"] or "Reject"
    message = row["error_message"] or row["reason"]
    ts = row["record_timestamp_ms"]
    attempts = row["attempts"] or 1
    headers: list[tuple[str, bytes | None]] = list(headers_of(row["headers"]))
    headers += [
        (f"{_CONNECT}topic", _text(topic)), (f"{_CONNECT}partition", _text(partition)),
        (f"{_CONNECT}offset", _text(offset)), (f"{_CONNECT}connector.name", _text(group)),
        (f"{_CONNECT}stage", b"TASK_PUT"),
        (f"{_CONNECT}exception.class.name", _text(error_type)),
        (f"{_CONNECT}exception.message", _text(message)),
        (f"{_SPRING}original-topic", _text(topic)),
        (f"{_SPRING}original-partition", struct.pack(">i", partition)),
        (f"{_SPRING}original-offset", struct.pack(">q", offset)),
        (f"{_SPRING}original-consumer-group", _text(group)),
        (f"{_SPRING}exception-fqcn", _text(error_type)),
        (f"{_SPRING}exception-message", _text(message)),
    ]
    if ts is not None:
        headers += [(f"{_SPRING}original-timestamp", struct.pack(">q", ts)),
                    (f"{_SPRING}original-timestamp-type", b"CreateTime"),
                    (f"{_OURS}timestamp", _text(ts))]
    headers += [(f"{_OURS}reason", _text(row["reason"])),
                (f"{_OURS}error.type", _text(error_type)),
                (f"{_OURS}attempts", _text(attempts)), (f"{_OURS}group", _text(group)),
                (DEDUPE_HEADER, _text(dedupe))]
    return DeadLetter(dedupe, row["key"], row["value"], tuple(headers), ts,
                      (group, topic, partition, offset, epoch))


async def relay_lock(conn: Any, group: str) -> bool:
    """Take the group's relay lock for this session; False when another relay holds it."""
    return bool(await conn.fetchval("SELECT pg_try_advisory_lock(hashtext($1))",
                                    f"fenceworker.relay:{group}"))


async def pending(conn: Any, schema: str, *, group: str, topic: str | None,
                  limit: int) -> list[Any]:
    """Up to ``limit`` rows to relay, oldest quarantine first."""
    return list(await conn.fetch(
        f"SELECT {_COLUMNS} FROM {quote_schema(schema)}.quarantine WHERE group_id = $1"
        " AND ($2::text IS NULL OR topic = $2) AND state = 'quarantined'"
        ' AND relayed_at IS NULL ORDER BY at, topic, partition, "offset" LIMIT $3',
        group, topic, limit))


async def mark(conn: Any, schema: str, delivered: Sequence[Delivered]) -> int:
    """Mark acknowledged rows relayed (see the module Rules); how many were marked."""
    if not delivered:
        return 0
    rows = [d.letter.row for d in delivered]
    got = await conn.fetch(
        f"UPDATE {quote_schema(schema)}.quarantine q SET relayed_at = now(), relayed_to = d.t,"
        " relayed_partition = d.p, relayed_offset = d.o"
        " FROM unnest($1::text[], $2::text[], $3::int[], $4::bigint[], $5::bigint[],"
        " $6::text[], $7::int[], $8::bigint[]) AS d(g, topic, part, off, epoch, t, p, o)"
        ' WHERE q.group_id = d.g AND q.topic = d.topic AND q.partition = d.part'
        ' AND q."offset" = d.off AND q.epoch = d.epoch AND q.relayed_at IS NULL'
        " RETURNING 1",
        [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
        [r[3] for r in rows], [r[4] for r in rows], [d.topic for d in delivered],
        [d.partition for d in delivered], [d.offset for d in delivered])
    return len(got)


def grant_relay_sql(schema: str, role: str) -> list[str]:
    """What ``fencectl quarantine relay`` needs on ``schema`` and no more: read the rows and
    which groups exist, and set the ``relayed_*`` columns (no other column, no DELETE).
    Run as the schema owner."""
    q = quote_schema(schema)
    r = quote_ident(role)
    return [
        f"GRANT USAGE ON SCHEMA {q} TO {r}",
        f"GRANT SELECT ON {q}.schema_version, {q}.partitions, {q}.members TO {r}",
        f"GRANT SELECT ON {q}.quarantine TO {r}",
        f"GRANT UPDATE (relayed_at, relayed_to, relayed_partition, relayed_offset) ON "
        f"{q}.quarantine TO {r}",
    ]
