"""The change events of the CDC benchmark (``ops.bench.cdc``): ``ops.bench.sink.sink_row``'s
rows as Debezium's PostgreSQL connector sends them through Kafka Connect's JSON converter
(pure, no I/O)."""

from __future__ import annotations

import json

from ops.bench.sink import sink_row

__all__ = ["CDC_SCHEMA", "cdc_schemas_value", "cdc_value"]

_CDC_FIELDS = [{"type": "string", "optional": False, "field": "id"},
               {"type": "int64", "optional": False, "field": "amount"},
               {"type": "string", "optional": False, "field": "status"},
               {"type": "string", "optional": False, "field": "note"}]
#: the schema Kafka Connect's JSON converter writes with each of Debezium's PostgreSQL
#: connector's events of a table of ``sink_row``'s columns (``schemas.enable=true``)
CDC_SCHEMA = {"type": "struct", "optional": False, "name": "bench.public.orders.Envelope",
              "fields": [
    {"type": "struct", "optional": True, "name": "bench.public.orders.Value",
     "field": "before", "fields": _CDC_FIELDS},
    {"type": "struct", "optional": True, "name": "bench.public.orders.Value",
     "field": "after", "fields": _CDC_FIELDS},
    {"type": "struct", "optional": False, "name": "io.debezium.connector.postgresql.Source",
     "field": "source", "fields": [
        {"type": "string", "optional": False, "field": f}
        for f in ("version", "connector", "name", "db", "schema", "table")] + [
        {"type": "int64", "optional": False, "field": "ts_ms"},
        {"type": "string", "optional": True, "name": "io.debezium.data.Enum", "version": 1,
         "parameters": {"allowed": "true,first,first_in_data_collection,"
                        "last_in_data_collection,last,false,incremental"},
         "default": "false", "field": "snapshot"},
        {"type": "int64", "optional": True, "field": "txId"},
        {"type": "int64", "optional": True, "field": "lsn"},
        {"type": "int64", "optional": True, "field": "xmin"}]},
    {"type": "string", "optional": False, "field": "op"},
    {"type": "int64", "optional": True, "field": "ts_ms"}]}


def cdc_value(i: int, *, schemas: bool = False) -> bytes:
    """``sink_row(i)`` created, as the change event Debezium's PostgreSQL connector sends
    through Kafka Connect's JSON converter (``source.lsn``: ``1000 + i``): the envelope
    alone (``schemas.enable=false``, 470 bytes), or with ``schemas`` each record carries
    ``CDC_SCHEMA`` too (``schemas.enable=true``, the converter's default, 2 KB)."""
    source = {"version": "3.6.1.Final", "connector": "postgresql", "name": "bench",
              "db": "source", "schema": "public", "table": "orders",
              "ts_ms": 1_700_000_000_000 + i, "snapshot": "false", "txId": 5_000 + i,
              "lsn": 1_000 + i, "xmin": None}
    payload = {"before": None, "after": sink_row(i), "source": source, "op": "c",
               "ts_ms": 1_700_000_000_001 + i}
    return json.dumps({"schema": CDC_SCHEMA, "payload": payload} if schemas else payload,
                      separators=(",", ":")).encode()


def cdc_schemas_value(i: int) -> bytes:
    """``cdc_value`` with the schema in each record (``schemas.enable=true``)."""
    return cdc_value(i, schemas=True)
