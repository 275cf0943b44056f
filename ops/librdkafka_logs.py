"""librdkafka's own log lines on the operator commands (``produce``, ``status``, ``topic``).

librdkafka prints its log to stderr by itself (e.g. ``%3|…|GETPID|…: Failed to acquire
transactional PID from broker …: Coordinator load in progress`` on a broker started seconds
before, which it retries by itself). A command reports what failed in its own words, so
these lines are noise unless asked for: ``--log-level debug`` (or ``FENCE_LOG_LEVEL=debug``)
shows them; any other level sets librdkafka's ``log_level`` to 0 (emergencies only).
"""

from __future__ import annotations

import argparse
import os

__all__ = ["LEVELS", "add_log_level_argument", "client_log_settings"]

LEVELS = ("debug", "info", "warning", "error", "critical")


def add_log_level_argument(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` (default ``$FENCE_LOG_LEVEL`` or info)."""
    default = os.environ.get("FENCE_LOG_LEVEL", "info").lower()
    parser.add_argument("--log-level", type=str.lower, choices=LEVELS,
                        default=default if default in LEVELS else "info",
                        help="debug also shows the Kafka client's own log lines (default "
                             "$FENCE_LOG_LEVEL or info)")


def client_log_settings(level: str | None) -> dict[str, str]:
    """librdkafka settings for a command run at ``level``: its log only at debug."""
    return {} if (level or "").lower() == "debug" else {"log_level": "0"}
