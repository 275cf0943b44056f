"""Translate asyncpg and OS errors into the fence's error tree (outcome classification,
docs/ARCHITECTURE.md).

Rules (each verified against PostgreSQL 15 + asyncpg 0.32 through ``fencing.testing.pgproxy``; see
tests/integration/test_lost_commit.py and tests/unit/test_classify.py)
- ``Phase.READ`` (validate, observe): every foreign error is ``ReadFailed``.
- ``Phase.BEFORE_COMMIT`` (acquiring a connection, BEGIN, the lock, the handler's SQL, the
  quarantine insert): every foreign error is ``NotCommitted``. COMMIT was never sent, and a
  server that loses the session rolls its open transaction back.
- ``Phase.IN_FLIGHT`` (COMMIT, or a mutation that is one autocommit statement: claim,
  skip, journal):
  * a server error reply (``PostgresError`` with a SQLSTATE outside classes 08 and 57P):
    the server rolled back, e.g. 40001 serialization failure, 40P01 deadlock,
    23xxx deferred constraint -> ``NotCommitted``;
  * ``InterfaceError`` ("connection is closed", "another operation is in progress", or
    "released back to the pool" when the server ended the session mid-transaction):
    asyncpg raises it before writing the message -> ``NotCommitted`` (verified with an
    idle-in-transaction timeout: nothing committed);
  * connection errors (SQLSTATE class 08, incl. asyncpg's ``ConnectionDoesNotExistError``
    "connection was closed in the middle of operation"), operator intervention (57P01-03),
    ``OSError``, ``TimeoutError``, protocol errors -> ``OutcomeUnknown``. Verified: a cut
    after COMMIT reached the server (it committed) and a cut before it was forwarded (it
    rolled back) raise the *same* ``ConnectionDoesNotExistError``; only a re-read tells.
- In every phase, a server error reply whose SQLSTATE class says a retry cannot help
  (``DETERMINISTIC_CLASSES``: data exception 22, integrity constraint 23, syntax or access
  rule 42 -- undefined table or column, permission denied --, invalid schema 3F, PL/pgSQL
  raise P0, ...) is ``StatementRejected``: the statement failed, its transaction rolled
  back, and the same statement would fail again. It is never retried as unavailability.
- ``asyncio.CancelledError`` is never translated: it propagates unchanged so asyncio
  cancellation keeps its meaning. When it interrupts an in-flight COMMIT the store adds
  a note ("outcome unknown") and discards the connection; the cancelled lifetime stops and
  never writes again, and the next owner's claim fences whatever did commit.
- Errors that are not foreign (``FenceError``, a handler's own exceptions) are not translated.
- Inside the handler (``wrap_handler_error``): serialization failure 40001, deadlock 40P01
  and lock not available 55P03 are transient (a failure before COMMIT is a known "not
  committed": the batch is rolled back and retried with backoff), and so is an ``OSError``
  of the handler's own calls; a lost store connection (asyncpg's interface errors, 08,
  57P0x) is the store's failure and stays ``NotCommitted`` (the
  three-call policy retries it at once under the same token, so a zombie's retry is
  fenced); a statement in an aborted transaction (25P02, handler misuse) and deployment
  errors (classes 42 and 3F: undefined table or column, permission, schema) keep their own
  classification and stop the lifetime; any other error is poison (``fencing.failures``).
- ``connection_suspect``: after a cancellation or a foreign error other than a server error
  reply (SQLSTATE outside class 08) the store discards the connection instead of using it.
"""

from __future__ import annotations

import asyncio
import enum

import asyncpg

from fencing.errors import (
    FenceError,
    NotCommitted,
    OutcomeUnknown,
    ReadFailed,
    StatementRejected,
)
from fencing.failures import handler_failure

__all__ = [
    "DETERMINISTIC_CLASSES",
    "Phase",
    "classify",
    "connection_suspect",
    "deterministic",
    "handler_transient",
    "is_foreign",
    "translate",
    "wrap_handler_error",
]


class Phase(enum.Enum):
    """Where a store call was when it failed."""

    READ = "read"
    BEFORE_COMMIT = "before-commit"
    IN_FLIGHT = "in-flight"


_UNKNOWN_SQLSTATES = frozenset({"57P01", "57P02", "57P03"})
# SQLSTATE classes (first two characters) whose errors repeat on retry.
DETERMINISTIC_CLASSES = frozenset({"22", "23", "2F", "38", "39", "3F", "42", "44", "P0"})


