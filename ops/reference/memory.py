"""The reference handler over the in-memory store's transaction object.

Rules
- ``conn`` is the in-memory store's transaction; the handler needs only
  ``conn.table(name) -> MutableMapping`` returning a mutable mapping that belongs to the
  transaction (its changes are kept only if the store commits). See ``TableTx``.
- Tables: ``ref_documents`` maps (topic, doc_id) -> ``DocState``;
  ``ref_outbox`` maps (topic, doc_id, seq) -> ``OutboxEntry``.
- Decisions are ``ops.reference.domain.decide_batch``, the same rules as the
  PostgreSQL handler; an outbox key collision raises ``KeyError`` (the transaction must
  then be aborted), mirroring the PostgreSQL primary key.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from typing import Any, Protocol, runtime_checkable

from fencing.handler import handler
from fencing.types import SourceRecord, Verdict
from ops.reference.domain import (
    DocKey,
    DocState,
    OutboxEntry,
    batch_keys,
    decide_batch,
    parse_batch,
)

__all__ = ["DOCUMENTS", "OUTBOX", "TableTx", "memory_ref_handler", "read_tables"]

DOCUMENTS = "ref_documents"
OUTBOX = "ref_outbox"


@runtime_checkable
class TableTx(Protocol):
    """What the handler needs from the in-memory store's transaction."""

    def table(self, name: str) -> MutableMapping[Any, Any]: ...


@handler(durability="durable-critical", effects="transactional")
async def memory_ref_handler(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
    """The reference handler; ``conn`` must provide ``table(name)`` (``TableTx``)."""
    documents: MutableMapping[DocKey, DocState] = conn.table(DOCUMENTS)
    outbox: MutableMapping[tuple[str, str, int], OutboxEntry] = conn.table(OUTBOX)
    parsed = parse_batch(records)
    current = {k: documents[k] for k in batch_keys(records, parsed) if k in documents}
    decision = decide_batch(records, current, parsed=parsed)
    for entry in decision.outbox:
        ok = (entry.topic, entry.doc_id, entry.seq)
        if ok in outbox:
            raise KeyError(f"duplicate outbox row {ok!r}")
        outbox[ok] = entry
    documents.update(decision.documents)
    return list(decision.verdicts)


def read_tables(
    tables: Any,
) -> tuple[dict[DocKey, DocState], dict[tuple[str, str, int], OutboxEntry]]:
    """Copies of the two effect tables from a ``TableTx`` or a plain ``{name: mapping}``."""
    if not isinstance(tables, dict) and isinstance(tables, TableTx):  # a Protocol check is slow
        docs, ob = tables.table(DOCUMENTS), tables.table(OUTBOX)
    else:
        docs, ob = tables.get(DOCUMENTS, {}), tables.get(OUTBOX, {})
    return dict(docs), dict(ob)
