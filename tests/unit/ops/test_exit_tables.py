"""Every ``fencectl`` command declares its exit-code table, and returns only declared codes.

- each command that runs (a leaf of the parser) has a table (``exits`` in its parser's
  defaults): codes ascending and unique, 0 among them, each with a meaning and an action;
- ``fencectl run``'s table is ``consumer.exits.EXITS``: one row per ``ExitCode``, in order,
  whose restart column is what ``fencectl run --processes`` restarts;
- in each command module no ``return`` gives a literal number: a code is ``ROW.code`` (or
  ``(A if c else B).code``) of a row of the module's ``EXITS``, and every row is returned
  somewhere (``run`` returns ``ExitCode`` members, which its table covers);
- the check catches a literal and an undeclared row in a mutated module.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from types import ModuleType

import pytest

from consumer.exits import EXITS, Exit, ExitCode
from ops.cli import COMMAND_MODULES, COMMON_EXITS, PIPE_CLOSED
from ops.docgen.commands import commands, tables
from ops.worker.supervisor import restartable

#: modules whose functions return the exit codes of their commands
MODULES = (*COMMAND_MODULES, "ops.commands.relay")


def test_every_command_that_runs_declares_a_table() -> None:
    leaves = [c for c in commands() if c.leaf]
    assert len(leaves) >= 20, [c.name for c in leaves]
    for command in leaves:
        rows = command.exits
        assert rows, f"{command.name} declares no exit codes"
        codes = [int(r.code) for r in rows]
        assert codes == sorted(set(codes)) and codes[0] == 0, (command.name, codes)
        assert all(isinstance(r, Exit) and r.meaning and r.action for r in rows), command.name


def test_the_tables_are_one_per_command() -> None:
    names = [t.name for t in tables()]
    assert len(names) == len(set(names)), names
    assert {"fencectl run", "fencectl reset", "fencectl quarantine",
            "fencectl quarantine relay", "fencectl sink plan", "fencectl stack"} <= set(names)


def test_run_declares_every_exit_code_in_order() -> None:
    assert [r.code for r in EXITS] == list(ExitCode)
    (run,) = [c for c in commands() if c.path == ("run",)]
    assert run.exits is EXITS


@pytest.mark.parametrize("row", EXITS, ids=lambda r: str(int(r.code)))
def test_run_s_restart_column_is_what_a_set_restarts(row: Exit) -> None:
    assert row.restart == restartable(int(row.code))


def test_the_common_codes_are_the_cli_s() -> None:
    assert [r.code for r in COMMON_EXITS] == [2, PIPE_CLOSED]


def _rows(module: ModuleType) -> dict[str, Exit]:
    return {name: value for name, value in vars(module).items() if isinstance(value, Exit)}


def undeclared_returns(source: str, rows: dict[str, Exit], declared: tuple[Exit, ...]) -> list[str]:
    """What in ``source`` returns a code its table does not declare, and the declared rows
    it never returns."""
    problems: list[str] = []
    returned: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Return) and node.value is not None:
            values = [node.value.body, node.value.orelse] if isinstance(
                node.value, ast.IfExp) else [node.value]
            for value in values:
                if isinstance(value, ast.Constant) and isinstance(value.value, int) \
                        and not isinstance(value.value, bool):
                    problems.append(f"line {node.lineno}: returns the literal {value.value}")
        if isinstance(node, ast.Attribute) and node.attr == "code":
            inner = node.value
            names = [inner.body, inner.orelse] if isinstance(inner, ast.IfExp) else [inner]
            for name in names:
                if not isinstance(name, ast.Name) or not (name.id in rows or name.id.isupper()):
                    continue  # another object's code (an HTTPError's)
                returned.add(name.id)
                row = rows.get(name.id)
                if row is None or row not in declared:
                    problems.append(f"line {node.lineno}: {name.id}.code is not a row of EXITS")
    problems += [f"{name} is declared but never returned" for name, row in rows.items()
                 if row in declared and name not in returned]
    return problems


@pytest.mark.parametrize("name", MODULES)
def test_a_command_returns_only_declared_codes(name: str) -> None:
    module = importlib.import_module(name)
    declared = module.EXITS
    rows = {} if name == "ops.commands.run" else _rows(module)
    assert declared and (name == "ops.commands.run" or rows), name
    assert undeclared_returns(inspect.getsource(module), rows, declared) == []


def test_the_check_catches_a_literal_and_an_undeclared_row() -> None:
    ok, other = Exit(0, "done", "nothing"), Exit(1, "failed", "again")
    rows = {"OK": ok, "OTHER": other}
    clean = "def main():\n    return (OK if x else OTHER).code\n"
    assert undeclared_returns(clean, rows, (ok, other)) == []
    assert undeclared_returns("def main():\n    return 0 if x else OTHER.code\n", rows,
                              (ok, other)) == ["line 2: returns the literal 0",
                                               "OK is declared but never returned"]
    assert undeclared_returns(clean, rows, (ok,)) == [
        "line 2: OTHER.code is not a row of EXITS"]
