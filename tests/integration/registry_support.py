"""Test support for the schema'd formats: records produced with confluent-kafka's own
serializers against the real schema registry, and Protobuf message classes built at run
time (no protoc: a ``FileDescriptorProto`` in the default pool).

The serializers name subjects by topic (``<topic>-value``, TopicNameStrategy) and their
client waits at most ``TIMEOUT_S`` per request. confluent-kafka 2.16's default strategy,
ASSOCIATED, first asks the registry for an association (``GET /associations/...``), which
Apicurio 3.3.3 answers 404 before the serializer falls back to the topic's name; and
without a timeout a request whose answer never arrives waits forever (seen once here: the
registry logged its 404, the client never read it).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, timestamp_pb2
from google.protobuf.message_factory import GetMessageClass

__all__ = ["TIMEOUT_S", "avro", "client", "json_schema", "protobuf", "protobuf_class"]

F = descriptor_pb2.FieldDescriptorProto
_ = timestamp_pb2  # google/protobuf/timestamp.proto in the default pool, for dependencies


TIMEOUT_S = 30
_TOPIC = {"subject.name.strategy.type": "TOPIC"}


def client(url: str) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": url, "timeout": TIMEOUT_S})


def _ctx(topic: str, key: bool) -> SerializationContext:
    return SerializationContext(topic, MessageField.KEY if key else MessageField.VALUE)


def avro(url: str, topic: str, schema: str, *, key: bool = False) -> Callable[[Any], bytes]:
    """``value -> bytes`` by ``AvroSerializer`` (registers ``schema`` under the topic's
    subject on first use)."""
    ser = AvroSerializer(client(url), schema, conf=_TOPIC)
    return lambda value: ser(value, _ctx(topic, key))


def json_schema(url: str, topic: str, schema: str) -> Callable[[Any], bytes]:
    ser = JSONSerializer(schema, client(url), conf=_TOPIC)
    return lambda value: ser(value, _ctx(topic, False))


def protobuf_class(message: str, fields: list[tuple[str, int, int, str]], *,
                   enums: dict[str, list[str]] | None = None,
                   nested: dict[str, list[tuple[str, int, int]]] | None = None) -> Any:
    """A message class ``<pkg>.<message>`` in a fresh ``.proto`` file of the default pool.
    ``fields``: (name, type, label, type_name or ""); proto3; a label of
    ``LABEL_OPTIONAL`` with the name starting with ``opt_`` gets explicit presence."""
    pkg = f"t{uuid.uuid4().hex[:8]}"
    fdp = descriptor_pb2.FileDescriptorProto(name=f"{pkg}.proto", package=pkg, syntax="proto3")
    fdp.dependency.append("google/protobuf/timestamp.proto")
    for name, values in (enums or {}).items():
        e = fdp.enum_type.add(name=name)
        for i, v in enumerate(values):
            e.value.add(name=v, number=i)
    m = fdp.message_type.add(name=message)  # first: the wire format's message index [0]
    for name, number, ftype, type_name in fields:
        label = F.LABEL_REPEATED if name.startswith("rep_") else F.LABEL_OPTIONAL
        f = m.field.add(name=name, number=number, type=ftype, label=label)
        if type_name:
            f.type_name = type_name if type_name.startswith(".google") else f".{pkg}.{type_name}"
        if name.startswith("opt_"):
            f.proto3_optional = True
            f.oneof_index = len(m.oneof_decl)
            m.oneof_decl.add(name=f"_{name}")
    for name, nfields in (nested or {}).items():
        n = fdp.message_type.add(name=name)
        for fname, number, ftype in nfields:
            n.field.add(name=fname, number=number, type=ftype, label=F.LABEL_OPTIONAL)
    pool = descriptor_pool.Default()
    pool.Add(fdp)
    return GetMessageClass(pool.FindMessageTypeByName(f"{pkg}.{message}"))


def protobuf(url: str, topic: str, cls: Any) -> Callable[[Any], bytes]:
    ser = ProtobufSerializer(cls, client(url), {"use.deprecated.format": False, **_TOPIC})
    return lambda msg: ser(msg, _ctx(topic, False))
