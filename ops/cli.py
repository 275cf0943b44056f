"""``fencectl``: one entry point; each subcommand lives in its own module.

Each module in ``COMMAND_MODULES`` exposes ``register(subparsers)``, which adds its
parser(s) and sets ``func`` to a callable ``(args) -> int`` (the exit code).
Exit codes: 0 success, 1 failure of the work itself, 2 bad usage or configuration.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["COMMAND_MODULES", "build_parser", "main"]

COMMAND_MODULES: tuple[str, ...] = (
    "ops.commands.stack",
    "ops.commands.migrate",
    "ops.commands.run",
    "ops.commands.produce",
    "ops.commands.status",
    "ops.commands.reset",
    "ops.commands.quarantine",
    "ops.commands.trace",
    "ops.commands.sim",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fencectl", description="fenceworker: exactly-once effects in PostgreSQL from Kafka"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # fencectl run --processes
    code = args.func(args)
    return int(code or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
