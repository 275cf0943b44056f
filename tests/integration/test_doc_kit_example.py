"""The documented handler examples, run exactly as a user would copy them (they need
``FENCE_DSN``: the integration services):

- the test kit's example (the ```` ```python ```` block of "Test your own handler") saved as
  a file and run by pytest;
- the README's quick-start handler saved as ``orders_app.py`` (the name the README gives
  it) and proven exactly-once by the same kit, from a plain pytest file beside it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_pages import README, page_with

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def python_blocks(page: Path) -> list[str]:
    return [str(b) for b in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)]


def kit_example() -> str:
    blocks = python_blocks(page_with("# Test your own handler"))
    assert len(blocks) == 1, "the kit's page shows one python example"
    return blocks[0]


def run_pytest(directory: Path, pg_dsn: str, test_file: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, FENCE_DSN=pg_dsn, PYTHONPATH=os.pathsep.join([str(directory),
                                                                         str(ROOT)]))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           test_file], cwd=directory, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def test_the_kit_example_runs_and_passes(pg_dsn: str, tmp_path: Path) -> None:
    (tmp_path / "test_order_totals.py").write_text(kit_example())
    done = run_pytest(tmp_path, pg_dsn, "test_order_totals.py")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout


def test_the_readme_quick_start_handler_is_exactly_once(pg_dsn: str, tmp_path: Path) -> None:
    (handler,) = python_blocks(README)
    assert "--handler orders_app:order_totals" in README.read_text()
    (tmp_path / "orders_app.py").write_text(handler)
    (tmp_path / "test_orders_app.py").write_text(
        "import os\n\n"
        "from fencing.testing import check_handler, json_records\n"
        "from orders_app import order_totals\n\n\n"
        "def test_orders_app():\n"
        "    records = json_records('orders', [(f'c{i % 5}', {'amount': i - 3})\n"
        "                                      for i in range(120)], partitions=3)\n"
        "    report = check_handler(order_totals, records, dsn=os.environ['FENCE_DSN'])\n"
        "    assert report.faults['lost-reply-committed'] > 0\n")
    done = run_pytest(tmp_path, pg_dsn, "test_orders_app.py")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
