"""How to type ``fencectl`` in a hint so that it works as printed.

A hint such as "run `fencectl migrate`" fails with "command not found" when the user ran
``.venv/bin/fencectl`` without activating the virtual environment. ``fencectl()`` names the
command the way this process can be started again: ``fencectl`` when that name on ``PATH``
is this installation's console script, else the script's path (relative to the current
directory when it lies below it), else ``python -m ops.cli`` with this interpreter.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from fencing.errors import SchemaMismatch

__all__ = ["fencectl", "schema_advice"]


def fencectl() -> str:
    """The command line prefix that runs this installation's ``fencectl``."""
    script = Path(sys.prefix) / "bin" / "fencectl"
    on_path = shutil.which("fencectl")
    if on_path is not None and Path(on_path).resolve() == script.resolve():
        return "fencectl"
    if script.is_file():
        try:
            return str(script.relative_to(Path.cwd()))
        except ValueError:
            return str(script)
    return f"{sys.executable} -m ops.cli"


def schema_advice(exc: SchemaMismatch, schema: str) -> str:
    """``exc``'s message, followed by the migrate command when migrating fixes it."""
    if not exc.migrate:
        return str(exc)
    return f"{exc}; run `{fencectl()} migrate --schema {schema}`"
