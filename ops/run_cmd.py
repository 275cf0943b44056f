"""``fencectl run``: the worker process (flags + environment -> ``consumer.worker.Worker``).

Settings: flags below; ``KAFKA_BOOTSTRAP_SERVERS``, ``FENCE_DSN`` (never a flag: a secret
must not appear in argv), ``FENCE_SCHEMA``, standard ``OTEL_*``. Exit codes: see
``consumer.exits`` (0 stopped, 2 configuration, 3 retired, 4 source refused,
5 unavailable, 6 shutdown bound exceeded).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from consumer.adapter import KafkaThread
from consumer.config import (
    DEFAULT_HANDLER,
    GroupProtocol,
    WorkerConfig,
    kafka_settings,
    parse_x_options,
    redact,
)
from consumer.exits import ExitCode
from consumer.source import KafkaSource
from consumer.worker import Worker
from fencing.errors import (
    ConfigError,
    SchemaMismatch,
    SourceRefused,
    SourceUnavailable,
    StoreUnavailable,
)
from ops.db import connection
from ops.observability import ObsOptions, WorkerObservability
from ops.observability import add_arguments as add_obs_arguments
from ops.observability import options_from_args as obs_options_from_args

__all__ = ["config_from_args", "register"]

log = logging.getLogger("fenceworker.run")

_EARLY_STOP = threading.Event()
_ADMIN_PREFIXES = ("security.", "sasl.", "ssl.", "client.", "socket.", "broker.")


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="run a fenced consumer-group worker",
                       description="Consume a topic with exactly-once effects in PostgreSQL.")
    p.add_argument("--topic", required=True)
    p.add_argument("--group", required=True, help="consumer group id")
    p.add_argument("--handler", default=DEFAULT_HANDLER, help="effect handler module:callable")
    p.add_argument("-X", dest="x", action="append", default=[], metavar="KEY=VALUE",
                   help="librdkafka consumer property (repeatable)")
    p.add_argument("--bootstrap-servers", default=None,
                   help="default: $KAFKA_BOOTSTRAP_SERVERS")
    p.add_argument("--schema", default=None, help="PostgreSQL schema (default $FENCE_SCHEMA "
                   "or fence)")
    p.add_argument("--batch-max-records", type=int, default=500)
    p.add_argument("--batch-max-bytes", type=int, default=1 << 20)
    p.add_argument("--queue-max-batches", type=int, default=16,
                   help="pause a partition once this many batches wait locally")
    p.add_argument("--db-concurrency", type=int, default=4)
    p.add_argument("--shutdown-timeout-s", type=float, default=15.0)
    p.add_argument("--group-protocol", choices=[g.value for g in GroupProtocol],
                   default="classic")
    p.add_argument("--assignment-strategy", default="cooperative-sticky",
                   help="classic protocol: range, roundrobin or cooperative-sticky")
    p.add_argument("--auto-offset-reset", choices=["earliest", "latest"], default="earliest")
    p.add_argument("--allow-retention-gap", action="store_true",
                   help="skip (and journal) records deleted before processing")
    p.add_argument("--db-idle-in-transaction-timeout-s", type=float, default=8.0,
                   help="PostgreSQL idle_in_transaction_session_timeout of worker sessions")
    p.add_argument("--restart-lifetimes", type=int, default=0,
                   help="start up to N fresh lifetimes after a retirement before exiting 3")
    p.add_argument("--log-level", default=os.environ.get("FENCE_LOG_LEVEL", "INFO"))
    add_obs_arguments(p)
    p.set_defaults(func=main)


def config_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> WorkerConfig:
    """A checked ``WorkerConfig``; raises ``ConfigError`` naming the bad setting."""
    cfg = WorkerConfig(
        topic=args.topic, group_id=args.group,
        bootstrap_servers=args.bootstrap_servers or env.get("KAFKA_BOOTSTRAP_SERVERS", ""),
        dsn=env.get("FENCE_DSN", ""), handler=args.handler,
        schema=args.schema or env.get("FENCE_SCHEMA") or "fence",
        group_protocol=GroupProtocol(args.group_protocol),
        assignment_strategy=args.assignment_strategy, auto_offset_reset=args.auto_offset_reset,
        batch_max_records=args.batch_max_records, batch_max_bytes=args.batch_max_bytes,
        queue_max_batches=args.queue_max_batches, db_concurrency=args.db_concurrency,
        shutdown_timeout_s=args.shutdown_timeout_s, allow_retention_gap=args.allow_retention_gap,
        restart_lifetimes=args.restart_lifetimes,
        db_idle_in_transaction_timeout_s=args.db_idle_in_transaction_timeout_s,
        x_options=parse_x_options(args.x))
    cfg.check()
    return cfg


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s pid=%(process)d %(message)s")
    dsn = os.environ.get("FENCE_DSN", "")
    for sig in (signal.SIGTERM, signal.SIGINT):  # a stop during start-up is honoured (exit 0)
        signal.signal(sig, lambda _sig, _frame: _EARLY_STOP.set())
    try:
        cfg = config_from_args(args, os.environ)
        obs_options = obs_options_from_args(args)
    except ConfigError as exc:
        print(f"fencectl run: {redact(str(exc), dsn=dsn)}", file=sys.stderr)
        return int(ExitCode.CONFIG)
    with asyncio.Runner() as runner:
        try:
            code = runner.run(_run(cfg, obs_options))
        except ConfigError as exc:
            print(f"fencectl run: {redact(str(exc), dsn=dsn)}", file=sys.stderr)
            return int(ExitCode.CONFIG)
        if code is ExitCode.SHUTDOWN_TIMEOUT:
            # Work that ignored cancellation is still on the loop: closing the runner would
            # wait for it forever. The bound is final: leave without waiting.
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(int(code))
    return int(code)


def _admin_conf(cfg: WorkerConfig) -> dict[str, str]:
    conf = {"bootstrap.servers": cfg.bootstrap_servers}
    conf.update({k: v for k, v in cfg.x_options.items() if k.startswith(_ADMIN_PREFIXES)})
    return conf


async def _open_store(cfg: WorkerConfig) -> Any:
    from fencing.pgstore import PgFenceStore

    try:
        return await PgFenceStore.connect(cfg.dsn, group_id=cfg.group_id, schema=cfg.schema,
                                          pool_min=1, pool_max=cfg.db_concurrency + 1,
                                          server_settings={
                                              "idle_in_transaction_session_timeout": str(int(
                                                  cfg.db_idle_in_transaction_timeout_s * 1000)),
                                              "application_name": "fenceworker"})
    except SchemaMismatch as exc:
        raise ConfigError(f"{exc}; the worker never migrates: run `fencectl migrate "
                          f"--schema {cfg.schema}`") from exc
    except StoreUnavailable as exc:
        raise ConfigError(f"FENCE_DSN: PostgreSQL unreachable at start: "
                          f"{redact(str(exc), dsn=cfg.dsn)}") from None


def _schema_bound(handler: Any, cfg: WorkerConfig) -> Any:
    """The reference handler follows ``--schema`` even if its module was imported earlier."""
    module_name, _, attr = cfg.handler.partition(":")
    module = importlib.import_module(module_name)
    factory = getattr(module, "make_pg_handler", None)
    if attr == "ref_handler" and callable(factory):
        return factory(schema=cfg.schema)
    return handler


async def _ensure_handler_tables(cfg: WorkerConfig) -> None:
    """Call the handler module's ``ensure_tables(conn, schema)`` if it provides one."""
    import asyncpg

    module = importlib.import_module(cfg.handler.partition(":")[0])
    ensure = getattr(module, "ensure_tables", None)
    if ensure is None:
        return
    try:
        async with connection(cfg.dsn) as conn:
            await ensure(conn, cfg.schema)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise ConfigError(f"FENCE_DSN: creating the handler's tables failed: "
                          f"{redact(str(exc), dsn=cfg.dsn)}") from None


