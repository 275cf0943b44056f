"""The table sink's schema'd formats against the real schema registry and PostgreSQL, records
produced by confluent-kafka's ``AvroSerializer``, ``ProtobufSerializer`` and
``JSONSerializer``: tables created from the writer schema, logical types mapped exactly,
unknown schema ids and undecodable bytes quarantined, a registry that does not answer a
transient failure that quarantines nothing."""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import json
import uuid
from typing import Any

import asyncpg
import pytest
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2

from fencing.errors import ConfigError, HandlerFailed
from fencing.postgres.sink import SinkSpec, ensure_table, make_table_sink
from fencing.postgres.sink.keys import Format
from fencing.postgres.sink.registry import Registry
from fencing.postgres.store import PgFenceStore
from fencing.store import BatchCall
from fencing.types import ClaimRequest, SourceRecord, TopicPartition
from ops.stack.config import ServiceSettings
from tests.integration.registry_support import (
    avro,
    client,
    json_schema,
    protobuf,
    protobuf_class,
)
from tests.integration.sink_support import (
    apply,
    fetch,
)

pytestmark = pytest.mark.integration

F = descriptor_pb2.FieldDescriptorProto
ORDER = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "name", "type": "string"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 14,
                                "scale": 2}},
    {"name": "tags", "type": {"type": "map", "values": "string"}},
    {"name": "updated", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}],
     "default": None},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
    {"name": "nums", "type": {"type": "array", "items": "long"}},
    {"name": "ship", "type": {"type": "record", "name": "Ship", "fields": [
        {"name": "city", "type": "string"},
        {"name": "fee", "type": {"type": "bytes", "logicalType": "decimal", "precision": 6,
                                 "scale": 3}}]}},
]}


def order(i: int, **over: Any) -> dict[str, Any]:
    return {"id": i, "name": f"n{i}", "amount": decimal.Decimal(f"{i}1234567890.{i:02d}"),
            "tags": {"k": str(i)}, "updated": dt.datetime(2024, 5, 1, 10, 0, 0, 123456 + i,
                                                         tzinfo=dt.UTC),
            "day": dt.date(2024, 1, 1 + i), "ref": uuid.UUID(int=i), "status": "PAID",
            "nums": [i, -i], "ship": {"city": "Oslo", "fee": decimal.Decimal("1.005")},
            **over}


def rec(tp: TopicPartition, offset: int, value: bytes | None, key: bytes | None = None
        ) -> SourceRecord:
    return SourceRecord(tp.topic, tp.partition, offset, key, value, timestamp_ms=1_700_000_000_000)


async def columns(dsn: str, table: str) -> dict[str, str]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT a.attname, format_type(a.atttypid, a.atttypmod) AS t, "
                                "a.attnotnull FROM pg_attribute a WHERE a.attrelid = "
                                "$1::regclass AND a.attnum > 0 ORDER BY a.attnum", table)
    finally:
        await conn.close()
    return {r["attname"]: r["t"] + (" not null" if r["attnotnull"] else "") for r in rows}


