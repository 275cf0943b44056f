"""Test-only handler module: one incoherent declaration next to a coherent handler.

Importing it must succeed; ``--handler tests.unit.ops.handlers_mixed:mailer`` is refused when
the worker loads it, while ``:ledger`` loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fencing.handler import handler
from fencing.types import ACCEPT, SourceRecord, Verdict

__all__ = ["ledger", "mailer"]


@handler(durability="durable-critical", effects="loss-tolerant")
async def mailer(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
    return [ACCEPT for _ in records]


@handler(durability="durable-critical", effects="transactional")
async def ledger(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
    return [ACCEPT for _ in records]
