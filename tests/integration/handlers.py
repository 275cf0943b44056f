"""Test-only handlers for worker subprocesses (``--handler tests.integration.handlers:...``).

``holding_handler`` is the reference handler, except that while the file
``$FENCE_TEST_HOLD_DIR/hold`` exists it first writes ``held-<pid>`` (partition and first
offset of the batch) and waits, inside the store's transaction, until the file is removed.
Without ``FENCE_TEST_HOLD_DIR`` it is exactly the reference handler.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fencing.handler import handler
from fencing.reference.pg import ensure_tables, make_pg_handler
from fencing.types import SourceRecord, Verdict

__all__ = ["ensure_tables", "holding_handler"]

_inner = make_pg_handler(schema=os.environ.get("FENCE_SCHEMA") or "fence")


@handler(durability="durable-critical", effects="transactional")
async def holding_handler(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
    hold_dir = os.environ.get("FENCE_TEST_HOLD_DIR")
    if hold_dir:
        hold = Path(hold_dir) / "hold"
        if hold.exists():
            (Path(hold_dir) / f"held-{os.getpid()}-{records[0].partition}").write_text(
                f"{records[0].partition} {records[0].offset} {records[-1].offset}")
            while hold.exists():  # noqa: ASYNC110 - a file written by another process
                await asyncio.sleep(0.02)
    return list(await _inner(conn, records))
