"""``fencectl stack up | down | status | env``: the local PostgreSQL, Kafka, Jaeger, Prometheus.

Exit codes: 0 success (``status``: every service up), 1 a service failed or is not
up, 2 bad configuration (e.g. an invalid ``FENCE_*_PORT``).
"""

from __future__ import annotations

import argparse
import sys

from ops.hints import fencectl
from ops.stack import control as stack
from ops.stack.config import StackError, env_lines, settings_from

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``stack`` command with its four actions."""
    parser = subparsers.add_parser(
        "stack",
        help="start/stop/check the local PostgreSQL, Kafka, Jaeger and Prometheus (no Docker)",
        description="Local services under .stack/ (data, logs, pids); builds cached per user.",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("up", help="start what is not running; return when all are healthy")
    down = actions.add_parser("down", help="stop the processes `up` started (by pid)")
    down.add_argument("--grace-s", type=float, default=30.0, help="seconds before SIGKILL (30)")
    actions.add_parser("status", help="each service: up, down or unhealthy, with pid and port")
    actions.add_parser("env", help='print export lines: eval "$(fencectl stack env)"')
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from(cli=fencectl())
    except StackError as exc:
        print(f"fencectl stack: {exc}", file=sys.stderr)
        return 2
    try:
        if args.action == "up":
            stack.up(settings)
            return 0
        if args.action == "down":
            stack.down(settings, grace_s=args.grace_s)
            return 0
        if args.action == "status":
            return _status(settings)
        for line in env_lines(stack.env(settings)):
            print(line)
        return 0
    except StackError as exc:
        print(f"fencectl stack {args.action}: {exc}", file=sys.stderr)
        return 1


def _status(settings: stack.StackSettings) -> int:
    rows = stack.status(settings)
    width = max(len(row.service.value) for row in rows)
    for row in rows:
        pid = str(row.pid) if row.pid is not None else "-"
        line = (f"{row.service.value:<{width}} {row.state.value:<10} pid={pid:<8} "
                f"port={row.port}")
        print(line + (f"  {row.detail}" if row.detail else ""))
    return 0 if all(r.state is stack.ServiceState.UP for r in rows) else 1
