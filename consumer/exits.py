"""Exit codes of ``fencectl run``, the table that says what each means, and the pure mapping
from a failure to one.

``EXITS`` is the declared table (one ``Exit`` per ``ExitCode``: meaning, what to do, whether a
supervisor restarts on it); ``docs/exit-codes.md``, the README and the runbook render it
(``python -m ops.docgen``). In short:

- 0: stopped on SIGTERM/SIGINT; every in-flight batch committed or not applied.
- 1: internal error: a handler declared ``on_failure="stop"`` failed, a handler misused the
  transaction, a statement refused for a reason no retry fixes (naming its SQLSTATE), a bug.
- 2: configuration, at once: a bad flag or setting, a refused handler or ``-X`` property,
  ``FENCE_DSN`` refused (login, unknown database or host, TLS) or malformed, schema not
  migrated, a missing topic, a database not set up for the worker (undefined table, column,
  function or schema; permission denied: ``CONFIG_SQLSTATES``), naming the SQLSTATE.
- 3: the lifetime retired: fenced by a newer owner, stopped, its budget used up, or an
  unknown outcome that could not be resolved (a supervisor restarts; ``--restart-lifetimes
  N`` does it in-process).
- 4: the source was refused: recreated topic, retention gap, records deleted mid-consumption
  (an operator decides; ``--allow-retention-gap`` skips and journals).
- 5: unavailable: PostgreSQL failing after the three-call policy, Kafka or PostgreSQL not
  answering past ``--outage-bound-s`` (also at start: ``ops.worker.startup`` retries a
  service that does not answer within that bound, then exits 5), or the Kafka client failed
  a rebalance step.
- 6: shutdown bound exceeded; the in-flight partitions and offsets were logged (each batch is
  committed or not applied, never half). It wins over every other code: work was abandoned.

A ``Retired`` error carries the failure that retired the lifetime as ``__cause__``; the code
is the cause's (a retirement because PostgreSQL was unavailable exits 5, not 3).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

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

__all__ = ["CONFIG_SQLSTATES", "EXITS", "Exit", "ExitCode", "exit_code_for"]

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
    """The codes ``fencectl run`` exits with; ``EXITS`` says what each means."""

    OK = 0
    INTERNAL = 1
    CONFIG = 2
    RETIRED = 3
    SOURCE_REFUSED = 4
    UNAVAILABLE = 5
    SHUTDOWN_TIMEOUT = 6


@dataclass(frozen=True, slots=True)
class Exit:
    """One row of a command's exit-code table: the ``code``, its ``meaning`` (the cases that
    end there), the ``action`` an operator takes, and ``restart``: whether a supervisor starts
    the command again on it (a restart can fix the cause by itself). Every ``fencectl``
    command declares its rows beside its code and returns ``row.code``; ``ops.docgen`` renders
    them."""

    code: int
    meaning: str
    action: str
    restart: bool = False


#: ``fencectl run``'s table, one row per ``ExitCode`` in order (``restart``: what
#: ``ops.worker.supervisor.restartable`` and ``--restart-lifetimes`` start again)
EXITS: tuple[Exit, ...] = (
    Exit(ExitCode.OK, "stopped by SIGTERM/SIGINT; every in-flight batch committed or not "
         "applied",
         "nothing"),
    Exit(ExitCode.INTERNAL, "internal error, logged with its traceback: a handler declared "
         '`on_failure="stop"` failed; a handler broke the transaction (`HandlerMisuse`) or '
         "returned the wrong number of verdicts; a statement refused for a reason no retry "
         "fixes (syntax error, a constraint at COMMIT), naming its SQLSTATE; a bug",
         "read the traceback in the log and fix the handler or the statement it names (a bug "
         "of fenceworker: report it with the log); a restart fails the same way"),
    Exit(ExitCode.CONFIG, "configuration, at once: a bad flag or `FENCE_*` value; an "
         "unknown or refused handler; a conflicting or refused `-X` property; `FENCE_DSN` "
         "malformed or refused (login, unknown database or host name, TLS); schema not "
         "migrated; a missing topic; a statement refused because the database is not set up "
         "for the worker (undefined table, column, function or schema; permission denied), "
         "naming its SQLSTATE",
         "fix what the one line on stderr names (`fencectl migrate`, `fencectl migrate "
         "--grant-worker ROLE`, `fencectl topic create`); a restart fails the same way"),
    Exit(ExitCode.RETIRED, "lifetime retired: fenced by a newer owner (a zombie), its budget "
         "(`--call-budget-s`) used up, an unknown outcome that could not be re-read, or its "
         "`--instance-id` taken by another process",
         "restart it: the next lifetime claims a newer epoch and loses nothing "
         "(`--restart-lifetimes N` restarts in-process, not after a taken `--instance-id`: "
         "give each member its own id); often, look at PostgreSQL's reachability and slow "
         "batches", restart=True),
    Exit(ExitCode.SOURCE_REFUSED, "source refused: recreated topic, retention gap, records "
         "deleted mid-consumption",
         "an operator decides: `fencectl reset adopt-topic` for a recreated topic; re-produce "
         "the lost records, or `fencectl reset accept-gap` (or `--allow-retention-gap`) for "
         "a gap; a restart is refused the same way"),
    Exit(ExitCode.UNAVAILABLE, "unavailable: PostgreSQL still failing after the three-call "
         "policy; PostgreSQL (at start) or Kafka not answering past `--outage-bound-s`; the "
         "Kafka client failed a rebalance step",
         "restart it with a backoff: it resumes from the durable frontier once the service "
         "answers; check the host, port and that the server runs", restart=True),
    Exit(ExitCode.SHUTDOWN_TIMEOUT, "shutdown bound (`--shutdown-timeout-s`) exceeded: work "
         "that ignored cancellation was abandoned; the in-flight partitions and offsets are "
         "logged, each batch committed or not applied. Wins over every other code",
         "find what blocked in the logged partitions (a handler that blocks the event loop "
         "or ignores cancellation); raise `--shutdown-timeout-s` if a drain needs longer; it "
         "ends a stop, so nothing restarts it"),
)


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
