"""What a cell reads back: the marker, and PostgreSQL's rows as frozen values.

Rules
- ``install_audit`` adds, in the cell's own fresh schema only, a trigger that records every
  insert or update of a partition row (epoch, old and new frontier, owner) with
  ``clock_timestamp()``: the statement's wall time on this host, comparable with the
  marker's ``time.time()``. A row exists only if its transaction committed, so the audit is
  the list of committed claims and frontier moves, each with the epoch it was written under.
- The readers take a connection; nothing here decides (``tests.crash.verdict`` does).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "AuditRow",
    "CellFacts",
    "JournalRow",
    "Marker",
    "MemberRow",
    "PartitionRow",
    "QuarantineRow",
    "install_audit",
    "read_markers",
    "read_partitions",
    "read_rows",
]


@dataclass(frozen=True, slots=True)
class Marker:
    point: str
    n: int
    pid: int
    at: float
    signal_name: str
    fields: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class PartitionRow:
    partition: int
    epoch: int
    frontier: int
    owner: str | None


@dataclass(frozen=True, slots=True)
class AuditRow:
    partition: int
    epoch: int
    old_frontier: int | None  # None: the row was created (first claim)
    frontier: int
    owner: str | None
    at: float


@dataclass(frozen=True, slots=True)
class JournalRow:
    partition: int
    event: str
    epoch: int | None
    lifetime: str | None
    at: float


@dataclass(frozen=True, slots=True)
class QuarantineRow:
    partition: int
    offset: int
    epoch: int
    at: float


@dataclass(frozen=True, slots=True)
class MemberRow:
    lifetime_id: str
    pid: int | None
    state: str
    last_seen: float


@dataclass(frozen=True, slots=True)
class CellFacts:
    """Everything the verdict judges, gathered after the successor stopped."""

    markers: tuple[Marker, ...]
    a_pid: int
    b_pid: int | None
    a_exit: int | None  # A's return code (-9: SIGKILL), None if it never ended
    a_stopped_at_marker: bool  # STOP plans: A was frozen ('T') once its marker was there
    b_exit: int | None
    at_death: tuple[PartitionRow, ...]
    final: tuple[PartitionRow, ...]
    high_watermarks: Mapping[int, int]
    audit: tuple[AuditRow, ...] = ()
    journal: tuple[JournalRow, ...] = ()
    quarantine: tuple[QuarantineRow, ...] = ()
    members: tuple[MemberRow, ...] = ()
    oracle_problems: tuple[str, ...] = ()
    commit_reply_held: bool | None = None  # the proxy held a COMMIT reply (hold plans)
    setup_lifetimes: frozenset[str] = field(default_factory=frozenset)
    #: lanes: partition -> (frontier, spans) at A's death (``fencing.lanes``)
    lanes_at_death: Mapping[int, tuple[int, tuple[tuple[int, int], ...]]] = field(
        default_factory=dict)


def read_markers(path: Path) -> tuple[Marker, ...]:
    """The marker lines of ``path`` (none if it does not exist)."""
    if not path.exists():
        return ()
    out = []
    for line in path.read_text().splitlines():
        raw = json.loads(line)
        fields = {k: v for k, v in raw.items()
                  if k not in ("point", "n", "pid", "at", "signal")}
        out.append(Marker(raw["point"], raw["n"], raw["pid"], raw["at"], raw["signal"], fields))
    return tuple(out)


async def install_audit(conn: Any, schema: str) -> None:
    s = f'"{schema}"'
    await conn.execute(f"""
