"""Exit codes of ``fencectl run`` and the pure mapping from a failure to one.

- 0: stopped on SIGTERM/SIGINT; every in-flight batch committed or not applied.
- 1: unexpected internal error (a bug, or a handler exception or misuse); the traceback is
  logged. A PostgreSQL statement refused for a reason no retry fixes (a syntax error, a
  constraint) also ends here, naming its SQLSTATE.
- 2: invalid configuration, Kafka/PostgreSQL unreachable at start, unknown schema version,
  a librdkafka property the client refuses, or a statement refused because the database is
  not set up for the worker (undefined table, column, function or schema; permission
  denied), naming the SQLSTATE (fix the named setting; ``fencectl migrate``; grant).
- 3: the lifetime retired: fenced by a newer owner, stopped, its budget used up, or an
  unknown outcome that could not be resolved (a supervisor restarts; ``--restart-lifetimes
  N`` does it in-process).
- 4: the source was refused: recreated topic, retention gap, records deleted mid-consumption
  (an operator decides; ``--allow-retention-gap`` skips and journals).
- 5: PostgreSQL unavailable after the three-call policy, Kafka facts unavailable, or the
  Kafka client failed a rebalance step.
- 6: shutdown bound exceeded; the in-flight partitions and offsets were logged (each batch is
  committed or not applied, never half). It wins over every other code: work was abandoned.

A ``Retired`` error carries the failure that retired the lifetime as ``__cause__``; the code
is the cause's (a retirement because PostgreSQL was unavailable exits 5, not 3).
"""

from __future__ import annotations

import enum

from fencing.errors import (
    ConfigError,
    FenceError,
    HandlerFailed,
    HandlerMisuse,
    Retired,
    SchemaMismatch,
    SourceRefused,
    SourceUnavailable,
    StatementRejected,
    StoreUnavailable,
)

__all__ = ["CONFIG_SQLSTATES", "ExitCode", "exit_code_for"]

# SQLSTATEs that mean the database is not set up for the worker: the operator fixes it.
CONFIG_SQLSTATES = frozenset({
    "42501",  # insufficient_privilege: grant (fencectl migrate --grant-worker)
    "42P01",  # undefined_table: migrate / create the handler's tables
    "42703",  # undefined_column
    "42883",  # undefined_function
    "3F000",  # invalid_schema_name
    "3D000",  # invalid_catalog_name
})


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
    cause = exc.__cause__
    if isinstance(exc, Retired) and cause is not None and not isinstance(cause, Retired):
        return exit_code_for(cause)
    if isinstance(exc, ConfigError | SchemaMismatch):
        return ExitCode.CONFIG
    if isinstance(exc, StatementRejected):
        return ExitCode.CONFIG if exc.sqlstate in CONFIG_SQLSTATES else ExitCode.INTERNAL
    if isinstance(exc, HandlerMisuse | HandlerFailed):  # misuse; a handler declared to stop
        return ExitCode.INTERNAL
    if isinstance(exc, SourceRefused):
        return ExitCode.SOURCE_REFUSED
    if isinstance(exc, StoreUnavailable | SourceUnavailable | TimeoutError):
        return ExitCode.UNAVAILABLE
    if isinstance(exc, FenceError):  # fenced, unknown outcome, budget, stopped
        return ExitCode.RETIRED
    return ExitCode.INTERNAL
