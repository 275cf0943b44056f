"""Exit codes of ``fencectl run`` and the pure mapping from a failure to one.

- 0: stopped on SIGTERM/SIGINT; every in-flight batch committed or not applied.
- 1: unexpected internal error (a bug); the traceback is logged.
- 2: invalid configuration, Kafka/PostgreSQL unreachable at start, unknown schema version
  (fix the named setting; run ``fencectl migrate``).
- 3: the lifetime retired: fenced by a newer owner, stopped, or an unknown outcome that
  could not be resolved (a supervisor restarts; ``--restart-lifetimes N`` does it in-process).
- 4: the source was refused: recreated topic, retention gap, records deleted mid-consumption
  (an operator decides; ``--allow-retention-gap`` skips and journals).
- 5: PostgreSQL (after the three-call policy) or Kafka facts unavailable.
- 6: shutdown bound exceeded; the in-flight partitions and offsets were logged (each batch is
  committed or not applied, never half).
"""

from __future__ import annotations

import enum

from fencing.errors import (
    ConfigError,
    Fenced,
    OutcomeUnknown,
    Retired,
    SchemaMismatch,
    SourceRefused,
    StoreUnavailable,
)

__all__ = ["ExitCode", "exit_code_for"]


class ExitCode(enum.IntEnum):
    OK = 0
    INTERNAL = 1
    CONFIG = 2
    RETIRED = 3
    SOURCE_REFUSED = 4
    UNAVAILABLE = 5
    SHUTDOWN_TIMEOUT = 6


def exit_code_for(exc: BaseException) -> ExitCode:
    """The exit code a failure ends the worker with (checked most specific first)."""
    from consumer.source import SourceUnavailable

    if isinstance(exc, ConfigError | SchemaMismatch):
        return ExitCode.CONFIG
    if isinstance(exc, SourceRefused):
        return ExitCode.SOURCE_REFUSED
    if isinstance(exc, Fenced | Retired | OutcomeUnknown):
        return ExitCode.RETIRED
    if isinstance(exc, StoreUnavailable | SourceUnavailable | TimeoutError):
        return ExitCode.UNAVAILABLE
    return ExitCode.INTERNAL
