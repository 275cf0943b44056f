"""The reference handler over asyncpg, and its effect tables.

Rules
- ``reference`` is the handler factory ``fencectl run`` uses by default: it builds the
  handler for the run's ``--schema`` (``make_pg_handler``), and its ``ensure_tables`` runs at
  start. ``ensure_tables(conn, schema)`` creates the schema and the tables
  ``ref_documents`` and ``ref_outbox`` if missing; idempotent and safe to run concurrently
  (advisory lock).
- The handler makes two round trips per batch of one topic, whatever its size: one read
  of the current rows of every document in the batch (locked ``FOR UPDATE`` in doc-id
  order, one read per topic), then one statement writing the final document rows and
  all outbox rows.
  Decisions are ``ops.reference.domain.decide_batch``.
- It runs inside the store's transaction and never commits; a database error
  propagates, so the transaction rolls back (the store classifies it).
- The outbox primary key (topic, doc_id, seq) turns a lost update from a mis-keyed
  producer (one document in two partitions, processed concurrently) into an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fencing.handler import HandlerContext, handler, handler_factory
from fencing.postgres.schema import DEFAULT_SCHEMA, quote_ident, quote_schema
from fencing.store import HandlerFn
from fencing.types import SourceRecord, Verdict
from ops.reference.domain import DocKey, DocState, batch_keys, decide_batch, parse_batch

__all__ = [
    "DEFAULT_SCHEMA",
    "ddl",
    "ensure_tables",
    "grant_sql",
    "make_pg_handler",
    "reference",
]


def ddl(schema: str = DEFAULT_SCHEMA) -> str:
    """The idempotent DDL of the effect tables in ``schema`` (usable inside a migration)."""
    s = quote_schema(schema)
    return f"""
CREATE SCHEMA IF NOT EXISTS {s};
CREATE TABLE IF NOT EXISTS {s}.ref_documents (
    topic         text        NOT NULL,
    doc_id        text        NOT NULL,
    revision      bigint      NOT NULL,
    body          text,
    withdrawn     boolean     NOT NULL,
    src_partition integer     NOT NULL,
    src_offset    bigint      NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (doc_id, topic)
);
CREATE TABLE IF NOT EXISTS {s}.ref_outbox (
    outbox_id     bigint      GENERATED ALWAYS AS IDENTITY,
    topic         text        NOT NULL,
    doc_id        text        NOT NULL,
    seq           bigint      NOT NULL,
    version       bigint      NOT NULL,
    kind          text        NOT NULL,
    body          text,
    src_partition integer     NOT NULL,
    src_offset    bigint      NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, doc_id, seq)
);
"""


def grant_sql(schema: str, role: str) -> list[str]:
    """Statements granting ``role`` what the handler needs on the effect tables and nothing
    more (no DDL, no DELETE). Run as the tables' owner after ``ensure_tables``."""
    s = quote_schema(schema)
    r = quote_ident(role)
    return [
        f"GRANT USAGE ON SCHEMA {s} TO {r}",
        f"GRANT SELECT, INSERT, UPDATE ON {s}.ref_documents TO {r}",
        f"GRANT SELECT, INSERT ON {s}.ref_outbox TO {r}",
    ]


async def ensure_tables(conn: Any, schema: str = DEFAULT_SCHEMA) -> None:
    """Create the effect tables in ``schema`` if missing (one transaction, serialized).
    When both exist it only reads the catalog, so a role without DDL rights can call it."""
    s = quote_schema(schema)
    present = await conn.fetchval(
        "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL",
        f"{s}.ref_documents",
        f"{s}.ref_outbox",
    )
    if present:
        return
    async with conn.transaction():
        lock_name = f"fenceworker.ref:{schema}"
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", lock_name)
        await conn.execute(ddl(schema))


def _statements(schema: str) -> tuple[str, str]:
    s = quote_schema(schema)
    # one index probe per document (LATERAL), whatever the table's statistics say; rows
    # are locked in the order of $2 (sorted doc ids), so concurrent batches cannot deadlock
    read = f"""
SELECT d.doc_id, d.revision, d.body, d.withdrawn, d.src_partition, d.src_offset
FROM unnest($2::text[]) WITH ORDINALITY AS k(doc_id, n)
CROSS JOIN LATERAL (
    SELECT * FROM {s}.ref_documents r
    WHERE r.doc_id = k.doc_id AND r.topic = $1
    FOR UPDATE
) AS d
ORDER BY k.n
"""
    write = f"""
WITH docs AS (
    INSERT INTO {s}.ref_documents
        (topic, doc_id, revision, body, withdrawn, src_partition, src_offset)
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::boolean[],
                         $6::integer[], $7::bigint[])
    ON CONFLICT (topic, doc_id) DO UPDATE SET
        revision = EXCLUDED.revision, body = EXCLUDED.body, withdrawn = EXCLUDED.withdrawn,
        src_partition = EXCLUDED.src_partition, src_offset = EXCLUDED.src_offset,
        updated_at = now()
)
INSERT INTO {s}.ref_outbox
    (topic, doc_id, seq, version, kind, body, src_partition, src_offset)
SELECT * FROM unnest($8::text[], $9::text[], $10::bigint[], $11::bigint[], $12::text[],
                     $13::text[], $14::integer[], $15::bigint[])
"""
    return read, write


def make_pg_handler(*, schema: str = DEFAULT_SCHEMA) -> HandlerFn:
    """The reference handler writing to ``schema``'s effect tables; raises ``ConfigError``
    for an invalid schema name."""
    read_sql, write_sql = _statements(schema)

    @handler(durability="durable-critical", effects="transactional")
    async def handle(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
        parsed = parse_batch(records)
        by_topic: dict[str, list[str]] = {}
        for topic, doc_id in sorted(batch_keys(records, parsed)):
            by_topic.setdefault(topic, []).append(doc_id)
        current: dict[DocKey, DocState] = {}
        for topic, doc_ids in by_topic.items():
            for r in await conn.fetch(read_sql, topic, doc_ids):
                current[(topic, r[0])] = DocState(r[1], r[2], r[3], r[4], r[5])
        decision = decide_batch(records, current, parsed=parsed)
        if decision.outbox:
            docs = sorted(decision.documents.items())
            ob = decision.outbox
            await conn.execute(
                write_sql,
                [k[0] for k, _ in docs],
                [k[1] for k, _ in docs],
                [d.revision for _, d in docs],
                [d.body for _, d in docs],
                [d.withdrawn for _, d in docs],
                [d.partition for _, d in docs],
                [d.offset for _, d in docs],
                [e.topic for e in ob],
                [e.doc_id for e in ob],
                [e.seq for e in ob],
                [e.version for e in ob],
                [e.kind.value for e in ob],
                [e.body for e in ob],
                [e.partition for e in ob],
                [e.offset for e in ob],
            )
        return list(decision.verdicts)

    handle.__qualname__ = f"ref_handler[{schema}]"
    return handle


async def _ensure(conn: Any, context: HandlerContext) -> None:
    await ensure_tables(conn, context.schema)


@handler_factory(ensure_tables=_ensure)
def reference(context: HandlerContext) -> HandlerFn:
    """The reference handler for ``context.schema`` (``--handler ops.reference.pg:reference``)."""
    return make_pg_handler(schema=context.schema)