async def test_avro_creates_the_table_from_the_schema_and_maps_logical_types_exactly(
        services: ServiceSettings, pg_dsn: str, schema: str) -> None:
    url, topic = services.schema_registry_url, f"avro_{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 0)
    value, key = avro(url, topic, json.dumps(ORDER)), avro(url, topic, '"long"', key=True)
    first = value(order(1))  # registers the schema: the table is created from it
    spec = SinkSpec(f"{schema}.orders", keys=("id",), value_format=Format.AVRO,
                    key_format=Format.AVRO, registry=url)
    records = [rec(tp, 0, first, key(1)), rec(tp, 1, value(order(2)), key(2)),
               rec(tp, 2, value(order(3, updated=None)), key(3)), rec(tp, 3, None, key(2)),
               rec(tp, 4, first[:1] + (987_654).to_bytes(4, "big") + first[5:], key(4)),
               rec(tp, 5, first[:7], key(5)), rec(tp, 6, b"\x07" + first[1:], key(6)),
               rec(tp, 7, value(order(1, name="again")), key(1))]
    quarantined = await apply(pg_dsn, schema, spec, records, topics=[topic], tp=tp)
    assert await columns(pg_dsn, f"{schema}.orders") == {
        "id": "bigint not null", "name": "text not null", "amount": "numeric(14,2) not null",
        "tags": "jsonb not null", "updated": "timestamp with time zone",
        "day": "date not null", "ref": "uuid not null", "status": "text not null",
        "nums": "bigint[] not null", "ship": "jsonb not null",
        "kafka_topic": "text not null", "kafka_partition": "integer not null",
        "kafka_offset": "bigint not null", "kafka_timestamp": "timestamp with time zone"}
    rows = await fetch(pg_dsn, f'SELECT id, name, amount, tags::text, updated, day, ref, '
                               f'status, nums, ship::text FROM "{schema}".orders ORDER BY id')
    one, three = order(1, name="again"), order(3, updated=None)
    assert rows == [
        (1, "again", one["amount"], '{"k": "1"}', one["updated"], one["day"], one["ref"],
         "PAID", [1, -1], '{"fee": "1.005", "city": "Oslo"}'),
        (3, "n3", three["amount"], '{"k": "3"}', None, three["day"], three["ref"], "PAID",
         [3, -3], '{"fee": "1.005", "city": "Oslo"}')]
    assert rows[0][2] == decimal.Decimal("11234567890.01")  # no float rounding on the way
    assert sorted(quarantined) == [4, 5, 6]
    assert "schema id 987654: the schema registry has no such schema" in quarantined[4]
    assert "does not decode as Avro with schema id" in quarantined[5]
    assert "not in the schema registry's wire format" in quarantined[6]


async def test_the_sinks_avro_reader_decodes_as_confluent_kafkas_deserializer(
        services: ServiceSettings) -> None:
    url, topic = services.schema_registry_url, f"avro_{uuid.uuid4().hex[:8]}"
    wire = avro(url, topic, json.dumps(ORDER))(order(4, updated=None))
    registry = Registry(url)
    try:
        read = await registry.reader(Format.AVRO, int.from_bytes(wire[1:5], "big"))
        ours = read(wire[5:])
    finally:
        await registry.close()
    theirs = AvroDeserializer(client(url))(
        wire, SerializationContext(topic, MessageField.VALUE))
    assert ours == theirs == order(4, updated=None)


