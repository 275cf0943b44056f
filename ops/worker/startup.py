"""Start-up of one ``fencectl run`` before the worker starts: Kafka reachable and every named
topic present (``ConfigError`` naming the setting otherwise), the store opened with the
worker's session settings, the handler factory's tables ensured; then the heap settled
(``settle_heap``) right before the worker starts consuming.

Rules
- Every failure here is a ``ConfigError`` (exit 2) whose message names what to fix; the
  password in ``FENCE_DSN`` never appears in it.
- The probe's own librdkafka log is off: its result is the one message.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

from consumer.config import WorkerConfig, redact
from consumer.kafka.source import KafkaSource
from fencing.errors import (
    ConfigError,
    SchemaMismatch,
    SourceRefused,
    SourceUnavailable,
    StoreUnavailable,
)
from fencing.handler import LoadedHandler
from ops.hints import schema_advice
from ops.operator.db import connect_mistake, connection

__all__ = ["GC_YOUNG_THRESHOLD", "admin_conf", "ensure_handler_tables", "open_store",
           "probe_kafka", "settle_heap"]

log = logging.getLogger("fenceworker.run")

_ADMIN_PREFIXES = ("security.", "sasl.", "ssl.", "client.", "socket.", "broker.")
_PROBE_TIMEOUT_S = 5.0


async def probe_kafka(cfg: WorkerConfig) -> dict[str, int]:
    """Kafka answers within the probe timeout, and the partition counts of the topics
    (``_probe_topics``)."""
    probe = KafkaSource(_probe_conf(cfg), request_timeout_s=_PROBE_TIMEOUT_S)
    if not await asyncio.to_thread(probe.list_topics_ok, _PROBE_TIMEOUT_S):
        raise ConfigError(f"{cfg.bootstrap_source} {cfg.bootstrap_servers}: cannot reach Kafka "
                          f"(no answer within {_PROBE_TIMEOUT_S:g} s at start); check the host "
                          "and port (and any -X security settings)")
    return await _probe_topics(cfg, probe)


def admin_conf(cfg: WorkerConfig) -> dict[str, str]:
    conf = {"bootstrap.servers": cfg.bootstrap_servers}
    conf.update({k: v for k, v in cfg.x_options.items() if k.startswith(_ADMIN_PREFIXES)})
    return conf


def _probe_conf(cfg: WorkerConfig) -> dict[str, str]:
    """The start-up probe's AdminClient: librdkafka's own log is off (an unreachable broker
    would print a line per connection attempt); the probe's result is the one message."""
    return {**admin_conf(cfg), "log_level": "0"}


async def open_store(cfg: WorkerConfig) -> Any:
    from fencing.postgres.store import APPLICATION_NAME, PgFenceStore

    try:
        return await PgFenceStore.connect(
            cfg.dsn, group_id=cfg.group_id, schema=cfg.schema, pool_min=1,
            pool_max=cfg.db_concurrency + 1,
            # a claim blocked this long by an older owner's session ends it (a zombie frozen
            # mid-statement is never idle in transaction); well inside the claim's timeout
            unblock_after_s=min(5.0, cfg.db_idle_in_transaction_timeout_s),
            server_settings={
                "idle_in_transaction_session_timeout": str(int(
                    cfg.db_idle_in_transaction_timeout_s * 1000)),
                "application_name": APPLICATION_NAME})
    except SchemaMismatch as exc:
        raise ConfigError(f"{schema_advice(exc, cfg.schema)} (the worker never migrates)") \
            from exc
    except StoreUnavailable as exc:
        raise ConfigError(connect_mistake(exc, dsn=cfg.dsn) or (
            f"FENCE_DSN: PostgreSQL unreachable at start: {redact(str(exc), dsn=cfg.dsn)}")) \
            from None


async def ensure_handler_tables(cfg: WorkerConfig, loaded: LoadedHandler) -> None:
    """Run the handler factory's ``ensure_tables`` once, before any batch."""
    import asyncpg

    if loaded.ensure_tables is None:
        return
    try:
        async with connection(cfg.dsn) as conn:
            await loaded.ensure_tables(conn)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise ConfigError(f"FENCE_DSN: creating the handler's tables failed: "
                          f"{redact(str(exc), dsn=cfg.dsn)}") from None


async def _probe_topics(cfg: WorkerConfig, probe: KafkaSource) -> dict[str, int]:
    """Partition counts of every ``--topic`` (each must exist) and of the topics matching
    ``--topic-pattern`` now (none is fine: later ones are picked up while running). Raises
    ``ConfigError`` naming the topic or the bootstrap setting."""
    topics = list(dict.fromkeys(cfg.topics))
    try:
        if cfg.topic_pattern is not None:
            matched = await asyncio.to_thread(probe.matching_topics, cfg.topic_pattern)
            topics += [t for t in matched if t not in topics]
            log.info("--topic-pattern %s matches %d topic(s) now: %s", cfg.topic_pattern,
                     len(matched), ", ".join(matched) or "none yet")
        counts: dict[str, int] = {}
        for topic in topics:
            try:
                counts[topic] = (await asyncio.to_thread(probe.topic_id, topic))[1]
            except SourceRefused as exc:
                if topic in cfg.topics:
                    raise ConfigError(f"--topic {topic}: {exc}") from None
                log.warning("topic %s matched --topic-pattern but is gone: %s", topic, exc)
    except SourceUnavailable as exc:
        raise ConfigError(f"{cfg.bootstrap_source} {cfg.bootstrap_servers}: {exc}") from None
    return counts


#: CPython's cyclic collector runs a young collection every ``threshold0`` net allocations of
#: tracked objects (default 700) and, every ten of those, an older one; a full collection
#: walks every tracked object of the process. A worker at full speed allocates several
#: tracked objects per record (its ``SourceRecord``, the buffer's entry, asyncio's futures
#: and handles per batch) and holds up to its queue bounds of records alive, so with the
#: defaults the collector took 1.6 s of CPU in a 200,000-record `make bench` run (2,273
#: young, 207 middle and 18 full collections, measured with ``gc.callbacks``) -- about 15%
#: of the worker's time, spent proving that records freed by reference counting form no
#: cycles. The same held for the unfenced baseline (1.4 s).
GC_YOUNG_THRESHOLD = 20_000


def settle_heap(young_threshold: int = GC_YOUNG_THRESHOLD) -> None:
    """Collect once, freeze what is left (modules, configuration, pools, the telemetry SDK:
    start-up state that is never garbage, so no later collection walks it again), and run
    young collections every ``young_threshold`` allocations instead of 700. Cycles are
    still collected; between two young collections at most ``young_threshold`` tracked
    objects wait (a few MiB at most). Measured: the collector's CPU per 200,000 records
    1.6 s -> 0.24 s (docs/benchmarks.md)."""
    gc.collect()
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, old)
