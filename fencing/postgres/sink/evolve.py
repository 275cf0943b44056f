"""The table sink's schema evolution plan: the ``ALTER TABLE`` statements a topic's writer
schemas need of its table (``fencectl sink plan``), and what no statement of the sink's
kind can fix (pure, no I/O).

Rules
- A field of any schema version with no column (and not a reserved or key column) gets a
  nullable column of the field's type (``schemas``: the type the sink would create), as
  ``ALTER TABLE … ADD COLUMN IF NOT EXISTS``: running the plan twice, or after another
  operator, changes nothing. When versions disagree on a new field's type, the latest
  version's wins.
- A field whose column cannot hold it (a type change), and a required column (NOT NULL, no
  default) that some version no longer fills (a dropped required field), are listed as
  problems, never altered: narrowing or retyping a column is the operator's decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fencing.postgres.schema import quote_ident
from fencing.postgres.sink.schemas import Field, fits

__all__ = ["Plan", "plan"]


@dataclass(frozen=True, slots=True)
class Plan:
    """The statements to run (in order) and the problems they cannot fix."""

    statements: tuple[str, ...]
    problems: tuple[str, ...]


def plan(table: str, versions: Sequence[tuple[str, Sequence[Field]]],
         columns: dict[str, tuple[str, bool]], filled_elsewhere: Sequence[str]) -> Plan:
    """The plan for ``table`` (quoted) from ``versions`` (a name and the fields of each
    writer schema, oldest first) and the table's ``columns`` (name -> (pg_type name,
    required)); ``filled_elsewhere``: key and reserved columns (see the module Rules)."""
    skip = set(filled_elsewhere)
    new: dict[str, Field] = {}
    problems: list[str] = []
    for what, fields in versions:
        for f in fields:
            if f.name not in columns and f.name not in skip:
                new[f.name] = f  # a later version's type replaces an earlier one's
        problems += [p for p in fits(fields, columns, filled_elsewhere, what)
                     if p not in problems]
    statements = tuple(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {quote_ident(f.name)} "
                       f"{f.pg_type};" for f in new.values())
    return Plan(statements, tuple(problems))
