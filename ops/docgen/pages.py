"""Which page holds which generated region, and what renders it.

``REGIONS`` maps a region's name to its renderer; ``PAGES`` lists every page with regions
(README.md and docs/*.md). A region may sit on several pages (``exit-codes-run``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ops.docgen import cli_ref, environment, exit_codes, metrics

__all__ = ["PAGES", "REGIONS", "ROOT"]

ROOT = Path(__file__).resolve().parents[2]


def _lines(render: Callable[[], list[str]]) -> Callable[[], str]:
    return lambda: "\n".join(render())


REGIONS: dict[str, Callable[[], str]] = {
    "exit-codes-run": exit_codes.run_brief,
    "exit-codes-runbook": exit_codes.runbook,
    "exit-codes-summary": exit_codes.summary,
    "exit-codes-common": exit_codes.common,
    "exit-codes-all": exit_codes.all_tables,
    "cli": cli_ref.render,
    "environment": _lines(environment.render),
    "metrics": _lines(metrics.render),
}

PAGES: tuple[Path, ...] = tuple(ROOT / p for p in (
    "README.md", "docs/configuration.md", "docs/operations.md", "docs/exit-codes.md",
    "docs/cli.md", "docs/environment.md", "docs/metrics.md"))
