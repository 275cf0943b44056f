"""Exit-code tables of every ``fencectl`` command, rendered from what each declares
(``consumer.exits.EXITS`` for ``run``, each command module's ``EXITS``, ``ops.cli.COMMON_EXITS``):
``docs/exit-codes.md`` holds them all; the README, ``docs/configuration.md`` and the runbook
(``docs/operations.md``) hold the views their readers need.
"""

from __future__ import annotations

from collections.abc import Sequence

from consumer.exits import Exit
from ops.docgen.commands import ExitTable, tables

__all__ = ["all_tables", "anchor", "common", "run_brief", "runbook", "summary"]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _yes(row: Exit) -> str:
    return "yes" if row.restart else "no"


def anchor(table: ExitTable) -> str:
    """The id the site gives the table's heading (``fencectl quarantine relay``)."""
    return "-".join(table.name.split())


def _full(rows: Sequence[Exit]) -> list[str]:
    return ["| code | meaning | what to do | a supervisor restarts |", "|---|---|---|---|",
            *(f"| {int(r.code)} | {_cell(r.meaning)} | {_cell(r.action)} | {_yes(r)} |"
              for r in rows)]


def _run() -> ExitTable:
    (run,) = [t for t in tables() if t.path == ("run",)]
    return run


def _ordered() -> list[ExitTable]:
    """``run`` first, then the others as ``fencectl --help`` lists them."""
    return sorted(tables(), key=lambda t: t.path != ("run",))


def all_tables() -> str:
    """One section per declared table: the commands it covers, then its rows."""
    out: list[str] = []
    for table in _ordered():
        out += [f"### {table.name}", ""]
        if len(table.commands) > 1:
            subs = ", ".join(f"`{p[-1]}`" for p in table.commands)
            out += [f"For each of its actions: {subs}.", ""]
        out += [*_full(table.rows), ""]
    return "\n".join(out[:-1])


def common() -> str:
    """The codes every command may end with besides its own."""
    from ops.cli import COMMON_EXITS

    return "\n".join(_full(COMMON_EXITS))


def run_brief() -> str:
    """``fencectl run``'s codes with their meaning and whether a supervisor restarts."""
    return "\n".join(["| code | meaning | a supervisor restarts |", "|---|---|---|",
                      *(f"| {int(r.code)} | {_cell(r.meaning)} | {_yes(r)} |"
                        for r in _run().rows)])


def runbook() -> str:
    """``fencectl run``'s codes with what to do about each."""
    return "\n".join(["| exit | what happened | what to do | a supervisor restarts |",
                      "|---|---|---|---|",
                      *(f"| {int(r.code)} | {_cell(r.meaning)} | {_cell(r.action)} | "
                        f"{_yes(r)} |" for r in _run().rows)])


def summary() -> str:
    """One row per table: what 0, 1 and 2 mean, and the other codes, each linked to its
    section of ``exit-codes.md``."""
    out = ["| command | 0 | 1 | 2 | other |", "|---|---|---|---|---|"]
    for table in _ordered():
        by_code = {int(r.code): r for r in table.rows}
        cells = [_cell(by_code[c].meaning) if c in by_code else "" for c in (0, 1, 2)]
        other = " · ".join(f"{c} {_cell(r.meaning)}" for c, r in by_code.items() if c > 2)
        out.append(f"| [`{' '.join(table.path)}`](exit-codes.md#{anchor(table)}) | "
                   f"{' | '.join(cells)} | {other} |")
    return "\n".join(out)
