"""``fencectl migrate``: apply the fence schema's numbered migrations (reads ``FENCE_DSN``).

Running it twice is a no-op. ``--grant-worker ROLE`` also grants ROLE the least
privileges a worker needs on the fence tables (see ``fencing.postgres.schema.grant_worker_sql``).
Exit codes: ``EXITS`` (0 applied or already current, 1 the database refused, 2 bad
configuration).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from consumer.exits import Exit
from fencing.errors import ConfigError, SchemaMismatch
from fencing.postgres.schema import (
    DEFAULT_SCHEMA,
    SCHEMA_VERSION,
    grant_worker_sql,
    migrate,
    quote_schema,
)
from ops.hints import schema_advice
from ops.operator.db import connection, dsn_from_env

__all__ = ["EXITS", "register", "run_migrate"]

DONE = Exit(0, "the schema is current: its migrations applied, or none needed (and the "
            "grants of `--grant-worker` given)", "nothing")
REFUSED = Exit(1, "the database refused a statement (e.g. the role may not create the schema "
               "or its tables)",
               "run it as a role that may (the schema's owner); run again, it applies only "
               "what is missing")
CONFIG = Exit(2, "`FENCE_DSN` unset, malformed, refused or unreachable; a bad `--schema`; a "
              "schema newer than this build", "fix what the line on stderr names")
EXITS = (DONE, REFUSED, CONFIG)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg,unused-ignore]
    p = sub.add_parser("migrate", help="apply the fence schema migrations (FENCE_DSN)")
    p.add_argument("--schema", default=os.environ.get("FENCE_SCHEMA", DEFAULT_SCHEMA),
                   help="PostgreSQL schema for the fence tables (default: $FENCE_SCHEMA or fence)")
    p.add_argument("--grant-worker", metavar="ROLE", default=None,
                   help="also grant ROLE the least privileges a worker needs")
    p.set_defaults(func=_main, exits=EXITS)


async def run_migrate(dsn: str, *, schema: str, grant_role: str | None = None) -> list[int]:
    """Apply migrations (and grants); return the versions applied now."""
    async with connection(dsn) as conn:
        applied = await migrate(conn, schema)
        if grant_role is not None:
            async with conn.transaction():
                for stmt in grant_worker_sql(schema, grant_role):
                    await conn.execute(stmt)
        return applied


def _main(args: argparse.Namespace) -> int:
    dsn = dsn_from_env("fencectl migrate")
    if dsn is None:
        return CONFIG.code
    try:
        quote_schema(args.schema)
        applied = asyncio.run(run_migrate(dsn, schema=args.schema, grant_role=args.grant_worker))
    except ConfigError as exc:
        print(f"fencectl migrate: {exc}", file=sys.stderr)
        return CONFIG.code
    except SchemaMismatch as exc:
        print(f"fencectl migrate: {schema_advice(exc, args.schema)}", file=sys.stderr)
        return CONFIG.code
    except Exception as exc:  # the database refused: report without the DSN
        print(f"fencectl migrate: {type(exc).__name__}: {exc}", file=sys.stderr)
        return REFUSED.code
    if applied:
        print(f"schema {args.schema!r}: applied {', '.join(map(str, applied))}; "
              f"now at version {SCHEMA_VERSION}")
    else:
        print(f"schema {args.schema!r}: already at version {SCHEMA_VERSION}; nothing to do")
    if args.grant_worker:
        print(f"granted worker privileges on {args.schema!r} to {args.grant_worker!r}")
    return DONE.code