async def test_protobuf_fields_map_to_a_created_table(
        services: ServiceSettings, pg_dsn: str, schema: str) -> None:
    url, topic = services.schema_registry_url, f"pb_{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 0)
    cls = protobuf_class("Order", [
        ("id", 1, F.TYPE_INT64, ""), ("name", 2, F.TYPE_STRING, ""),
        ("updated", 3, F.TYPE_MESSAGE, ".google.protobuf.Timestamp"),
        ("rep_tags", 4, F.TYPE_STRING, ""), ("status", 5, F.TYPE_ENUM, "Status"),
        ("opt_qty", 6, F.TYPE_INT32, ""), ("ship", 7, F.TYPE_MESSAGE, "Ship"),
        ("big", 8, F.TYPE_UINT64, "")],
        enums={"Status": ["NEW", "PAID"]}, nested={"Ship": [("city", 1, F.TYPE_STRING)]})
    ser = protobuf(url, topic, cls)

    def msg(i: int, **fields: Any) -> bytes:
        m = cls(id=i, name=f"n{i}", rep_tags=["a", str(i)], status=1, big=2**64 - i, **fields)
        m.updated.FromMicroseconds(1_714_557_600_123_456 + i)
        m.ship.city = "Oslo"
        return ser(m)

    first = msg(1, opt_qty=5)
    spec = SinkSpec(f"{schema}.pb", keys=("id",), value_format=Format.PROTOBUF, registry=url)
    quarantined = await apply(pg_dsn, schema, spec, [
        rec(tp, 0, first), rec(tp, 1, msg(2)), rec(tp, 2, first[:-3] + b"\xff\xff\xff")],
        topics=[topic], tp=tp)
    got = await columns(pg_dsn, f"{schema}.pb")
    assert {k: got[k] for k in ("id", "name", "updated", "rep_tags", "status", "opt_qty",
                                "ship", "big")} == {
        "id": "bigint not null", "name": "text not null", "updated": "timestamp with time zone",
        "rep_tags": "text[]", "status": "text not null", "opt_qty": "integer",
        "ship": "jsonb", "big": "numeric(20,0) not null"}
    at = dt.datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=dt.UTC)
    assert await fetch(pg_dsn, f'SELECT id, name, updated, rep_tags, status, opt_qty, '
                               f'ship::text, big FROM "{schema}".pb ORDER BY id') == [
        (1, "n1", at + dt.timedelta(microseconds=1), ["a", "1"], "PAID", 5,
         '{"city": "Oslo"}', decimal.Decimal(2**64 - 1)),
        (2, "n2", at + dt.timedelta(microseconds=2), ["a", "2"], "PAID", None,
         '{"city": "Oslo"}', decimal.Decimal(2**64 - 2))]
    assert list(quarantined) == [2] and "does not decode as Protobuf" in quarantined[2]


JSON_SCHEMA = json.dumps({
    "type": "object", "title": "Payment", "required": ["id", "amount"],
    "properties": {"id": {"type": "integer"}, "amount": {"type": "number"},
                   "at": {"type": "string", "format": "date-time"},
                   "note": {"type": ["string", "null"]}}})


async def test_json_schema_records_are_validated_and_numbers_kept_exact(
        services: ServiceSettings, pg_dsn: str, schema: str) -> None:
    url, topic = services.schema_registry_url, f"js_{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 0)
    ser = json_schema(url, topic, JSON_SCHEMA)
    good = ser({"id": 1, "amount": 0.1, "at": "2024-05-01T10:00:00.5+02:00", "note": None})
    forged = good[:5] + b'{"id": "x", "amount": 1}'  # valid JSON, invalid for its schema
    spec = SinkSpec(f"{schema}.pay", keys=("id",), value_format=Format.JSON_SCHEMA,
                    registry=url)
    quarantined = await apply(pg_dsn, schema, spec, [
        rec(tp, 0, good), rec(tp, 1, forged),
        rec(tp, 2, good[:5] + b'{"id": 2, "amount": 12345678901234567.123456789}')],
        topics=[topic], tp=tp)
    assert await columns(pg_dsn, f"{schema}.pay") == {
        "id": "bigint not null", "amount": "numeric not null",
        "at": "timestamp with time zone", "note": "text", "kafka_topic": "text not null",
        "kafka_partition": "integer not null", "kafka_offset": "bigint not null",
        "kafka_timestamp": "timestamp with time zone"}
    assert await fetch(pg_dsn, f'SELECT id, amount::text, at FROM "{schema}".pay '
                               "ORDER BY id") == [
        (1, "0.1", dt.datetime(2024, 5, 1, 8, 0, 0, 500000, tzinfo=dt.UTC)),
        (2, "12345678901234567.123456789", None)]
    assert list(quarantined) == [1] and "is not of type 'integer'" in quarantined[1]