async def _run(cfg: WorkerConfig, obs_options: ObsOptions | None = None) -> ExitCode:
    from consumer.lifecycle import Lifecycle
    from fencing.handler import load_handler
    from ops.telemetry import setup_telemetry

    os.environ["FENCE_SCHEMA"] = cfg.schema  # the reference handler reads it at import
    handler = _schema_bound(load_handler(cfg.handler), cfg)
    source = KafkaSource(_admin_conf(cfg))
    if not await asyncio.to_thread(source.list_topics_ok, 5.0):
        raise ConfigError(f"KAFKA_BOOTSTRAP_SERVERS={cfg.bootstrap_servers}: Kafka unreachable "
                          "at start")
    try:
        await asyncio.to_thread(source.topic_id, cfg.topic)
    except SourceRefused as exc:
        raise ConfigError(f"--topic {cfg.topic}: {exc}") from None
    except SourceUnavailable as exc:
        raise ConfigError(f"KAFKA_BOOTSTRAP_SERVERS: {exc}") from None
    store = await _open_store(cfg)
    telemetry = setup_telemetry()  # OTEL_SERVICE_NAME, default fenceworker
    obs = WorkerObservability(options=obs_options or ObsOptions(), telemetry=telemetry,
                              store=store, cooperative=cfg.cooperative,
                              lag_facts=source.facts, observe=store.observe,
                              group_id=cfg.group_id)
    try:
        await _ensure_handler_tables(cfg)
        settings = kafka_settings(cfg)
        worker = Worker(
            config=cfg, handler=handler, source=source,
            lifecycle_factory=lambda lid: Lifecycle(
                store=store, lifetime_id=lid, clock=time.monotonic, wait=asyncio.sleep,
                budget_s=cfg.budget_s, auto_offset_reset=cfg.auto_offset_reset,
                allow_retention_gap=cfg.allow_retention_gap, instruments=obs.instruments),
            kafka_factory=lambda rb: KafkaThread(
                settings=settings, topic=cfg.topic, cooperative=cfg.cooperative,
                rebalancer=rb, poll_timeout_s=cfg.poll_timeout_s, clock=time.monotonic,
                on_commit_failure=obs.instruments.kafka_commit_failed),
            on_event=obs.on_event, trace_links=telemetry.exporting)
        obs.member_id_source = lambda: worker.member_id
        obs.observer.progress = worker.progress
        obs.observer.mirror = worker.offset_mirror
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.request_stop)
        if _EARLY_STOP.is_set():
            worker.request_stop()
        try:
            obs.start()
        except OSError as exc:
            raise ConfigError(f"--http-port {obs.options.http_port}: {exc}") from None
        log.info("worker starting: topic=%s group=%s protocol=%s strategy=%s schema=%s",
                 cfg.topic, cfg.group_id, cfg.group_protocol.value,
                 settings.get("partition.assignment.strategy", "-"), cfg.schema)
        code = await worker.run()
        log.info("worker exits with %d (%s)", int(code), code.name)
        return code
    finally:
        await obs.close()
        await asyncio.to_thread(telemetry.shutdown, timeout_s=3.0)
        await store.close(timeout_s=5.0)  # abandoned work may still hold a connection
