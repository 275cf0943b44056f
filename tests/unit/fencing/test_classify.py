"""Outcome classification: asyncpg/OS errors by phase (the integration tests produce them live)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from fencing.errors import Fenced, NotCommitted, OutcomeUnknown, ReadFailed, StatementRejected
from fencing.postgres.classify import Phase, classify, connection_suspect, translate

LOST = asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation")
CLOSED = asyncpg.InterfaceError("connection is closed")
SERIAL = asyncpg.SerializationError("could not serialize access")
DEADLOCK = asyncpg.DeadlockDetectedError("deadlock detected")
UNIQUE = asyncpg.UniqueViolationError("duplicate key")
SHUTDOWN = asyncpg.AdminShutdownError("terminating connection due to administrator command")
PROTOCOL = asyncpg.exceptions.ProtocolError("unexpected message")


@pytest.mark.parametrize(("exc", "expected"), [
    (LOST, OutcomeUnknown),
    (ConnectionResetError(), OutcomeUnknown),
    (OSError("broken pipe"), OutcomeUnknown),
    (TimeoutError(), OutcomeUnknown),
    (SHUTDOWN, OutcomeUnknown),
    (PROTOCOL, OutcomeUnknown),
    (CLOSED, NotCommitted),
    (SERIAL, NotCommitted),
    (DEADLOCK, NotCommitted),
    (UNIQUE, StatementRejected),  # a deferred constraint at COMMIT: rolled back, and would again
])
def test_in_flight(exc: BaseException, expected: type) -> None:
    assert classify(exc, Phase.IN_FLIGHT) is expected


@pytest.mark.parametrize("exc", [LOST, CLOSED, SERIAL, ConnectionRefusedError(), TimeoutError(),
                                 SHUTDOWN])
def test_before_commit_is_not_committed_and_reads_are_read_failed(exc: BaseException) -> None:
    assert classify(exc, Phase.BEFORE_COMMIT) is NotCommitted
    assert classify(exc, Phase.READ) is ReadFailed


@pytest.mark.parametrize("exc", [asyncio.CancelledError(), Fenced("x"), ValueError("handler"),
                                 KeyError("handler")])
@pytest.mark.parametrize("phase", list(Phase))
def test_not_foreign_is_not_translated(exc: BaseException, phase: Phase) -> None:
    assert classify(exc, phase) is None
    assert translate(exc, phase, "op") is exc


UNDEFINED_TABLE = asyncpg.UndefinedTableError("relation \"x\" does not exist")
DENIED = asyncpg.InsufficientPrivilegeError("permission denied for table x")
SYNTAX = asyncpg.PostgresSyntaxError("syntax error at or near \"SELEC\"")


@pytest.mark.parametrize("exc", [UNDEFINED_TABLE, DENIED, SYNTAX, UNIQUE,
                                 asyncpg.UndefinedColumnError("column y does not exist"),
                                 asyncpg.InvalidSchemaNameError("schema z does not exist")])
@pytest.mark.parametrize("phase", list(Phase))
def test_deterministic_statement_errors_are_rejected_in_every_phase(exc: BaseException,
                                                                    phase: Phase) -> None:
    """Never retried as unavailability: the same statement would fail the same way."""
    assert classify(exc, phase) is StatementRejected
    err = translate(exc, phase, "op")
    assert isinstance(err, StatementRejected)
    assert err.sqlstate == exc.sqlstate  # type: ignore[attr-defined]
    assert f"SQLSTATE {exc.sqlstate}" in str(err)  # type: ignore[attr-defined]


def test_translate_names_operation_and_sqlstate() -> None:
    err = translate(SERIAL, Phase.IN_FLIGHT, "process t[0]")
    assert isinstance(err, NotCommitted)
    assert str(err).startswith("process t[0]: SerializationError [40001]")


@pytest.mark.parametrize(("exc", "suspect"), [
    (asyncio.CancelledError(), True),
    (LOST, True),
    (CLOSED, True),
    (PROTOCOL, True),
    (TimeoutError(), True),
    (ConnectionResetError(), True),
    (SERIAL, False),
    (DEADLOCK, False),
    (UNIQUE, False),
    (Fenced("x"), False),
    (ValueError("handler"), False),
])
def test_connection_suspect(exc: BaseException, suspect: bool) -> None:
    assert connection_suspect(exc) is suspect
