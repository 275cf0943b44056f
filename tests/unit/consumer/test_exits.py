"""Exit codes: a retirement exits with its cause's code (no services)."""

from __future__ import annotations

import pytest

from consumer.exits import ExitCode, exit_code_for
from fencing.errors import (
    BudgetExceeded,
    ConfigError,
    Fenced,
    HandlerFailed,
    HandlerMisuse,
    KafkaClientFailed,
    NotCommitted,
    OutcomeUnknown,
    ReadFailed,
    Retired,
    SourceUnavailable,
    StatementRejected,
)


def retired_from(cause: BaseException) -> Retired:
    exc = Retired("lifetime lt-x retired")
    exc.__cause__ = cause
    return exc


@pytest.mark.parametrize(("exc", "code"), [
    (retired_from(NotCommitted("three calls")), ExitCode.UNAVAILABLE),
    (retired_from(ReadFailed("three calls")), ExitCode.UNAVAILABLE),
    (retired_from(ValueError("handler bug")), ExitCode.INTERNAL),
    (retired_from(OutcomeUnknown("unresolved")), ExitCode.RETIRED),
    (retired_from(BudgetExceeded("budget")), ExitCode.RETIRED),
    (retired_from(Fenced("newer epoch")), ExitCode.RETIRED),
    (retired_from(Retired("stopped")), ExitCode.RETIRED),
    (Retired("stopped"), ExitCode.RETIRED),
    (retired_from(StatementRejected("x", sqlstate="42P01")), ExitCode.CONFIG),
    (retired_from(StatementRejected("x", sqlstate="42501")), ExitCode.CONFIG),
    (retired_from(StatementRejected("x", sqlstate="42601")), ExitCode.INTERNAL),
    (retired_from(StatementRejected("x", sqlstate="23505")), ExitCode.INTERNAL),
    (retired_from(HandlerMisuse("rollback")), ExitCode.INTERNAL),
    (HandlerFailed("declared stop", transient=False, error_type="ValueError",
                   error_message="m", traceback_digest="0" * 16), ExitCode.INTERNAL),
    (ConfigError("-X no.such.property"), ExitCode.CONFIG),
    (KafkaClientFailed("assign failed"), ExitCode.UNAVAILABLE),
    (SourceUnavailable("list_offsets"), ExitCode.UNAVAILABLE),
    (BudgetExceeded("budget"), ExitCode.RETIRED),
])
def test_exit_code_follows_the_cause(exc: BaseException, code: ExitCode) -> None:
    assert exit_code_for(exc) is code
