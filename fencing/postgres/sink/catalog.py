"""The table sink's catalog side: what to write (``SinkSpec``), the table it writes
(``Target``: schema, name, layout read from the catalog), and creating or validating it at
start, for JSON values or from the writer schema in the registry (rules in
``fencing.postgres.sink.table`` and ``fencing.postgres.sink.schemas``).

Long because ``SinkSpec.from_settings`` names each flag's mistake before anything starts,
and the catalog's queries sit beside the code that reads their rows."""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fencing.errors import ConfigError, Unavailable
from fencing.postgres.schema import quote_ident
from fencing.postgres.sink.keys import Format
from fencing.postgres.sink.registry import Registry
from fencing.postgres.sink.routes import check_template, is_routed, route
from fencing.postgres.sink.rows import RESERVED, Column, Layout, writable
from fencing.postgres.sink.schemas import Field, fits
from fencing.postgres.sink.values import Misfit

__all__ = ["VERSION_TYPES", "Method", "SinkSpec", "Target", "create_ddl", "ensure_in_batch",
           "ensure_table", "read_layout"]

log = logging.getLogger("fenceworker.sink")


class Method(enum.Enum):
    """How the fitting rows of a batch reach the table."""

    COPY = "copy"  # binary COPY (into a staging table for upserts) + one set statement
    EXECUTEMANY = "executemany"  # one prepared INSERT (... ON CONFLICT) executed per row


_SETTINGS = ("table", "key", "method", "key_format", "format", "registry", "evolve",
             "ddl_dsn", "envelope", "truncate", "version", "version_from")
EVOLVE = ("none", "add-columns")  # --sink-evolve
#: the types of a version column (``--sink-version-column``): ordered, compared in SQL
VERSION_TYPES = frozenset({"int2", "int4", "int8", "numeric", "timestamp", "timestamptz"})
ENVELOPES = ("debezium",)  # --sink-envelope


def _version(settings: Any, *, keys: tuple[str, ...], envelope: str | None,
             method: Method) -> tuple[str | None, str]:
    """``--sink-version-column`` and ``--sink-version-from`` checked (``ConfigError``)."""
    version = str(settings.get("version") or "").strip() or None
    version_from = str(settings.get("version_from") or "").strip() or "row"
    if version is None:
        if settings.get("version_from"):
            raise ConfigError("--sink-version-from: needs --sink-version-column COL")
        return None, "row"
    if version in keys:
        raise ConfigError(f"--sink-version-column {version}: a key column cannot be the "
                          "version")
    if not keys and envelope is None:
        raise ConfigError(f"--sink-version-column {version}: needs --sink-key (or "
                          "--sink-envelope debezium): a version guards the row of a key")
    if method is not Method.COPY:
        raise ConfigError(f"--sink-version-column {version}: the guard writes by the copy "
                          "method (method=copy, the default)")
    field_name = version_from.partition(".")[2]
    if version_from != "row" and not (version_from.startswith("source.") and field_name):
        raise ConfigError(f"--sink-version-from {version_from}: use row (the record's own "
                          "column) or source.FIELD (a change event's source block, e.g. "
                          "source.lsn)")
    if version_from != "row" and envelope is None:
        raise ConfigError(f"--sink-version-from {version_from}: needs --sink-envelope "
                          "debezium (only a change event has a source block)")
    return version, version_from


