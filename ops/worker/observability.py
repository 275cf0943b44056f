"""Observability of one ``fencectl run`` process: flags, and the pieces wired together.

``WorkerObservability`` owns the metric instruments, the readiness state, the loop
heartbeat, the per-lifetime member heartbeats (``members`` table; ``member_detail``, e.g.
the handler the run records for ``fencectl quarantine replay``, goes into every row), lag
sampling and the HTTP port (``/metrics``, ``/healthz``, ``/readyz``). ``fencectl run`` passes
``instruments`` to each ``Lifecycle`` and ``on_event`` to the ``Worker``.

Flags: ``--http-port`` (default ``$FENCE_HTTP_PORT``; unset: no HTTP server; 0: any free
port, logged), ``--http-host`` (default ``$FENCE_HTTP_HOST`` or 127.0.0.1),
``--heartbeat-interval-s`` (default 5;
a member is shown unavailable after 3 intervals without a heartbeat), ``--stall-timeout-s``
(default 30; ``consumer.observability.stall``), ``--offset-mirror-warn-s`` (default 30;
``consumer.mirror``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from consumer.events import WorkerEvent
from consumer.observability.heartbeat import HeartbeatStore, MemberHeartbeat, MemberIdentity
from consumer.observability.instruments import Instruments
from consumer.observability.observer import LagFacts, Observe, WorkerObserver
from consumer.observability.readiness import LoopHeartbeat, ReadinessHolder
from fencing.errors import ConfigError
from fencing.handler import Declaration
from fencing.postgres.sink.unknown import STALE_CHANGES, UNKNOWN_FIELDS
from fencing.types import TopicPartition
from ops.worker.http import HttpServer, start_http_server
from ops.worker.telemetry import Telemetry

__all__ = ["ObsOptions", "WorkerObservability", "add_arguments", "options_from_args"]

log = logging.getLogger("fenceworker.observability")


@dataclass(frozen=True, slots=True)
class ObsOptions:
    # HTTP port for /metrics /healthz /readyz; None: no server; 0: any free port
    http_port: int | None = None
    # interface the HTTP server binds (default loopback)
    http_host: str = "127.0.0.1"
    # seconds between member heartbeats (default 5)
    heartbeat_interval_s: float = 5.0
    # /healthz turns 503 when the loop has not beaten for this long, seconds (default 15)
    health_bound_s: float = 15.0
    # seconds between lag samples (default 5, or a third of the stall timeout if smaller)
    lag_interval_s: float = 5.0
    # an owned partition with lag and no fetch or commit progress this long is stalled (s)
    stall_timeout_s: float = 30.0
    # warn when Kafka's committed offset has lagged the durable frontier this long (s)
    offset_mirror_warn_s: float = 30.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the flags; reads no environment (``options_from_args`` does, so a bad
    ``FENCE_HTTP_PORT`` concerns only the command that uses it)."""
    parser.add_argument("--http-port", type=int, default=None,
                        help="serve /metrics /healthz /readyz on this port (default "
                             "$FENCE_HTTP_PORT; unset: off; 0: any free port)")
    parser.add_argument("--http-host", default=os.environ.get("FENCE_HTTP_HOST", "127.0.0.1"),
                        help="interface for the HTTP port (default $FENCE_HTTP_HOST or "
                             "127.0.0.1; 0.0.0.0 inside a container)")
    parser.add_argument("--heartbeat-interval-s", type=float, default=5.0,
                        help="member heartbeat interval, seconds (default 5)")
    parser.add_argument("--stall-timeout-s", type=float, default=30.0,
                        help="report an owned partition with lag and no fetch or commit "
                             "progress for this long as stalled (/readyz, metrics, status; "
                             "default 30)")
    parser.add_argument("--offset-mirror-warn-s", type=float, default=30.0,
                        help="warn when Kafka's committed offset of an owned partition has "
                             "differed from the durable frontier this long without a "
                             "successful commit, seconds (default 30)")


