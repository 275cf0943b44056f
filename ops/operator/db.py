"""PostgreSQL for the ``fencectl`` commands and scripts: ``FENCE_DSN`` and short-lived connections.

Rules
- The DSN comes from the ``FENCE_DSN`` environment variable only (a secret never appears in
  argv) and is never printed.
- ``connection`` closes its connection on every exit path; with ``schema`` it first checks
  that schema's fence version (``SchemaMismatch`` otherwise) before yielding.
- A connection that cannot be set up (wrong user or password, unknown database, host not
  answering, malformed DSN) is a configuration mistake: ``connection`` raises
  ``ConfigError`` naming ``FENCE_DSN`` (every command exits 2 for it), with the password
  redacted.
- ``one_transaction`` is how an operator command writes: one transaction bounded by a
  timeout, its failures classified by phase as the fence store's are
  (``fencing.postgres.classify``): ``NotCommitted`` before COMMIT was sent (nothing
  changed), ``OutcomeUnknown`` once it was (reply lost, timed out); a cancellation
  propagates, ``Progress.phase`` saying whether COMMIT was in flight. A connection left in
  an unknown state is terminated, never waited on.
- ``server_not_answering`` tells the failures a long-running worker retries at start (the
  server refused or dropped the connection, timed out, is starting up or shutting down,
  has no connection slot left) from the configuration mistakes above (a refused login, an
  unknown database or host name, a malformed DSN).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from consumer.config import redact
from fencing import crashpoints
from fencing.errors import ConfigError, FenceError
from fencing.postgres.classify import Phase, connection_suspect, translate
from fencing.postgres.schema import check_version, quote_schema
from ops.hints import fencectl

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "Progress",
    "connect_mistake",
    "connection",
    "dsn_from_env",
    "one_transaction",
    "require_known_group",
    "server_not_answering",
    "tool_dsn_from_env",
]

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 30.0


@dataclass(slots=True)
class Progress:
    """How far ``one_transaction`` got: ``Phase.IN_FLIGHT`` once COMMIT may have been sent."""

    phase: Phase = Phase.BEFORE_COMMIT


async def one_transaction(conn: Any, body: Callable[[], Awaitable[T]], *, what: str,
                          timeout_s: float = DEFAULT_TIMEOUT_S,
                          progress: Progress | None = None) -> T:
    """Run ``body`` in one transaction on ``conn``, COMMIT, return its result; the whole
    bounded by ``timeout_s``. Raises what ``body`` raises of the fence's errors (rolled
    back), ``NotCommitted`` (failed before COMMIT: nothing changed), ``OutcomeUnknown``
    (COMMIT sent, its reply lost or timed out), or a cancellation (``progress.phase``)."""
    progress = progress if progress is not None else Progress()
    progress.phase = Phase.BEFORE_COMMIT
    try:
        async with asyncio.timeout(timeout_s):
            tr = conn.transaction()
            await tr.start()
            try:
                result = await body()
            except BaseException as exc:
                if not connection_suspect(exc):
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(asyncio.shield(tr.rollback()), timeout=5.0)
                raise
            progress.phase = Phase.IN_FLIGHT
            await tr.commit()
            return result
    except FenceError:
        raise
    except BaseException as exc:
        if connection_suspect(exc):  # never wait for a cancelled or lost statement's reply
            with contextlib.suppress(Exception):
                conn.terminate()  # the server rolls an open transaction back
        err = translate(exc, progress.phase, what)
        if err is exc:
            raise
        raise err from exc

_GROUPS_LISTED_MAX = 10

# SQLSTATE classes of a login the server refused: 28 authorization, 3D unknown database
_LOGIN_REFUSED_CLASSES = ("28", "3D")


def dsn_from_env(command: str) -> str | None:
    """``FENCE_DSN``; None after telling ``command``'s user how to set it (then exit 2)."""
    dsn = os.environ.get("FENCE_DSN")
    if not dsn:
        print(f"{command}: FENCE_DSN is not set (for the local stack: "
              f"eval \"$({fencectl()} stack env)\")", file=sys.stderr)
        return None
    return dsn


def tool_dsn_from_env(command: str) -> str | None:
    """``dsn_from_env`` for a tool with crash points (``fencing.crashpoints.TOOL_POINTS``):
    also None (then exit 2) when ``FENCE_CRASH_AT`` is malformed or names an unknown point,
    never silently disarmed."""
    try:
        crashpoints.armed()
    except ConfigError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return None
    return dsn_from_env(command)


def _tls_mistake(exc: BaseException) -> str | None:
    """What is wrong with ``FENCE_DSN``'s TLS settings when ``exc`` shows it, else None: a
    certificate that does not verify, a certificate or key file that cannot be read
    (``sslrootcert``, ``sslcert``, ``sslkey``), a server without TLS asked for it (asyncpg
    raises a bare ``ConnectionError`` "rejected SSL upgrade"). None of these is retried."""
    import ssl

    if isinstance(exc, ssl.SSLCertVerificationError):
        detail = getattr(exc, "verify_message", "") or exc
        return f"the server's certificate does not verify ({detail})"
    if isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError):
        return f"a TLS file cannot be read ({exc})"
    if type(exc) is ConnectionError and "SSL upgrade" in str(exc):
        return f"{exc}: the server does not speak TLS, or sslmode asks for it"
    return None


