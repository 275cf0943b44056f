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


def _f(kind: str, name: str, optional: bool = True) -> dict[str, object]:
    return {"type": kind, "optional": optional, "field": name}


#: the schema Kafka Connect's JSON converter writes with each of Debezium's PostgreSQL
#: connector's events of a table of ``sink_row``'s columns (``schemas.enable=true``): the
#: envelope of ``io.debezium:debezium-connector-postgres:3.6.1.Final`` as the stack's
#: Connect writes it, fields in its order (read from a real event of ``fencectl stack up
#: --with debezium``)
CDC_SCHEMA = {"type": "struct", "fields": [
    {"type": "struct", "fields": _CDC_FIELDS, "optional": True,
     "name": "bench.public.orders.Value", "field": "before"},
    {"type": "struct", "fields": _CDC_FIELDS, "optional": True,
     "name": "bench.public.orders.Value", "field": "after"},
    {"type": "struct", "fields": [
        _f("string", "version", False), _f("string", "connector", False),
        _f("string", "name", False), _f("int64", "ts_ms", False),
        {"type": "string", "optional": True, "name": "io.debezium.data.Enum", "version": 1,
         "parameters": {"allowed": "true,first,first_in_data_collection,"
                        "last_in_data_collection,last,false,incremental"},
         "default": "false", "field": "snapshot"},
        _f("string", "db", False), _f("string", "sequence"), _f("int64", "ts_us"),
        _f("int64", "ts_ns"), _f("string", "schema", False), _f("string", "table", False),
        _f("int64", "txId"), _f("int64", "lsn"), _f("int64", "xmin"), _f("string", "origin"),
        _f("int64", "origin_lsn")],
     "optional": False, "name": "io.debezium.connector.postgresql.Source", "version": 1,
     "field": "source"},
    {"type": "struct", "fields": [
        _f("string", "id", False), _f("int64", "total_order", False),
        _f("int64", "data_collection_order", False)],
     "optional": True, "name": "event.block", "version": 1, "field": "transaction"},
    _f("string", "op", False), _f("int64", "ts_ms"), _f("int64", "ts_us"),
    _f("int64", "ts_ns")], "optional": False, "name": "bench.public.orders.Envelope",
    "version": 2}


def cdc_value(i: int, *, schemas: bool = False) -> bytes:
    """``sink_row(i)`` created, as the change event Debezium's PostgreSQL connector sends
    through Kafka Connect's JSON converter, fields in its order (``source.lsn``:
    ``1000 + i``): the envelope alone (``schemas.enable=false``, 550 bytes), or with
    ``schemas`` each record carries ``CDC_SCHEMA`` too (``schemas.enable=true``, the
    converter's default, 2.8 KB)."""
    ms, lsn = 1_700_000_000_000 + i, 1_000 + i
    source = {"version": "3.6.1.Final", "connector": "postgresql", "name": "bench",
              "ts_ms": ms, "snapshot": "false", "db": "source",
              "sequence": f'[null,"{lsn}"]', "ts_us": ms * 1000, "ts_ns": ms * 1_000_000,
              "schema": "public", "table": "orders", "txId": 5_000 + i, "lsn": lsn,
              "xmin": None, "origin": None, "origin_lsn": None}
    payload = {"before": None, "after": sink_row(i), "source": source, "transaction": None,
               "op": "c", "ts_ms": ms + 100, "ts_us": (ms + 100) * 1000 + 165,
               "ts_ns": (ms + 100) * 1_000_000 + 165_240}
    return json.dumps({"schema": CDC_SCHEMA, "payload": payload} if schemas else payload,
                      separators=(",", ":")).encode()


def cdc_schemas_value(i: int) -> bytes:
    """``cdc_value`` with the schema in each record (``schemas.enable=true``)."""
    return cdc_value(i, schemas=True)