def _port_from(args: argparse.Namespace, env: Mapping[str, str]) -> int | None:
    if args.http_port is not None:
        if not 0 <= args.http_port <= 65535:
            raise ConfigError(f"--http-port {args.http_port}: use 0..65535")
        return int(args.http_port)
    raw = env.get("FENCE_HTTP_PORT", "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 0 <= int(raw) <= 65535:
        raise ConfigError(f"FENCE_HTTP_PORT={raw!r}: not a port number; use 0..65535 (0: any "
                          "free port) or unset it (no HTTP server)")
    return int(raw)


def options_from_args(args: argparse.Namespace,
                      env: Mapping[str, str] | None = None) -> ObsOptions:
    """Checked options from ``args`` parsed with ``add_arguments`` and ``env`` (default
    ``os.environ``: ``FENCE_HTTP_PORT`` when ``--http-port`` is not given); ``ConfigError``
    names the bad flag or variable."""
    port = _port_from(args, os.environ if env is None else env)
    interval = float(args.heartbeat_interval_s)
    if not 0 < interval <= 300:
        raise ConfigError(f"--heartbeat-interval-s {interval}: use (0, 300]")
    stall_s = float(args.stall_timeout_s)
    if not 0 < stall_s <= 86_400:
        raise ConfigError(f"--stall-timeout-s {stall_s}: use (0, 86400]")
    mirror_s = float(args.offset_mirror_warn_s)
    if not 0 < mirror_s <= 86_400:
        raise ConfigError(f"--offset-mirror-warn-s {mirror_s}: use (0, 86400]")
    return ObsOptions(http_port=port, http_host=args.http_host,
                      heartbeat_interval_s=interval,
                      health_bound_s=max(15.0, 3 * interval),
                      lag_interval_s=min(5.0, stall_s / 3), stall_timeout_s=stall_s,
                      offset_mirror_warn_s=mirror_s)


def _unknown_fields() -> dict[str, Any]:
    """A member row's ``sink_unknown_fields`` and ``sink_stale_changes`` (``fencectl
    status``), when there are any."""
    got = UNKNOWN_FIELDS.detail()
    stale = {table: n for table, n in STALE_CHANGES.counts().items() if n}
    return ({"sink_unknown_fields": got} if any(v["records"] for v in got.values()) else {}) | (
        {"sink_stale_changes": stale} if stale else {})


class WorkerObservability:
    """Start with ``start()``, stop with ``close()``; see the module docstring."""

    def __init__(
        self,
        *,
        options: ObsOptions,
        telemetry: Telemetry,
        store: HeartbeatStore,
        cooperative: bool,
        lag_facts: LagFacts | None = None,
        observe: Observe | None = None,
        group_id: str = "",
        member_detail: Mapping[str, Any] | None = None,
        declaration: Declaration | None = None,
    ) -> None:
        """``member_detail``: written in every member row (``detail.handler``: the handler's
        record, ``ops.operator.handler_record``); ``declaration``: the handler's, added to
        that ``detail.handler`` and to the metrics (``Instruments.declare``)."""
        self.options = options
        self.telemetry = telemetry
        self.instruments = Instruments(telemetry.meter(), group_id=group_id)
        self.instruments.watch_unknown_fields(UNKNOWN_FIELDS.records)
        self.instruments.watch_stale_changes(STALE_CHANGES.counts)
        handler = dict((member_detail or {}).get("handler") or {})
        if declaration is not None:
            handler.update(declaration.as_dict())
            self.instruments.declare(declaration)
        handler_detail = {**(member_detail or {}), **({"handler": handler} if handler else {})}
        self.readiness = ReadinessHolder()
        self.loop_heartbeat = LoopHeartbeat(clock=time.monotonic, bound_s=options.health_bound_s)
        # the Kafka group member id for member rows (set once the worker exists)
        self.member_id_source: Callable[[], str | None] = lambda: None
        # partitions an operator owns now, as a heartbeat read them (set once the worker
        # exists: ``Worker.operator_owned``)
        self.on_operator_owned: Callable[[Collection[TopicPartition]], None] = lambda _tps: None

        def member(lifetime: str) -> MemberHeartbeat:
            return MemberHeartbeat(
                store=store, identity=MemberIdentity.of_this_process(lifetime),
                clock=time.monotonic, interval_s=options.heartbeat_interval_s,
                member_id=lambda: self.member_id_source(), detail=handler_detail,
                live_detail=_unknown_fields,
                on_operator_owned=lambda tps: self.on_operator_owned(tps))

        self.observer = WorkerObserver(
            instruments=self.instruments, readiness=self.readiness,
            loop_heartbeat=self.loop_heartbeat, clock=time.monotonic,
            heartbeat_factory=member, cooperative=cooperative, lag_facts=lag_facts,
            observe=observe, lag_interval_s=options.lag_interval_s,
            stall_timeout_s=options.stall_timeout_s,
            mirror_warn_s=options.offset_mirror_warn_s,
            span_attrs={"messaging.system": "kafka", "messaging.consumer.group.name": group_id})
        self.http: HttpServer | None = None
        self._task: asyncio.Task[None] | None = None

    def on_event(self, event: WorkerEvent) -> None:
        """The ``Worker``'s ``on_event`` hook."""
        self.observer.on_event(event)

    def start(self) -> None:
        """Bind the HTTP port (``OSError`` if taken) and start the background task."""
        if self.options.http_port is not None:
            self.http = start_http_server(
                registry=self.telemetry.registry, readiness=self.readiness,
                heartbeat=self.loop_heartbeat, host=self.options.http_host,
                port=self.options.http_port)
            log.info("http: serving /metrics /healthz /readyz on %s", self.http.url)
        self._task = asyncio.get_running_loop().create_task(self.observer.run(),
                                                            name="observability")

    async def close(self) -> None:
        """Final member rows (bounded), stop the task and the HTTP server."""
        await self.observer.close()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout=5.0)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
        if self.http is not None:
            await asyncio.to_thread(self.http.close)