def is_foreign(exc: BaseException) -> bool:
    """True for the errors this module translates (asyncpg, OS, timeouts)."""
    if isinstance(exc, FenceError | asyncio.CancelledError):
        return False
    return isinstance(
        exc,
        asyncpg.PostgresError
        | asyncpg.InterfaceError
        | asyncpg.exceptions.InternalClientError
        | OSError
        | TimeoutError
        | EOFError,
    )


def _sqlstate(exc: BaseException) -> str:
    return str(getattr(exc, "sqlstate", "") or "")


def _server_rolled_back(exc: BaseException) -> bool:
    if not isinstance(exc, asyncpg.PostgresError):
        return False
    state = _sqlstate(exc)
    if not state or state.startswith("08") or state in _UNKNOWN_SQLSTATES:
        return False
    return True


def deterministic(exc: BaseException) -> bool:
    """True for a server error reply that no retry can fix (see ``DETERMINISTIC_CLASSES``)."""
    return (isinstance(exc, asyncpg.PostgresError)
            and _sqlstate(exc)[:2] in DETERMINISTIC_CLASSES)


def connection_suspect(exc: BaseException) -> bool:
    """True when ``exc`` may leave its connection unusable or a reply pending: a cancellation,
    or a foreign error other than a server error reply outside SQLSTATE class 08."""
    if isinstance(exc, asyncio.CancelledError):
        return True
    if not is_foreign(exc):
        return False
    state = _sqlstate(exc)
    return not (isinstance(exc, asyncpg.PostgresError) and state and not state.startswith("08"))


_TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "55P03"})
_NOT_WRAPPED_CLASSES = frozenset({"42", "3F"})
_MISUSE_SQLSTATE = "25P02"


def handler_transient(exc: BaseException) -> bool:
    """True for an error of the handler's own work that a retry may not repeat: 40001,
    40P01, 55P03, or an ``OSError``/``TimeoutError`` of its own network calls."""
    return _sqlstate(exc) in _TRANSIENT_SQLSTATES or (
        isinstance(exc, OSError | TimeoutError) and not _store_failure(exc))


def _store_failure(exc: BaseException) -> bool:
    """The store's connection failing under a handler statement: asyncpg's interface and
    connection errors, the server ending the session (SQLSTATE 08, 57P0x)."""
    state = _sqlstate(exc)
    return (isinstance(exc, asyncpg.InterfaceError | asyncpg.exceptions.InternalClientError)
            or (isinstance(exc, asyncpg.PostgresError)
                and (state.startswith("08") or state in _UNKNOWN_SQLSTATES)))


def wrap_handler_error(exc: Exception, what: str) -> Exception:
    """What the store raises for ``exc`` from the handler: ``HandlerFailed`` (transient or
    poison), or ``exc`` itself where the store's classification applies (see the Rules)."""
    state = _sqlstate(exc)
    if _store_failure(exc) or (isinstance(exc, asyncpg.PostgresError) and (
            state == _MISUSE_SQLSTATE or state[:2] in _NOT_WRAPPED_CLASSES)):
        return exc
    return handler_failure(exc, what=what, transient=handler_transient)


def classify(exc: BaseException, phase: Phase) -> type[FenceError] | None:
    """The fence error class for a foreign ``exc`` raised in ``phase``; None when not foreign."""
    if not is_foreign(exc):
        return None
    if deterministic(exc):
        return StatementRejected
    if phase is Phase.READ:
        return ReadFailed
    if phase is Phase.BEFORE_COMMIT:
        return NotCommitted
    if _server_rolled_back(exc) or isinstance(exc, asyncpg.InterfaceError):
        return NotCommitted
    return OutcomeUnknown


def translate(exc: BaseException, phase: Phase, what: str) -> BaseException:
    """The exception to raise (``from exc``) for ``exc``: a fence error, or ``exc`` itself."""
    cls = classify(exc, phase)
    if cls is None:
        return exc
    state = getattr(exc, "sqlstate", None)
    code = f" [{state}]" if state else ""
    message = f"{what}: {type(exc).__name__}{code}: {exc}"
    if cls is StatementRejected:
        return StatementRejected(f"{message} (SQLSTATE {state}: not retried, it would fail "
                                 "again)", sqlstate=str(state))
    return cls(message)
