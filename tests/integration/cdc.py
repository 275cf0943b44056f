"""Test support for replication through Debezium: the source table of every type the sink
reads, its workload, the connector registered through Kafka Connect's REST API, and the
source and target read back for comparison."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from ops.stack.connectors import delete_connector, drop_slot, http, register_connector

__all__ = [
    "COLUMNS",
    "MOOD_DDL",
    "PREFIX",
    "SOURCE_DDL",
    "TARGET_DDL",
    "after_truncate",
    "clean_leftovers",
    "delete_connector",
    "drop_slot",
    "register_connector",
    "rows",
    "workload",
]

#: the name of the tests' connectors, topic prefixes and slots (``PREFIX`` + 6 hex digits)
PREFIX = "cdc"

#: (column, PostgreSQL type) of the source table: each maps to a Debezium logical type
COLUMNS = (
    ("id", "int PRIMARY KEY"),
    ("name", "text NOT NULL"),
    ("qty", "smallint"),
    ("big", "bigint"),
    ("ratio", "double precision"),
    ("price", "numeric(10,2)"),          # org.apache.kafka.connect.data.Decimal
    ("amount", "numeric"),               # io.debezium.data.VariableScaleDecimal
    ("born", "date"),                    # io.debezium.time.Date
    ("at", "time"),                      # io.debezium.time.MicroTime
    ("seen", "timestamp"),               # io.debezium.time.MicroTimestamp
    ("seen3", "timestamp(3)"),           # io.debezium.time.Timestamp
    ("seen_tz", "timestamptz"),          # io.debezium.time.ZonedTimestamp
    ("at_tz", "timetz"),                 # io.debezium.time.ZonedTime
    ("ref", "uuid"),                     # io.debezium.data.Uuid
    ("doc", "jsonb"),                    # io.debezium.data.Json
    ("flag", "boolean"),
    ("tags", "text[]"),
    ("raw", "bytea"),
    ("mood", "mood"),                    # io.debezium.data.Enum (an enum type, MOOD)
    ("bits", "bit(12)"),                 # io.debezium.data.Bits
    ("vbits", "varbit(16)"),             # io.debezium.data.Bits
    ("span", "interval"),                # io.debezium.time.MicroDuration
    ("addr", "inet"),                    # a string
    ("net", "cidr"),                     # a string
    ("page", "xml"),                     # io.debezium.data.Xml
    ("obj", "oid"),                      # an int64
)
#: the enum type of ``mood``, created in each database's public schema (``MOOD_DDL``)
MOOD = ("sad", "ok", "happy")
MOOD_DDL = ("DO $$ BEGIN CREATE TYPE public.mood AS ENUM ("
            + ", ".join(f"'{m}'" for m in MOOD)
            + "); EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$")
SOURCE_DDL = "(" + ", ".join(f"{c} {t}" for c, t in COLUMNS) + ")"
#: the target: the source's columns and the version guard's (``--sink-version-column lsn
#: --sink-version-from source.lsn``: the change's position in the source's WAL)
TARGET_DDL = SOURCE_DDL[:-1] + ", lsn bigint)"


def _row(i: int) -> str:
    return (f"({i}, 'item {i}', {i % 300}, {i * 1_000_003}, {i / 7}, {i}.25, {i}.123456789, "
            f"DATE '2024-01-01' + {i}, TIME '12:34:56.789012', "
            f"TIMESTAMP '2024-01-01 12:34:56.789012' + interval '{i} minutes', "
            f"TIMESTAMP '2024-01-01 00:00:00.123', "
            f"TIMESTAMPTZ '2024-01-01 12:34:56.789012+02' + interval '{i} seconds', "
            f"TIMETZ '12:34:56+02', gen_random_uuid(), '{{\"i\": {i}}}', {i % 2 == 0!s}, "
            f"ARRAY['a{i}', NULL], decode('00ff{i % 256:02x}', 'hex'), '{MOOD[i % 3]}', "
            f"{i * 37 % 4096}::bit(12), substring(B'1011001110001111' from 1 for {i % 16 + 1}), "
            f"interval '{i} hours {i} minutes 1.5 seconds', '10.{i % 256}.0.{i % 7}/24', "
            f"'10.{i % 256}.0.0/16', '<item n=\"{i}\"/>', {i * 100_003})")


def after_truncate(table: str) -> str:
    """The rows written into the source after its truncate."""
    return f"INSERT INTO {table} VALUES " + ", ".join(_row(i) for i in range(600, 620))


def workload(table: str, *, rows_n: int = 60) -> list[str]:
    """Statements run on the source, in order: inserts, updates of every kind of column, a
    delete, a primary-key change and inserts after it."""
    stmts = [f"INSERT INTO {table} VALUES " + ", ".join(_row(i) for i in range(1, rows_n + 1))]
    stmts += [
        f"UPDATE {table} SET name = name || ' v2', price = price + 1, doc = doc || "
        "'{\"v\": 2}' WHERE id % 3 = 0",
        f"UPDATE {table} SET seen = seen + interval '1 day', tags = ARRAY['x'], mood = 'happy', "
        "bits = ~bits, vbits = B'0', span = -span, addr = '::1', net = '2001:db8::/32' "
        "WHERE id % 5 = 0",
        f"DELETE FROM {table} WHERE id % 7 = 0",
        f"UPDATE {table} SET id = id + 1000 WHERE id IN (1, 2)",   # primary-key changes
        f"INSERT INTO {table} VALUES " + ", ".join(_row(i) for i in range(500, 510)),
        f"UPDATE {table} SET amount = NULL, born = NULL WHERE id = 500",
    ]
    return stmts


async def rows(dsn: str, table: str) -> list[tuple[Any, ...]]:
    """Every row of ``table`` in ``COLUMNS`` order, by id."""
    conn = await asyncpg.connect(dsn)
    try:
        cols = ", ".join(c for c, _ in COLUMNS)
        return [tuple(r) for r in await conn.fetch(f"SELECT {cols} FROM {table} ORDER BY id")]
    finally:
        await conn.close()


def clean_leftovers(connect_url: str, source_dsn: str) -> None:
    """The tests' connectors and slots an interrupted run left behind: deleted, dropped."""
    for name in http("GET", f"{connect_url}/connectors") or []:
        if name.startswith(PREFIX):
            delete_connector(connect_url, name)

    async def slots() -> list[str]:
        conn = await asyncpg.connect(source_dsn)
        try:
            return [r["slot_name"] for r in await conn.fetch(
                "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE $1",
                PREFIX + "%")]
        finally:
            await conn.close()

    for slot in asyncio.run(slots()):
        asyncio.run(drop_slot(source_dsn, slot))
