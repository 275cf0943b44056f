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
- ``server_not_answering`` tells the failures a long-running worker retries at start (the
  server refused or dropped the connection, timed out, is starting up or shutting down,
  has no connection slot left) from the configuration mistakes above (a refused login, an
  unknown database or host name, a malformed DSN).
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from consumer.config import redact
from fencing.errors import ConfigError
from fencing.postgres.schema import check_version, quote_schema
from ops.hints import fencectl

__all__ = ["connect_mistake", "connection", "dsn_from_env", "require_known_group",
           "server_not_answering"]

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


def connect_mistake(exc: BaseException, *, dsn: str) -> str | None:
    """One line naming ``FENCE_DSN`` when ``exc`` (or its cause) shows the connection could
    not be set up; None for any other failure. The password never appears in it."""
    import asyncpg

    seen: BaseException | None = exc
    while seen is not None:
        state = str(getattr(seen, "sqlstate", "") or "")
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