async def test_a_present_table_is_checked_against_the_writer_schema_at_start(
        services: ServiceSettings, pg_dsn: str, schema: str) -> None:
    url, topic = services.schema_registry_url, f"avro_{uuid.uuid4().hex[:8]}"
    avro(url, topic, json.dumps(ORDER))(order(1))
    spec = SinkSpec(f"{schema}.t", keys=("id",), value_format=Format.AVRO, registry=url)
    await fetch(pg_dsn, f'CREATE TABLE "{schema}".t (id bigint PRIMARY KEY, name int, '
                        "extra text NOT NULL, amount numeric)")
    conn = await asyncpg.connect(pg_dsn)
    try:
        with pytest.raises(ConfigError) as info:
            await ensure_table(conn, spec, topics=[topic])
        message = str(info.value)
        assert "column name (int4) cannot hold field name (text in Avro schema id" in message
        assert "required column extra is no field of Avro schema id" in message
        assert "amount" not in message  # numeric(14,2) into numeric fits
        with pytest.raises(ConfigError, match=r"no schema is registered under nope-value"):
            await ensure_table(conn, SinkSpec(f"{schema}.missing", value_format=Format.AVRO,
                                              registry=url), topics=["nope"])
        with pytest.raises(ConfigError, match=r"SCHEMA_REGISTRY_URL http://127\.0\.0\.1:1/x: "):
            await ensure_table(conn, SinkSpec(f"{schema}.t", value_format=Format.AVRO,
                                              registry="http://u:secret@127.0.0.1:1/x"),
                               topics=[topic])
    finally:
        await conn.close()


async def test_schema_version_two_with_an_added_optional_field_mid_batch(
        services: ServiceSettings, pg_dsn: str, schema: str) -> None:
    url, topic = services.schema_registry_url, f"avro_{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 0)
    v1 = {"type": "record", "name": "Acct", "fields": [{"name": "id", "type": "long"},
                                                      {"name": "name", "type": "string"}]}
    v2 = {**v1, "fields": [*v1["fields"], {"name": "email", "type": ["null", "string"],
                                           "default": None}]}
    one, two = avro(url, topic, json.dumps(v1)), avro(url, topic, json.dumps(v2))
    first = one({"id": 1, "name": "a"})
    spec = SinkSpec(f"{schema}.acct", keys=("id",), value_format=Format.AVRO, registry=url)
    conn = await asyncpg.connect(pg_dsn)
    try:  # created from version 1, then the new field gets its column
        await ensure_table(conn, spec, topics=[topic])
        await conn.execute(f'ALTER TABLE "{schema}".acct ADD COLUMN email text')
    finally:
        await conn.close()
    records = [rec(tp, 0, first), rec(tp, 1, two({"id": 2, "name": "b", "email": "b@x"})),
               rec(tp, 2, one({"id": 3, "name": "c"})), rec(tp, 3, two({"id": 1, "name": "a2",
                                                                          "email": None}))]
    assert await apply(pg_dsn, schema, spec, records, topics=[topic], tp=tp) == {}
    assert await fetch(pg_dsn, f'SELECT id, name, email FROM "{schema}".acct ORDER BY id') == [
        (1, "a2", None), (2, "b", "b@x"), (3, "c", None)]


async def test_a_registry_that_does_not_answer_fails_the_batch_as_unavailable(
        pg_dsn: str, schema: str) -> None:
    """Nothing is quarantined and the frontier stays: the worker retries the batch with
    backoff until the registry answers (``consumer.failure_run``)."""
    await fetch(pg_dsn, f'CREATE TABLE "{schema}".u (id bigint PRIMARY KEY)')
    spec = SinkSpec(f"{schema}.u", keys=("id",), value_format=Format.AVRO,
                    registry="http://127.0.0.1:1/apis/ccompat/v7")
    tp = TopicPartition("u", 0)
    store = await PgFenceStore.connect(pg_dsn, group_id="g", schema=schema, pool_max=2)
    try:
        token = (await store.claim([ClaimRequest(tp, 0)], lifetime="L"))[tp]
        with pytest.raises(HandlerFailed) as info:
            await store.process(BatchCall(tp, [rec(tp, 0, b"\x00\x00\x00\x00\x07abc")],
                                          make_table_sink(spec)), token)
        assert info.value.unavailable and info.value.transient
        assert "schema registry http://127.0.0.1:1/apis/ccompat/v7: schema id 7" in str(
            info.value)
        assert (await store.observe([tp]))[tp] == token
    finally:
        await store.close()
    assert await fetch(pg_dsn, f'SELECT count(*) FROM "{schema}".quarantine') == [(0,)]


