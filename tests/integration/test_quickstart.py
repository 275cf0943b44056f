"""The quick start (``docs/quickstart.md``), run as written: from a checkout to rows in the
user's own table, then a record that does not fit, quarantined and replayed.

Each block marked ``<!-- quickstart: NAME -->`` runs literally in ``bash`` from the
repository's root, as the page says: *setup* then *worker* in one shell (the worker keeps
running), *check*, *misfit*, *quarantined* and *replay* in a second one. Output blocks
(*rows*, *replayed*) are what the user must see. The test starts from what a fresh clone
would meet: no table ``orders``, no topic ``orders``, and a fence schema of its own
(``FENCE_SCHEMA``, which every command reads and ``fencectl stack env`` leaves alone), so
``fencectl migrate`` really migrates. Point ``PAGE`` elsewhere if the page moves.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from confluent_kafka.admin import AdminClient

from tests.integration.workers import ROOT
from tests.polling import wait_until

pytestmark = pytest.mark.integration

PAGE = ROOT / "docs" / "quickstart.md"
_BLOCK = re.compile(r"<!-- quickstart: (\w+) -->\n```(\w+)\n(.*?)\n```", re.S)


def blocks(page: Path = PAGE) -> dict[str, str]:
    """The page's marked code blocks by name."""
    found = {m.group(1): m.group(3) for m in _BLOCK.finditer(page.read_text("utf-8"))}
    assert {"setup", "worker", "check", "rows", "misfit", "quarantined", "replay",
            "replayed"} <= set(found), sorted(found)
    return found


def _bash(script: str, env: dict[str, str], *, timeout_s: float = 600.0
          ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-e", "-c", script], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=timeout_s, check=False)


def _lines(text: str) -> list[str]:
    return [ln.rstrip() for ln in text.strip("\n").splitlines()]


def _fresh_start(dsn: str, bootstrap: str, schema: str | None = None) -> None:
    """What a fresh clone meets: no ``orders`` table, no ``orders`` topic (also after the
    test: an unqualified ``orders`` of another test must not find this one's table)."""
    async def drop() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("DROP TABLE IF EXISTS public.orders")
            if schema is not None:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(drop())
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if "orders" in admin.list_topics(timeout=10).topics:
        admin.delete_topics(["orders"])["orders"].result(timeout=30)
        wait_until(lambda: "orders" not in admin.list_topics(timeout=10).topics,
                   timeout_s=30, what="topic orders deleted")


def test_the_quick_start_as_written(services: Any) -> None:
    page = blocks()
    _fresh_start(services.dsn, services.kafka_bootstrap)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["FENCE_SCHEMA"] = f"quickstart_{uuid.uuid4().hex[:8]}"
    shell_one = subprocess.Popen(["bash", "-e", "-c", page["setup"] + "\n" + page["worker"]],
                                 cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    try:
        checked: list[subprocess.CompletedProcess[str]] = []

        def rows_shown() -> bool:
            assert shell_one.poll() is None, shell_one.communicate()[0][-4000:]
            done = _bash(page["check"], env)
            checked.append(done)
            return done.returncode == 0 and _lines(page["rows"]) == _lines(done.stdout)[
                :len(_lines(page["rows"]))]

        wait_until(rows_shown, timeout_s=300, interval_s=2.0, what="the quick start's rows")
        status = checked[-1].stdout
        assert "orders-sink" in status and "observed/running" in status, status

        # the second shell keeps what the check block set up (its first line)
        second = page["check"].splitlines()[0]
        assert second.startswith(". .venv/bin/activate"), second
        misfit = _bash(second + "\n" + page["misfit"], env)
        assert misfit.returncode == 0, misfit.stderr
        listed: list[str] = []

        def quarantined() -> bool:
            done = _bash(second + "\n" + page["quarantined"], env)
            listed.append(done.stdout)
            return "table sink: missing required column amount" in done.stdout

        wait_until(quarantined, timeout_s=120, interval_s=1.0, what="o-3 quarantined")
        assert listed[-1].startswith("orders-sink orders[")
        replay = _bash(second + "\n" + page["replay"], env)
        assert replay.returncode == 0, replay.stdout + replay.stderr
        out = _lines(replay.stdout)
        assert out[0] == "ALTER TABLE"
        assert out[1].startswith("replaying with fencing.postgres.sink:table_sink (key=id, "
                                 "table=orders) (recorded by the group's live member lt-")
        assert "replay: 1 applied, 0 failed again (still quarantined), 0 skipped" in out
        assert out[-len(_lines(page["replayed"])):] == _lines(page["replayed"])
    finally:
        if shell_one.poll() is None:
            os.killpg(shell_one.pid, signal.SIGINT)  # Ctrl-C in the worker's shell
        try:
            output = shell_one.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            os.killpg(shell_one.pid, signal.SIGKILL)
            output = shell_one.communicate()[0]
        _fresh_start(services.dsn, services.kafka_bootstrap, env["FENCE_SCHEMA"])
    assert shell_one.returncode == 0, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
