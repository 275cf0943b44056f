"""``fencectl``: one entry point; each subcommand lives in its own module.

Each module in ``COMMAND_MODULES`` exposes ``register(subparsers)``, which adds its
parser(s) and sets ``func`` to a callable ``(args) -> int`` (the exit code).
Exit codes: each command declares its table (``exits`` in its parser's defaults, e.g.
``ops.commands.reset.EXITS``; ``docs/exit-codes.md`` renders them): 0 success, 1 failure of
the work itself, 2 bad usage or configuration. ``COMMON_EXITS`` are every command's too: a
flag the chosen (sub)command does not know is refused with that command's usage, not the
top-level one (2); a reader that closes the command's stdout early (``fencectl status --json
| head``) ends it quietly with 141 (128 + SIGPIPE, as ``cat`` or ``grep`` end there).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from consumer.exits import Exit

__all__ = ["COMMAND_MODULES", "COMMON_EXITS", "PIPE_CLOSED", "build_parser", "main"]

PIPE_CLOSED = 141  # 128 + SIGPIPE: what a shell reports for ``cat`` cut off by ``| head``

#: the codes every command may end with besides its own table's
COMMON_EXITS = (
    Exit(2, "usage: a flag the parser refuses (unknown, abbreviated, missing, not a number); "
         "the (sub)command's usage and one `error:` line on stderr",
         "fix the command line (its `--help` lists the flags)"),
    Exit(PIPE_CLOSED, "the reader of stdout closed it early (`fencectl status --json | "
         "head`): the command ends quietly, as `cat` does", "nothing"),
)

COMMAND_MODULES: tuple[str, ...] = (
    "ops.commands.stack",
    "ops.commands.migrate",
    "ops.commands.run",
    "ops.commands.produce",
    "ops.commands.topic",
    "ops.commands.status",
    "ops.commands.reset",
    "ops.commands.quarantine",
    "ops.commands.sink",
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
    _remember_parsers(parser)
    return parser


def _remember_parsers(parser: argparse.ArgumentParser) -> None:
    """Each (sub)parser records itself as a default, so the deepest one chosen is known; none
    takes an abbreviated flag (``--shutdown-timeout`` is not ``--shutdown-timeout-s``: what a
    page or a unit file writes is the flag's whole name, or it is refused)."""
    parser.allow_abbrev = False
    parser.set_defaults(usage_parser=parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                _remember_parsers(child)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # argparse would print the top-level usage: say it with the command's own
        args.usage_parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.argv = list(sys.argv[1:] if argv is None else argv)  # fencectl run --processes
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here at the latest, not at interpreter exit
    except BrokenPipeError:
        # Python's documented way out (library/signal.html, "Note on SIGPIPE"): point stdout
        # at /dev/null so the interpreter's final flush cannot raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return PIPE_CLOSED
    return int(code or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
