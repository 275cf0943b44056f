"""Test-only handler factory for ``fencectl quarantine replay`` subprocesses
(``--handler tests.integration.quarantine_handlers:effects_handler``).

It inserts every accepted record into ``<schema>.effects`` (the table of
``tests.integration.pg_helpers.create_fence_schema``: no key, so a record applied twice shows
as two rows). Settings (``--handler-setting``):

- ``reject=V``: records whose value is ``V`` are rejected ("still bad: V");
- ``raise=V``: the handler raises ``ValueError`` on a record whose value is ``V``;
- ``hold_at=O``: after inserting the record at offset ``O`` (inside the replay's transaction),
  while ``$FENCE_TEST_HOLD_DIR/hold`` exists, write ``$FENCE_TEST_HOLD_DIR/held-<pid>`` and
  wait (the test kills the process there).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fencing.handler import HandlerContext, handler, handler_factory
from fencing.postgres.schema import quote_schema
from fencing.store import HandlerFn
from fencing.types import ACCEPT, Reject, SourceRecord, Verdict

__all__ = ["effects_handler"]


async def _hold(offset: int) -> None:
    hold_dir = os.environ.get("FENCE_TEST_HOLD_DIR")
    if not hold_dir:
        return
    hold = Path(hold_dir) / "hold"
    if hold.exists():
        (Path(hold_dir) / f"held-{os.getpid()}").write_text(str(offset))
        while hold.exists():  # noqa: ASYNC110 - a file removed by another process
            await asyncio.sleep(0.02)


@handler_factory()
def effects_handler(context: HandlerContext) -> HandlerFn:
    sql = (f'INSERT INTO {quote_schema(context.schema)}.effects (topic, partition, "offset",'
           " value) VALUES ($1, $2, $3, $4)")
    reject, raising = context.settings.get("reject"), context.settings.get("raise")
    hold_at = context.settings.get("hold_at")

    @handler(durability="durable-critical", effects="transactional")
    async def handle(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
        out: list[Verdict] = []
        for r in records:
            value = (r.value or b"").decode(errors="replace")
            await conn.execute(sql, r.topic, r.partition, r.offset, r.value)
            if raising is not None and value == raising:
                raise ValueError(f"handler refuses {value}")
            if reject is not None and value == reject:
                out.append(Reject(f"still bad: {value}"))
                continue
            if hold_at is not None and r.offset == int(hold_at):
                await _hold(r.offset)
            out.append(ACCEPT)
        return out

    return handle
