"""``fencectl run``: the worker process (flags + environment -> ``consumer.worker.Worker``).

Long because every flag of ``fencectl run`` is declared here with its help text, next to
the translation of flags and environment into a ``WorkerConfig``.

Settings: flags below; ``KAFKA_BOOTSTRAP_SERVERS``, ``FENCE_DSN`` (never a flag: a secret
must not appear in argv), ``SCHEMA_REGISTRY_URL`` (``--sink`` with a schema'd format; it
may carry credentials, so never a flag either), ``FENCE_DDL_DSN`` (``--sink-evolve
add-columns``: the connection that alters the table; a secret too), ``FENCE_SINK_EVOLVE``,
``FENCE_SCHEMA``, standard ``OTEL_*``.
Exit codes: ``consumer.exits.EXITS`` (0 stopped, 1 internal error, 2 configuration, 3
retired, 4 source refused, 5 unavailable, 6 shutdown bound exceeded).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from consumer.config import (
    DEFAULT_BATCH_LINGER_S,
    DEFAULT_BATCH_MAX_RECORDS,
    GroupProtocol,
    WorkerConfig,
    client_properties,
    kafka_settings,
    parse_x_options,
    redact,
)
from consumer.exits import EXITS, ExitCode, exit_code_for
from consumer.kafka.adapter import KafkaThread, check_consumer_settings
from consumer.kafka.source import KafkaSource
from consumer.outage import DEFAULT_BOUND_S
from consumer.worker import Worker
from fencing import crashpoints
from fencing.errors import ConfigError, SourceUnavailable, StoreUnavailable
from fencing.failures import RetryPolicy
from fencing.handler import HandlerContext, build_handler, declaration_of
from fencing.types import Token, TopicPartition
from ops.operator.handler_record import SINK_FLAGS, SINK_HANDLER, handler_from_flags, record_of
from ops.reference import pg as reference_pg
from ops.worker import startup, supervisor
from ops.worker.observability import ObsOptions, WorkerObservability
from ops.worker.observability import add_arguments as add_obs_arguments
from ops.worker.observability import options_from_args as obs_options_from_args

__all__ = ["DEFAULT_HANDLER", "SINK_HANDLER", "config_from_args", "register"]

log = logging.getLogger("fenceworker.run")

_EARLY_STOP = threading.Event()
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: the handler of ``fencectl run`` without ``--handler``: the reference domain's factory,
#: spelled from the imported object, so the import-boundary test sees the tie (the worker's
#: config has no default). ``SINK_HANDLER`` (``--sink``) is spelled the same way in
#: ``ops.operator.handler_record``.
DEFAULT_HANDLER = f"{reference_pg.__name__}:{reference_pg.reference.__name__}"
#: ``--batch-max-records`` with ``--sink``: a batch is one transaction, and a bulk sink
#: amortizes each transaction's fixed cost (the fence's guard, the COPY set-up, the COMMIT's
#: WAL flush) over more rows: measured (one member, upsert, docs/benchmarks.md) 500 ->
#: ~45,000, 1,000 -> ~55,000, 2,000 -> ~61,000, 4,000 -> ~58,000 records/s. Kafka
#: Connect's JDBC sink batches 3,000 (``batch.size``) by default for the same reason.
SINK_BATCH_MAX_RECORDS = 2000


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="run a fenced consumer-group worker",
                       description="Consume Kafka topics with exactly-once effects in PostgreSQL.")
    p.add_argument("--topic", action="append", default=[], metavar="TOPIC",
                   help="topic to consume (repeatable); each is validated and fenced per "
                        "partition")
    p.add_argument("--topic-pattern", default=None, metavar="REGEX",
                   help="also consume every topic whose name matches REGEX, also topics "
                        "created later (librdkafka '^' subscription; picked up at its metadata "
                        "refresh, -X topic.metadata.refresh.interval.ms, default 300000)")
    p.add_argument("--group", required=True, help="consumer group id")
    p.add_argument("--handler", default=None,
                   help=f"effect handler, or handler factory, as module:name (default "
                        f"{DEFAULT_HANDLER})")
    p.add_argument("--sink", default=None, metavar="table=NAME",
                   help="the built-in table sink instead of a handler: write each value "
                        "into the PostgreSQL table NAME (created if missing)")
    p.add_argument("--sink-key", default=None, metavar="COLUMN[,COLUMN...]",
                   help="with --sink: upsert on these columns (a primary key or unique index "
                        "on exactly them; a tombstone deletes); without it every record is "
                        "inserted")
    p.add_argument("--sink-format", default=None, metavar="FORMAT",
                   help="with --sink: how values are encoded: json (default), avro, protobuf "
                        "or json-schema (the last three through the schema registry at "
                        "$SCHEMA_REGISTRY_URL)")
    p.add_argument("--sink-key-format", default=None, metavar="FORMAT",
                   help="with --sink: how the Kafka key is encoded, for tombstones and "
                        "records whose value lacks a key column: string (default), json, "
                        "avro, protobuf or json-schema")
    p.add_argument("--sink-evolve", default=None, metavar="MODE",
                   help="with --sink: add-columns gives a field with no column a nullable "
                        "column (ALTER TABLE over $FENCE_DDL_DSN, then the batch is retried); "
                        "none (default) ignores such fields and counts them (default "
                        "$FENCE_SINK_EVOLVE, else none)")
    p.add_argument("--sink-envelope", default=None, metavar="ENVELOPE",
                   help="with --sink: debezium reads each value as a Debezium change event "
                        "(c/r/u upsert the after image, d deletes the key, a tombstone "
                        "changes nothing); without --sink-key the table's primary key (default: "
                        "none)")
    p.add_argument("--sink-truncate", action="store_const", const="true", default=None,
                   help="with --sink-envelope debezium: a truncate event truncates the "
                        "table (default: off; the event is then quarantined)")
    p.add_argument("--sink-version-column", default=None, metavar="COL",
                   help="with --sink: a version guard: an upsert or delete whose version is "
                        "older than the stored row's COL changes nothing and is counted; "
                        "without it every change applies (default: none)")
    p.add_argument("--sink-version-from", default=None, metavar="FROM",
                   help="with --sink-version-column: row (the record's own COL) or "
                        "source.FIELD (a change event's source block, e.g. source.lsn) "
                        "(default: row)")
    p.add_argument("--handler-setting", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting given to a handler factory (repeatable)")
    p.add_argument("-X", dest="x", action="append", default=[], metavar="KEY=VALUE",
                   help="librdkafka consumer property (repeatable)")
    p.add_argument("--bootstrap-servers", default=None,
                   help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS)")
    p.add_argument("--schema", default=None, help="PostgreSQL schema (default $FENCE_SCHEMA "
                   "or fence)")
    p.add_argument("--batch-max-records", type=int, default=None,
                   help=f"most records in one transaction (default {DEFAULT_BATCH_MAX_RECORDS}; "
                        f"{SINK_BATCH_MAX_RECORDS} with --sink)")
    p.add_argument("--batch-max-bytes", type=int, default=1 << 20,
                   help="most key + value bytes in one batch (default 1 MiB)")
    p.add_argument("--batch-linger-ms", type=float, default=DEFAULT_BATCH_LINGER_S * 1000,
                   help="longest a batch that is not full waits for more records after its "
                        f"oldest arrived (default {DEFAULT_BATCH_LINGER_S * 1000:g}; 0: never)")
    p.add_argument("--queue-max-batches", type=int, default=16,
                   help="pause a partition once this many batches wait locally")
    p.add_argument("--db-concurrency", type=int, default=4,
                   help="partitions with a batch in flight at once; the pool holds one "
                        "connection more (default 4)")
    p.add_argument("--lanes", type=int, default=1,
                   help="key-ordered lanes per partition: records of different keys are "
                        "applied side by side, each key's in offset order (default 1)")
    p.add_argument("--lanes-window", type=int, default=10_000,
                   help="most offsets a partition's lanes run ahead of its frontier; a full "
                        "window pauses the partition (default 10000)")
    p.add_argument("--lanes-null", choices=("one", "any"), default="one",
                   help="records without a key: one lane, in order (default), or any lane")
    p.add_argument("--shutdown-timeout-s", type=float, default=15.0,
                   help="bound of the drain after SIGTERM/SIGINT; past it the in-flight "
                        "work is abandoned and logged, exit 6 (default 15)")
    p.add_argument("--group-protocol", choices=[g.value for g in GroupProtocol],
                   default="classic",
                   help="classic (the client assigns: eager rebalances with --assignment-"
                        "strategy range or roundrobin, cooperative ones with cooperative-"
                        "sticky) or consumer (KIP-848: the broker assigns, incrementally); "
                        "three group protocols from two values (default classic)")
    p.add_argument("--assignment-strategy", default=None,
                   help="classic protocol only: range, roundrobin or cooperative-sticky "
                        "(default cooperative-sticky); refused with --group-protocol consumer")
    p.add_argument("--auto-offset-reset", choices=["earliest", "latest"], default="earliest",
                   help="where a partition with no fence row starts (default earliest)")
    p.add_argument("--allow-retention-gap", action="store_true",
                   help="skip (and journal) records deleted before processing")
    p.add_argument("--db-idle-in-transaction-timeout-s", type=float, default=8.0,
                   help="PostgreSQL idle_in_transaction_session_timeout of worker sessions, "
                        "seconds (default 8; must be below --call-budget-s); a handler call "
                        "may last 90 %% of it")
    p.add_argument("--call-budget-s", type=float, default=20.0,
                   help="budget of every guarded call (assign, seek, process, revoke), "
                        "seconds (default 20); a handler call may last 75 %% of it")
    p.add_argument("--restart-lifetimes", type=int, default=0,
                   help="start up to N fresh lifetimes after a retirement before exiting 3")
    p.add_argument("--outage-bound-s", type=float, default=DEFAULT_BOUND_S, metavar="SECONDS",
                   help="how long Kafka not answering (a broker, controller or coordinator "
                        "failover), or PostgreSQL not answering at start, is retried with "
                        f"backoff before exit 5 (default {DEFAULT_BOUND_S:g})")
    p.add_argument("--instance-id", default=None, metavar="ID",
                   help="static group membership (librdkafka group.instance.id): a restarted "
                        "member with the same ID gets its partitions back without waiting for "
                        "the session timeout; one ID per member (default $FENCE_INSTANCE_ID, "
                        "else none)")
    p.add_argument("--retry-initial-ms", type=int, default=200,
                   help="first backoff of a transient handler failure (jittered, doubling)")
    p.add_argument("--retry-max-ms", type=int, default=10_000, help="longest retry backoff")
    p.add_argument("--retry-max-attempts", type=int, default=5,
                   help="attempts of a transiently failing batch before it is bisected")
    p.add_argument("--max-attempts", type=int, default=3,
                   help="durable attempts of one record (e.g. process deaths) before it is "
                        "quarantined")
    p.add_argument("--processes", default=None, metavar="N|auto",
                   help="run N members of the group, each its own process, supervised as "
                        "one set (auto: the cores this process may use); member i serves "
                        "HTTP on --http-port + i (docs/operations.md)")
    p.add_argument("--log-level", default=None,
                   help=f"{' | '.join(n.lower() for n in _LOG_LEVELS)} (default "
                        "$FENCE_LOG_LEVEL or info)")
    add_obs_arguments(p)
    p.set_defaults(func=main, exits=EXITS)


def _instance_id(given: str | None, env: Mapping[str, str]) -> str | None:
    """``--instance-id`` as this process uses it: member i of a ``--processes`` set takes
    ``ID-i`` (static membership needs one id per member; the set's restarts keep the index)."""
    index = supervisor.member_index(env)
    return given if given is None or index is None else f"{given}-{index}"


def config_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> WorkerConfig:
    """A checked ``WorkerConfig``; raises ``ConfigError`` naming the bad setting."""
    handler, settings = _handler_of(args, env)
    cfg = WorkerConfig(
        topics=tuple(args.topic), topic_pattern=args.topic_pattern, group_id=args.group,
        bootstrap_servers=args.bootstrap_servers or env.get("KAFKA_BOOTSTRAP_SERVERS", ""),
        bootstrap_source=("--bootstrap-servers" if args.bootstrap_servers
                          else "KAFKA_BOOTSTRAP_SERVERS"),
        dsn=env.get("FENCE_DSN", ""), handler=handler,
        schema=args.schema or env.get("FENCE_SCHEMA") or "fence",
        group_protocol=GroupProtocol(args.group_protocol),
        assignment_strategy=args.assignment_strategy, auto_offset_reset=args.auto_offset_reset,
        batch_max_records=_batch_max_records(args), batch_max_bytes=args.batch_max_bytes,
        batch_linger_s=args.batch_linger_ms / 1000,
        queue_max_batches=args.queue_max_batches, db_concurrency=args.db_concurrency,
        lanes=args.lanes, lanes_window=args.lanes_window, lanes_null_any=args.lanes_null == "any",
        shutdown_timeout_s=args.shutdown_timeout_s, allow_retention_gap=args.allow_retention_gap,
        restart_lifetimes=args.restart_lifetimes, outage_bound_s=args.outage_bound_s,
        instance_id=_instance_id(args.instance_id or env.get("FENCE_INSTANCE_ID") or None, env),
        db_idle_in_transaction_timeout_s=args.db_idle_in_transaction_timeout_s,
        budget_s=args.call_budget_s,
        x_options={**client_properties(env), **parse_x_options(args.x)},
        retry=RetryPolicy(initial_ms=args.retry_initial_ms, max_ms=args.retry_max_ms,
                          retry_max_attempts=args.retry_max_attempts,
                          max_attempts=args.max_attempts),
        handler_settings=settings)
    cfg.check()
    return cfg


def _handler_of(args: argparse.Namespace, env: Mapping[str, str]
                ) -> tuple[str, dict[str, str]]:
    """The handler spec and factory settings: ``--handler``/``--handler-setting``, or the
    table sink's factory for ``--sink table=NAME [--sink-key COL] [--sink-format F]
    [--sink-key-format F] [--sink-evolve MODE]`` (``FENCE_SINK_EVOLVE`` when the flag is
    not given; ``SCHEMA_REGISTRY_URL`` as its ``registry``, ``FENCE_DDL_DSN`` as its
    ``ddl_dsn``)."""
    settings = parse_x_options(args.handler_setting, flag="--handler-setting",
                               strip_values=False)
    options = {attr: getattr(args, attr, None) for attr, _flag, _setting in SINK_FLAGS}
    if args.sink is not None and options.get("sink_evolve") is None:
        options["sink_evolve"] = env.get("FENCE_SINK_EVOLVE") or None
    chosen = handler_from_flags(
        handler=args.handler, settings=settings, sink=args.sink, sink_options=options,
        registry=env.get("SCHEMA_REGISTRY_URL", ""), ddl_dsn=env.get("FENCE_DDL_DSN", ""))
    if chosen is None:
        return DEFAULT_HANDLER, settings
    if chosen.settings.get("envelope"):
        from fencing.postgres.sink.debezium import not_a_table_topic

        for topic in args.topic:
            why = not_a_table_topic(topic)
            if why is not None:
                raise ConfigError(f"--topic {topic}: {why}; --sink-envelope debezium reads a "
                                  "table's change events (its topic is PREFIX.SCHEMA.TABLE)")
    return chosen.spec, dict(chosen.settings)


def _batch_max_records(args: argparse.Namespace) -> int:
    """``--batch-max-records``, else the table sink's larger default, else the worker's."""
    if args.batch_max_records is not None:
        return int(args.batch_max_records)
    if args.sink is not None:
        return SINK_BATCH_MAX_RECORDS
    return DEFAULT_BATCH_MAX_RECORDS


def log_level_from(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """The logging level of ``--log-level`` or ``FENCE_LOG_LEVEL`` (default info); raises
    ``ConfigError`` naming the one that holds an unknown level."""
    name, where = (args.log_level, "--log-level") if args.log_level is not None else (
        env.get("FENCE_LOG_LEVEL") or "info", "FENCE_LOG_LEVEL")
    if str(name).upper() not in _LOG_LEVELS:
        raise ConfigError(f"{where} {name!r}: use one of "
                          f"{', '.join(n.lower() for n in _LOG_LEVELS)}")
    return int(getattr(logging, str(name).upper()))


def main(args: argparse.Namespace) -> int:
    dsn = os.environ.get("FENCE_DSN", "")
    try:
        level = log_level_from(args, os.environ)
    except ConfigError as exc:
        print(f"fencectl run: {exc}", file=sys.stderr)
        return int(ExitCode.CONFIG)
    logging.basicConfig(level=level,
                        format="%(asctime)s %(levelname)s %(name)s pid=%(process)d %(message)s")
    for sig in (signal.SIGTERM, signal.SIGINT):  # a stop during start-up is honoured (exit 0)
        signal.signal(sig, lambda _sig, _frame: _EARLY_STOP.set())
    try:
        cfg = config_from_args(args, os.environ)
        obs_options = obs_options_from_args(args)
        if (index := supervisor.member_index(os.environ)) is not None and obs_options.http_port:
            # inside a set, member i serves HTTP on the set's port + i (0: any free port)
            obs_options = dataclasses.replace(obs_options,
                                              http_port=obs_options.http_port + index)
        check_consumer_settings(kafka_settings(cfg))  # librdkafka's own refusals, up front
        crash = crashpoints.armed()  # FENCE_CRASH_AT (the crash-point matrix)
        members = supervisor.members_asked(args.processes, os.environ)
    except ConfigError as exc:
        print(f"fencectl run: {redact(str(exc), dsn=dsn)}", file=sys.stderr)
        return int(ExitCode.CONFIG)
    if members is not None:  # a member drains, leaves the group, closes: past that, killed
        return supervisor.run_set(getattr(args, "argv", None), members, cfg.group_id,
                                  grace_s=cfg.shutdown_timeout_s + cfg.budget_s + 20,
                                  stop_early=_EARLY_STOP.is_set())
    if crash is not None:
        log.warning("crash point armed: %s@%d (SIG%s, marker %s)", crash.point, crash.nth,
                    crash.signal_name, crash.marker)
    with asyncio.Runner() as runner:
        try:
            code = runner.run(_run(cfg, obs_options))
        except ConfigError as exc:
            print(f"fencectl run: {redact(str(exc), dsn=dsn)}", file=sys.stderr)
            return int(ExitCode.CONFIG)
        except (SourceUnavailable, StoreUnavailable) as exc:  # a service did not answer
            if _EARLY_STOP.is_set():
                log.info("stopped during start-up (%s)", redact(str(exc), dsn=dsn))
                return int(ExitCode.OK)
            print(f"fencectl run: {redact(str(exc), dsn=dsn)}", file=sys.stderr)
            return int(exit_code_for(exc))
        if code is ExitCode.SHUTDOWN_TIMEOUT:
            # Work that ignored cancellation is still on the loop: closing the runner would
            # wait for it forever. The bound is final: leave without waiting.
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(int(code))
    return int(code)


async def _run(cfg: WorkerConfig, obs_options: ObsOptions | None = None) -> ExitCode:
    from consumer.lifecycle import Lifecycle
    from consumer.observability.otel_tracing import OtelTracing
    from consumer.observability.tracecontext import links_for_records
    from ops.worker.telemetry import setup_telemetry

    loaded = build_handler(cfg.handler, HandlerContext(
        schema=cfg.schema, group_id=cfg.group_id, topics=tuple(dict.fromkeys(cfg.topics)),
        settings=cfg.handler_settings))  # a --topic-pattern's topics are not known up front
    partition_counts = await startup.probe_kafka(cfg, stopped=_EARLY_STOP.is_set)
    source = KafkaSource(startup.admin_conf(cfg))
    store = await startup.open_store(cfg, stopped=_EARLY_STOP.is_set)
    telemetry = setup_telemetry()  # OTEL_SERVICE_NAME, default fenceworker

    async def own_frontiers(tps: Sequence[TopicPartition]) -> dict[TopicPartition, Token | None]:
        # lag samples read the lifetime's retained tokens (the frontiers it committed: only
        # the owner moves them), not PostgreSQL, so an idle worker issues no statement
        return worker.tokens(tps)

    obs = WorkerObservability(options=obs_options or ObsOptions(), telemetry=telemetry,
                              store=store, cooperative=cfg.cooperative,
                              lag_facts=lambda tps: worker.watched_facts(tps),
                              observe=own_frontiers,
                              group_id=cfg.group_id, member_detail={
                                  "handler": record_of(cfg.handler, cfg.handler_settings)},
                              declaration=declaration_of(loaded.fn))
    obs.instruments.export_zeros(TopicPartition(topic, p)
                                 for topic, count in partition_counts.items()
                                 for p in range(count))
    try:
        await startup.ensure_handler_tables(cfg, loaded)
        settings = kafka_settings(cfg)
        worker = Worker(
            config=cfg, handler=loaded.fn, source=source,
            lifecycle_factory=lambda lid: Lifecycle(
                store=store, lifetime_id=lid, clock=time.monotonic, wait=asyncio.sleep,
                budget_s=cfg.budget_s, auto_offset_reset=cfg.auto_offset_reset,
                allow_retention_gap=cfg.allow_retention_gap, instruments=obs.instruments,
                tracing=OtelTracing(),
                idle_in_transaction_s=cfg.db_idle_in_transaction_timeout_s),
            kafka_factory=lambda rb: KafkaThread(
                settings=settings, topic=cfg.subscription, cooperative=cfg.cooperative,
                rebalancer=rb, poll_timeout_s=cfg.poll_timeout_s, clock=time.monotonic,
                on_commit_failure=obs.instruments.kafka_commit_failed,
                outage_bound_s=cfg.outage_bound_s),
            on_event=obs.on_event, instruments=obs.instruments, tracing=OtelTracing(),
            trace_links=links_for_records if telemetry.exporting else None)
        obs.member_id_source = lambda: worker.member_id
        obs.on_operator_owned = worker.operator_owned
        obs.observer.progress = worker.progress
        obs.observer.lanes = worker.lanes
        obs.observer.mirror = worker.offset_mirror
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.request_stop)
        if _EARLY_STOP.is_set():
            worker.request_stop()
        try:
            obs.start()
        except OSError as exc:
            raise ConfigError(f"--http-host {obs.options.http_host} --http-port "
                              f"{obs.options.http_port}: cannot serve there: {exc}") from None
        log.info("worker starting: topics=%s pattern=%s group=%s protocol=%s strategy=%s "
                 "schema=%s", ",".join(partition_counts) or "-", cfg.topic_pattern or "-",
                 cfg.group_id, cfg.group_protocol.value,
                 settings.get("partition.assignment.strategy", "-"), cfg.schema)
        startup.settle_heap()
        code = await worker.run()
        log.info("worker exits with %d (%s)", int(code), code.name)
        return code
    finally:
        await obs.close()
        await asyncio.to_thread(telemetry.shutdown, timeout_s=3.0)
        await store.close(timeout_s=5.0)  # abandoned work may still hold a connection
