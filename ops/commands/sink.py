"""``fencectl sink plan``: the ``ALTER TABLE`` statements a topic's schemas would need of the
table sink's table, for operators who apply DDL themselves.

  fencectl sink plan --topic T --sink table=NAME [--sink-key COL] --sink-format F
      [--sink-envelope debezium] [--json]

Reads every version registered under ``<topic>-value`` (``SCHEMA_REGISTRY_URL``) and the
table (``FENCE_DSN``; ``--sink table='{topic}'`` names the topic's table), and prints the
plan of ``fencing.postgres.sink.evolve``: one ``ALTER TABLE … ADD COLUMN IF NOT EXISTS`` per
field without a column, then the problems no such statement fixes as ``--`` comments.
Nothing is changed. Exit codes: ``EXITS`` (0 nothing to change; 1 statements or problems
printed; 2 bad usage or configuration: no registry, a missing table or subject, JSON values).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from consumer.config import redact
from consumer.exits import Exit
from fencing.errors import ConfigError, Unavailable
from fencing.postgres.sink import SinkSpec
from fencing.postgres.sink.catalog import read_layout
from fencing.postgres.sink.evolve import Plan, plan
from fencing.postgres.sink.registry import Registry
from fencing.postgres.sink.rows import RESERVED
from fencing.postgres.sink.values import Misfit
from ops.operator.db import connection, dsn_from_env

__all__ = ["EXITS", "register"]

CURRENT = Exit(0, "nothing to change: the table has a column for every field of every "
               "registered schema", "nothing")
PLANNED = Exit(1, "statements or problems printed (nothing was changed)",
               "apply the statements as the table's owner (or run the worker with "
               "`--sink-evolve add-columns`); each `--` problem needs a decision no `ADD "
               "COLUMN` makes")
CONFIG = Exit(2, "bad usage or configuration: `FENCE_DSN` or `SCHEMA_REGISTRY_URL` unset or "
              "refused, a missing table or subject, a `--sink-format` without writer schemas "
              "(json)", "fix what the line on stderr names")
EXITS = (CURRENT, PLANNED, CONFIG)


def register(sub: Any) -> None:
    p = sub.add_parser("sink", help="the table sink's schema evolution plan")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    a = actions.add_parser("plan", help="print the ALTER TABLE statements a topic's schemas "
                                        "would need of its table")
    a.add_argument("--topic", required=True, help="the topic whose schemas are read "
                   "(subject <topic>-value)")
    a.add_argument("--sink", required=True, metavar="table=NAME",
                   help="the table, as for run ('{topic}' names the topic's table)")
    a.add_argument("--sink-key", default=None, metavar="COLUMN[,COLUMN...]",
                   help="its key columns, as for run")
    a.add_argument("--sink-format", required=True, metavar="FORMAT",
                   help="avro, protobuf or json-schema")
    a.add_argument("--sink-envelope", default=None, metavar="ENVELOPE",
                   help="debezium: the schemas are Debezium's change events, whose after "
                        "image holds the row (as for run; default: none)")
    a.add_argument("--json", action="store_true", help="machine-readable output")
    a.set_defaults(func=_main, exits=EXITS)


async def _plan(dsn: str, spec: SinkSpec, topic: str) -> Plan:
    assert spec.registry is not None
    registry = Registry(spec.registry)
    subject = f"{topic}-value"
    try:
        versions = []
        for v in await registry.versions(subject):
            got = await registry.latest_fields(spec.value_format, subject, v,
                                               envelope=spec.envelope is not None)
            if got is not None:
                versions.append((f"{got[1]} version {v}", got[0]))
    except (Unavailable, Misfit) as exc:
        raise ConfigError(f"SCHEMA_REGISTRY_URL {registry.where}: {exc}") from None
    finally:
        await registry.close()
    if not versions:
        raise ConfigError(f"--topic {topic}: no schema is registered under {subject}")
    async with connection(dsn) as conn:
        target, problems = await read_layout(conn, spec)
    if target is None:
        raise ConfigError(f"--sink table={spec.table}: {'; '.join(problems)}")
    columns = {c.name: (c.kind, c.required) for c in target.layout.columns}
    keys = target.layout.keys  # with the envelope and no --sink-key: the primary key
    return plan(target.quoted, versions, columns, (*keys, *RESERVED))


def _main(args: argparse.Namespace) -> int:
    dsn = dsn_from_env("fencectl sink plan")
    if dsn is None:
        return CONFIG.code
    try:
        kind, _, name = args.sink.partition("=")
        if kind.strip() != "table" or not name.strip():
            raise ConfigError(f"--sink {args.sink}: expected table=NAME")
        spec = SinkSpec.from_settings({
            "table": name.strip(), "key": args.sink_key, "format": args.sink_format,
            "envelope": args.sink_envelope,
            "registry": os.environ.get("SCHEMA_REGISTRY_URL", "")}).for_topic(args.topic)
        if not spec.value_format.registry:
            raise ConfigError(f"--sink-format {args.sink_format}: a plan reads writer schemas "
                              "(avro, protobuf or json-schema)")
        got = asyncio.run(_plan(dsn, spec, args.topic))
    except ConfigError as exc:
        print(f"fencectl sink plan: {redact(str(exc), dsn=dsn)}", file=sys.stderr)
        return CONFIG.code
    if args.json:
        print(json.dumps({"statements": list(got.statements), "problems": list(got.problems)},
                         indent=2))
    else:
        for stmt in got.statements:
            print(stmt)
        for problem in got.problems:
            print(f"-- not fixed by ADD COLUMN: {problem}")
    return (PLANNED if got.statements or got.problems else CURRENT).code
