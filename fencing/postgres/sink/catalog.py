"""The table sink's catalog side: what to write (``SinkSpec``), the table it writes
(``Target``: schema, name, layout read from the catalog), and creating or validating it at
start (rules in ``fencing.postgres.sink.table``)."""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Any

from fencing.errors import ConfigError
from fencing.postgres.schema import quote_ident
from fencing.postgres.sink.rows import RESERVED, Column, Layout, supported

__all__ = ["Method", "SinkSpec", "Target", "create_ddl", "ensure_table", "read_layout"]

log = logging.getLogger("fenceworker.sink")


class Method(enum.Enum):
    """How the fitting rows of a batch reach the table."""

    COPY = "copy"  # binary COPY (into a staging table for upserts) + one set statement
    EXECUTEMANY = "executemany"  # one prepared INSERT (... ON CONFLICT) executed per row


@dataclass(frozen=True, slots=True)
class SinkSpec:
    """What the sink writes: ``table`` (``name`` or ``schema.name``), its ``key`` column
    (None: plain insert) and the write ``method``."""

    table: str
    key: str | None = None
    method: Method = Method.COPY

    @classmethod
    def from_settings(cls, settings: Any) -> SinkSpec:
        """From ``--handler-setting`` values ``table``, ``key``, ``method``; raises
        ``ConfigError`` naming the bad one."""
        table = str(settings.get("table", "")).strip()
        parts = table.split(".")
        if not table or len(parts) > 2 or not all(parts):
            raise ConfigError(f"--sink table={table}: expected table=NAME or table=SCHEMA.NAME")
        unknown = set(settings) - {"table", "key", "method"}
        if unknown:
            raise ConfigError(f"--handler-setting {sorted(unknown)[0]}: the table sink knows "
                              "table, key and method")
        try:
            method = Method(settings.get("method", Method.COPY.value))
        except ValueError:
            raise ConfigError(f"--handler-setting method={settings['method']}: use "
                              f"{' or '.join(m.value for m in Method)}") from None
        key = str(settings.get("key") or "").strip() or None
        return cls(table, key, method)

    @property
    def quoted(self) -> str:
        return ".".join(quote_ident(p) for p in self.table.split("."))


def create_ddl(spec: SinkSpec) -> str:
    """The table the sink creates when it is missing."""
    key = f"{quote_ident(spec.key)} text PRIMARY KEY,\n    " if spec.key else ""
    pk = "" if spec.key else ",\n    PRIMARY KEY (kafka_topic, kafka_partition, kafka_offset)"
    return (f"CREATE TABLE IF NOT EXISTS {spec.quoted} (\n    {key}payload jsonb NOT NULL,\n"
            "    kafka_topic text NOT NULL,\n    kafka_partition integer NOT NULL,\n"
            "    kafka_offset bigint NOT NULL,\n    kafka_key text,\n"
            f"    kafka_timestamp timestamptz{pk}\n)")


_COLUMNS = """
SELECT a.attname AS name, t.typname AS type_name, a.attnotnull AS not_null,
       (a.atthasdef OR a.attidentity <> '') AS has_default,
       CASE WHEN t.typname IN ('varchar', 'bpchar') AND a.atttypmod > 4
            THEN a.atttypmod - 4 END AS max_chars,
       (a.attgenerated <> '' OR a.attidentity = 'a') AS not_writable
FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""
_KEY_UNIQUE = """
SELECT EXISTS (
    SELECT 1 FROM pg_index i JOIN pg_attribute a
      ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
    WHERE i.indrelid = $1::regclass AND i.indisunique AND i.indnkeyatts = 1
      AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attname = $2)
"""
_WHERE = "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n " \
         "ON n.oid = c.relnamespace WHERE c.oid = $1::regclass"


@dataclass(frozen=True, slots=True)
class Target:
    """The resolved table: its schema and name, and the layout the sink writes."""

    schema: str
    name: str
    layout: Layout

    @property
    def quoted(self) -> str:
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"


async def read_layout(conn: Any, spec: SinkSpec) -> tuple[Target | None, list[str]]:
    """The table's target and the problems that keep the sink from writing it (empty: fits)."""
    if not await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", spec.quoted):
        return None, [f"table {spec.table} does not exist"]
    where = await conn.fetchrow(_WHERE, spec.quoted)
    problems: list[str] = []
    columns: list[Column] = []
    names: set[str] = set()
    for r in await conn.fetch(_COLUMNS, spec.quoted):
        names.add(r["name"])
        if r["not_writable"]:
            continue
        col = Column(r["name"], r["type_name"], r["not_null"], r["has_default"], r["max_chars"])
        if supported(col.type_name):
            columns.append(col)
        elif col.required:
            problems.append(f"required column {col.name} has type {col.type_name}, which the "
                            "sink cannot fill from JSON (give it a default or make it nullable)")
    if spec.key is not None:
        if spec.key not in {c.name for c in columns}:
            problems.append(f"key column {spec.key} is missing or of a type the sink cannot "
                            f"write (columns: {', '.join(sorted(names))})")
        elif spec.key in RESERVED:
            problems.append(f"key column {spec.key} is a reserved column name")
        elif not await conn.fetchval(_KEY_UNIQUE, spec.quoted, spec.key):
            problems.append(f"key column {spec.key} has no single-column unique index or "
                            "primary key (needed for ON CONFLICT)")
    if not columns:
        problems.append("no column the sink can write")
    layout = Layout(tuple(columns), spec.key)
    return Target(where["nspname"], where["relname"], layout), problems


async def ensure_table(conn: Any, spec: SinkSpec) -> Target:
    """Create the table if missing (logged at info, naming its schema and columns), then
    validate it; raises ``ConfigError`` when it does not fit (see the module Rules)."""
    created = False
    if not await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", spec.quoted):
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))",
                               f"fenceworker.sink:{spec.table}")
            if not await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", spec.quoted):
                await conn.execute(create_ddl(spec))  # another member may have won the lock
                created = True
    target, problems = await read_layout(conn, spec)
    if created and target is not None:
        log.info("table sink: created table %s.%s (%s)", quote_ident(target.schema),
                 quote_ident(target.name), ", ".join(f"{c.name} {c.type_name}"
                                                     for c in target.layout.columns))
    if problems or target is None:
        raise ConfigError(f"--sink table={spec.table}: the table does not fit: "
                          f"{'; '.join(problems)}")
    return target
