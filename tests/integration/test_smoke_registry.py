"""The schema registry is real: confluent-kafka's serializers register schemas through its
Confluent-compatible API and its deserializers read them back by id (Avro with logical
types, JSON Schema); an unknown id is a 404 with the Confluent error code."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient, SchemaRegistryError
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from ops.stack.config import ServiceSettings

pytestmark = pytest.mark.integration

AVRO = json.dumps({"type": "record", "name": "Smoke", "fields": [
    {"name": "id", "type": "long"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12,
                                "scale": 2}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}]})
JSON_SCHEMA = json.dumps({"type": "object", "title": "Smoke",
                          "properties": {"id": {"type": "integer"}}, "required": ["id"]})


def test_avro_and_json_schema_round_trips_through_the_registry(
        services: ServiceSettings) -> None:
    client = SchemaRegistryClient({"url": services.schema_registry_url, "timeout": 30})
    topic = f"smoke_{uuid.uuid4().hex[:8]}"
    ctx = SerializationContext(topic, MessageField.VALUE)
    value = {"id": 214, "amount": decimal.Decimal("12.34"),
             "at": dt.datetime(2024, 5, 1, 10, 0, 0, 123000, tzinfo=dt.UTC)}
    wire = AvroSerializer(client, AVRO, conf={"subject.name.strategy.type": "TOPIC"})(value, ctx)
    assert wire is not None and wire[0] == 0  # magic byte, then the 4-byte schema id
    schema_id = int.from_bytes(wire[1:5], "big")
    assert AvroDeserializer(client)(wire, ctx) == value
    assert f"{topic}-value" in client.get_subjects()
    assert client.get_schema(schema_id).schema_type in ("AVRO", None)
    ctx_json = SerializationContext(f"{topic}_json", MessageField.VALUE)
    wire = JSONSerializer(JSON_SCHEMA, client, conf={"subject.name.strategy.type": "TOPIC"})(
        {"id": 7}, ctx_json)
    assert JSONDeserializer(None, schema_registry_client=client)(wire, ctx_json) == {"id": 7}
    with pytest.raises(SchemaRegistryError) as info:
        client.get_schema(987_654)
    assert (info.value.http_status_code, info.value.error_code) == (404, 40403)
