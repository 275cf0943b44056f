"""PostgreSQL for the ``fencectl`` commands and scripts: ``FENCE_DSN`` and short-lived connections.

Rules
- The DSN comes from the ``FENCE_DSN`` environment variable only (a secret never appears in
  argv) and is never printed.
- ``connection`` closes its connection on every exit path; with ``schema`` it first checks
  that schema's fence version (``SchemaMismatch`` otherwise) before yielding.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fencing.postgres.schema import check_version

__all__ = ["connection", "dsn_from_env"]


def dsn_from_env(command: str) -> str | None:
    """``FENCE_DSN``; None after telling ``command``'s user how to set it (then exit 2)."""
    dsn = os.environ.get("FENCE_DSN")
    if not dsn:
        print(f"{command}: FENCE_DSN is not set (eval \"$(fencectl stack env)\")",
              file=sys.stderr)
        return None
    return dsn


@asynccontextmanager
async def connection(dsn: str, *, schema: str | None = None) -> AsyncIterator[Any]:
    """One asyncpg connection, version-checked against ``schema`` when given, then closed."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        if schema is not None:
            await check_version(conn, schema)
        yield conn
    finally:
        await conn.close()