@dataclass(frozen=True, slots=True)
class SinkSpec:
    """What the sink writes: ``table`` (``name`` or ``schema.name``), its ``keys`` (the key
    columns; none: plain insert), the write ``method``, how values and Kafka keys are
    encoded (``value_format``, ``key_format``) and the schema registry's URL for the
    schema'd formats (``registry``, from ``SCHEMA_REGISTRY_URL``; never logged); whether
    a field with no column gets one (``evolve``, ``--sink-evolve add-columns``) over the
    connection of ``ddl_dsn`` (``FENCE_DDL_DSN``; a secret, never logged); whether values
    are Debezium change events (``envelope``, ``--sink-envelope debezium``: without
    ``keys`` the table's primary key is the key) and a truncate event truncates the table
    (``truncate``, ``--sink-truncate``); the column whose stored value an upsert or delete
    must not be older than (``version``, ``--sink-version-column``) and where an operation's
    version comes from (``version_from``: ``row``, the record's own field; ``source.FIELD``,
    a change event's ``source`` block, e.g. ``source.lsn``)."""

    table: str
    keys: tuple[str, ...] = ()
    method: Method = Method.COPY
    value_format: Format = Format.JSON
    key_format: Format = Format.STRING
    registry: str | None = field(default=None, repr=False)
    evolve: bool = False
    ddl_dsn: str | None = field(default=None, repr=False)
    envelope: str | None = None
    truncate: bool = False
    version: str | None = None
    version_from: str = "row"

    @classmethod
    def from_settings(cls, settings: Any) -> SinkSpec:
        """From ``--handler-setting`` values ``table``, ``key`` (``a`` or ``a,b``),
        ``method``, ``format``, ``key_format``, ``registry``; raises ``ConfigError`` naming
        the bad one."""
        table = str(settings.get("table", "")).strip()
        parts = table.split(".")
        if not table or len(parts) > 2 or not all(parts):
            raise ConfigError(f"--sink table={table}: expected table=NAME or table=SCHEMA.NAME")
        check_template(table)
        unknown = set(settings) - set(_SETTINGS)
        if unknown:
            raise ConfigError(f"--handler-setting {sorted(unknown)[0]}: the table sink knows "
                              f"{', '.join(_SETTINGS)}")
        method = _choice(Method, settings, "method", Method.COPY)
        value_format = _choice(Format, settings, "format", Format.JSON, flag="--sink-format")
        if value_format is Format.STRING:
            raise ConfigError("--sink-format string: a value is json, avro, protobuf or "
                              "json-schema")
        key_format = _choice(Format, settings, "key_format", Format.STRING,
                             flag="--sink-key-format")
        keys = tuple(k.strip() for k in str(settings.get("key") or "").split(","))
        keys = () if keys == ("",) else keys
        if not all(keys) or len(set(keys)) != len(keys):
            raise ConfigError(f"--sink-key {settings.get('key')}: expected COLUMN or "
                              "COLUMN,COLUMN,... (distinct, none empty)")
        registry = str(settings.get("registry") or "").strip() or None
        if registry is None and (value_format.registry or key_format.registry):
            fmt = value_format if value_format.registry else key_format
            raise ConfigError(f"{fmt.value} needs a schema registry: set SCHEMA_REGISTRY_URL "
                              "(e.g. eval \"$(fencectl stack env)\" for the local stack)")
        evolve = str(settings.get("evolve") or "none").strip()
        if evolve not in EVOLVE:
            raise ConfigError(f"--sink-evolve {evolve}: use {' | '.join(EVOLVE)}")
        ddl_dsn = str(settings.get("ddl_dsn") or "").strip() or None
        if evolve == "add-columns" and ddl_dsn is None:
            raise ConfigError("--sink-evolve add-columns needs FENCE_DDL_DSN: a connection "
                              "whose role may ALTER the table (its owner, or a member of the "
                              "owning role); the worker's FENCE_DSN role needs no DDL right")
        envelope = str(settings.get("envelope") or "").strip() or None
        if envelope is not None and envelope not in ENVELOPES:
            raise ConfigError(f"--sink-envelope {envelope}: use {' | '.join(ENVELOPES)}")
        truncate = str(settings.get("truncate") or "").strip().lower() in ("true", "1", "yes")
        if truncate and envelope is None:
            raise ConfigError("--sink-truncate: needs --sink-envelope debezium (only a change "
                              "event says to truncate)")
        if envelope is not None and evolve == "add-columns":
            raise ConfigError("--sink-evolve add-columns with --sink-envelope: a change "
                              "event's columns follow the source table's; create the target "
                              "table with them (or let the sink create it from the schema)")
        version, version_from = _version(settings, keys=keys, envelope=envelope,
                                         method=method)
        return cls(table, keys, method, value_format, key_format, registry,
                   evolve == "add-columns", ddl_dsn, envelope, truncate, version, version_from)

    @property
    def version_source(self) -> str | None:
        """The ``source`` field an operation's version is read from (``--sink-version-from
        source.FIELD``), None when it is the row's own column."""
        if self.version is None or not self.version_from.startswith("source."):
            return None
        return self.version_from.partition(".")[2]

    @property
    def quoted(self) -> str:
        return ".".join(quote_ident(p) for p in self.table.split("."))

    @property
    def routed(self) -> bool:
        """Whether ``table`` is a template naming a table per topic (``routes``)."""
        return is_routed(self.table)

    def for_topic(self, topic: str) -> SinkSpec:
        """This spec with the table of ``topic`` (itself when not routed)."""
        return replace(self, table=route(self.table, topic)) if self.routed else self


