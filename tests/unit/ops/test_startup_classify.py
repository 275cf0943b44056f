"""ops.operator.db.server_not_answering: what a worker retries at start, what is a mistake."""

from __future__ import annotations

import socket
import ssl

import asyncpg
import pytest

from fencing.errors import ReadFailed
from ops.operator.db import connect_mistake, server_not_answering

DSN = "postgresql://fw:S3cretPw@db.example:5432/fw"


def _wrapped(exc: BaseException) -> ReadFailed:
    """As PgFenceStore.connect raises it: translated, the driver's error as the cause."""
    err = ReadFailed("schema check failed")
    err.__cause__ = exc
    return err


@pytest.mark.parametrize("exc", [
    ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 5432)"),
    ConnectionError("unexpected connection_lost() call"),
    TimeoutError(),
    asyncpg.CannotConnectNowError("the database system is starting up"),
    asyncpg.TooManyConnectionsError("sorry, too many clients already"),
    socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"),
])
def test_a_server_that_does_not_answer_is_retried(exc: BaseException) -> None:
    line = server_not_answering(_wrapped(exc), dsn=DSN)
    assert line is not None and line.startswith("FENCE_DSN: ")
    assert "S3cretPw" not in line


@pytest.mark.parametrize("exc", [
    asyncpg.InvalidPasswordError("password authentication failed for user \"fw\""),
    asyncpg.InvalidCatalogNameError("database \"fw\" does not exist"),
    socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
    asyncpg.ClientConfigurationError("invalid DSN"),
    ConnectionError('PostgreSQL server at "db.example:5432" rejected SSL upgrade'),
    FileNotFoundError(2, "No such file or directory"),
    ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify "
                                 "failed: self-signed certificate"),
])
def test_a_configuration_mistake_is_not(exc: BaseException) -> None:
    assert server_not_answering(_wrapped(exc), dsn=DSN) is None
    assert connect_mistake(_wrapped(exc), dsn=DSN) is not None


def test_a_tls_mistake_names_the_tls_settings() -> None:
    line = connect_mistake(_wrapped(ConnectionError(
        'PostgreSQL server at "db.example:5432" rejected SSL upgrade')), dsn=DSN)
    assert line == ('FENCE_DSN: TLS: PostgreSQL server at "db.example:5432" rejected SSL '
                    "upgrade: the server does not speak TLS, or sslmode asks for it; check "
                    "sslmode, sslrootcert, sslcert and sslkey in FENCE_DSN")
