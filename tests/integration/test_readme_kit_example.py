"""The README's handler test kit example, run exactly as a user would copy it: the
```python block of "Test your own handler" saved as a file and run by pytest (it needs
``FENCE_DSN``: the integration services)."""

# ruff: noqa: F811  (pytest fixtures imported from pg_helpers are redefined as parameters)

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.pg_helpers import pg_dsn  # noqa: F401  (fixture)
from tests.readme import README

pytestmark = pytest.mark.integration


def kit_example() -> str:
    text = README.read_text()
    section = text[text.index("## Test your own handler"):]
    section = section[:section.index("\n## ")]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the kit section shows one python example"
    return str(blocks[0])


def test_the_readme_kit_example_runs_and_passes(pg_dsn: str, tmp_path: Path) -> None:
    (tmp_path / "test_order_totals.py").write_text(kit_example())
    env = dict(os.environ, FENCE_DSN=pg_dsn,
               PYTHONPATH=str(Path(__file__).resolve().parents[3]))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "test_order_totals.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
