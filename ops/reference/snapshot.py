"""Read committed reference-domain state into the oracle's shape (``oracle.Expected``),
from PostgreSQL or from the in-memory store's tables. Read-only helpers for tests and
the simulator; the handlers never import this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fencing.postgres.schema import DEFAULT_SCHEMA, quote_schema
from ops.reference.memory import read_tables
from ops.reference.oracle import Doc, Expected, OutboxRow

__all__ = ["memory_state", "memory_store_state", "pg_state"]


def memory_state(tables: Any, quarantine: Mapping[tuple[str, int, int], str]) -> Expected:
    """State of the in-memory tables (a ``TableTx`` or ``{name: mapping}``) plus the store's
    quarantine, given as {(topic, partition, offset): reason}."""
    docs, outbox = read_tables(tables)
    return Expected(
        documents={
            k: Doc(d.revision, d.body, d.withdrawn, d.partition, d.offset) for k, d in docs.items()
        },
        outbox={
            k: OutboxRow(e.version, e.kind.value, e.body, e.partition, e.offset)
            for k, e in outbox.items()
        },
        quarantine=dict(quarantine),
    )


async def pg_state(
    conn: Any,
    *,
    topic: str,
    schema: str = DEFAULT_SCHEMA,
    group_id: str | None = None,
    quarantine: Mapping[tuple[str, int, int], str] | None = None,
) -> Expected:
    """Committed effect rows of ``topic`` in ``schema``, with the quarantine rows of
    ``group_id`` from the fence's ``quarantine`` table (or ``quarantine`` when given)."""
    s = quote_schema(schema)
    drows = await conn.fetch(
        f"SELECT doc_id, revision, body, withdrawn, src_partition, src_offset "
        f"FROM {s}.ref_documents WHERE topic = $1",
        topic,
    )
    orows = await conn.fetch(
        f"SELECT doc_id, seq, version, kind, body, src_partition, src_offset "
        f"FROM {s}.ref_outbox WHERE topic = $1",
        topic,
    )
    if quarantine is None:
        qrows = await conn.fetch(
            f'SELECT partition, "offset", reason FROM {s}.quarantine '
            f"WHERE group_id = $1 AND topic = $2",
            group_id,
            topic,
        )
        quarantine = {(topic, r[0], r[1]): r[2] for r in qrows}
    return Expected(
        documents={(topic, r[0]): Doc(r[1], r[2], r[3], r[4], r[5]) for r in drows},
        outbox={(topic, r[0], r[1]): OutboxRow(r[2], r[3], r[4], r[5], r[6]) for r in orows},
        quarantine=dict(quarantine),
    )


def memory_store_state(store: Any) -> Expected:
    """Committed state of a ``MemoryFenceStore`` (its ``tables()`` and ``quarantine`` rows)."""
    quarantine = {(q.tp.topic, q.tp.partition, q.offset): q.reason for q in store.quarantine}
    return memory_state(store.tables(), quarantine)