CREATE TABLE {s}.crash_audit (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, partition integer NOT NULL,
    epoch bigint NOT NULL, old_frontier bigint, frontier bigint NOT NULL, owner text,
    at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION {s}.crash_audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.crash_audit (partition, epoch, old_frontier, frontier, owner)
    VALUES (NEW.partition, NEW.epoch,
            CASE WHEN TG_OP = 'UPDATE' THEN OLD.frontier END, NEW.frontier, NEW.owner);
    RETURN NULL;
END $$;
CREATE TRIGGER crash_audit AFTER INSERT OR UPDATE ON {s}.partitions
    FOR EACH ROW EXECUTE FUNCTION {s}.crash_audit_row();
CREATE FUNCTION {s}.crash_audit_lane() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.crash_audit (partition, epoch, old_frontier, frontier, owner)
    VALUES (NEW.partition, NEW.epoch, NULL,
            (SELECT max(l) + 1 FROM unnest(NEW.last) AS l), NULL);
    RETURN NULL;
END $$;
CREATE TRIGGER crash_audit_lane AFTER INSERT ON {s}.completions
    FOR EACH ROW EXECUTE FUNCTION {s}.crash_audit_lane();
""")


async def read_completions(conn: Any, schema: str, group: str,
                           topic: str) -> dict[int, tuple[int, tuple[tuple[int, int], ...]]]:
    """partition -> (the row's frontier, the lanes' spans above it)."""
    rows = await conn.fetch(
        f'SELECT p.partition, p.frontier, c.first, c.last FROM "{schema}".partitions p '
        f'LEFT JOIN "{schema}".completions c ON c.group_id = p.group_id '
        "AND c.topic = p.topic AND c.partition = p.partition "
        "WHERE p.group_id = $1 AND p.topic = $2", group, topic)
    out: dict[int, tuple[int, list[tuple[int, int]]]] = {}
    for r in rows:
        _base, spans = out.setdefault(r["partition"], (r["frontier"], []))
        if r["first"] is not None:
            spans.extend(zip(r["first"], r["last"], strict=True))
    return {p: (base, tuple(spans)) for p, (base, spans) in out.items()}


async def read_partitions(conn: Any, schema: str, group: str,
                          topic: str) -> tuple[PartitionRow, ...]:
    rows = await conn.fetch(
        f'SELECT partition, epoch, frontier, owner FROM "{schema}".partitions '
        "WHERE group_id = $1 AND topic = $2 ORDER BY partition", group, topic)
    return tuple(PartitionRow(r["partition"], r["epoch"], r["frontier"], r["owner"])
                 for r in rows)


async def read_rows(conn: Any, schema: str, group: str, topic: str) -> dict[str, tuple[Any, ...]]:
    """audit, journal, quarantine and members rows of the cell (times as epoch seconds)."""
    s = f'"{schema}"'
    audit = await conn.fetch(
        f"SELECT partition, epoch, old_frontier, frontier, owner, "
        f"extract(epoch FROM at)::float8 AS at FROM {s}.crash_audit ORDER BY id")
    journal = await conn.fetch(
        f"SELECT partition, event, epoch, lifetime, extract(epoch FROM at)::float8 AS at "
        f"FROM {s}.journal WHERE group_id = $1 AND topic = $2 ORDER BY id", group, topic)
    quarantine = await conn.fetch(
        f'SELECT partition, "offset", epoch, extract(epoch FROM at)::float8 AS at '
        f"FROM {s}.quarantine WHERE group_id = $1 AND topic = $2", group, topic)
    members = await conn.fetch(
        f"SELECT lifetime_id, pid, state, extract(epoch FROM last_seen)::float8 AS last_seen "
        f"FROM {s}.members WHERE group_id = $1", group)
    return {
        "audit": tuple(AuditRow(r["partition"], r["epoch"], r["old_frontier"], r["frontier"],
                                r["owner"], r["at"]) for r in audit),
        "journal": tuple(JournalRow(r["partition"], r["event"], r["epoch"], r["lifetime"],
                                    r["at"]) for r in journal),
        "quarantine": tuple(QuarantineRow(r["partition"], r["offset"], r["epoch"], r["at"])
                            for r in quarantine),
        "members": tuple(MemberRow(r["lifetime_id"], r["pid"], r["state"], r["last_seen"])
                         for r in members),
    }
