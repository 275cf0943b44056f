"""The documented PostgreSQL examples that need no running worker (README quick start, the
runbook), run as typed against the real stack: ``fencectl migrate`` (twice: the second is a
no-op) and ``fencectl status``.

``FENCE_SCHEMA`` points them at a schema of their own, so the shared ``fence`` schema of
the stack is left alone; everything else is the pages' text.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.doc_pages import inline_commands, shell_commands
from tests.integration.workers import ROOT, unique

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent


def shell(script: str, schema: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "FENCE_SCHEMA": schema, "OTEL_TRACES_EXPORTER": "none"}
    return subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def test_migrate_then_status_as_typed(services: Any) -> None:
    assert "fencectl migrate" in shell_commands()
    assert "fencectl status" in inline_commands()
    schema = unique("readme")
    first = shell("fencectl migrate", schema)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith(f"schema '{schema}': applied ")
    again = shell("fencectl migrate", schema)
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stderr
    status = shell("fencectl status", schema)
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith("fence status at ")
    assert "(no partition rows)" in status.stdout
    typo = shell("fencectl status --group docs-workers", schema)
    assert typo.returncode == 2
    assert typo.stderr.strip() == (
        f"fencectl status: --group docs-workers: unknown group in schema '{schema}': no group "
        "has fence rows there yet (a worker writes them when it is first assigned)")


@pytest.mark.parametrize("activated", [True, False], ids=["activated", "venv-path"])
def test_the_migrate_hint_runs_as_printed(services: Any, activated: bool) -> None:
    """The hint names fencectl the way this shell can run it, and the hinted command works."""
    schema = unique("hint")
    env = {**os.environ, "FENCE_SCHEMA": schema, "OTEL_TRACES_EXPORTER": "none",
           "PATH": os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                                   if Path(p) != BIN)}
    if activated:
        env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    script = "fencectl status" if activated else ".venv/bin/fencectl status"
    refused = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=60, check=False)
    assert refused.returncode == 2, refused.stderr
    hint = refused.stderr.split("run `", 1)[1].split("`", 1)[0]
    assert hint == f"{'fencectl' if activated else '.venv/bin/fencectl'} migrate --schema {schema}"
    done = subprocess.run(["bash", "-c", hint], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
