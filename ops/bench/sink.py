"""The table sink's numbers: its write methods compared on batches through the real fence
store (``python -m ops.bench.sink``), and the 100-byte JSON values the worker benchmark's
sink run produces (``ops.bench.worker --sink-only``).

Each method (binary COPY, binary executemany) x mode (insert, upsert) processes ``--rounds``
batches of ``--batch`` records of fresh keys into its own table, the four taking turns batch
by batch; the median milliseconds per batch and records/s are printed as JSON. The
machine's load moves single numbers: compare the methods within one run.

``--in-order`` measures what applying every record of a key in order costs (the sink's
rule: ``order.sets_then_rest``) against applying only each key's last record of the batch
(``order.last_wins``: the records that rule would write, given to the same sink), on
upsert batches in which every key appears ``R`` times (``--repeats``), the two lanes taking
turns batch by batch.

``--decode`` measures one record's decode and conversion, in ns of this process's CPU time
(a shared machine's load moves wall time, much less CPU time), best of seven rounds (the
steps taking turns), on
the benchmark's record (``sink_row``): as JSON (``rows.parse_json``), as Avro through
confluent-kafka's ``AsyncAvroDeserializer`` whole and through the sink's reader of the
same schema id (``fencing.postgres.sink.registry``), and each format's full conversion
into the typed table (``TYPED_DDL``). It needs the registry at ``SCHEMA_REGISTRY_URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from typing import Any

from fencing.postgres.schema import migrate
from fencing.postgres.sink import Method, SinkSpec, ensure_table, make_table_sink
from fencing.postgres.store import PgFenceStore
from fencing.store import BatchCall
from fencing.types import ClaimRequest, SourceRecord, TopicPartition
from ops.bench.provenance import provenance
from ops.operator.db import connection

__all__ = ["AVRO_SCHEMA", "TYPED_DDL", "measure_decode", "measure_in_order", "measure_methods",
           "produce_avro_values", "produce_values", "sink_row", "sink_value"]

#: the fields of ``sink_value`` as an Avro record: the Avro sink run's writer schema
AVRO_SCHEMA = json.dumps({"type": "record", "name": "BenchSink", "namespace": "fenceworker",
                          "fields": [{"name": "id", "type": "string"},
                                     {"name": "amount", "type": "long"},
                                     {"name": "status", "type": "string"},
                                     {"name": "note", "type": "string"}]})
#: the typed table both the JSON and the Avro run write (``{}``: its quoted name): what the
#: sink creates from ``AVRO_SCHEMA`` with ``--sink-key id`` (``catalog.schema_ddl``)
TYPED_DDL = ("CREATE TABLE IF NOT EXISTS {} (id text NOT NULL, amount int8 NOT NULL, "
             "status text NOT NULL, note text NOT NULL, kafka_topic text NOT NULL, "
             "kafka_partition integer NOT NULL, kafka_offset bigint NOT NULL, "
             "kafka_timestamp timestamptz, PRIMARY KEY (id))")


def sink_row(i: int) -> dict[str, Any]:
    """Record ``i``'s fields: an ``id`` (the upsert key), an amount, a status and a note
    that pads its JSON text to exactly 100 bytes."""
    row = {"id": f"o{i}", "amount": i % 997, "status": "new", "note": ""}
    return {**row, "note": "x" * (100 - len(json.dumps(row, separators=(",", ":"))))}


def sink_value(i: int) -> bytes:
    """``sink_row(i)`` as a JSON object of exactly 100 bytes."""
    return json.dumps(sink_row(i), separators=(",", ":")).encode()


def produce_values(topic: str, count: int, partitions: int, bootstrap: str, *,
                   value: Any = sink_value) -> None:
    """Create ``topic`` (``partitions``), produce ``count`` ``value(i)`` records keyed by
    their id, round robin over the partitions; raises ``RuntimeError`` if one fails."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    from ops.commands.produce import ProduceOptions, ensure_topic

    opts = ProduceOptions(topic, count, 0, "valid", partitions=partitions, bootstrap=bootstrap)
    problem = ensure_topic(AdminClient({"bootstrap.servers": bootstrap}), opts)
    if problem is not None:
        raise RuntimeError(problem)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 20, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 500_000})
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value(i), f"o{i}".encode(), partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120) != 0:
        raise RuntimeError(f"{topic}: records left undelivered")


