"""``fencectl stack up | down | status | env | stop-node | start-node``: the local PostgreSQL,
Kafka (one node, or three with ``--kafka-nodes 3`` / ``FENCE_KAFKA_NODES=3``), Jaeger and
Prometheus.

Exit codes: ``EXITS`` (0 success, ``status``: every service up; 1 a service failed or is
not up; 2 bad configuration, e.g. an invalid ``FENCE_*_PORT``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from consumer.exits import Exit
from ops.hints import fencectl
from ops.stack import control as stack
from ops.stack.config import (
    KAFKA_NODE_COUNTS,
    KAFKA_NODES,
    Service,
    StackError,
    default_services,
    env_lines,
    settings_from,
)

__all__ = ["EXITS", "register"]

DONE = Exit(0, "done; `status`: every service up", "nothing")
FAILED = Exit(1, "a service failed to start, stop or become healthy; `status`: a service is "
              "not up", "read the line on stderr and the service's log under the stack "
              "directory (`.stack/`, or `FENCE_STACK_DIR`); `fencectl stack up` starts what "
              "is not running")
CONFIG = Exit(2, "an invalid `FENCE_*_PORT` (not a port, or two equal) or `FENCE_KAFKA_NODES`",
              "fix the variable the line on stderr names")
EXITS = (DONE, FAILED, CONFIG)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``stack`` command with its four actions."""
    parser = subparsers.add_parser(
        "stack",
        help="start/stop/check the local PostgreSQL, Kafka, Jaeger and Prometheus (no Docker)",
        description="Local services under .stack/ (data, logs, pids); builds cached per user.",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    nodes_help = ("Kafka nodes: 1, or 3 for a three-node cluster (every node broker + "
                  "controller, replication 3, min ISR 2) on ports of its own (default "
                  "$FENCE_KAFKA_NODES or 1)")
    up = actions.add_parser("up", help="start what is not running; return when all are healthy")
    down = actions.add_parser("down", help="stop the processes `up` started (by pid)")
    down.add_argument("--grace-s", type=float, default=30.0, help="seconds before SIGKILL (30)")
    status = actions.add_parser("status", help="each service (each Kafka node): up, down or "
                                "unhealthy, with pid and port")
    env = actions.add_parser("env", help='print export lines: eval "$(fencectl stack env)"')
    for p in (up, status, env):
        p.add_argument("--kafka-nodes", type=int, choices=KAFKA_NODE_COUNTS, default=None,
                       help=nodes_help)
    up.add_argument("--with", dest="with_", action="append", default=[],
                    choices=["debezium"], metavar="debezium",
                    help="also Kafka Connect with Debezium's PostgreSQL connector, reading "
                         "the source database 'source' on the stack's PostgreSQL (repeatable; "
                         "jars from Maven Central once)")
    stop = actions.add_parser("stop-node", help="stop one node of the three-node Kafka cluster "
                              "(a failover rehearsal)")
    stop.add_argument("node", type=int, choices=range(1, len(KAFKA_NODES) + 1), metavar="N",
                      help="the node: 1, 2 or 3")
    stop.add_argument("--kill", action="store_true",
                      help="SIGKILL at once (a crash) instead of a controlled shutdown")
    stop.add_argument("--grace-s", type=float, default=30.0, help="seconds before SIGKILL (30)")
    start = actions.add_parser("start-node", help="start one node of the three-node Kafka "
                               "cluster; return once it is healthy and in sync")
    start.add_argument("node", type=int, choices=range(1, len(KAFKA_NODES) + 1), metavar="N",
                       help="the node: 1, 2 or 3")
    parser.set_defaults(func=run, exits=EXITS)


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from(cli=fencectl())
    except StackError as exc:
        print(f"fencectl stack: {exc}", file=sys.stderr)
        return CONFIG.code
    if getattr(args, "kafka_nodes", None) is not None:
        settings = dataclasses.replace(settings, kafka_nodes=args.kafka_nodes,
                                       kafka_nodes_chosen=True)
    try:
        if args.action == "up":
            extra = (Service.CONNECT,) if "debezium" in args.with_ else ()
            stack.up(settings, services=(*default_services(settings.kafka_nodes), *extra))
            return DONE.code
        if args.action == "down":
            stack.down(settings, grace_s=args.grace_s)
            return DONE.code
        if args.action == "status":
            return _status(settings)
        if args.action == "stop-node":
            if stack.stop_node(args.node, settings=settings, kill=args.kill,
                               grace_s=args.grace_s) is None:
                print(f"kafka-{args.node}: not running", file=sys.stderr)
            return DONE.code
        if args.action == "start-node":
            stack.start_node(args.node, settings=settings)
            return DONE.code
        for line in env_lines(stack.env(settings)):
            print(line)
        return DONE.code
    except StackError as exc:
        print(f"fencectl stack {args.action}: {exc}", file=sys.stderr)
        return FAILED.code


def _status(settings: stack.StackSettings) -> int:
    rows = stack.status(settings)
    width = max(len(row.service.value) for row in rows)
    for row in rows:
        pid = str(row.pid) if row.pid is not None else "-"
        line = (f"{row.service.value:<{width}} {row.state.value:<10} pid={pid:<8} "
                f"port={row.port}")
        print(line + (f"  {row.detail}" if row.detail else ""))
    return (DONE if all(r.state is stack.ServiceState.UP for r in rows) else FAILED).code