def _choice(kind: Any, settings: Any, name: str, default: Any, *, flag: str | None = None
            ) -> Any:
    raw = settings.get(name)
    if raw is None:
        return default
    try:
        return kind(str(raw).strip())
    except ValueError:
        shown = flag or f"--handler-setting {name}="
        sep = " " if flag else ""
        raise ConfigError(f"{shown}{sep}{raw}: use {' | '.join(m.value for m in kind)}"
                          ) from None


def create_ddl(spec: SinkSpec) -> str:
    """The table the sink creates for JSON values when it is missing."""
    keys = "".join(f"{quote_ident(k)} text NOT NULL,\n    " for k in spec.keys)
    pk = ", ".join(map(quote_ident, spec.keys)) if spec.keys else \
        "kafka_topic, kafka_partition, kafka_offset"
    return (f"CREATE TABLE IF NOT EXISTS {spec.quoted} (\n    {keys}payload jsonb NOT NULL,\n"
            "    kafka_topic text NOT NULL,\n    kafka_partition integer NOT NULL,\n"
            "    kafka_offset bigint NOT NULL,\n    kafka_key text,\n"
            f"    kafka_timestamp timestamptz,\n    PRIMARY KEY ({pk})\n)")


_COLUMNS = """
SELECT a.attname AS name, t.typname AS type_name, a.attnotnull AS not_null,
       (a.atthasdef OR a.attidentity <> '') AS has_default,
       CASE WHEN t.typname IN ('varchar', 'bpchar') AND a.atttypmod > 4
            THEN a.atttypmod - 4
            WHEN t.typname IN ('bit', 'varbit') AND a.atttypmod > 0
            THEN a.atttypmod END AS max_chars,
       CASE WHEN t.typname IN ('numeric', '_numeric') AND a.atttypmod >= 4
            THEN (a.atttypmod - 4) & 65535
            WHEN t.typname IN ('timestamp', 'timestamptz', 'time', 'timetz', '_timestamp',
                               '_timestamptz', '_time', '_timetz') AND a.atttypmod >= 0
            THEN a.atttypmod END AS scale,
       (a.attgenerated <> '' OR a.attidentity = 'a') AS not_writable,
       (SELECT array_agg(e.enumlabel::text ORDER BY e.enumsortorder) FROM pg_enum e
        WHERE e.enumtypid = CASE WHEN t.typelem <> 0 THEN t.typelem ELSE t.oid END) AS labels
FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""
# a unique index ON CONFLICT can infer: immediate, no predicate or expression, its key
# columns exactly the given set (in any order; INCLUDE columns do not count)
_KEY_UNIQUE = """
SELECT EXISTS (
    SELECT 1 FROM pg_index i
    WHERE i.indrelid = $1::regclass AND i.indisunique AND i.indimmediate
      AND i.indnkeyatts = cardinality($2::text[]) AND i.indpred IS NULL
      AND i.indexprs IS NULL
      AND (SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_attribute a
           WHERE a.attrelid = i.indrelid
             AND a.attnum = ANY((i.indkey::int2[])[0:i.indnkeyatts - 1]))
        = (SELECT array_agg(k ORDER BY k) FROM unnest($2::text[]) k))
