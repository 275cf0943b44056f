"""Where a benchmark figure came from: the command, the commit and the date it was measured.

Every JSON report the benchmarks write carries ``provenance`` (``python -m ops.bench.tables``
prints it above each table it generates), so a published figure names what reproduces it.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["provenance"]

ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=10, check=False)
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def provenance(command: str) -> dict[str, Any]:
    """``command`` (as a user types it), the tree's commit (``+dirty`` with uncommitted
    changes; ``None`` outside a git checkout), today's UTC date and the 1-minute load average
    at the start."""
    commit = _git("rev-parse", "--short", "HEAD")
    if commit and _git("status", "--porcelain", "--untracked-files=no"):
        commit += "+dirty"
    return {"command": command, "commit": commit,
            "date": dt.datetime.now(dt.UTC).date().isoformat(),
            "load_average_1m_at_start": round(os.getloadavg()[0], 2)}
