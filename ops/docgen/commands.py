"""The commands of ``fencectl`` as the parser declares them: every (sub)command's path, its
parser, and the exit-code table it declares.

Rules
- The parser is ``ops.cli.build_parser()`` built in an environment without the variables of
  ``ops.docgen.environment.VARIABLES`` (a default read from the environment shows as the
  code's own default, not as this machine's value), so the pages are the same everywhere.
- A command's table is the ``exits`` default of its parser or of the nearest parser above it
  (``reset`` sets it on each action, ``stack`` on the command); a leaf without one has none.
- ``tables()`` groups leaves that share one table object under their common path
  (``reset frontier``, ``reset accept-gap``, ``reset adopt-topic``: ``reset``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from consumer.exits import Exit

__all__ = ["Command", "ExitTable", "clean_parser", "commands", "tables"]


@dataclass(frozen=True, slots=True)
class Command:
    """One parser of the tree: ``path`` is the words after ``fencectl`` (empty for the top),
    ``leaf`` whether it runs (no subcommands below it)."""

    path: tuple[str, ...]
    parser: argparse.ArgumentParser
    help: str
    leaf: bool
    exits: tuple[Exit, ...] | None

    @property
    def name(self) -> str:
        return " ".join(("fencectl", *self.path))


@dataclass(frozen=True, slots=True)
class ExitTable:
    """One declared table and the commands that return it."""

    path: tuple[str, ...]  # the common path of its commands
    commands: tuple[tuple[str, ...], ...]
    rows: tuple[Exit, ...]

    @property
    def name(self) -> str:
        return " ".join(("fencectl", *self.path))


@contextlib.contextmanager
def _without(names: Sequence[str]) -> Iterator[None]:
    saved = {n: os.environ.pop(n) for n in names if n in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def clean_parser() -> argparse.ArgumentParser:
    """``ops.cli.build_parser()`` with no documented variable set (see Rules)."""
    from ops.cli import build_parser
    from ops.docgen.environment import VARIABLES

    with _without([v.name for v in VARIABLES]):
        return build_parser()


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def commands(parser: argparse.ArgumentParser | None = None) -> list[Command]:
    """Every parser below the top one, depth first in the order they were added."""
    out: list[Command] = []

    def walk(p: argparse.ArgumentParser, path: tuple[str, ...], help_text: str,
             inherited: tuple[Exit, ...] | None) -> None:
        exits = p.get_default("exits") or inherited
        sub = _subparsers(p)
        if path:
            out.append(Command(path, p, help_text, sub is None, exits))
        if sub is None:
            return
        helps = {a.dest: a.help or "" for a in sub._choices_actions}
        for name, child in sub.choices.items():
            walk(child, (*path, name), helps.get(name, ""), exits)

    walk(parser if parser is not None else clean_parser(), (), "", None)
    return out


def tables(parser: argparse.ArgumentParser | None = None) -> list[ExitTable]:
    """Each declared table once, in the order of its first command."""
    grouped: dict[int, tuple[tuple[Exit, ...], list[tuple[str, ...]]]] = {}
    for command in commands(parser):
        if command.leaf and command.exits is not None:
            grouped.setdefault(id(command.exits), (command.exits, []))[1].append(command.path)
    out = []
    for rows, paths in grouped.values():
        common = paths[0]
        while any(p[:len(common)] != common for p in paths):
            common = common[:-1]
        out.append(ExitTable(common, tuple(paths), rows))
    return out