"""
_PRIMARY_KEY = """
SELECT array_agg(a.attname::text ORDER BY k.i)
FROM pg_index x
CROSS JOIN LATERAL unnest(x.indkey::int2[]) WITH ORDINALITY AS k(attnum, i)
JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum
WHERE x.indrelid = $1::regclass AND x.indisprimary
"""
_EXISTS = "SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = " \
          "c.relnamespace WHERE c.relname = $1 AND n.nspname = coalesce($2, current_schema()))"
_WHERE = "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n " \
         "ON n.oid = c.relnamespace WHERE c.oid = $1::regclass"


@dataclass(frozen=True, slots=True)
class Target:
    """The resolved table: its schema and name, the layout the sink writes and the names
    of all its columns (``names``: also those the sink cannot write)."""

    schema: str
    name: str
    layout: Layout
    names: frozenset[str] = frozenset()

    @property
    def quoted(self) -> str:
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"


#: (table, column) of the columns the sink cannot write that a WARNING already named
_SAID_UNWRITABLE: set[tuple[str, str]] = set()


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
        col = Column(r["name"], r["type_name"], r["not_null"], r["has_default"], r["max_chars"],
                     r["scale"], None if r["labels"] is None else tuple(r["labels"]))
        if writable(col):
            columns.append(col)
        elif col.required:
            problems.append(f"required column {col.name} has type {col.type_name}, which the "
                            "sink cannot fill from JSON (give it a default or make it nullable)")
        elif (spec.table, col.name) not in _SAID_UNWRITABLE:  # once per process
            _SAID_UNWRITABLE.add((spec.table, col.name))
            log.warning("table sink: column %s of %s has type %s, which the sink cannot "
                        "write: it keeps its default, and a field named %s is ignored",
                        col.name, spec.table, col.type_name, col.name)
    names_written = {c.name for c in columns}
    if spec.envelope is not None and not spec.keys:
        primary = tuple(await conn.fetchval(_PRIMARY_KEY, spec.quoted) or ())
        if not primary:
            problems.append("a change event's table needs a primary key (or --sink-key) to "
                            "apply its updates and deletes to")
        spec = replace(spec, keys=primary)
    for key in spec.keys:
        if key not in names_written:
            problems.append(f"key column {key} is missing or of a type the sink cannot "
                            f"write (columns: {', '.join(sorted(names))})")
        elif key in RESERVED:
            problems.append(f"key column {key} is a reserved column name")
    if spec.keys and not problems and not await conn.fetchval(
            _KEY_UNIQUE, spec.quoted, list(spec.keys)):
        what = f"key column {spec.keys[0]}" if len(spec.keys) == 1 else \
            f"key columns ({', '.join(spec.keys)})"
        problems.append(f"{what} has no unique index or primary key on exactly "
                        f"{'it' if len(spec.keys) == 1 else 'them'} (needed for ON CONFLICT)")
    if spec.version is not None:
        version = next((c for c in columns if c.name == spec.version), None)
        if version is None:
            problems.append(f"version column {spec.version} (--sink-version-column) is "
                            f"missing (columns: {', '.join(sorted(names))})")
        elif version.type_name not in VERSION_TYPES:
            problems.append(f"version column {spec.version} has type {version.type_name}: use "
                            "bigint, integer, smallint, numeric, timestamp or timestamptz")
        elif version.name in spec.keys:
            problems.append(f"version column {spec.version} is a key column")
    if not columns:
        problems.append("no column the sink can write")
    layout = Layout(tuple(columns), spec.keys if not problems else ())
    return Target(where["nspname"], where["relname"], layout, frozenset(names)), problems


async def _writer_fields(spec: SinkSpec, topics: Sequence[str], *, at_start: bool = True
                         ) -> tuple[list[Field], str, list[str]] | None:
    """The latest value schema of the first topic that has one, its name, and the subjects
    asked; None with JSON values. A registry that does not answer raises ``ConfigError``
    at start (``at_start``), else ``Unavailable`` (a batch waits for it)."""
    if not spec.value_format.registry or spec.registry is None:
        return None
    registry = Registry(spec.registry)
    subjects = [f"{t}-value" for t in topics]
    try:
        await registry.subjects()
        for subject in subjects:
            got = await registry.latest_fields(spec.value_format, subject,
                                               envelope=spec.envelope is not None)
            if got is not None:
                return got[0], got[1], subjects
    except (Unavailable, Misfit) as exc:
        if not at_start and isinstance(exc, Unavailable):
            raise
        raise ConfigError(f"SCHEMA_REGISTRY_URL {registry.where}: {exc}; check the URL (the "
                          "Confluent-compatible API, e.g. .../apis/ccompat/v7 for Apicurio) "
                          "and that the registry runs") from None
    finally:
        await registry.close()
    return [], "", subjects


def schema_ddl(spec: SinkSpec, fields: Sequence[Field]) -> str:
    """The table created from a writer schema's ``fields`` (see ``schemas``): a column per
    field (key columns NOT NULL), the Kafka coordinates, the primary key."""
    cols = {f.name: f for f in fields if f.name not in RESERVED}
    lines = [f"{quote_ident(f.name)} {f.pg_type}"
             f"{' NOT NULL' if f.not_null or f.name in spec.keys else ''}"
             for f in cols.values()]
    lines += [f"{quote_ident(k)} text NOT NULL" for k in spec.keys if k not in cols]
    if spec.version is not None and spec.version not in cols:  # from the source block
        lines.append(f"{quote_ident(spec.version)} bigint")
    lines += ["kafka_topic text NOT NULL", "kafka_partition integer NOT NULL",
              "kafka_offset bigint NOT NULL", "kafka_timestamp timestamptz"]
    pk = ", ".join(map(quote_ident, spec.keys)) if spec.keys else \
        "kafka_topic, kafka_partition, kafka_offset"
    body = ",\n    ".join([*lines, f"PRIMARY KEY ({pk})"])
    return f"CREATE TABLE IF NOT EXISTS {spec.quoted} (\n    {body}\n)"


async def ensure_table(conn: Any, spec: SinkSpec, *, topics: Sequence[str] = ()) -> Target:
    """Create the table if missing (logged at info, naming its schema and columns), then
    validate it; raises ``ConfigError`` when it does not fit (see the module Rules). With a
    schema'd value format the table is created from, and checked against, the latest schema
    registered for the first of ``topics`` that has one (subject ``<topic>-value``)."""
    return (await _ensure(conn, spec, topics, in_batch=False))[0]


async def ensure_in_batch(conn: Any, spec: SinkSpec, topic: str) -> tuple[Target, bool]:
    """``ensure_table`` for ``topic``'s table on its first sight, inside the batch's own
    (fenced) transaction: the advisory lock and a created table last until that transaction
    ends, so a batch rolled back takes its table back with it. Returns the target and
    whether this transaction created it; raises ``ConfigError`` when the table does not
    fit and ``Unavailable`` when the registry does not answer."""
    return await _ensure(conn, spec, (topic,), in_batch=True)


async def _ensure(conn: Any, spec: SinkSpec, topics: Sequence[str], *, in_batch: bool
                  ) -> tuple[Target, bool]:
    writer = await _writer_fields(spec, topics, at_start=not in_batch)
    created = False
    if not await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", spec.quoted):
        if spec.envelope is not None and writer is not None and not spec.keys:
            raise ConfigError(
                f"--sink table={spec.table}: the table does not exist; to create it from the "
                "change events' schema give its primary key with --sink-key COL[,COL]")
        if spec.envelope is not None and writer is None:
            raise ConfigError(
                f"--sink table={spec.table}: the table does not exist; with "
                f"--sink-envelope {spec.envelope} and JSON values create it with the source "
                "table's columns and primary key (the events' schemas are not read at start)")
        if writer is not None and not writer[0]:
            raise ConfigError(
                f"--sink table={spec.table}: the table does not exist and no schema is "
                f"registered under {', '.join(writer[2]) or 'a subject (no --topic given)'} "
                "to create it from: create the table, or start the sink after the first "
                "record was produced with a registry serializer")
        ddl = create_ddl(spec) if writer is None else schema_ddl(spec, writer[0])
        if in_batch:
            created = await _create(conn, spec, ddl)
        else:
            async with conn.transaction():
                created = await _create(conn, spec, ddl)
    target, problems = await read_layout(conn, spec)
    if created and target is not None:
        log.info("table sink: created table %s.%s (%s)", quote_ident(target.schema),
                 quote_ident(target.name), ", ".join(f"{c.name} {c.type_name}"
                                                     for c in target.layout.columns))
    if target is not None and writer is not None and writer[0]:
        columns = {c.name: (c.kind, c.required) for c in target.layout.columns}
        problems += fits(writer[0], columns, (*spec.keys, *RESERVED), writer[1])
    if problems or target is None:
        raise ConfigError(f"--sink table={spec.table}: the table does not fit: "
                          f"{'; '.join(problems)}")
    return target, created


async def _create(conn: Any, spec: SinkSpec, ddl: str) -> bool:
    """Run ``ddl`` under the table's transaction-scoped advisory lock unless another member
    created the table first; whether this call created it."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))",
                       f"fenceworker.sink:{spec.table}")
    # pg_class read with this statement's snapshot: to_regclass may answer from a catalog
    # cache that waiting on an advisory lock (no relation lock) did not refresh
    schema, _, name = spec.table.rpartition(".")
    if await conn.fetchval(_EXISTS, name, schema or None):
        return False  # another member held the lock and created it
    await conn.execute(ddl)
    return True
