"""``docs/cli.md``: every ``fencectl`` command and subcommand with its usage and every flag,
its default and its help, rendered from the parser (``ops.docgen.commands``).

Rules
- A flag whose help is ``argparse.SUPPRESS`` (a hidden alias) is left out; ``-h`` too.
- The default column: ``required``; ``off`` for a switch; ``none (repeatable)`` for an
  empty repeatable flag; ``—`` for no default; else the value (a float without a trailing
  ``.0``). A default the help says comes from a variable (``$FENCE_SCHEMA``) is the code's
  own, read without the variable set.
- The usage lines are argparse's, at a fixed width of 88 columns.
"""

from __future__ import annotations

import argparse

from ops.docgen.commands import Command, ExitTable, commands, tables
from ops.docgen.exit_codes import anchor

__all__ = ["default_text", "flag_text", "render", "usage"]

WIDTH = 88


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def flag_text(action: argparse.Action) -> str:
    """``--flag METAVAR`` (every option string), or the positional's name."""
    if not action.option_strings:
        return str(action.metavar or action.dest)
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    if action.metavar is not None:
        metavar = str(action.metavar)
    elif action.choices is not None:
        metavar = "{" + ",".join(str(c) for c in action.choices) + "}"
    else:
        metavar = action.dest.upper()
    return ", ".join(f"{o} {metavar}" for o in action.option_strings)


def default_text(action: argparse.Action) -> str:
    """What the default column shows for ``action`` (see Rules)."""
    if action.required:
        return "required"
    default = action.default
    if action.nargs == 0:
        return "on" if default else "off"
    if isinstance(action, argparse._AppendAction) and not default:
        return "none (repeatable)"
    if default is None:
        return "—"
    if isinstance(default, float):
        return f"{default:g}"
    return str(default)


def usage(parser: argparse.ArgumentParser) -> str:
    """argparse's usage of ``parser`` at ``WIDTH`` columns."""
    formatter = argparse.HelpFormatter(prog=parser.prog, width=WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _flags(command: Command) -> list[str]:
    rows = [a for a in command.parser._actions
            if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
            and a.help is not argparse.SUPPRESS]
    if not rows:
        return []
    return ["| flag | default | help |", "|---|---|---|",
            *(f"| `{flag_text(a)}` | {_cell(default_text(a))} | {_cell(a.help or '')} |"
              for a in rows)]


def _section(command: Command) -> list[str]:
    level = "#" * (len(command.path) + 1)
    out = [f"{level} {command.name}", ""]
    if command.help:
        out += [_cell(command.help[0].upper() + command.help[1:]) + ".", ""]
    description = command.parser.description
    if description and description != command.help:
        out += [_cell(description), ""]
    out += ["```text", usage(command.parser), "```", ""]
    flags = _flags(command)
    if flags:
        out += [*flags, ""]
    if command.leaf and command.exits is not None:
        table = _table_of(command)
        codes = ", ".join(str(int(r.code)) for r in command.exits)
        out += [f"Exit codes {codes}: [{table.name}](exit-codes.md#{anchor(table)}).", ""]
    return out


def _table_of(command: Command) -> ExitTable:
    for table in tables():
        if command.path in table.commands:
            return table
    raise ValueError(f"{command.name}: no exit-code table")


def render() -> str:
    """Every command, in the order ``fencectl --help`` lists them, each subcommand after it."""
    out: list[str] = []
    for command in commands():
        out += _section(command)
    return "\n".join(out).rstrip("\n")