def connect_mistake(exc: BaseException, *, dsn: str) -> str | None:
    """One line naming ``FENCE_DSN`` when ``exc`` (or its cause) shows the connection could
    not be set up; None for any other failure. The password never appears in it."""
    import asyncpg

    seen: BaseException | None = exc
    while seen is not None:
        state = str(getattr(seen, "sqlstate", "") or "")
        if (tls := _tls_mistake(seen)) is not None:
            return redact(f"FENCE_DSN: TLS: {tls}; check sslmode, sslrootcert, sslcert and "
                          "sslkey in FENCE_DSN", dsn=dsn)
        if isinstance(seen, asyncpg.PostgresError) and state[:2] in _LOGIN_REFUSED_CLASSES:
            return redact(f"FENCE_DSN: PostgreSQL refused the connection: {seen}; check the "
                          "user, password and database name in FENCE_DSN", dsn=dsn)
        if isinstance(seen, OSError | TimeoutError):
            return redact(f"FENCE_DSN: PostgreSQL unreachable: {seen or type(seen).__name__}; "
                          "check the host and port in FENCE_DSN and that the server runs",
                          dsn=dsn)
        if isinstance(seen, asyncpg.ClientConfigurationError | ValueError) \
                and not isinstance(seen, ConfigError):
            return redact(f"FENCE_DSN: not a usable PostgreSQL DSN: {seen}", dsn=dsn)
        seen = seen.__cause__
    return None


# SQLSTATEs of a server that cannot take the connection now: 57P01 admin_shutdown,
# 57P02 crash_shutdown, 57P03 cannot_connect_now (starting up or shutting down),
# 53300 too_many_connections
_NOT_NOW_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300"})


def server_not_answering(exc: BaseException, *, dsn: str) -> str | None:
    """One line naming ``FENCE_DSN`` when ``exc`` (or its cause) shows a server that does not
    answer or dropped the connection -- worth retrying -- else None (a configuration mistake
    or any other failure). The password never appears in it."""
    import socket

    import asyncpg

    seen: BaseException | None = exc
    while seen is not None:
        state = str(getattr(seen, "sqlstate", "") or "")
        if isinstance(seen, asyncpg.PostgresError):
            if state in _NOT_NOW_SQLSTATES:
                return redact(f"FENCE_DSN: PostgreSQL cannot take connections now "
                              f"(SQLSTATE {state}: {seen})", dsn=dsn)
            return None  # refused login, unknown database, or another server answer
        if isinstance(seen, asyncpg.ClientConfigurationError | ValueError):
            return None  # a malformed DSN
        if _tls_mistake(seen) is not None:
            return None  # a TLS setting: a mistake (connect_mistake names it)
        if isinstance(seen, socket.gaierror):
            if seen.errno == socket.EAI_AGAIN:
                return redact(f"FENCE_DSN: the host name did not resolve now ({seen})", dsn=dsn)
            return None  # an unknown host name: a mistake
        if isinstance(seen, OSError | TimeoutError | asyncpg.InterfaceError):
            return redact(f"FENCE_DSN: PostgreSQL did not answer or dropped the connection "
                          f"({type(seen).__name__}: {seen or 'no detail'})", dsn=dsn)
        seen = seen.__cause__
    return None


@asynccontextmanager
async def connection(dsn: str, *, schema: str | None = None) -> AsyncIterator[Any]:
    """One asyncpg connection, version-checked against ``schema`` when given, then closed.

    Raises ``ConfigError`` (naming ``FENCE_DSN``) when the connection cannot be set up."""
    import asyncpg

    try:
        conn = await asyncpg.connect(dsn, timeout=10)
    except Exception as exc:
        message = connect_mistake(exc, dsn=dsn)
        if message is None:
            raise
        raise ConfigError(message) from None
    try:
        if schema is not None:
            await check_version(conn, schema)
        yield conn
    finally:
        await conn.close()


async def require_known_group(conn: Any, *, schema: str, group: str) -> None:
    """Return when ``group`` has fence rows or member rows in ``schema``; otherwise raise
    ``ConfigError`` saying so and listing the known groups (the first few when many)."""
    q = quote_schema(schema)
    rows = await conn.fetch(
        f"SELECT group_id FROM {q}.partitions UNION SELECT group_id FROM {q}.members"
        " ORDER BY 1")
    known = [r["group_id"] for r in rows]
    if group in known:
        return
    if not known:
        raise ConfigError(f"--group {group}: unknown group in schema {schema!r}: no group has "
                          "fence rows there yet (a worker writes them when it is first assigned)")
    if len(known) <= _GROUPS_LISTED_MAX:
        listed = "known groups: " + ", ".join(known)
    else:
        listed = (f"{len(known)} known groups, e.g. " + ", ".join(known[:_GROUPS_LISTED_MAX])
                  + f"; `{fencectl()} status` lists them all")
    raise ConfigError(f"--group {group}: unknown group in schema {schema!r} (no fence rows or "
                      f"members); {listed}")