def produce_avro_values(topic: str, count: int, partitions: int, bootstrap: str,
                        registry_url: str) -> None:
    """``produce_values`` with the same records as Avro (``AVRO_SCHEMA``, registered under
    ``<topic>-value`` by confluent-kafka's ``AvroSerializer``), keyed by their id."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from ops.commands.produce import ProduceOptions, ensure_topic

    opts = ProduceOptions(topic, count, 0, "valid", partitions=partitions, bootstrap=bootstrap)
    problem = ensure_topic(AdminClient({"bootstrap.servers": bootstrap}), opts)
    if problem is not None:
        raise RuntimeError(problem)
    # subjects by topic (the default ASSOCIATED strategy asks the registry first, see
    # tests/integration/registry_support.py); a request waits at most 30 s
    serialize = AvroSerializer(SchemaRegistryClient({"url": registry_url, "timeout": 30}),
                               AVRO_SCHEMA, conf={"subject.name.strategy.type": "TOPIC"})
    ctx = SerializationContext(topic, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 20, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 500_000})
    for i in range(count):
        value = serialize(sink_row(i), ctx)
        while True:
            try:
                producer.produce(topic, value, f"o{i}".encode(), partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120) != 0:
        raise RuntimeError(f"{topic}: records left undelivered")


class _Lane:
    """One method x mode: its table, fence store, partition token and batch timings."""

    def __init__(self, dsn: str, schema: str, spec: SinkSpec) -> None:
        self.dsn, self.schema, self.spec = dsn, schema, spec
        self.tp = TopicPartition(f"t-{uuid.uuid4().hex[:6]}", 0)
        self.took: list[float] = []

    async def open(self) -> None:
        async with connection(self.dsn) as conn:
            await ensure_table(conn, self.spec)
        self.store = await PgFenceStore.connect(self.dsn, group_id="bench", schema=self.schema,
                                                pool_max=2)
        self.token = (await self.store.claim([ClaimRequest(self.tp, 0)], lifetime="b"))[self.tp]
        self.sink = make_table_sink(self.spec)

    async def batch(self, first_id: int, size: int, *, repeats: int = 1,
                    last_only: bool = False) -> None:
        """One batch of ``size`` records, each key ``repeats`` times (fresh keys from
        ``first_id``); ``last_only``: only each key's last record reaches the sink."""
        records = [SourceRecord(self.tp.topic, 0, self.token.frontier + i, None,
                                sink_value(first_id + i % (size // repeats)))
                   for i in range(size)]
        if last_only:
            last = {sink_value(first_id + i % (size // repeats)): i for i in range(size)}
            keep = set(last.values())
            records = [r for i, r in enumerate(records) if i in keep]
        start = time.perf_counter()
        self.token = await self.store.process(BatchCall(self.tp, records, self.sink), self.token)
        self.took.append(time.perf_counter() - start)

    def result(self, size: int) -> dict[str, Any]:
        ms = statistics.median(self.took[1:] or self.took) * 1000  # batch 1 reads the catalog
        return {"ms_per_batch": round(ms, 2), "records_per_s": round(size / ms * 1000)}


async def measure_methods(dsn: str, *, batch: int = 500, rounds: int = 20) -> dict[str, Any]:
    """Median ms per batch and records/s of each method x mode (see the module doc). The
    lanes take turns batch by batch, so a change of load hits all of them alike."""
    schema = f"bench_sink_{uuid.uuid4().hex[:8]}"
    async with connection(dsn) as conn:
        await migrate(conn, schema)
    lanes = {f"{mode}/{method.value}": _Lane(dsn, schema, SinkSpec(
                 f"{schema}.{mode}_{method.value}", keys=keys, method=method))
             for mode, keys in (("insert", ()), ("upsert", ("id",))) for method in Method}
    try:
        for lane in lanes.values():
            await lane.open()
        for r in range(rounds):
            for lane in lanes.values():
                await lane.batch(r * batch, batch)
    finally:
        for lane in lanes.values():
            if hasattr(lane, "store"):
                await lane.store.close()
        async with connection(dsn) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return {"batch": batch, "rounds": rounds, "load_average_1m": round(os.getloadavg()[0], 2),
            **{name: lane.result(batch) for name, lane in lanes.items()}}


async def measure_in_order(dsn: str, *, batch: int = 2000, rounds: int = 12,
                           repeats: tuple[int, ...] = (1, 2, 10, 100)) -> dict[str, Any]:
    """Per ``repeats`` R: median ms per upsert batch (COPY) and records/s, every record
    applied in order against only each key's last record (see the module doc)."""
    schema = f"bench_sink_{uuid.uuid4().hex[:8]}"
    async with connection(dsn) as conn:
        await migrate(conn, schema)
    out: dict[str, Any] = {"batch": batch, "rounds": rounds}
    lanes: list[_Lane] = []
    try:
        for r in repeats:
            pair = {name: _Lane(dsn, schema, SinkSpec(f"{schema}.r{r}_{name}", keys=("id",)))
                    for name in ("in_order", "last_wins")}
            lanes += pair.values()
            for lane in pair.values():
                await lane.open()
            for n in range(rounds):
                for name, lane in pair.items():
                    await lane.batch(n * batch, batch, repeats=r,
                                     last_only=name == "last_wins")
            got = {name: lane.result(batch) for name, lane in pair.items()}
            got["in_order_over_last_wins"] = round(
                got["in_order"]["records_per_s"] / got["last_wins"]["records_per_s"], 3)
            out[f"repeats_{r}"] = got
    finally:
        for lane in lanes:
            if hasattr(lane, "store"):
                await lane.store.close()
        async with connection(dsn) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    out["load_average_1m"] = round(os.getloadavg()[0], 2)
    return out


async def measure_decode(registry_url: str, *, records: int = 20_000) -> dict[str, Any]:
    """ns per record of each decode step (see the module doc)."""
    import timeit

    from confluent_kafka.schema_registry import AsyncSchemaRegistryClient
    from confluent_kafka.schema_registry._async.avro import AsyncAvroDeserializer

    from fencing.postgres.sink.keys import Format
    from fencing.postgres.sink.registry import Registry
    from fencing.postgres.sink.rows import Column, Layout, converter, parse_json

    topic = f"bench_decode_{uuid.uuid4().hex[:8]}"
    wire = await asyncio.to_thread(_avro_wire, registry_url, topic)
    registry = Registry(registry_url)
    client = AsyncSchemaRegistryClient({"url": registry_url, "timeout": 30})
    theirs = await AsyncAvroDeserializer(client)
    ours = await registry.reader(Format.AVRO, int.from_bytes(wire[1:5], "big"))
    await theirs(wire, None)
    text = sink_value(7)
    layout = Layout(tuple(Column(n, t) for n, t in (
        ("id", "text"), ("amount", "int8"), ("status", "text"), ("note", "text"),
        ("kafka_topic", "text"), ("kafka_partition", "int4"), ("kafka_offset", "int8"),
        ("kafka_timestamp", "timestamptz"))), keys=("id",))
    convert = converter(layout, epoch_ms=True)
    record = SourceRecord(topic, 0, 7, b"o7", text, timestamp_ms=1_700_000_000_000)
    payload = wire[5:]
    loop = asyncio.get_running_loop()

    def deserializer() -> None:
        for _ in range(records):  # each call a coroutine run to its end, as in a handler
            coro = theirs(wire, None)
            try:
                coro.send(None)
            except StopIteration:
                pass

    steps = {
        "json_parse": lambda: [parse_json(text) for _ in range(records)],
        "avro_deserializer": deserializer,
        "avro_sink_reader": lambda: [ours(payload) for _ in range(records)],
        "json_convert": lambda: [convert(record) for _ in range(records)],
        "avro_convert": lambda: [convert(record, ours(payload)) for _ in range(records)],
    }
    best = dict.fromkeys(steps, float("inf"))
    for _ in range(7):  # the steps take turns round by round: a load spike hits them alike
        for name, fn in steps.items():
            best[name] = min(best[name], timeit.timeit(fn, number=1, timer=time.process_time))
    out = {name: round(t / records * 1e9) for name, t in best.items()}
    await client.__aexit__()
    await registry.close()
    _ = loop
    return {"ns_per_record": out, "records": records,
            "load_average_1m": round(os.getloadavg()[0], 2)}


def _avro_wire(registry_url: str, topic: str) -> bytes:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serialize = AvroSerializer(SchemaRegistryClient({"url": registry_url, "timeout": 30}),
                               AVRO_SCHEMA, conf={"subject.name.strategy.type": "TOPIC"})
    wire: bytes = serialize(sink_row(7), SerializationContext(topic, MessageField.VALUE))
    return wire


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.bench.sink")
    p.add_argument("--batch", type=int, default=None,
                   help="records per batch (default 500; 2000 with --in-order)")
    p.add_argument("--rounds", type=int, default=None,
                   help="batches per lane (default 20; 12 with --in-order)")
    p.add_argument("--in-order", action="store_true",
                   help="in-order application against last-wins, keys repeated (module doc)")
    p.add_argument("--repeats", default="1,2,10,100",
                   help="with --in-order: how often each key appears in a batch, a list")
    p.add_argument("--decode", action="store_true",
                   help="ns per record of JSON and Avro decoding and conversion (module doc)")
    a = p.parse_args(argv)
    typed = ["python -m ops.bench.sink", *(sys.argv[1:] if argv is None else argv)]
    made = {"provenance": provenance(" ".join(typed))}  # shown above its table in the docs
    if a.decode:
        print(json.dumps({**made, **asyncio.run(measure_decode(
            os.environ["SCHEMA_REGISTRY_URL"]))}, indent=2))
        return 0
    dsn = os.environ["FENCE_DSN"]
    if a.in_order:
        got = asyncio.run(measure_in_order(
            dsn, batch=a.batch or 2000, rounds=a.rounds or 12,
            repeats=tuple(int(r) for r in a.repeats.split(","))))
        print(json.dumps({**made, **got}, indent=2))
        return 0
    got = asyncio.run(measure_methods(dsn, batch=a.batch or 500, rounds=a.rounds or 20))
    print(json.dumps({**made, **got}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
