"""The table sink's churn scenario as data: a keyed stream of accounts (a ``bigint`` key,
upserts, tombstones, records PostgreSQL refuses, records that do not decode), in JSON with a
decimal-text Kafka key or in Avro with an Avro ``long`` key, and its fold: what the table
must hold and which records the quarantine must hold, whatever the churn."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from ops.reference.generate import GeneratedRecord
from tests.integration.registry_support import avro
from tests.integration.workers import fresh_schema

__all__ = ["ACCOUNT_AVRO", "ACCOUNT_TABLE", "Script", "account_schema", "script"]

#: the table of the issue's user: a bigint key, a CHECK, jsonb, a timestamptz
ACCOUNT_TABLE = ("(id bigint PRIMARY KEY, name text NOT NULL, amount numeric CHECK "
                 "(amount >= 0), tags jsonb, updated timestamptz, kafka_partition int, "
                 "kafka_offset bigint)")
ACCOUNT_AVRO = json.dumps({"type": "record", "name": "Account", "namespace": "churn", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12,
                                "scale": 2}},
    {"name": "tags", "type": {"type": "map", "values": "long"}},
    {"name": "updated", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}],
     "default": None}]})
_T0 = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)


@dataclass
class Script:
    """The records in production order, the table they fold to (id -> name, amount, tags,
    updated) and the (partition, offset) of every record that must be quarantined."""

    records: list[GeneratedRecord] = field(default_factory=list)
    table: dict[int, tuple[Any, ...]] = field(default_factory=dict)
    unfit: set[tuple[int, int]] = field(default_factory=set)


def _row(i: int, k: int) -> dict[str, Any]:
    return {"id": k, "name": f"n{i}", "amount": decimal.Decimal(f"{i % 5000}.{i % 100:02d}"),
            "tags": {"i": i}, "updated": _T0 + dt.timedelta(milliseconds=i)}


def script(topic: str, *, count: int, partitions: int, keys: int, fmt: str,
           registry_url: str = "") -> Script:
    """Record i has key k = 1 + (i * 7919) % keys, always in partition k % partitions; every
    23rd is a tombstone, every 31st refused by the CHECK (amount < 0), every 37th does not
    fit (JSON: no name; Avro: an unknown schema id or bytes that do not decode)."""
    out = Script()
    offsets = [0] * partitions
    value: Callable[[dict[str, Any]], bytes]
    if fmt == "avro":
        encode = avro(registry_url, topic, ACCOUNT_AVRO)
        encode_key = avro(registry_url, topic, '"long"', key=True)
        value = encode
        key_of: Callable[[int], bytes] = encode_key
    else:
        def value(row: dict[str, Any]) -> bytes:
            return json.dumps({**row, "amount": str(row["amount"]),
                               "updated": row["updated"].isoformat()}).encode()

        def key_of(k: int) -> bytes:
            return str(k).encode()
    for i in range(count):
        k = 1 + (i * 7919) % keys
        p = k % partitions
        raw: bytes | None
        fits = True
        if i % 23 == 5:
            raw = None
        elif i % 31 == 7:
            raw, fits = value({**_row(i, k), "amount": decimal.Decimal("-1.00")}), False
        elif i % 37 == 11:
            fits = False
            if fmt == "avro":
                good = value(_row(i, k))
                raw = (good[:1] + (987_654).to_bytes(4, "big") + good[5:] if i % 2
                       else good[:8])
            else:
                raw = json.dumps({"id": k, "amount": 1}).encode()
        else:
            raw = value(_row(i, k))
        out.records.append(GeneratedRecord(topic, p, key_of(k), raw))  # type: ignore[arg-type]
        if not fits:
            out.unfit.add((p, offsets[p]))
        elif raw is None:
            out.table.pop(k, None)
        else:
            r = _row(i, k)
            out.table[k] = (r["name"], r["amount"], r["tags"], r["updated"])
        offsets[p] += 1
    return out


async def account_schema(dsn: str) -> str:
    """A fresh fence schema holding the churn scenarios' ``acct`` table (``ACCOUNT_TABLE``)."""
    schema = await fresh_schema(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'CREATE TABLE "{schema}".acct {ACCOUNT_TABLE}')
    finally:
        await conn.close()
    return schema
