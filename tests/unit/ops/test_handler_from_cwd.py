"""``--handler module:name`` finds a module in the directory ``fencectl`` runs from, as the
README tells a new user to save it, through the installed console script (no PYTHONPATH):
the script's own directory, not the current one, is first on its ``sys.path``.

No service is needed: the handler is imported before Kafka or PostgreSQL is dialled, so a
handler module that imports but names no such callable answers exit 2 naming the callable —
proof the module itself was found — and a module that is not there answers exit 2 naming the
module and where it was looked for.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
FENCECTL = BIN / "fencectl"

HANDLER = '''
from fencing.handler import handler
from fencing.types import ACCEPT


@handler()
async def accept_all(conn, records):
    return [ACCEPT] * len(records)
'''


def _run(cwd: Path, spec: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FENCE_", "KAFKA_", "OTEL_")) and k != "PYTHONPATH"}
    env.update({"PATH": f"{BIN}{os.pathsep}/usr/bin:/bin",
                # nothing listens here: the handler is loaded before either is dialled
                "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "FENCE_DSN": "postgresql://x@127.0.0.1:9/x"})
    return subprocess.run(["fencectl", "run", "--topic", "t", "--group", "g", "--handler", spec],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=60,
                          check=False)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    assert FENCECTL.exists(), f"{FENCECTL} missing: `make setup` installs the console script"
    (tmp_path / "orders_app.py").write_text(HANDLER)
    return tmp_path


def test_a_module_in_the_current_directory_is_imported(app_dir: Path) -> None:
    done = _run(app_dir, "orders_app:no_such_handler")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == ("fencectl run: --handler 'orders_app:no_such_handler': "
                                   "'orders_app' has no callable 'no_such_handler'")


def test_a_missing_module_names_where_it_was_looked_for(app_dir: Path) -> None:
    done = _run(app_dir, "no_such_app:handle")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "fencectl run: --handler 'no_such_app:handle': cannot import 'no_such_app': no module "
        f"named 'no_such_app' in the current directory ({app_dir}) or in the environment "
        f"{BIN.parent}")


def test_an_import_error_inside_the_module_is_its_own(app_dir: Path) -> None:
    (app_dir / "broken_app.py").write_text("import no_such_dependency\n")
    done = _run(app_dir, "broken_app:handle")
    assert done.returncode == 2, done.stderr
    assert "cannot import 'broken_app': No module named 'no_such_dependency'" in done.stderr
