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


def _doc(d: Any) -> Doc:
    return Doc(d.revision, d.body, d.withdrawn, d.partition, d.offset)


def _outbox_row(e: Any) -> OutboxRow:
    return OutboxRow(e.version, e.kind.value, e.body, e.partition, e.offset)


def memory_state(tables: Any, quarantine: Mapping[tuple[str, int, int], str], *,
                 memo: dict[int, tuple[Any, Any]] | None = None) -> Expected:
    """State of the in-memory tables (a ``TableTx`` or ``{name: mapping}``) plus the store's
    quarantine, given as {(topic, partition, offset): reason}. With ``memo`` (a dict the
    caller keeps), a table entry seen before (the same immutable object) is not converted
    again: a caller reading the state after every commit gets the same row objects back."""
    docs, outbox = read_tables(tables)
    if memo is None:
        return Expected(documents={k: _doc(d) for k, d in docs.items()},
                        outbox={k: _outbox_row(e) for k, e in outbox.items()},
                        quarantine=dict(quarantine))

    def seen(entry: Any, convert: Any) -> Any:
        hit = memo.get(id(entry))
        if hit is None or hit[0] is not entry:
            hit = memo[id(entry)] = (entry, convert(entry))  # holds entry: its id stays its
        return hit[1]

    return Expected(documents={k: seen(d, _doc) for k, d in docs.items()},
                    outbox={k: seen(e, _outbox_row) for k, e in outbox.items()},
                    quarantine=dict(quarantine))


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


def memory_store_state(store: Any, *, memo: dict[int, tuple[Any, Any]] | None = None
                       ) -> Expected:
    """Committed state of a ``MemoryFenceStore`` (its ``tables()`` and ``quarantine`` rows);
    ``memo`` as for ``memory_state``."""
    quarantine = {(q.tp.topic, q.tp.partition, q.offset): q.reason for q in store.quarantine}
    return memory_state(store.tables(), quarantine, memo=memo)
