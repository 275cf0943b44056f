"""The reference pages generated from the code: ``python -m ops.docgen --write`` renders
every generated region (``ops.docgen.regions``) of ``ops.docgen.pages.PAGES``; ``--check``
only compares and exits 1 naming the stale regions.

- exit codes: every command's declared table (``ops.docgen.exit_codes``);
- ``docs/cli.md``: every command, subcommand and flag (``ops.docgen.cli_ref``);
- ``docs/environment.md``: every variable the code reads (``ops.docgen.environment``);
- ``docs/metrics.md``: every metric a worker exports (``ops.docgen.metrics``).
"""

from __future__ import annotations

__all__: list[str] = []
