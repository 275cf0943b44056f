"""Debezium change events into a table (``--sink-envelope debezium``) against real PostgreSQL,
through the fence store: creates, snapshot reads and updates upsert the after image, a
delete removes its key (from the before image or the Kafka key), the tombstone after it
changes nothing, a truncate truncates only when asked, a primary-key change ends with one
row under the new key, and every logical type lands in its column exactly."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import decimal
import json
import uuid
from typing import Any

import asyncpg
import pytest

from fencing.errors import ConfigError
from fencing.postgres.sink import SinkSpec, ensure_table
from fencing.postgres.sink.keys import Format
from fencing.types import SourceRecord, TopicPartition
from tests.integration.sink_support import apply, fetch, write_path  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("write_path")]

TP = TopicPartition("dbserver.public.items", 0)
D = decimal.Decimal

FIELDS = [
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "string", "optional": True, "field": "name"},
    {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "field": "born"},
    {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
     "parameters": {"scale": "2", "connect.decimal.precision": "10"}, "field": "price"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp",
     "field": "seen"},
    {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp",
     "field": "seen_tz"},
    {"type": "string", "optional": True, "name": "io.debezium.data.Uuid", "field": "ref"},
    {"type": "string", "optional": True, "name": "io.debezium.data.Json", "field": "doc"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTime", "field": "at"},
    {"type": "array", "optional": True, "items": {"type": "string", "optional": True},
     "field": "tags"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroDuration",
     "field": "span"},
    {"type": "string", "optional": True, "field": "addr"},
    {"type": "string", "optional": True, "field": "net"},
    {"type": "string", "optional": True, "name": "io.debezium.data.Xml", "field": "page"},
    {"type": "int64", "optional": True, "field": "obj"},
]
SCHEMA = {"type": "struct", "name": "dbserver.public.items.Envelope", "fields": [
    {"type": "struct", "optional": True, "field": "before", "fields": FIELDS},
    {"type": "struct", "optional": True, "field": "after", "fields": FIELDS},
    {"type": "struct", "optional": False, "field": "source", "fields": []},
    {"type": "string", "optional": False, "field": "op"}]}
KEY_SCHEMA = {"type": "struct", "fields": [{"type": "int32", "optional": False, "field": "id"}]}
DDL = ("(id int PRIMARY KEY, name text NOT NULL, born date, price numeric(10,2), "
       "seen timestamp, seen_tz timestamptz, ref uuid, doc jsonb, at time, tags text[], "
       "span interval, addr inet, net cidr, page xml, obj oid)")


def row(id_: int, name: str, **more: Any) -> dict[str, Any]:
    return {"id": id_, "name": name, "born": None, "price": None, "seen": None, "seen_tz": None,
            "ref": None, "doc": None, "at": None, "tags": None, "span": None, "addr": None,
            "net": None, "page": None, "obj": None, **more}


def event(offset: int, op: str | None, *, before: Any = None, after: Any = None,
          key: int | None = None, schemas: bool = True, lsn: int | None = None,
          tp: TopicPartition = TP) -> SourceRecord:
    """A record as Kafka Connect's JSON converter writes Debezium's event (and its key);
    its ``source.lsn`` 100 + ``offset`` unless given."""
    id_ = key if key is not None else (after or before or {}).get("id")
    if op is None:
        value = None
    else:
        payload = {"before": before, "after": after, "op": op, "ts_ms": 1,
                   "source": {"lsn": 100 + offset if lsn is None else lsn, "table": "items"}}
        value = json.dumps({"schema": SCHEMA, "payload": payload} if schemas else payload)
    key_bytes = None if id_ is None else json.dumps(
        {"schema": KEY_SCHEMA, "payload": {"id": id_}} if schemas else {"id": id_})
    return SourceRecord(tp.topic, tp.partition, offset,
                        None if key_bytes is None else key_bytes.encode(),
                        None if value is None else value.encode(),
                        timestamp_ms=1_700_000_000_000 + offset)


def spec(schema: str, **more: Any) -> SinkSpec:
    return SinkSpec(f"{schema}.items", envelope="debezium", key_format=Format.JSON, **more)


async def _table(dsn: str, schema: str) -> None:
    await fetch(dsn, f'CREATE TABLE "{schema}".items {DDL}')


async def test_changes_apply_in_order_and_deletes_take_their_key(pg_dsn: str,
                                                                 schema: str) -> None:
    await _table(pg_dsn, schema)
    quarantined = await apply(pg_dsn, schema, spec(schema), [
        event(0, "r", after=row(1, "snap")),                       # snapshot read
        event(1, "c", after=row(2, "two")),
        event(2, "u", before=row(1, "snap"), after=row(1, "one")),
        event(3, "d", before=row(2, "two")),                       # delete by before's key
        event(4, None, key=2),                                     # its tombstone: nothing
        event(5, "c", after=row(3, "three")),
        event(6, "d", key=3),                                      # no before: the Kafka key
        event(7, None, key=3),
        event(8, "c", after=row(4, "four"), schemas=False),        # JSON without schemas
        event(9, "t"),                                             # not asked to truncate
        event(10, "m"),
    ], tp=TP)
    assert await fetch(pg_dsn, f'SELECT id, name FROM "{schema}".items ORDER BY id') == [
        (1, "one"), (4, "four")]
    assert quarantined == {
        9: "table sink: a truncate of the source table (op t): applied only with "
           "--sink-truncate",
        10: "table sink: a logical decoding message (op m) is not a row change"}


async def test_a_primary_key_change_ends_with_one_row_under_the_new_key(pg_dsn: str,
                                                                         schema: str) -> None:
    """Debezium writes a key change as a delete of the old key (``__debezium.newkey``), its
    tombstone, and a create of the new key, which may land on another partition and be
    applied first: either order ends with the one row under the new key."""
    await _table(pg_dsn, schema)
    other = TopicPartition(TP.topic, 1)
    create_new = event(0, "c", after=row(30, "moved"))
    create_new = SourceRecord(other.topic, other.partition, 0, create_new.key,
                              create_new.value, timestamp_ms=create_new.timestamp_ms)
    await apply(pg_dsn, schema, spec(schema), [event(0, "c", after=row(3, "here"))], tp=TP)
    await apply(pg_dsn, schema, spec(schema), [create_new], tp=other)   # the new key first
    await apply(pg_dsn, schema, spec(schema),
                [event(1, "d", before=row(3, "here")), event(2, None, key=3)], tp=TP)
    assert await fetch(pg_dsn, f'SELECT id, name FROM "{schema}".items') == [(30, "moved")]


async def test_a_truncate_when_asked_in_order_with_the_batch(pg_dsn: str, schema: str) -> None:
    await _table(pg_dsn, schema)
    quarantined = await apply(pg_dsn, schema, spec(schema, truncate=True), [
        event(0, "c", after=row(1, "a")), event(1, "c", after=row(2, "b")),
        event(2, "t"), event(3, "c", after=row(3, "c")),
    ], tp=TP)
    assert quarantined == {}
    assert await fetch(pg_dsn, f'SELECT id FROM "{schema}".items') == [(3,)]


async def test_every_logical_type_lands_in_its_column(pg_dsn: str, schema: str) -> None:
    await _table(pg_dsn, schema)
    ref = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    full = row(1, "typed", born=19_723, price="MDk=", seen=1_704_112_496_789_012,
               seen_tz="2024-01-01T12:34:56.789012Z", ref=ref, doc='{"k": [1, 2.5]}',
               at=45_296_789_012, tags=["x", None], span=93_784_500_000,
               addr="10.1.2.3/24", net="2001:db8::/32", page='<a n="1"/>', obj=4_000_000_000)
    assert await apply(pg_dsn, schema, spec(schema), [event(0, "c", after=full)], tp=TP) == {}
    got = await fetch(pg_dsn, f'SELECT born, price, seen, seen_tz, ref, doc::text, at, tags, '
                              f'span::text, addr::text, net::text, page::text, obj '
                              f'FROM "{schema}".items')
    assert got == [(dt.date(2024, 1, 1), D("123.45"),
                    dt.datetime(2024, 1, 1, 12, 34, 56, 789_012),
                    dt.datetime(2024, 1, 1, 12, 34, 56, 789_012, dt.UTC), uuid.UUID(ref),
                    '{"k": [1, 2.5]}', dt.time(12, 34, 56, 789_012), ["x", None],
                    "1 day 02:03:04.5", "10.1.2.3/24", "2001:db8::/32", '<a n="1"/>',
                    4_000_000_000)]


async def test_a_value_the_column_cannot_hold_is_quarantined_not_cut(pg_dsn: str,
                                                                     schema: str) -> None:
    await _table(pg_dsn, schema)
    too_big = row(1, "big", price=base64.b64encode(                   # 10,000,000,000.00
        (10**12).to_bytes(6, "big", signed=True)).decode())
    quarantined = await apply(pg_dsn, schema, spec(schema), [
        event(0, "c", after=too_big), event(1, "c", after=row(2, "fits"))], tp=TP)
    assert await fetch(pg_dsn, f'SELECT id FROM "{schema}".items') == [(2,)]
    assert quarantined[0].startswith("table sink: refused by PostgreSQL [22003]: numeric "
                                     "field overflow")


async def test_a_value_the_column_would_round_is_quarantined_not_rounded(
        pg_dsn: str, schema: str) -> None:
    """numeric(10,2) and timestamp(3) read from the catalog: a price of three decimals or a
    timestamp of microseconds would be rounded by PostgreSQL without a word; quarantined."""
    await fetch(pg_dsn, f'CREATE TABLE "{schema}".items (id int PRIMARY KEY, name text, '
                        "price numeric(10,2), seen timestamp(3))")
    quarantined = await apply(pg_dsn, schema, spec(schema), [
        event(0, "c", after={"id": 1, "name": "a", "price": 1.255}, schemas=False),
        event(1, "c", after={"id": 2, "name": "b", "seen": "2024-01-01T00:00:00.123456"},
              schemas=False),
        event(2, "c", after={"id": 3, "name": "c", "price": 1.25,
                             "seen": "2024-01-01T00:00:00.123"}, schemas=False)], tp=TP)
    assert await fetch(pg_dsn, f'SELECT id, price, seen FROM "{schema}".items') == [
        (3, D("1.25"), dt.datetime(2024, 1, 1, 0, 0, 0, 123_000))]
    assert sorted(quarantined) == [0, 1]
    assert all("which PostgreSQL would round" in why for why in quarantined.values())


async def test_with_json_values_the_table_must_exist(pg_dsn: str, schema: str) -> None:
    c = await asyncpg.connect(pg_dsn)
    try:
        with pytest.raises(ConfigError, match="create it with the source table's columns and "
                                              "primary key"):
            await ensure_table(c, spec(schema))
        await c.execute(f'CREATE TABLE "{schema}".items (id int, name text)')
        with pytest.raises(ConfigError, match="needs a primary key"):
            await ensure_table(c, spec(schema))
    finally:
        await c.close()


AVRO_ROW = {"type": "record", "name": "Value", "namespace": "dbz.public.items", "fields": [
    {"name": "id", "type": "int"},
    {"name": "name", "type": "string"},
    {"name": "born", "type": ["null", {"type": "int", "connect.version": 1,
                                       "connect.name": "io.debezium.time.Date"}],
     "default": None},
    {"name": "seen", "type": ["null", {"type": "long", "connect.version": 1,
                                       "connect.name": "io.debezium.time.MicroTimestamp"}],
     "default": None},
    {"name": "price", "type": ["null", {
        "type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2,
        "connect.name": "org.apache.kafka.connect.data.Decimal",
        "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"}}],
     "default": None}]}
AVRO_ENVELOPE = json.dumps({"type": "record", "name": "Envelope", "namespace": "dbz.public.items",
                            "fields": [
    {"name": "before", "type": ["null", AVRO_ROW], "default": None},
    {"name": "after", "type": ["null", "Value"], "default": None},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": ["null", "long"], "default": None}]})


@pytest.mark.parametrize("table_present", [True, False], ids=["present", "created"])
async def test_avro_change_events_through_the_registry(pg_dsn: str, schema: str, services: Any,
                                                       table_present: bool) -> None:
    """Debezium's events in Avro, as Kafka Connect's Avro converter writes them (Connect
    names on the fields): the start-up check reads the after image's fields, the table is
    made from them when missing, and each logical type lands in its column."""
    from tests.integration.registry_support import avro

    topic = f"dbz{uuid.uuid4().hex[:6]}.public.items"
    tp = TopicPartition(topic, 0)
    serialize = avro(services.schema_registry_url, topic, AVRO_ENVELOPE)
    image = {"id": 1, "name": "ada", "born": 19_723, "seen": 1_704_112_496_789_012,
             "price": D("12.50")}

    def rec(offset: int, op: str, before: Any, after: Any) -> SourceRecord:
        value = serialize({"before": before, "after": after, "op": op, "ts_ms": 1})
        return SourceRecord(topic, 0, offset, b'{"id": 1}', value, timestamp_ms=1)

    records = [rec(0, "c", None, image), rec(1, "u", image, {**image, "name": "ada v2"}),
               rec(2, "c", None, {**image, "id": 2, "born": None})]
    records[2] = SourceRecord(topic, 0, 2, b'{"id": 2}', records[2].value, timestamp_ms=1)
    if table_present:
        await fetch(pg_dsn, f'CREATE TABLE "{schema}".items (id int PRIMARY KEY, name text '
                            "NOT NULL, born date, seen timestamp, price numeric(10,2))")
    spec = SinkSpec(f"{schema}.items", envelope="debezium", value_format=Format.AVRO,
                    key_format=Format.JSON, registry=services.schema_registry_url,
                    keys=() if table_present else ("id",))
    serialize({"before": None, "after": image, "op": "r", "ts_ms": 1})  # registered first
    assert await apply(pg_dsn, schema, spec, records, tp=tp, topics=(topic,)) == {}
    got = await fetch(pg_dsn, f'SELECT id, name, born, seen, price FROM "{schema}".items '
                              "ORDER BY id")
    assert got == [(1, "ada v2", dt.date(2024, 1, 1), dt.datetime(2024, 1, 1, 12, 34, 56, 789_012),
                    D("12.50")), (2, "ada", None, dt.datetime(2024, 1, 1, 12, 34, 56, 789_012),
                                  D("12.50"))]


def test_sink_plan_reads_the_after_image_of_change_events(pg_dsn: str, schema: str,
                                                          services: Any) -> None:
    """``fencectl sink plan --sink-envelope debezium``: the columns a registered change
    event's after image needs of the table, not the envelope's own fields."""
    import os
    import subprocess

    from tests.integration.registry_support import avro
    from tests.integration.workers import FENCECTL, ROOT

    topic = f"dbz{uuid.uuid4().hex[:6]}.public.items"
    avro(services.schema_registry_url, topic, AVRO_ENVELOPE)(
        {"before": None, "after": {"id": 1, "name": "a", "born": None, "seen": None,
                                   "price": None}, "op": "c", "ts_ms": 1})
    asyncio.run(fetch(pg_dsn, f'CREATE TABLE "{schema}".items (id int PRIMARY KEY, '
                              "name text NOT NULL, born date)"))
    done = subprocess.run(
        [*FENCECTL, "sink", "plan", "--topic", topic, "--sink", f"table={schema}.items",
         "--sink-format", "avro", "--sink-envelope", "debezium", "--json"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "FENCE_DSN": pg_dsn,
                       "SCHEMA_REGISTRY_URL": services.schema_registry_url},
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout) == {"problems": [], "statements": [
        f'ALTER TABLE "{schema}"."items" ADD COLUMN IF NOT EXISTS "seen" timestamp;',
        f'ALTER TABLE "{schema}"."items" ADD COLUMN IF NOT EXISTS "price" numeric(10,2);']}


JSON_SCHEMA_ENVELOPE = json.dumps({
    "type": "object", "title": "dbz.public.items.Envelope",
    "properties": {
        "before": {"oneOf": [{"type": "null"}, {"$ref": "#/definitions/Value"}]},
        "after": {"oneOf": [{"type": "null"}, {"$ref": "#/definitions/Value"}]},
        "source": {"type": "object", "properties": {"lsn": {"type": "integer"}}},
        "op": {"type": "string"}, "ts_ms": {"type": "integer"}},
    "definitions": {"Value": {"type": "object", "properties": {
        "id": {"type": "integer"}, "name": {"type": "string"}}}}})


async def test_json_schema_and_protobuf_change_events_through_the_registry(
        pg_dsn: str, schema: str, services: Any) -> None:
    """The envelope read from JSON Schema and Protobuf values through the real registry, as
    Kafka Connect's converters for them write Debezium's events: the table exists (these
    formats' schemas are not checked at start), creates, updates and deletes apply."""
    from google.protobuf.descriptor_pb2 import FieldDescriptorProto as F

    from tests.integration.registry_support import json_schema, protobuf, protobuf_class

    await fetch(pg_dsn, f'CREATE TABLE "{schema}".items (id int PRIMARY KEY, name text)')
    await fetch(pg_dsn, f'CREATE TABLE "{schema}".items_pb (id int PRIMARY KEY, name text)')
    js_topic = f"dbz{uuid.uuid4().hex[:6]}.public.items"
    pb_topic = f"dbz{uuid.uuid4().hex[:6]}.public.items_pb"
    to_js = json_schema(services.schema_registry_url, js_topic, JSON_SCHEMA_ENVELOPE)
    cls = protobuf_class("Envelope", [("before", 1, F.TYPE_MESSAGE, "Value"),
                                      ("after", 2, F.TYPE_MESSAGE, "Value"),
                                      ("op", 3, F.TYPE_STRING, ""),
                                      ("source", 4, F.TYPE_MESSAGE, "Source")],
                         nested={"Value": [("id", 1, F.TYPE_INT32), ("name", 2, F.TYPE_STRING)],
                                 "Source": [("lsn", 1, F.TYPE_INT64)]})
    to_pb = protobuf(services.schema_registry_url, pb_topic, cls)

    def pb(op: str, before: Any = None, after: Any = None, lsn: int = 1) -> bytes:
        msg = cls(op=op)
        msg.source.lsn = lsn
        for name, image in (("before", before), ("after", after)):
            if image is not None:
                getattr(msg, name).CopyFrom(getattr(msg, name).__class__(**image))
        return to_pb(msg)

    changes = [("c", None, {"id": 1, "name": "one"}), ("c", None, {"id": 2, "name": "two"}),
               ("u", {"id": 1, "name": "one"}, {"id": 1, "name": "uno"}),
               ("d", {"id": 2, "name": "two"}, None)]
    for fmt, topic, table, encode in (
            (Format.JSON_SCHEMA, js_topic, "items", lambda op, b, a, i: to_js(
                {"before": b, "after": a, "op": op, "source": {"lsn": i}, "ts_ms": 1})),
            (Format.PROTOBUF, pb_topic, "items_pb", lambda op, b, a, i: pb(op, b, a, i))):
        records = [SourceRecord(topic, 0, i, None, encode(op, b, a, i), timestamp_ms=1)
                   for i, (op, b, a) in enumerate(changes)]
        got = await apply(pg_dsn, schema, SinkSpec(
            f"{schema}.{table}", envelope="debezium", value_format=fmt,
            registry=services.schema_registry_url),
            records, tp=TopicPartition(topic, 0), topics=(topic,))
        assert got == {}, fmt
        assert await fetch(pg_dsn, f'SELECT id, name FROM "{schema}".{table}') == [
            (1, "uno")], fmt


#: Debezium's placeholder for a value an update left unchanged (an unchanged TOASTed value
#: under REPLICA IDENTITY DEFAULT): the string for text and jsonb, ``[it]`` for a text array
UNAVAILABLE = "__debezium_unavailable_value"


async def test_an_update_without_a_toasted_value_updates_the_rest_and_keeps_it(
        pg_dsn: str, schema: str) -> None:
    """An update holding Debezium's placeholder updates the row's other columns and keeps
    the value it lacks (a NOT NULL column too: ``name``), by each write path and in order
    with the batch's other changes of its key; the update of a row that is not there writes
    nothing; a primary-key change's create holding it (Debezium's ``__debezium.oldkey``
    header) is quarantined, and any other create holding its text writes it, the row's."""
    await _table(pg_dsn, schema)
    doc = json.dumps({"k": 1})
    quarantined = await apply(pg_dsn, schema, spec(schema), [
        event(0, "c", after=row(1, "one", tags=["a"], doc=doc, obj=1)),
        event(1, "u", after=row(1, UNAVAILABLE, tags=[UNAVAILABLE], doc=UNAVAILABLE, obj=2)),
        event(2, "u", after=row(2, UNAVAILABLE, obj=2)),         # no row 2: nothing
        event(3, "c", after=row(3, "three", obj=3)),
        event(4, "u", after=row(3, UNAVAILABLE, obj=4)),
        event(5, "u", after=row(3, UNAVAILABLE, obj=5), schemas=False),
        _key_change(event(6, "c", after=row(4, UNAVAILABLE, obj=6))),  # its new key
        event(7, "c", after=row(6, UNAVAILABLE, obj=7)),          # a create: its own text
        event(8, "c", after=row(5, "five", obj=7)),
        event(9, "u", after=row(5, UNAVAILABLE, obj=8)),
        event(10, "d", before=row(5, "five")),
    ], tp=TP)
    assert list(quarantined) == [6] and "primary-key change" in quarantined[6]
    assert await fetch(pg_dsn, f'SELECT id, name, tags, doc, obj FROM "{schema}".items '
                               "ORDER BY id") == [(1, "one", ["a"], doc, 2),
                                                  (3, "three", None, None, 5),
                                                  (6, UNAVAILABLE, None, None, 7)]
    # a later batch: the patch alone, then a whole update of the row
    other = TopicPartition(TP.topic, 1)
    await apply(pg_dsn, schema, spec(schema), [
        event(0, "u", after=row(1, UNAVAILABLE, tags=[UNAVAILABLE], doc=UNAVAILABLE, obj=9),
              tp=other)], tp=other)
    assert await fetch(pg_dsn, f'SELECT name, tags, doc, obj FROM "{schema}".items '
                               "WHERE id = 1") == [("one", ["a"], doc, 9)]


def _key_change(record: SourceRecord) -> SourceRecord:
    """``record`` as the create of a primary-key change's new key: with Debezium's header."""
    return SourceRecord(record.topic, record.partition, record.offset, record.key,
                        record.value, headers=(("__debezium.oldkey", b'{"id": 40}'),),
                        timestamp_ms=record.timestamp_ms)
