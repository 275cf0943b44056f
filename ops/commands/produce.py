"""``fencectl produce``: write the reference domain's generated source to a Kafka topic.

Rules
- The records are ``ops.reference.generate(seed, count=, partitions=, klass=, topic=)``;
  each goes to its generated partition, in generation order.
- The topic is created with ``--partitions`` partitions when missing; an existing topic
  with fewer partitions is refused (exit 2) since records would have nowhere to go.
- Every record carries a W3C ``traceparent`` header from its own OpenTelemetry PRODUCER
  span (``send <topic>``). When ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the ``_TRACES_``
  variant) is set, the spans of every ``--span-every``-th record are exported over OTLP
  gRPC as service ``fencectl-produce`` and flushed (bounded) before exit; the others carry
  valid, unsampled trace context. Without an endpoint nothing is exported.
- The producer is idempotent (acks=all) and every record's delivery is awaited.
- librdkafka's own log lines (e.g. its retries while a fresh broker loads its transaction
  coordinator) stay off stderr unless ``--log-level debug`` (``ops.librdkafka_logs``).
- Exit codes: ``EXITS`` (0 all delivered, one summary line on stdout; 1 a delivery failed;
  2 bad arguments, unreachable bootstrap, or a topic that cannot hold the partitions).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

from consumer.exits import Exit
from consumer.kafka.adapter import checked_client_properties
from fencing.errors import ConfigError
from ops.librdkafka_logs import add_log_level_argument, client_log_settings
from ops.reference.generate import CLASSES, GeneratedRecord, generate
from ops.worker.telemetry import run_bounded

__all__ = [
    "EXITS",
    "ProduceOptions",
    "ensure_topic",
    "options_from_args",
    "produce",
    "register",
    "run",
]

SERVICE_NAME = "fencectl-produce"

DELIVERED = Exit(0, "every record delivered (one summary line on stdout)", "nothing")
FAILED = Exit(1, "a delivery failed (the count is on stderr)",
              "read librdkafka's reason (`--log-level debug`); check the topic and the "
              "brokers, then run it again")
USAGE = Exit(2, "bad arguments; Kafka unset or unreachable; a topic with fewer partitions "
             "than `--partitions`", "fix what the line on stderr names")
EXITS = (DELIVERED, FAILED, USAGE)
_SPANS_EXPORTED_MAX = 5000


@dataclass(frozen=True, slots=True)
class ProduceOptions:
    """Validated options of one ``fencectl produce`` run."""

    topic: str
    count: int
    seed: int
    klass: str
    partitions: int = 6  # partitions of the generated source (and of a created topic)
    bootstrap: str = ""  # Kafka bootstrap servers
    bootstrap_source: str = "KAFKA_BOOTSTRAP_SERVERS"  # the flag or variable it came from
    replication_factor: int = 1  # of a created topic
    span_every: int = 0  # export the span of every Nth record; 0: automatic
    flush_timeout_s: float = 60.0  # bound on waiting for deliveries
    otlp_endpoint: str | None = None  # OTLP gRPC endpoint; None: no export
    log_level: str = "info"  # debug also shows librdkafka's own log lines
    kafka_properties: Mapping[str, str] = field(default_factory=dict)  # FENCE_KAFKA_CONFIG


def register(sub: Any) -> None:
    p = sub.add_parser("produce", help="produce the reference domain's generated source")
    p.add_argument("--topic", required=True, help="the topic (created when missing)")
    p.add_argument("--count", type=int, required=True, help="number of records")
    p.add_argument("--seed", type=int, required=True, help="generator seed")
    p.add_argument("--class", dest="klass", choices=CLASSES, required=True,
                   help="valid (every change applies in order) or conflict (stale and "
                        "skipped revisions mixed in: the handler rejects those)")
    p.add_argument("--partitions", type=int, default=6, help="partitions (default 6)")
    p.add_argument("--bootstrap-servers", dest="bootstrap", default=None,
                   help="Kafka bootstrap servers (default $KAFKA_BOOTSTRAP_SERVERS)")
    # the old spelling, kept working for existing scripts and hidden from --help
    p.add_argument("--bootstrap", dest="bootstrap", default=None, help=argparse.SUPPRESS)
    p.add_argument("--replication-factor", type=int, default=1,
                   help="replication of a topic it creates (default 1)")
    p.add_argument("--span-every", type=int, default=0,
                   help=f"export every Nth record's span (default: at most {_SPANS_EXPORTED_MAX})")
    p.add_argument("--flush-timeout-s", type=float, default=60.0,
                   help="bound on waiting for every delivery, seconds (default 60)")
    add_log_level_argument(p)
    p.set_defaults(func=run, exits=EXITS)


def options_from_args(
    args: argparse.Namespace, env: Mapping[str, str]
) -> ProduceOptions | str:
    """Pure: the options from ``args`` and ``env``, or the message naming the bad argument."""
    if not args.topic.strip():
        return "--topic must not be empty"
    for name in ("count", "partitions", "replication_factor"):
        if getattr(args, name) < (0 if name == "count" else 1):
            return f"--{name.replace('_', '-')} {getattr(args, name)}: out of range"
    if args.span_every < 0 or args.flush_timeout_s <= 0:
        return "--span-every must be >= 0 and --flush-timeout-s > 0"
    bootstrap = args.bootstrap or env.get("KAFKA_BOOTSTRAP_SERVERS", "")
    if not bootstrap:
        return "KAFKA_BOOTSTRAP_SERVERS is not set and no --bootstrap-servers given"
    try:
        properties = checked_client_properties(env)
    except ConfigError as exc:
        return str(exc)
    endpoint = (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None)
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        endpoint = None
    return ProduceOptions(
        topic=args.topic, count=args.count, seed=args.seed, klass=args.klass,
        partitions=args.partitions, bootstrap=bootstrap,
        bootstrap_source="--bootstrap-servers" if args.bootstrap else "KAFKA_BOOTSTRAP_SERVERS",
        replication_factor=args.replication_factor,
        span_every=args.span_every or max(1, -(-args.count // _SPANS_EXPORTED_MAX)),
        flush_timeout_s=args.flush_timeout_s, otlp_endpoint=endpoint,
        log_level=getattr(args, "log_level", None) or "info", kafka_properties=properties,
    )


class _Tracing:
    """Two tracers over one resource: ``exported`` records and exports (when an endpoint is
    set), ``silent`` only mints valid unsampled span contexts."""

    def __init__(self, endpoint: str | None) -> None:
        resource = Resource.create({"service.name": SERVICE_NAME})
        self.silent_provider = TracerProvider(
            resource=resource, sampler=ALWAYS_OFF, shutdown_on_exit=False
        )
        self.silent = self.silent_provider.get_tracer(SERVICE_NAME)
        self.provider: TracerProvider | None = None
        self.exported = self.silent
        if endpoint:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            self.provider = TracerProvider(
                resource=resource, sampler=ALWAYS_ON, shutdown_on_exit=False
            )
            exporter = OTLPSpanExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"))
            self.provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=8192))
            self.exported = self.provider.get_tracer(SERVICE_NAME)

    def close(self, *, timeout_s: float) -> bool:
        """Flush exported spans within ``timeout_s`` (a stuck exporter is abandoned);
        True when flushed."""
        if self.provider is None:
            return True
        provider = self.provider

        def flush() -> None:
            provider.force_flush()
            provider.shutdown()

        return run_bounded(flush, timeout_s=timeout_s)


def _await_partitions(admin: AdminClient, topic: str, partitions: int,
                      timeout_s: float = 15.0) -> Any:
    """The topic's metadata once the broker reports ``partitions`` partitions with a leader
    (or the last answer after ``timeout_s``). Kafka's ``Admin.createTopics`` javadoc: "It may
    take several seconds after CreateTopicsResult returns success for all the brokers to
    become aware that the topics have been created. During this time, listTopics and
    describeTopics may not return information about the new topics." Seen here on a broker
    started seconds before: the first metadata after creation listed 0 partitions
    (`tests/unit/ops/test_produce_topic_wait.py`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        existing = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
        ready = (existing is not None and existing.error is None
                 and len(existing.partitions) >= partitions
                 and all(p.leader >= 0 for p in existing.partitions.values()))
        if ready or time.monotonic() >= deadline:
            return existing
        time.sleep(0.1)


def ensure_topic(admin: AdminClient, opts: ProduceOptions) -> str | None:
    """Create the topic if missing; None when it can take the records, else why not."""
    try:
        meta = admin.list_topics(timeout=10)
    except KafkaException as exc:
        return (f"{opts.bootstrap_source} {opts.bootstrap}: cannot reach Kafka ({exc}); "
                "check the host and port")
    existing = meta.topics.get(opts.topic)
    if existing is None or existing.error is not None:
        fut = admin.create_topics([NewTopic(opts.topic, opts.partitions, opts.replication_factor)])
        try:
            fut[opts.topic].result(timeout=30)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                return f"--topic {opts.topic}: cannot create: {exc}"
        existing = _await_partitions(admin, opts.topic, opts.partitions)
    have = 0 if existing is None else len(existing.partitions)
    if have < opts.partitions:
        return (f"--topic {opts.topic} has {have} partitions; "
                f"--partitions {opts.partitions} needs at least that many")
    return None


def produce(opts: ProduceOptions, records: Sequence[GeneratedRecord], tracing: _Tracing) -> int:
    """Produce every record and wait for delivery; returns the number of failed deliveries."""
    producer = Producer({
        "bootstrap.servers": opts.bootstrap, "enable.idempotence": True, "acks": "all",
        "linger.ms": 20, "batch.size": 1_000_000, "compression.type": "lz4",
        "queue.buffering.max.messages": 500_000, "client.id": SERVICE_NAME,
        **opts.kafka_properties, **client_log_settings(opts.log_level),
    })
    failed: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    def delivered_span(span: trace.Span) -> Any:
        def cb(err: Any, msg: Any) -> None:
            delivered(err, msg)
            if err is None:
                span.set_attribute("messaging.kafka.offset", msg.offset())
            else:
                span.set_status(trace.StatusCode.ERROR, str(err))
            span.end()
        return cb

    attrs = {"messaging.system": "kafka", "messaging.destination.name": opts.topic,
             "messaging.operation.type": "send", "messaging.operation.name": "send"}
    name = f"send {opts.topic}"
    for i, rec in enumerate(records):
        sampled = i % opts.span_every == 0
        tracer = tracing.exported if sampled else tracing.silent
        span = tracer.start_span(name, kind=trace.SpanKind.PRODUCER, attributes=attrs)
        if sampled:
            span.set_attribute("messaging.destination.partition.id", str(rec.partition))
        ctx = span.get_span_context()  # W3C traceparent, as TraceContextTextMapPropagator writes it
        headers: dict[str, str | bytes | None] = {
            "traceparent": f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
        }
        cb = delivered_span(span) if sampled else delivered
        while True:
            try:
                producer.produce(opts.topic, rec.value, rec.key, partition=rec.partition,
                                 headers=headers, on_delivery=cb)
                break
            except BufferError:
                producer.poll(0.05)
        if not sampled:
            span.end()
        if i % 1000 == 0:
            producer.poll(0)
    remaining = producer.flush(opts.flush_timeout_s)
    return len(failed) + remaining


def run(args: argparse.Namespace) -> int:
    opts = options_from_args(args, os.environ)
    if isinstance(opts, str):
        print(f"fencectl produce: {opts}", file=sys.stderr)
        return USAGE.code
    # connection failures are reported once, by ensure_topic, not per retry
    admin = AdminClient({"bootstrap.servers": opts.bootstrap, "client.id": SERVICE_NAME,
                         **opts.kafka_properties, **client_log_settings(opts.log_level)})
    refusal = ensure_topic(admin, opts)
    if refusal is not None:
        print(f"fencectl produce: {refusal}", file=sys.stderr)
        return USAGE.code
    started = time.perf_counter()
    records = generate(opts.seed, count=opts.count, partitions=opts.partitions,
                       klass=opts.klass, topic=opts.topic)  # type: ignore[arg-type]
    tracing = _Tracing(opts.otlp_endpoint)
    failed = produce(opts, records, tracing)
    elapsed_s = time.perf_counter() - started
    flushed = tracing.close(timeout_s=10.0)
    spans = "not exported" if opts.otlp_endpoint is None else (
        f"1 in {opts.span_every} exported" + ("" if flushed else " (flush timed out)"))
    if failed:
        print(f"fencectl produce: {failed} of {opts.count} records not delivered to "
              f"{opts.topic}", file=sys.stderr)
        return FAILED.code
    rate = opts.count / elapsed_s if elapsed_s > 0 else 0.0
    print(f"produced {opts.count} {opts.klass} records (seed {opts.seed}) to {opts.topic} "
          f"across {opts.partitions} partitions in {elapsed_s:.2f} s ({rate:,.0f} rec/s); "
          f"spans {spans}")
    return DELIVERED.code
