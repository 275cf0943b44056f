"""The table sink's schema evolution plan: the ``ALTER TABLE`` statements a topic's writer
schemas need of its table (``fencectl sink plan``), what no statement of the sink's kind can
fix, and the column a JSON field gets (``--sink-evolve add-columns``); pure, no I/O.

Rules
- A field of any schema version with no column (and not a reserved or key column) gets a
  nullable column of the field's type (``schemas``: the type the sink would create), as
  ``ALTER TABLE … ADD COLUMN IF NOT EXISTS``: running the plan twice, or after another
  operator, changes nothing. When versions disagree on a new field's type, the latest
  version's wins.
- A field whose column cannot hold it (a type change), and a required column (NOT NULL, no
  default) that some version no longer fills (a dropped required field), are listed as
  problems, never altered: narrowing or retyping a column is the operator's decision.
- A JSON field's column (``json_column``) is typed from the field's non-null values in the
  batch: all booleans ``bool``, all integers ``bigint``, numbers with a fraction (with or
  without integers) ``numeric`` (exact for the JSON text), all strings ``text``, anything
  else (objects, arrays, mixed kinds) ``jsonb``, which holds any JSON. A field that is null
  in every record gets no column yet.
- ``strays`` finds, in the values of a batch that hold a field with no column, each such
  field with its values, in the order first met.
"""

from __future__ import annotations

import decimal
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fencing.postgres.schema import quote_ident
from fencing.postgres.sink.schemas import Field, fits

__all__ = ["Plan", "add_columns", "json_column", "plan", "strays"]


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
    return Plan(add_columns(table, new.values()), tuple(problems))


def add_columns(table: str, fields: Iterable[Field]) -> tuple[str, ...]:
    """One ``ALTER TABLE … ADD COLUMN IF NOT EXISTS`` (nullable) per field, for ``table``
    (quoted)."""
    return tuple(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {quote_ident(f.name)} "
                 f"{f.pg_type};" for f in fields)


def json_column(values: Iterable[Any]) -> str | None:
    """The column type of a JSON field from its values (see the module Rules)."""
    kinds = set()
    for v in values:
        if v is None:
            continue
        if isinstance(v, bool):
            kinds.add("bool")
        elif isinstance(v, int):
            kinds.add("int8")
        elif isinstance(v, float | decimal.Decimal):
            kinds.add("numeric")
        elif isinstance(v, str):
            kinds.add("text")
        else:
            kinds.add("jsonb")
    if not kinds:
        return None
    if kinds == {"int8", "numeric"}:
        return "numeric"
    return kinds.pop() if len(kinds) == 1 else "jsonb"


def strays(values: Iterable[Mapping[str, Any]], known: Collection[str]
           ) -> dict[str, list[Any]]:
    """Each field of ``values`` not in ``known``, with its values (see the module Rules)."""
    out: dict[str, list[Any]] = {}
    for value in values:
        for name, v in value.items():
            if name not in known:
                out.setdefault(name, []).append(v)
    return out
