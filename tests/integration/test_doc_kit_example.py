"""The README's quick-start handler, proven exactly-once by the test kit a user would use
(``fencing.testing.check_handler``) from a plain pytest file beside it, in a folder outside
the repository, with the virtualenv's pytest and no PYTHONPATH. (The README and the kit's
page themselves run as written in ``tests/integration/test_doc_pages.py``.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_pages import README

pytestmark = pytest.mark.integration


def test_the_readme_quick_start_handler_is_exactly_once(pg_dsn: str, tmp_path: Path) -> None:
    (handler,) = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert "--handler orders_app:order_totals" in README.read_text()
    (tmp_path / "orders_app.py").write_text(handler)
    (tmp_path / "test_orders_app.py").write_text(
        "import os\n\n"
        "from fencing.testing import check_handler, json_records\n"
        "from orders_app import order_totals\n\n\n"
        "def test_orders_app():\n"
        "    records = json_records('orders', [\n"
        "        (f'c{i % 5}', {'id': f'o-{i}', 'customer': f'c{i % 5}', 'amount': i - 3})\n"
        "        for i in range(120)], partitions=3)\n"
        "    report = check_handler(order_totals, records, dsn=os.environ['FENCE_DSN'])\n"
        "    assert report.faults['lost-reply-committed'] > 0\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["FENCE_DSN"] = pg_dsn
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "test_orders_app.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