async def test_batches_of_two_partitions_decoding_at_once_keep_their_own_keys(
        services: ServiceSettings, pg_dsn: str, schema: str) -> None:
    """Two partitions' batches of Avro-keyed tombstones go through one sink at once, each
    waiting for the registry on a key schema it has not seen after one it has: each deletes
    its own keys (the first one's decoded key must survive the second batch starting)."""
    url, topic = services.schema_registry_url, f"avro_{uuid.uuid4().hex[:8]}"
    await fetch(pg_dsn, f'CREATE TABLE "{schema}".k (id bigint PRIMARY KEY)')
    await fetch(pg_dsn, f'INSERT INTO "{schema}".k SELECT generate_series(1, 8)')
    as_long = avro(url, topic, '"long"', key=True)
    as_int = avro(url, f"{topic}_i", '"int"', key=True)
    as_string = avro(url, f"{topic}_s", '"string"', key=True)
    spec = SinkSpec(f"{schema}.k", keys=("id",), value_format=Format.AVRO,
                    key_format=Format.AVRO, registry=url)
    sink = make_table_sink(spec)
    a, b = TopicPartition(topic, 0), TopicPartition(topic, 1)
    store = await PgFenceStore.connect(pg_dsn, group_id="g", schema=schema, pool_max=4)
    try:
        tokens = await store.claim([ClaimRequest(a, 0), ClaimRequest(b, 0)], lifetime="L")
        warm = await store.process(BatchCall(a, [rec(a, 0, None, as_long(7))], sink), tokens[a])
        await asyncio.gather(
            store.process(BatchCall(a, [rec(a, 1, None, as_long(1)),  # its schema known
                                    rec(a, 2, None, as_int(3))], sink), warm),  # asked for
            store.process(BatchCall(b, [rec(b, 0, None, as_string("2")),
                                         rec(b, 1, None, as_string("4"))], sink), tokens[b]))
    finally:
        await store.close()
    assert await fetch(pg_dsn, f'SELECT count(*) FROM "{schema}".quarantine') == [(0,)]
    assert await fetch(pg_dsn, f'SELECT id FROM "{schema}".k ORDER BY id') == [
        (5,), (6,), (8,)]


async def test_a_schema_id_in_a_header_and_other_headers_beside_the_wire_format(
        services: ServiceSettings, pg_dsn: str, schema: str) -> None:
    """confluent-kafka's header form (the id in ``__value_schema_id``, the payload bare) and
    an ordinary header (``traceparent``) beside the 5-byte wire header both decode."""
    url, topic = services.schema_registry_url, f"avro_{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 0)
    acct = {"type": "record", "name": "A", "fields": [{"name": "id", "type": "long"},
                                                      {"name": "name", "type": "string"}]}
    encode = avro(url, topic, json.dumps(acct))
    one, two = encode({"id": 1, "name": "a"}), encode({"id": 2, "name": "b"})
    spec = SinkSpec(f"{schema}.h", keys=("id",), value_format=Format.AVRO, registry=url)
    records = [SourceRecord(topic, 0, 0, None, one, (("traceparent", b"00-x"),)),
               SourceRecord(topic, 0, 1, None, two[5:], (("__value_schema_id", two[:5]),))]
    assert await apply(pg_dsn, schema, spec, records, topics=[topic], tp=tp) == {}
    assert await fetch(pg_dsn, f'SELECT id, name FROM "{schema}".h ORDER BY id') == [
        (1, "a"), (2, "b")]
