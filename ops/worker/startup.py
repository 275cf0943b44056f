"""Start-up of one ``fencectl run`` before the worker starts: Kafka reachable and every named
topic present (``ConfigError`` naming the setting otherwise), the store opened with the
worker's session settings, the handler factory's tables ensured; then the heap settled
(``settle_heap``) right before the worker starts consuming.

Rules
- A configuration mistake is a ``ConfigError`` (exit 2, at once) whose message names what to
  fix: a missing ``--topic``, a refused login, an unknown database or host name, a
  malformed DSN, an unknown schema version. The password in ``FENCE_DSN`` never appears.
- A service that does not answer (Kafka's metadata request times out; PostgreSQL refuses or
  drops the connection, times out, is starting up or shutting down) is transient: retried
  with backoff within ``--outage-bound-s`` (``consumer.outage``), each retry logged; past
  the bound ``SourceUnavailable`` / ``StoreUnavailable`` (exit 5) names the service, how
  long it did not answer and its last error. A stop requested meanwhile ends the retries.
- The probe's own librdkafka log is off: its result is the one message.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from consumer.config import WorkerConfig, redact
from consumer.kafka.source import KafkaSource
from consumer.outage import kafka_gave_up, retry_outage_async
from fencing.errors import (
    ConfigError,
    SchemaMismatch,
    SourceRefused,
    SourceUnavailable,
    StoreUnavailable,
)
from fencing.handler import LoadedHandler
from ops.hints import schema_advice
from ops.operator.db import connect_mistake, connection, server_not_answering

__all__ = ["GC_YOUNG_THRESHOLD", "admin_conf", "ensure_handler_tables", "open_store",
           "probe_kafka", "settle_heap"]

log = logging.getLogger("fenceworker.run")

_ADMIN_PREFIXES = ("security.", "sasl.", "ssl.", "client.", "socket.", "broker.")
_PROBE_TIMEOUT_S = 5.0
T = TypeVar("T")


def _pg_gave_up(cfg: WorkerConfig) -> Callable[[BaseException, float], BaseException]:
    def give_up(exc: BaseException, elapsed_s: float) -> BaseException:
        return StoreUnavailable(
            f"{exc} for {elapsed_s:.0f} s at start (--outage-bound-s "
            f"{cfg.outage_bound_s:g}); check the host and port in FENCE_DSN and that the "
            "server runs")
    return give_up


async def _within_bound(call: Callable[[], Awaitable[T]], cfg: WorkerConfig, *, service: str,
                        retry_on: type[BaseException],
                        give_up: Callable[[BaseException, float], BaseException],
                        stopped: Callable[[], bool]) -> T:
    def retrying(exc: BaseException, wait_s: float) -> None:
        log.warning("%s not answering at start (%s); retrying in %.1f s (--outage-bound-s "
                    "%g)", service, redact(str(exc), dsn=cfg.dsn), wait_s, cfg.outage_bound_s)

    return await retry_outage_async(call, bound_s=cfg.outage_bound_s, retry_on=(retry_on,),
                                    give_up=give_up, clock=time.monotonic, sleep=asyncio.sleep,
                                    stopped=stopped, on_retry=retrying)


async def probe_kafka(cfg: WorkerConfig, *,
                      stopped: Callable[[], bool] = lambda: False) -> dict[str, int]:
    """Kafka answers (retried within the bound, see Rules), and the partition counts of the
    topics (``_probe_topics``)."""
    probe = KafkaSource(_probe_conf(cfg), request_timeout_s=_PROBE_TIMEOUT_S)

    async def reach() -> dict[str, int]:
        if not await asyncio.to_thread(probe.list_topics_ok, _PROBE_TIMEOUT_S):
            raise SourceUnavailable(f"no answer to a metadata request within "
                                    f"{_PROBE_TIMEOUT_S:g} s")
        return await _probe_topics(cfg, probe)

    return await _within_bound(reach, cfg, service="Kafka", retry_on=SourceUnavailable,
                               give_up=kafka_gave_up(where=cfg.bootstrap_source,
                                                     servers=cfg.bootstrap_servers,
                                                     bound_s=cfg.outage_bound_s),
                               stopped=stopped)


def admin_conf(cfg: WorkerConfig) -> dict[str, str]:
    conf = {"bootstrap.servers": cfg.bootstrap_servers}
    conf.update({k: v for k, v in cfg.x_options.items() if k.startswith(_ADMIN_PREFIXES)})
    return conf


def _probe_conf(cfg: WorkerConfig) -> dict[str, str]:
    """The start-up probe's AdminClient: librdkafka's own log is off (an unreachable broker
    would print a line per connection attempt); the probe's result is the one message."""
    return {**admin_conf(cfg), "log_level": "0"}


async def open_store(cfg: WorkerConfig, *, stopped: Callable[[], bool] = lambda: False) -> Any:
    """The worker's store; a server not answering is retried within the bound (see Rules)."""
    return await _within_bound(lambda: _open_store(cfg), cfg, service="PostgreSQL",
                               retry_on=StoreUnavailable, give_up=_pg_gave_up(cfg),
                               stopped=stopped)


async def _open_store(cfg: WorkerConfig) -> Any:
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
        transient = server_not_answering(exc, dsn=cfg.dsn)
        if transient is not None:
            raise StoreUnavailable(transient) from None
        raise ConfigError(connect_mistake(exc, dsn=cfg.dsn) or (
            f"FENCE_DSN: PostgreSQL refused the worker at start: "
            f"{redact(str(exc), dsn=cfg.dsn)}")) from None


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
    ``ConfigError`` naming a missing topic, ``SourceUnavailable`` when Kafka did not
    answer."""
    topics = list(dict.fromkeys(cfg.topics))
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
